"""Depthwise transposed convolutions in one direct launch (kernels/transpose_depthwise.cu).

The input gradient of a strided depthwise layer (MobileNetV2's and EfficientNet's stride-2 3x3 and 5x5) is a
transposed convolution of one output channel a group. The phase route (conv_transpose.program) runs each
stride phase as a depthwise convolution of its own, with its window of y and its output copied: MobileNetV2's
96-channel stride-2 layer ran at 0.63-0.83x cuDNN (H200, benchmarks/RESULTS.md). Here every phase runs in one
launch reading y and the weight in place, each output once; a memory-bound pass.

It takes groups == C (one output channel a group, any number M = K / C of channels of y a group: the
forward's channel multiplier), every dtype, any stride, dilation and padding, arrays below 2^31 elements.
The rules take it for strides above 1 (stride 1 is one phase, which the depthwise forward kernels run).
NCHW layers of stride 2 on both axes, 3x3 or 5x5 taps and no dilation (MobileNet's and EfficientNet's) run
its cells kernel instead: a thread computes 2 x 2 cells of outputs, one of every phase, so that a warp's
lanes take the same taps (the general NCHW kernel's lanes alternate phases along a row, each finding its
own taps).
"""
from __future__ import annotations

import dataclasses
import math

from .families.common import CTYPES, MAX_GRID_Y, STORAGE_BYTES
from .program import BIAS, OUT, WEIGHT, X, CallProgram, Launch, Pointer

KERNEL = "transpose_depthwise"
CELLS_KERNEL = "transpose_depthwise_cells"
#: Every dtype conv2d computes in.
DTYPES = ("float32", "float16", "bfloat16", "float64")
#: DEPTHWISE_T_ROWS in the kernel: output rows a thread computes, of one stride phase (stride rows apart).
ROWS = 4
#: Threads a block; NCHW blocks are 32 columns x 8 row groups of one channel.
THREADS = 256
COLUMNS = 32
#: The cells kernel's compiled strides and kernel sizes (square, dilation 1), and CELL_ROWS in it: cells a
#: thread computes down a column. Its NCHW blocks are COLUMNS cell columns x 8 groups of CELL_ROWS.
CELL_STRIDES = (2,)
CELL_KERNELS = (3, 5)
CELL_ROWS = 4


@dataclasses.dataclass(frozen=True)
class DepthwisePlan:
    """One launch: channels a thread (``vec``; NHWC with one channel of y a group and whole 16-byte
    vectors), its grid and the NCHW tiles a row of tiles (``column_tiles``); ``cells``: the cells kernel."""

    vec: int
    grid: tuple[int, int, int]
    column_tiles: int
    reason: str
    cells: bool = False


def refusal(tp) -> str:
    """Why the kernel cannot run transposed convolution ``tp`` (conv_transpose.TransposeProblem), or ''."""
    if tp.groups != tp.c:
        return f"groups={tp.groups} with {tp.c} output channels (it takes one output channel a group)"
    if tp.layout == "NCHW" and tp.c > MAX_GRID_Y:
        return f"{tp.c} channels of NCHW arrays (at most {MAX_GRID_Y}: a grid row each)"
    if tp.layout == "NHWC" and _row_groups(tp) > MAX_GRID_Y:
        return f"{tp.h} rows of NHWC arrays at stride {tp.stride[0]} (a grid row for every {ROWS} of a phase)"
    if max(tp.n * tp.k * tp.hy * tp.wy, tp.n * tp.c * tp.h * tp.w, tp.k * tp.kh * tp.kw) >= 2**31:
        return "arrays of 2^31 elements or more"
    return ""


def pays(tp) -> bool:
    """Whether the rules take it over the phase route: wherever it runs and the stride makes several phases
    (a stride-1 problem is one depthwise convolution, which the forward's depthwise kernels run)."""
    return not refusal(tp) and tp.stride != (1, 1)


def _row_groups(tp) -> int:
    """The kernel's row groups: ROWS rows of one stride phase each."""
    return tp.stride[0] * math.ceil(math.ceil(tp.h / tp.stride[0]) / ROWS)


def cells(tp) -> bool:
    """Whether the cells kernel runs ``tp``: NCHW, a stride of CELL_STRIDES on both axes, square CELL_KERNELS
    taps, no dilation."""
    return (tp.layout == "NCHW" and tp.stride[0] == tp.stride[1] and tp.stride[0] in CELL_STRIDES and
            tp.dilation == (1, 1) and tp.kh == tp.kw and tp.kh in CELL_KERNELS)


def _vec(tp) -> int:
    vec = 16 // STORAGE_BYTES[tp.dtype]
    return vec if tp.layout == "NHWC" and tp.k == tp.c and tp.c % vec == 0 else 1


def make_plan(tp) -> DepthwisePlan:
    """The launch for ``tp``: NHWC threads over columns x channel vectors, NCHW blocks over one channel's tiles."""
    why_not = refusal(tp)
    if why_not:
        raise ValueError(f"kernel {KERNEL!r} cannot run this problem: {why_not}")
    vec, groups = _vec(tp), _row_groups(tp)
    multiplier = tp.k // tp.c
    if cells(tp):
        stride = tp.stride[0]
        column_tiles = math.ceil(math.ceil(tp.w / stride) / COLUMNS)
        row_tiles = math.ceil(math.ceil(math.ceil(tp.h / stride) / CELL_ROWS) / (THREADS // COLUMNS))
        return DepthwisePlan(1, (column_tiles * row_tiles, tp.c, min(tp.n, MAX_GRID_Y)), column_tiles,
                             f"one output channel a group ({multiplier} of y each), NCHW at stride {stride}: "
                             f"cells of {stride} x {stride} outputs, one of every phase, y read in place", True)
    if tp.layout == "NHWC":
        column_tiles = 0
        grid = (math.ceil(tp.w * tp.c // vec / THREADS), groups, min(tp.n, MAX_GRID_Y))
    else:
        column_tiles = math.ceil(tp.w / COLUMNS)
        grid = (column_tiles * math.ceil(groups / (THREADS // COLUMNS)), tp.c, min(tp.n, MAX_GRID_Y))
    reason = (f"one output channel a group ({multiplier} channel{'s' if multiplier > 1 else ''} of y each): every "
              f"stride phase in one direct launch, y read in place")
    return DepthwisePlan(vec, grid, column_tiles, reason)


def specialisation(dtype: str, nhwc: bool, vec: int) -> str:
    return f"cupyconv::{KERNEL}<{CTYPES[dtype]},{'true' if nhwc else 'false'},{vec}>"


def cells_specialisation(dtype: str, taps: int, stride: int, pad_top: int, pad_left: int) -> str:
    """The cells kernel's, compiled for the paddings' residues modulo the stride."""
    return f"cupyconv::{CELLS_KERNEL}<{CTYPES[dtype]},{taps},{stride},{pad_top % stride},{pad_left % stride}>"


def specialisations() -> list[str]:
    return [specialisation(dtype, nhwc, vec) for dtype in DTYPES for nhwc in (False, True)
            for vec in ((1, 16 // STORAGE_BYTES[dtype]) if nhwc else (1,))] + \
        [cells_specialisation(dtype, taps, stride, pt, pl) for dtype in DTYPES for taps in CELL_KERNELS
         for stride in CELL_STRIDES for pt in range(stride) for pl in range(stride)]


def _steps(stride: int, dilation: int) -> tuple[int, int]:
    """Along an axis, taps between consecutive taps reaching one output, and positions of y between them."""
    common = math.gcd(stride, dilation)
    return stride // common, dilation // common


def program(plan: DepthwisePlan, tp) -> CallProgram:
    """One launch reading y (X) and the weight (WEIGHT, either layout) in place and writing OUT."""
    from .conv_transpose import _weight_strides

    stride_k, _, stride_r, stride_s = _weight_strides(tp)
    if plan.cells:
        s = tp.stride[0]
        return CallProgram((Launch(CELLS_KERNEL, cells_specialisation(tp.dtype, tp.kh, s, tp.pad_top, tp.pad_left),
                                   plan.grid, (COLUMNS, THREADS // COLUMNS, 1), 0, (
            Pointer(X), Pointer(WEIGHT), Pointer(BIAS), Pointer(OUT), tp.n, tp.c, tp.k // tp.c, tp.hy, tp.wy, tp.h,
            tp.w, tp.pad_top // s, tp.pad_left // s, stride_k, stride_r, stride_s, int(tp.has_bias),
            plan.column_tiles)),))
    nhwc = tp.layout == "NHWC"
    block = (THREADS, 1, 1) if nhwc else (COLUMNS, THREADS // COLUMNS, 1)
    return CallProgram((Launch(KERNEL, specialisation(tp.dtype, nhwc, plan.vec), plan.grid, block, 0, (
        Pointer(X), Pointer(WEIGHT), Pointer(BIAS), Pointer(OUT), tp.n, tp.c, tp.k // tp.c, tp.hy, tp.wy, tp.h, tp.w,
        tp.kh, tp.kw, *tp.stride, *tp.dilation, *_steps(tp.stride[0], tp.dilation[0]),
        *_steps(tp.stride[1], tp.dilation[1]), tp.pad_top, tp.pad_left, stride_k, stride_r, stride_s,
        int(tp.has_bias), plan.column_tiles)),))
