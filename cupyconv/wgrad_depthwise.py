"""The weight gradient of depthwise convolutions (kernels/wgrad_depthwise.cu): refusal, plan (runs of the
reduction, lanes, segments of the walk), specialisations and program. Lanes keep their channels' tap
sums in registers and walk segments of output pixels, loading each step's span of input positions
once: NHWC lanes hold up to 32 vectors of channels a block and walk along output rows; NCHW lanes
hold a block's channel and one output column or two (loaded as pairs where rows have even lengths) and
walk down the columns. wgrad.py's ordered reduction
adds the runs (a weight of one input channel per group has the same memory in KCHW and KHWC)."""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

from .arguments import ConvProblem
from .families.common import CTYPES, MAX_GRID_Y, PAIR_DTYPES, STORAGE_BYTES
from .program import GRAD_OUTPUT, OUT, WORKSPACE, X, CallProgram, Launch, Pointer
from .wgrad import ACC_BYTES, reduce_launch

KERNEL = "wgrad_depthwise"
NHWC_KERNEL = "wgrad_depthwise_nhwc"
#: The kernel sizes it is compiled for (its sums live in registers, one per tap).
KERNEL_SIZES = ((3, 3), (5, 5), (7, 7))
#: (stride, dilation) pairs along the walk (NHWC: the columns'; NCHW: the rows') compiled into the
#: kernels, so that a step's span of input positions is loaded once; others run with both at run
#: time, a load per tap and pixel.
COMPILED_WALKS = ((1, 1), (2, 1))
#: Segments are a multiple of ROW_STEP output pixels; a step takes at most MOST_STEP (the kernel's
#: WgradStep).
ROW_STEP = 4
MOST_STEP = 8
#: Blocks wanted: two per SM of the H100's 132, one wave of the kernels' two blocks an SM; at four per
#: SM (528) every MobileNetV2 row ran 1.1-1.5x slower in NHWC (benchmarks/NOTES.md).
TARGET_BLOCKS = 264
#: Segments are whole output rows (NHWC) or columns (NCHW), or halvings of them down to MIN_SEGMENT.
MIN_SEGMENT = 2 * ROW_STEP
#: NHWC: channel vectors a block takes at most, so that it has at least 8 row lanes.
MAX_VECTORS = 32
#: NCHW: lanes across a block at most (its 256 threads), each of one output column or two.
MAX_COLUMNS = 256
#: NHWC: sums a thread keeps at most (taps x channels, in 4-byte registers), and the widest load:
#: 3x3 16-bit layers at four channels (8 bytes), with a step's dy and input columns, fit two blocks of
#: 256 threads an SM without spills.
MAX_SUM_REGISTERS = 72
MAX_VECTOR_BYTES = 8
VECTOR_CHANNELS = (4, 2, 1)


class DepthwisePlan(NamedTuple):
    grid: tuple[int, int, int]
    splits: int  # runs of the reduction (grid y)
    across: int  # a block's channel vectors (NHWC) or lanes of output columns (NCHW); 256 // across lanes each
    segment: int  # output pixels of a lane's item along the walk
    columns: int = 1  # NCHW: output columns a lane (2: loaded as pairs)


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
    # Steps address their input by 32-bit offsets from the step's first position.
    nhwc = problem.layout == "NHWC"
    axis = 1 if nhwc else 0
    kernel_extent = problem.kw if nhwc else problem.kh
    span = MOST_STEP * problem.stride[axis] + (kernel_extent - 1) * problem.dilation[axis] + 1
    pitch = max(problem.c, problem.k) if nhwc else problem.w
    if span * pitch >= 2**31:
        what = f"input columns of {pitch} channels" if nhwc else f"input rows of {pitch} elements"
        return f"a step's {span} {what} past 2^31 elements"
    return ""


def _widest_vector(dtype: str, kh: int, kw: int) -> int:
    """Channels a thread loads at once, at most: MAX_VECTOR_BYTES, within MAX_SUM_REGISTERS sums."""
    item = STORAGE_BYTES[dtype]
    return next(v for v in VECTOR_CHANNELS
                if v * item <= MAX_VECTOR_BYTES and kh * kw * v * ACC_BYTES[dtype] // 4 <= MAX_SUM_REGISTERS or v == 1)


def vector_channels(problem: ConvProblem) -> int:
    """Channels per thread: the widest vector for NHWC layers of one output channel per input channel
    whose channel count it divides; 1 otherwise (NCHW; channel multipliers)."""
    if problem.layout != "NHWC" or problem.k != problem.c:
        return 1
    return next(v for v in VECTOR_CHANNELS if v <= _widest_vector(problem.dtype, problem.kh, problem.kw) and
                problem.k % v == 0)


def walk(problem: ConvProblem) -> tuple[int, int]:
    """The kernel's compiled (stride, dilation) along its walk (NHWC: the columns'; NCHW: the rows'),
    (0, 0) for run time."""
    axis = 1 if problem.layout == "NHWC" else 0
    pair = (problem.stride[axis], problem.dilation[axis])
    return pair if pair in COMPILED_WALKS else (0, 0)


def column_pairs(problem: ConvProblem) -> bool:
    """Whether NCHW lanes can take two output columns, loading pairs: a PAIR_DTYPES element, rows of
    even lengths (pairs aligned), and the walk compiled and the same along the columns."""
    p = problem
    return (p.layout == "NCHW" and p.dtype in PAIR_DTYPES and p.w % 2 == 0 and p.wo % 2 == 0 and
            walk(p) != (0, 0) and (p.stride[1], p.dilation[1]) == walk(p))


def specialisation(dtype: str, kh: int, kw: int, walk: tuple[int, int], pair_odd: int = -1) -> str:
    """The NCHW kernel's: ``pair_odd`` -1 for a column a lane, else the left padding's parity."""
    return f"cupyconv::{KERNEL}<{CTYPES[dtype]},{kh},{kw},{walk[0]},{walk[1]},{pair_odd}>"


def nhwc_specialisation(dtype: str, kh: int, kw: int, vector: int, walk: tuple[int, int]) -> str:
    return f"cupyconv::{NHWC_KERNEL}<{CTYPES[dtype]},{kh},{kw},{vector},{walk[0]},{walk[1]}>"


def specialisations() -> list[str]:
    walks = COMPILED_WALKS + ((0, 0),)
    return [specialisation(dtype, kh, kw, pair) for dtype in CTYPES for kh, kw in KERNEL_SIZES for pair in walks] + \
        [specialisation(dtype, kh, kw, pair, odd) for dtype in PAIR_DTYPES for kh, kw in KERNEL_SIZES
         for pair in COMPILED_WALKS for odd in (0, 1)] + \
        [nhwc_specialisation(dtype, kh, kw, v, pair) for dtype in CTYPES for kh, kw in KERNEL_SIZES
         for v in VECTOR_CHANNELS if v <= _widest_vector(dtype, kh, kw) for pair in walks]


def _runs(wanted: int, blocks: int, items: int, per_run: int) -> int:
    """Runs giving at most ``wanted`` blocks in all (one wave: a block past it waits for a second), of at
    least ``per_run`` items each; one at least."""
    return max(1, min(wanted // blocks, items // per_run, MAX_GRID_Y))


@functools.lru_cache(maxsize=1024)
def make_plan(problem: ConvProblem, columns: int | None = None) -> DepthwisePlan:
    """Lanes and runs. NHWC: all the layer's channel vectors, up to MAX_VECTORS a block, in as few
    blocks as evenly filled; NCHW: a block per channel and tile of up to MAX_COLUMNS lanes of
    ``columns`` output columns (default: 2 where column_pairs allows, else 1).
    256 // across lanes a block, and as many runs as give at most TARGET_BLOCKS blocks with an item for
    every lane. The segment is the one whose busiest lane loads the fewest input positions along the
    walk (a block's items dealt to its lanes in turn; a segment loads its windows' overlap, kernel
    taps less one, besides its pixels), the longest among equals."""
    p = problem
    if p.layout == "NHWC":
        wanted = p.k // vector_channels(p)
        blocks = math.ceil(wanted / MAX_VECTORS)
        across = math.ceil(wanted / blocks)
        lines, extent = p.n * p.ho, p.wo  # rows to walk along, and their length
        stride, overlap = p.stride[1], (p.kw - 1) * p.dilation[1]
    else:
        if columns == 2 and not column_pairs(p):
            raise ValueError(f"pairs of output columns need NCHW rows of even lengths and the same compiled walk "
                             f"along both axes; got {p.x_shape} -> {p.out_shape}, stride {p.stride}")
        columns = columns or (2 if column_pairs(p) else 1)
        across = min(math.ceil(p.wo / columns), MAX_COLUMNS)
        blocks = p.k * math.ceil(p.wo / (across * columns))
        lines, extent = p.n, p.ho  # each lane's column, in every image
        stride, overlap = p.stride[0], (p.kh - 1) * p.dilation[0]
    lanes = 256 // across
    best = None
    segment = math.ceil(extent / ROW_STEP) * ROW_STEP
    while True:
        items = lines * math.ceil(extent / segment)
        splits = _runs(TARGET_BLOCKS, blocks, items, lanes)
        busiest = math.ceil(math.ceil(items / splits) / lanes) * (min(segment, extent) * stride + overlap)
        if best is None or busiest < best[0]:
            best = (busiest, DepthwisePlan((blocks, splits, 1), splits, across, segment, columns or 1))
        if segment <= MIN_SEGMENT:
            return best[1]
        segment = max(MIN_SEGMENT, math.ceil(segment / 2 / ROW_STEP) * ROW_STEP)


def program(plan: DepthwisePlan, problem: ConvProblem) -> CallProgram:
    """The kernel from X and GRAD_OUTPUT into the runs' sums (the workspace; NCHW: a run's per column
    tile), wgrad.py's reduction into OUT; ``plan`` from make_plan. NCHW plans of one run and one column
    tile are the kernel alone, writing OUT."""
    p = problem
    taps = p.kh * p.kw
    partial = Pointer(WORKSPACE)
    shape = (p.n, p.c, p.h, p.w, p.k, p.ho, p.wo, p.stride[0], p.stride[1], p.pad_top, p.pad_left, p.dilation[0],
             p.dilation[1], plan.across, plan.segment)
    if p.layout == "NHWC":
        expression, partials = nhwc_specialisation(p.dtype, p.kh, p.kw, vector_channels(p), walk(p)), plan.splits
        kernel = Launch(NHWC_KERNEL, expression, plan.grid, (256, 1, 1), 0,
                        (Pointer(X), Pointer(GRAD_OUTPUT), partial, *shape))
    else:
        expression = specialisation(p.dtype, p.kh, p.kw, walk(p), p.pad_left % 2 if plan.columns == 2 else -1)
        partials = plan.splits * plan.grid[0] // p.k  # a run's sums per column tile
        if partials == 1:  # the blocks write the weight gradient themselves (ws unused: no workspace)
            return CallProgram((Launch(KERNEL, expression, plan.grid, (256, 1, 1), 0,
                                       (Pointer(X), Pointer(GRAD_OUTPUT), Pointer(OUT), Pointer(OUT), *shape)),))
        kernel = Launch(KERNEL, expression, plan.grid, (256, 1, 1), 0,
                        (Pointer(X), Pointer(GRAD_OUTPUT), partial, Pointer(OUT), *shape))
    reduce = reduce_launch(p.dtype, partials, p.k * taps, 1, taps, False, False, partial, Pointer(OUT))
    return CallProgram((kernel, reduce), partials * p.k * taps * ACC_BYTES[p.dtype])


def conv2d_weight_cupy(x, grad_output, problem: ConvProblem, out, plan: DepthwisePlan | None = None):
    """Write ``problem``'s weight gradient into ``out`` (C-contiguous, ``problem.weight_array_shape``)
    from C-contiguous CuPy ``x`` and ``grad_output`` in ``problem.layout``, on CuPy's current stream
    (refusal(problem) must be ""), by ``plan`` (default make_plan's)."""
    import cupy

    from .executor import program_executable
    from .launch import run_program

    run_program(program_executable(program, plan or make_plan(problem), problem, cupy.cuda.Device().id), x=x,
                grad_output=grad_output, out=out)
    return out
