"""Transposed convolutions of few output channels on the FMA units (kernels/transpose_few_channels.cu).

The input gradient of a network's RGB stem (3 output channels of a stride-2 7x7) and a generator's RGB layer
are transposed convolutions of 1-4 output channels. The phase route (conv_transpose.program) widens them to
the GEMMs' 8 channels and copies every stride phase's window of y and output: ResNet-50's stem input gradient
ran at 0.15x cuDNN in strict fp32 and 0.43x in TF32 (H200, channels_last). Here every phase runs in one
launch reading y in place, each thread 4 x 4 outputs of one phase x every channel, in float32 for every
storage type (TF32 calls get strict float32 sums, at least as exact as they ask): the stem's input gradient at
1.10x cuDNN's faster layout in fp32 and TF32, 1.3x in fp16 and bf16 (benchmarks/RESULTS.md).

It takes ungrouped float32, float16 and bfloat16 problems of at most MAX_CHANNELS output channels whose
dilation divides the stride along each axis (a phase's taps then read consecutive rows of y), of strides up
to MAX_AXIS_PHASES and up to the largest of TAP_WIDTHS taps a phase along each axis.
"""
from __future__ import annotations

import dataclasses
import math

from .families.common import CTYPES, MAX_GRID_Y
from .program import BIAS, OUT, WEIGHT, X, CallProgram, Launch, Pointer, Table

KERNEL = "transpose_few_channels"
DTYPES = ("float32", "float16", "bfloat16")
#: CP in the kernel: a float4 of weights a tap.
MAX_CHANNELS = 4
#: TAPS in the kernel: a phase's taps along an axis, at most (the shared tile's halo, a thread's tap row).
TAP_WIDTHS = (4, 8)
#: FEW_MAX_AXIS_PHASES, FEW_THREADS and FEW_KC in the kernel.
MAX_AXIS_PHASES = 8
THREADS = 64
CHUNK = 8
#: Block widths in threads (bx; the block is bx x THREADS / bx threads of 4 x 4 outputs): the one whose tiles
#: cover the phases' outputs with the least waste is taken.
BLOCK_WIDTHS = (16, 8, 32)
#: 16-bit problems go to the tensor cores' phase route below this many taps a phase. fp16 NHWC on the H200, this
#: kernel against the phase route (benchmarks/results/transpose_few_routes_h200.txt, 067b866): 7x7 stride 2 (12.25
#: taps a phase) 0.45 against 0.58 ms at 64 channels of y, 2.04 against 3.96 at 512; 3x3 stride 1 (9 taps) 0.30
#: against 0.25; 4x4 stride 2 (4) 0.11 against 0.09; 3x3 stride 2 (2.25) 0.16 against 0.13.
MIN_TENSOR_CORE_TAPS = 12


@dataclasses.dataclass(frozen=True)
class FewPlan:
    """One launch: the kernel's TAPS, block width ``bx``, its grid and shared memory, whether NHWC y is
    read 8 channels at once (``vector_k``) and the phases' table (FewPhases)."""

    taps: int
    bx: int
    grid: tuple[int, int, int]
    shared_bytes: int
    vector_k: bool
    table: Table
    reason: str

    @property
    def tile(self) -> tuple[int, int]:
        """Output pixels of one phase a block, rows x columns."""
        return 4 * (THREADS // self.bx), 4 * self.bx


def _axes(tp):
    from .conv_transpose import axis_phases

    return (axis_phases(tp.h, tp.hy, tp.kh, tp.stride[0], tp.dilation[0], tp.pad_top),
            axis_phases(tp.w, tp.wy, tp.kw, tp.stride[1], tp.dilation[1], tp.pad_left))


def refusal(tp) -> str:
    """Why the kernel cannot run transposed convolution ``tp`` (conv_transpose.TransposeProblem), or ''."""
    if tp.dtype not in DTYPES:
        return f"dtype {tp.dtype} (it takes {', '.join(DTYPES)})"
    if tp.groups != 1:
        return f"groups={tp.groups} (it takes ungrouped problems)"
    if tp.c > MAX_CHANNELS:
        return f"{tp.c} output channels (at most {MAX_CHANNELS})"
    for stride, dilation in zip(tp.stride, tp.dilation):
        if stride % dilation:
            return f"dilation {tp.dilation} does not divide stride {tp.stride}"
        if stride > MAX_AXIS_PHASES:
            return f"stride {tp.stride} (at most {MAX_AXIS_PHASES})"
    widest = max(len(phase.taps) for axis in _axes(tp) for phase in axis)
    if widest > TAP_WIDTHS[-1]:
        return f"{widest} taps a stride phase along an axis (at most {TAP_WIDTHS[-1]})"
    if max(tp.n * tp.k * tp.hy * tp.wy, tp.n * tp.c * tp.h * tp.w, tp.k * tp.c * tp.kh * tp.kw) >= 2**31:
        return "arrays of 2^31 elements or more (32-bit offsets)"
    return ""


def _padded(axis, tile: int) -> int:
    return sum(math.ceil(phase.count / tile) * tile for phase in axis)


def make_plan(tp) -> FewPlan:
    """The launch for ``tp``: the smallest TAPS that holds its phases' taps, the block width whose tiles waste
    the least, one block a tile of a phase of an image."""
    why_not = refusal(tp)
    if why_not:
        raise ValueError(f"kernel {KERNEL!r} cannot run this problem: {why_not}")
    rows, cols = _axes(tp)
    widest = max(len(phase.taps) for axis in (rows, cols) for phase in axis)
    taps = next(width for width in TAP_WIDTHS if widest <= width)
    bx = min(BLOCK_WIDTHS, key=lambda bx: _padded(rows, 4 * (THREADS // bx)) * _padded(cols, 4 * bx))
    tile_h, tile_w = 4 * (THREADS // bx), 4 * bx
    col_tiles = math.ceil(max(phase.count for phase in cols) / tile_w)
    grid = (col_tiles * len(rows) * len(cols), math.ceil(max(phase.count for phase in rows) / tile_h),
            min(tp.n, MAX_GRID_Y))
    segment = -(-(4 + taps - 1) // 4) * 4
    plane = (tile_h + taps - 1) * (tile_w + segment - 4)
    shared = 4 * CHUNK * (plane + taps * taps * 4)
    vector_k = tp.layout == "NHWC" and tp.k * (4 if tp.dtype == "float32" else 2) % 16 == 0
    table = []
    for axis in (rows, cols):
        fields = [(p.start, p.count, len(p.taps), p.taps[0] if p.taps else 0, p.read_start - p.pad_before)
                  for p in axis]
        fields += [(0, 0, 0, 0, 0)] * (MAX_AXIS_PHASES - len(axis))
        table += [len(axis), *(column for field in zip(*fields) for column in field)]
    reason = (f"{tp.c} output channel{'s' if tp.c > 1 else ''}: every stride phase in one launch on the FMA units, "
              f"no channels added")
    return FewPlan(taps, bx, grid, shared, vector_k, Table(tuple(table)), reason)


def mean_taps(tp) -> float:
    """Taps a stride phase reads, on average over its outputs (kh / (sh / dh) along rows, likewise columns)."""
    return tp.kh * tp.dilation[0] / tp.stride[0] * tp.kw * tp.dilation[1] / tp.stride[1]


def pays(tp) -> bool:
    """Whether the rules take it over the phase route: float32 wherever it runs, TF32 allowed or not (the phase
    route's FMA GEMMs do 8 / C times the work, 3-7x slower; its TF32 tensor cores, with the copies, 1.2-2.9x
    slower on every problem of benchmarks/results/transpose_few_routes_h200.txt); 16-bit where a phase has at
    least MIN_TENSOR_CORE_TAPS taps on average. It computes float32 whether or not the call allows TF32."""
    if refusal(tp):
        return False
    return tp.dtype == "float32" or mean_taps(tp) >= MIN_TENSOR_CORE_TAPS


def describe(plan: FewPlan, tp) -> str:
    tile_h, tile_w = plan.tile
    return (f"{KERNEL} [{tile_h}x{tile_w} outputs of a stride phase a block, {THREADS} threads of 4x4 x {tp.c} "
            f"channels, taps up to {plan.taps}x{plan.taps}, {CHUNK} channels of y a step]\n"
            f"  {tp.dtype} (float32 sums), {tp.layout}; {plan.shared_bytes} B shared memory\n"
            f"  grid {plan.grid}, block ({THREADS}, 1, 1)\n"
            f"  why: {plan.reason}")


def specialisation(dtype: str, channels: int, taps: int, nhwc: bool) -> str:
    return f"cupyconv::{KERNEL}<{CTYPES[dtype]},{channels},{taps},{'true' if nhwc else 'false'}>"


def specialisations() -> list[str]:
    return [specialisation(dtype, channels, taps, nhwc) for dtype in DTYPES for channels in range(1, MAX_CHANNELS + 1)
            for taps in TAP_WIDTHS for nhwc in (False, True)]


def program(plan: FewPlan, tp) -> CallProgram:
    """One launch reading y (X) and the weight (WEIGHT, either layout) in place and writing OUT."""
    from .conv_transpose import _weight_strides

    sh, sw = tp.stride
    expression = specialisation(tp.dtype, tp.c, plan.taps, tp.layout == "NHWC")
    return CallProgram((Launch(KERNEL, expression, plan.grid, (THREADS, 1, 1), plan.shared_bytes, (
        Pointer(X), Pointer(WEIGHT), Pointer(BIAS), Pointer(OUT), tp.n, tp.k, tp.hy, tp.wy, tp.h, tp.w, sh, sw,
        sh // tp.dilation[0], sw // tp.dilation[1], *_weight_strides(tp), int(tp.has_bias), plan.bx,
        int(plan.vector_k), plan.table)),))
