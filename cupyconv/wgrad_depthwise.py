"""The weight gradient of depthwise convolutions (kernels/wgrad_depthwise.cu): refusal, runs of the
reduction, specialisations and program. Each block sums a run of one channel's (NCHW) or 32 vectors
of channels' (NHWC) output pixels for every tap in registers; wgrad.py's ordered reduction adds the
runs (a weight of one input channel per group has the same memory in KCHW and KHWC)."""
from __future__ import annotations

import functools
import math


from .arguments import ConvProblem
from .families.common import CTYPES, MAX_GRID_Y, STORAGE_BYTES
from .program import GRAD_OUTPUT, OUT, WORKSPACE, X, CallProgram, Launch, Pointer
from .wgrad import ACC_BYTES, reduce_launch

KERNEL = "wgrad_depthwise"
#: The kernel sizes it is compiled for (its sums live in registers, one per tap).
KERNEL_SIZES = ((3, 3), (5, 5), (7, 7))
#: Blocks wanted (four per SM of the H100's 132) and the fewest output pixels a run keeps: 16 per
#: thread for one channel per block (NCHW), 8 per pixel lane (NHWC: a layer of a few hundred channels
#: is one block wide, so the runs make the blocks).
TARGET_BLOCKS = 528
MIN_RUN_PIXELS = {"NCHW": 4096}
MIN_LANE_PIXELS = 8
#: NHWC: channel vectors a block takes at most, so that it has at least 8 pixel lanes: neighbouring
#: pixels share their windows' rows in L1 (at 96 vectors and 2 lanes, 384 float32 channels ran 1.8x
#: slower than at 32 and 8 on the H100).
MAX_VECTORS = 32
#: Sums a thread keeps at most (taps x channels, in 4-byte registers): 72 keeps 3x3 16-bit layers at
#: eight channels (16 bytes) a load within two blocks of 256 threads an SM, without spills.
MAX_SUM_REGISTERS = 72
VECTOR_CHANNELS = (8, 4, 2, 1)


@functools.lru_cache(maxsize=1024)
def refusal(problem: ConvProblem) -> str:
    """Why this kernel cannot compute ``problem``'s weight gradient ("" when it can). Kept per problem:
    every backward of a layer asks it again."""
    if problem.c // problem.groups != 1:
        return f"{problem.c // problem.groups} input channels per group (not depthwise)"
    if (problem.kh, problem.kw) not in KERNEL_SIZES:
        return f"a {problem.kh}x{problem.kw} kernel (compiled for {', '.join(f'{h}x{w}' for h, w in KERNEL_SIZES)})"
    if max(problem.h * problem.w, problem.ho * problem.wo) >= 2**31 or problem.k > MAX_GRID_Y * 32:
        return "a plane past 2^31 elements or too many channels for the grid"
    return ""


def _widest_vector(dtype: str, kh: int, kw: int) -> int:
    """Channels a thread loads at once, at most: 16 bytes, within MAX_SUM_REGISTERS sums."""
    item = STORAGE_BYTES[dtype]
    return next(v for v in VECTOR_CHANNELS
                if v * item <= 16 and kh * kw * v * ACC_BYTES[dtype] // 4 <= MAX_SUM_REGISTERS or v == 1)


def vector_channels(problem: ConvProblem) -> int:
    """Channels per thread: the widest vector for NHWC layers of one output channel per input channel
    whose channel count it divides; 1 otherwise (NCHW; channel multipliers)."""
    if problem.layout != "NHWC" or problem.k != problem.c:
        return 1
    return next(v for v in VECTOR_CHANNELS if v <= _widest_vector(problem.dtype, problem.kh, problem.kw) and
                problem.k % v == 0)


def specialisation(dtype: str, channels_last: bool, kh: int, kw: int, vector: int = 1) -> str:
    return f"cupyconv::{KERNEL}<{CTYPES[dtype]},{str(channels_last).lower()},{kh},{kw},{vector}>"


def specialisations() -> list[str]:
    return [specialisation(dtype, channels_last, kh, kw, v) for dtype in CTYPES for channels_last in (False, True)
            for kh, kw in KERNEL_SIZES for v in VECTOR_CHANNELS
            if v == 1 or (channels_last and v <= _widest_vector(dtype, kh, kw))]


@functools.lru_cache(maxsize=1024)
def make_plan(problem: ConvProblem) -> tuple[tuple[int, int, int], int, int]:
    """(grid, runs, vectors): blocks of one channel (NCHW) or of ``vectors`` channel vectors x 256 //
    vectors pixel lanes (NHWC: all the layer's vectors, up to MAX_VECTORS, in as few blocks as evenly
    filled), the pixels cut into as many runs as give about TARGET_BLOCKS blocks, each of at least
    MIN_RUN_PIXELS (NCHW) or MIN_LANE_PIXELS a pixel lane (NHWC)."""
    pixels = problem.n * problem.ho * problem.wo
    if problem.layout == "NHWC":
        wanted = problem.k // vector_channels(problem)
        blocks = math.ceil(wanted / MAX_VECTORS)
        vectors = math.ceil(wanted / blocks)
        min_run = MIN_LANE_PIXELS * (256 // vectors)
    else:
        blocks, vectors, min_run = problem.k, 1, MIN_RUN_PIXELS["NCHW"]
    splits = max(1, min(math.ceil(TARGET_BLOCKS / blocks), pixels // min_run, MAX_GRID_Y))
    return (blocks, splits, 1), splits, vectors


def program(plan: tuple[tuple[int, int, int], int, int], problem: ConvProblem) -> CallProgram:
    """The kernel from X and GRAD_OUTPUT into the runs' sums (the workspace), wgrad.py's reduction
    into OUT; ``plan`` from make_plan."""
    p = problem
    grid, splits, vectors = plan
    taps = p.kh * p.kw
    partial = Pointer(WORKSPACE)
    kernel = Launch(KERNEL, specialisation(p.dtype, p.layout == "NHWC", p.kh, p.kw, vector_channels(p)), grid,
                    (256, 1, 1), 0, (Pointer(X), Pointer(GRAD_OUTPUT), partial, p.n, p.c, p.h, p.w, p.k, p.ho, p.wo,
                                     p.stride[0], p.stride[1], p.pad_top, p.pad_left, p.dilation[0], p.dilation[1],
                                     vectors))
    reduce = reduce_launch(p.dtype, splits, p.k * taps, 1, taps, False, False, partial, Pointer(OUT))
    return CallProgram((kernel, reduce), splits * p.k * taps * ACC_BYTES[p.dtype])


def conv2d_weight_cupy(x, grad_output, problem: ConvProblem, out):
    """Write ``problem``'s weight gradient into ``out`` (C-contiguous, ``problem.weight_array_shape``)
    from C-contiguous CuPy ``x`` and ``grad_output`` in ``problem.layout``, on CuPy's current stream
    (refusal(problem) must be "")."""
    import cupy

    from .executor import program_executable
    from .launch import run_program

    run_program(program_executable(program, make_plan(problem), problem, cupy.cuda.Device().id), x=x,
                grad_output=grad_output, out=out)
    return out
