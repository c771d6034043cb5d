"""Transposed convolution: conv_transpose2d, and the gradient of conv2d with respect to its input.

Both compute one sum. For a convolution of weight w (K, C/groups, kh, kw), stride (sh, sw),
dilation (dh, dw) and padding (pt, pl), the transposed convolution of y (N, K, Hy, Wy) is

    out[n, c, h, v] = sum of y[n, k, p, q] w[k, c, r, s] over p sh + r dh - pt = h, q sw + s dw - pl = v

(k and c in the same group). It runs on the forward kernels, without a zero-stuffed input: the
output splits into sh x sw stride phases, rows h = a + sh i and columns v = b + sw j. The taps that
reach phase (a, b) are those with r dh = a + pt (mod sh) and s dw = b + pl (mod sw), and they read
y at stride 1, every dh / gcd(sh, dh)-th row. So each phase is a stride-1 forward convolution of y
with those taps (flipped, K and C swapped in each group) and explicit, possibly asymmetric,
padding; where that padding would be negative, the phase reads a window of y instead. The planner
picks each phase's kernel as for any convolution (3x3 stride 1 is one phase, often on Winograd).
One phase writes the output in place; several write their rows and columns of it through a
temporary each. A phase no tap reaches holds the bias (or zeros).

On CUDA the phases make one program (``program``), made once per problem and launched like a
forward call: each phase's weight by kernels/phase_weight.cu into the workspace, its forward
program reading it, and kernels/strided_copy.cu's copies and fills for windows of y, the phases'
rows and columns of the output and the phases no tap reaches; an ungrouped output of fewer channels
than the GEMMs take is computed with zero channels added and cut on the way out. 16-bit and TF32
problems of several phases run every phase in one launch of the channels-last GEMM instead
(implicit_gemm_nhwc_phases): it reads the whole of y, a window as negative padding, and writes each
phase's rows and columns of the output in place, so the phases' tiles fill the GPU together and no
window or phase output is copied (an NCHW y is transposed to NHWC for it; the NCHW output is written
in place). Where the kernel is the stride (U-Net's 2x2 up-sampling: each phase one tap), the phases
are one GEMM of y and their weights stacked, on the producer tile's launch
(implicit_gemm_nhwc_tma_stacked), NHWC. An ungrouped output of 1-4 channels (a stem's input
gradient, a generator's RGB layer) runs every phase in one launch on the FMA units instead, y read
in place (transpose_few_channels; 16-bit ones only where a phase has enough taps to beat the tensor
cores' widened phases), and so does a strided depthwise one, one output channel a group
(transpose_depthwise). Arrays past 32-bit offsets go phase by phase on CuPy arrays (run_phases).

The NumPy path runs the same phases on the NumPy convolution, so the CPU tests check the
decomposition itself against torch.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import numbers

import numpy as np

from . import transpose_depthwise, transpose_few_channels
from .arguments import ConvProblem, _pair, check_arrays, check_layouts, check_x_dims, dtype_name
from .families.common import CTYPES, STORAGE_BYTES
from .program import (BIAS, OUT, PREPARED, WEIGHT, WORKSPACE, X, CallProgram, Launch, Pointer, Table, align,
                      relocated)

PHASE_WEIGHT, STRIDED_COPY, STRIDED_FILL = "phase_weight", "strided_copy", "strided_fill"
#: Every phase's weight in one tiled pass (kernels/phase_weight.cu) for the one-launch route; its
#: PhaseTaps holds up to MAX_PHASE_TAPS taps per axis and MAX_WEIGHT_PHASES phases.
PHASE_WEIGHTS = "phase_weights"
MAX_PHASE_TAPS, MAX_WEIGHT_PHASES = 32, 16


@dataclasses.dataclass(frozen=True)
class AxisPhase:
    """One stride phase along one axis: output indices start, start + stride, ... (``count`` of them)
    receive the forward taps ``taps`` (in the order the phase's kernel reads them: descending),
    which read y[read_start:read_stop] at ``dilation`` with ``pad_before`` / ``pad_after`` zeros.
    ``taps`` is empty where no tap reaches the phase (it holds the bias alone)."""

    start: int
    count: int
    taps: tuple[int, ...]
    dilation: int = 1
    read_start: int = 0
    read_stop: int = 0
    pad_before: int = 0
    pad_after: int = 0

    @property
    def tap_slice(self) -> slice:
        """``taps`` as a slice of the weight's axis (evenly spaced, descending): indexing by it is a
        view, with no index array copied from the host (which a CUDA-graph capture could not hold)."""
        first, last = self.taps[0], self.taps[-1]
        step = self.taps[1] - first if len(self.taps) > 1 else -1
        return slice(first, last - 1 if last > 0 else None, step)


def axis_phases(out_size: int, in_size: int, kernel: int, stride: int, dilation: int,
                pad_before: int) -> tuple[AxisPhase, ...]:
    """The stride phases of one axis of a transposed convolution reading ``in_size`` positions of y
    and writing ``out_size`` outputs (phases that hold no output are left out)."""
    phases = []
    for a in range(min(stride, out_size)):
        count = (out_size - a + stride - 1) // stride
        taps = [r for r in range(kernel) if (a + pad_before - r * dilation) % stride == 0]
        if not taps:
            phases.append(AxisPhase(a, count, ()))
            continue
        # Tap r_j reads y at i + o_j; consecutive taps' offsets differ by dilation / gcd(stride, dilation).
        step = dilation // math.gcd(stride, dilation) if len(taps) > 1 else 1
        last_offset = (a + pad_before - taps[-1] * dilation) // stride
        before = -last_offset
        after = count - in_size - before + step * (len(taps) - 1)
        read_start, read_stop = max(0, -before), in_size + min(0, after)
        if read_stop <= read_start:  # every tap reads past y's edges
            phases.append(AxisPhase(a, count, ()))
            continue
        phases.append(AxisPhase(a, count, tuple(reversed(taps)), step, read_start, read_stop, max(0, before),
                                max(0, after)))
    return tuple(phases)


@dataclasses.dataclass(frozen=True)
class TransposeProblem:
    """A transposed convolution by logical sizes: y (n, k, hy, wy) in, (n, c, h, w) out, the weight
    (k, c / groups, kh, kw) of the convolution it transposes, its stride, dilation and leading
    padding (pad_top, pad_left); the memory orders of y and the output (``layout``) and of the
    weight (``weight_layout``)."""

    n: int
    k: int
    hy: int
    wy: int
    c: int
    h: int
    w: int
    kh: int
    kw: int
    stride: tuple[int, int]
    dilation: tuple[int, int]
    pad_top: int
    pad_left: int
    groups: int
    dtype: str
    has_bias: bool
    layout: str = "NCHW"
    weight_layout: str = "KCHW"

    @property
    def out_array_shape(self) -> tuple[int, int, int, int]:
        return (self.n, self.h, self.w, self.c) if self.layout == "NHWC" else (self.n, self.c, self.h, self.w)


@dataclasses.dataclass(frozen=True)
class Phase:
    """One 2-D stride phase: its rows and columns (AxisPhase), and the forward problem that computes
    it (None where no tap reaches it)."""

    rows: AxisPhase
    cols: AxisPhase
    problem: ConvProblem | None


@functools.lru_cache(maxsize=1024)
def phases(tp: TransposeProblem) -> tuple[Phase, ...]:
    """The stride phases of ``tp``, each with its stride-1 forward ConvProblem on the phase's window
    of y (x: (n, k, rows read, columns read); weight: (c, k / groups, taps, taps), KCHW)."""
    rows = axis_phases(tp.h, tp.hy, tp.kh, tp.stride[0], tp.dilation[0], tp.pad_top)
    cols = axis_phases(tp.w, tp.wy, tp.kw, tp.stride[1], tp.dilation[1], tp.pad_left)
    result = []
    for row in rows:
        for col in cols:
            problem = None
            if row.taps and col.taps:
                problem = ConvProblem(
                    n=tp.n, c=tp.k, h=row.read_stop - row.read_start, w=col.read_stop - col.read_start, k=tp.c,
                    kh=len(row.taps), kw=len(col.taps), stride=(1, 1), dilation=(row.dilation, col.dilation),
                    pad_top=row.pad_before, pad_left=col.pad_before, pad_bottom=row.pad_after,
                    pad_right=col.pad_after, groups=tp.groups, dtype=tp.dtype, has_bias=tp.has_bias,
                    layout=tp.layout)
                assert (problem.ho, problem.wo) == (row.count, col.count), (tp, row, col)
            result.append(Phase(row, col, problem))
    return tuple(result)


def phase_weight_kernels() -> tuple[str, ...]:
    """The kernels the program adds around the phases' forward programs."""
    return PHASE_WEIGHT, STRIDED_COPY, STRIDED_FILL


def phase_weight_specialisations() -> list[str]:
    """The phase weight's and the strided copies' instances (every dtype), and the all-phases weight's
    (the one-launch route's dtypes)."""
    from .families.implicit_gemm_nhwc import PHASES_DTYPES

    return [f"cupyconv::{kernel}<{ctype}>" for kernel in phase_weight_kernels() for ctype in CTYPES.values()] + \
        [_phase_weights_specialisation(dtype) for dtype in PHASES_DTYPES]


def _phase_weights_specialisation(dtype: str) -> str:
    """phase_weights' instance: float32 rounded to TF32, the one-launch route running it on TF32 alone."""
    return f"cupyconv::{PHASE_WEIGHTS}<{CTYPES[dtype]},{str(dtype == 'float32').lower()}>"


def _weight_strides(tp: TransposeProblem) -> tuple[int, int, int, int]:
    """Element strides of the weight along (input channel, output channel of the group, row, column)."""
    cg = tp.c // tp.groups
    return (tp.kh * tp.kw * cg, 1, tp.kw * cg, cg) if tp.weight_layout == "KHWC" else \
        (cg * tp.kh * tp.kw, tp.kh * tp.kw, tp.kw, 1)


def _phase_weight_launch(tp: TransposeProblem, phase: Phase, source: Pointer, target: Pointer,
                         weight_layout: str = "KCHW", channels: int | None = None) -> Launch:
    """kernels/phase_weight.cu writing ``phase``'s weight, (channels, K / groups, taps, taps) in
    ``weight_layout``, at ``target`` from the weight at ``source`` (``tp.weight_layout``); channels past
    ``tp.c`` (an ungrouped output widened to ``channels``) are zeros."""
    kg = tp.k // tp.groups
    channels = channels or tp.c
    strides = _weight_strides(tp)
    picks = []
    for taps in (phase.rows.taps, phase.cols.taps):
        picks += [taps[0], taps[1] - taps[0] if len(taps) > 1 else 0]
    total = channels * kg * len(phase.rows.taps) * len(phase.cols.taps)
    return Launch(PHASE_WEIGHT, f"cupyconv::{PHASE_WEIGHT}<{CTYPES[tp.dtype]}>", (math.ceil(total / 256), 1, 1),
                  (256, 1, 1), 0, (source, target, channels, tp.c, kg, channels // tp.groups, len(phase.rows.taps),
                                   len(phase.cols.taps), *picks, *strides, int(weight_layout == "KHWC")))


def _strides(layout: str, n: int, c: int, h: int, w: int) -> tuple[int, int, int, int]:
    """Element strides along (n, c, h, w) of a C-contiguous array of those sizes in ``layout``."""
    return (c * h * w, 1, w * c, c) if layout == "NHWC" else (c * h * w, h * w, w, 1)


def _box(tp: TransposeProblem, kernel: str, sizes, strides, pointers: tuple, flags: tuple = ()) -> Launch:
    """kernels/strided_copy.cu over the (n, c, h, w) box ``sizes`` with one stride tuple per array, its
    dimensions ordered so that the written array's innermost (channels for NHWC) comes last."""
    order = (0, 2, 3, 1) if tp.layout == "NHWC" else (0, 1, 2, 3)
    args = [sizes[i] for i in order] + [each[i] for each in strides for i in order]
    return Launch(kernel, f"cupyconv::{kernel}<{CTYPES[tp.dtype]}>", (math.ceil(math.prod(sizes) / 256), 1, 1),
                  (256, 1, 1), 0, (*pointers, *flags, *args))


@dataclasses.dataclass(frozen=True)
class TransposePlan:
    """How a transposed convolution runs as one program: the output channels its phases compute
    (``channels``: the problem's, or more where an ungrouped output has fewer than the GEMMs take:
    zeros, cut on the way out) and each phase's forward plan (phase_plan; None for a phase no tap
    reaches), in phases()' order for that many channels; or, where ``gemm`` is set, every phase with
    taps in that one launch (implicit_gemm_nhwc.phases_plan) instead of the phases' own plans; or,
    where ``few`` is set, the whole of it in transpose_few_channels' one launch, or where ``depthwise`` is,
    in transpose_depthwise's, or where ``stacked`` is, every phase (each one tap) as one GEMM of their
    weights stacked (implicit_gemm_nhwc.stacked_plan)."""

    channels: int
    phases: tuple
    gemm: object = None
    few: object = None
    depthwise: object = None
    stacked: object = None


def program(plan: TransposePlan, tp: TransposeProblem) -> CallProgram:
    """The transposed convolution ``tp`` as one program, phase by phase. A phase with taps: the window
    of y it reads cut into the workspace where it is not all of y (strided_copy), its weight
    (phase_weight, in the layout its plan reads), its forward program reading them, into OUT where it
    is the only phase and computes ``tp.c`` channels, else into the workspace and then to its rows,
    columns and channels of OUT (strided_copy). A phase without taps: its positions filled with the
    bias or zeros (strided_fill). A widened output reads a bias widened with zeros in the workspace.
    The forward programs' prepared weights and temporaries are relocated into the workspace too."""
    from .planner import program as forward_program

    if plan.few is not None:
        return transpose_few_channels.program(plan.few, tp)
    if plan.depthwise is not None:
        return transpose_depthwise.program(plan.depthwise, tp)
    if plan.gemm is not None:
        return _phases_program(plan, tp)
    if plan.stacked is not None:
        return _stacked_program(plan, tp)
    item = STORAGE_BYTES[tp.dtype]
    channels = plan.channels
    every = phases(dataclasses.replace(tp, c=channels))
    y_strides = _strides(tp.layout, tp.n, tp.k, tp.hy, tp.wy)
    launches, used = [], 0

    def take(nbytes: int) -> Pointer:
        nonlocal used
        at, used = Pointer(WORKSPACE, used), used + align(nbytes)
        return at

    bias = Pointer(BIAS)
    if channels != tp.c and tp.has_bias:
        bias = take(channels * item)
        launches += [_box(tp, STRIDED_COPY, (1, tp.c, 1, 1), ((tp.c, 1, 1, 1), (channels, 1, 1, 1)),
                          (Pointer(BIAS), bias)),
                     _box(tp, STRIDED_FILL, (1, channels - tp.c, 1, 1), ((channels, 1, 1, 1),),
                          (Pointer(BIAS), Pointer(WORKSPACE, bias.offset + tp.c * item)), (0, 1))]
    for phase, phase_plan_ in zip(every, plan.phases):
        rows, cols = phase.rows, phase.cols
        target, target_strides = _phase_target(tp, phase)
        sizes = (tp.n, tp.c, rows.count, cols.count)
        if phase.problem is None:
            launches.append(_fill(tp, phase))
            continue
        p = dataclasses.replace(phase.problem, weight_layout=phase_plan_.weight_layout)
        x = Pointer(X)
        if (rows.read_start, rows.read_stop, cols.read_start, cols.read_stop) != (0, tp.hy, 0, tp.wy):
            x = take(math.prod(p.x_shape) * item)
            window = Pointer(X, (rows.read_start * y_strides[2] + cols.read_start * y_strides[3]) * item)
            launches.append(_box(tp, STRIDED_COPY, p.x_shape, (y_strides, _strides(tp.layout, *p.x_shape)),
                                 (window, x)))
        weight = take(math.prod(p.weight_shape) * item)
        launches.append(_phase_weight_launch(tp, phase, Pointer(WEIGHT), weight, p.weight_layout, channels))
        forward = forward_program(phase_plan_, p)
        moves = {X: x, WEIGHT: weight, BIAS: bias}
        if forward.weight:
            moves[PREPARED] = take(forward.weight.nbytes)
            launches += relocated(forward.weight.launches, moves)
        alone = len(every) == 1 and channels == tp.c
        out = Pointer(OUT) if alone else take(math.prod(p.out_shape) * item)
        moves.update({OUT: out, WORKSPACE: take(forward.workspace_bytes)})
        launches += relocated(forward.launches, moves)
        if not alone:
            launches.append(_box(tp, STRIDED_COPY, sizes, (_strides(tp.layout, *p.out_shape), target_strides),
                                 (out, target)))
    return CallProgram(tuple(launches), used)


def _phase_target(tp: TransposeProblem, phase: Phase) -> tuple[Pointer, tuple[int, int, int, int]]:
    """Where ``phase``'s first output element is in OUT, and the element strides along (n, c, rows,
    columns) of its rows and columns there."""
    out_strides = _strides(tp.layout, tp.n, tp.c, tp.h, tp.w)
    target = Pointer(OUT, (phase.rows.start * out_strides[2] + phase.cols.start * out_strides[3]) * STORAGE_BYTES[tp.dtype])
    return target, (*out_strides[:2], out_strides[2] * tp.stride[0], out_strides[3] * tp.stride[1])


def _fill(tp: TransposeProblem, phase: Phase) -> Launch:
    """strided_fill of the positions of a phase no tap reaches with the bias or zeros."""
    target, target_strides = _phase_target(tp, phase)
    return _box(tp, STRIDED_FILL, (tp.n, tp.c, phase.rows.count, phase.cols.count), (target_strides,),
                (Pointer(BIAS), target), (int(tp.has_bias), 1 if tp.layout == "NCHW" else 3))


def _phase_weights_launch(tp: TransposeProblem, offsets: dict[int, int], target: Pointer) -> Launch:
    """kernels/phase_weight.cu's phase_weights writing, in one pass, the KHWC weight (C, taps, taps,
    K / groups) of every phase with taps at ``target`` plus ``offsets[p]`` elements (p: its index in
    phases())."""
    every = phases(tp)
    columns = len({phase.cols.start for phase in every})
    row_phase, row_index, col_phase, col_index = ([-1] * MAX_PHASE_TAPS for _ in range(4))
    for p, phase in enumerate(every):
        for position, tap in enumerate(phase.rows.taps):
            row_phase[tap], row_index[tap] = p // columns, position
        for position, tap in enumerate(phase.cols.taps):
            col_phase[tap], col_index[tap] = p % columns, position
    blank = [0] * (MAX_WEIGHT_PHASES - len(every))
    table = Table((columns, *row_phase, *row_index, *col_phase, *col_index,
                   *(len(phase.rows.taps) for phase in every), *blank,
                   *(len(phase.cols.taps) for phase in every), *blank,
                   *(offsets.get(p, 0) for p in range(len(every))), *blank))
    cg = tp.c // tp.groups
    grid = (math.ceil(cg * tp.kh * tp.kw / 32), math.ceil(tp.k / 32), 1)
    return Launch(PHASE_WEIGHTS, _phase_weights_specialisation(tp.dtype), grid, (32, 8, 1), 0,
                  (Pointer(WEIGHT), target, tp.k, tp.k // tp.groups, cg, tp.kh, tp.kw, *_weight_strides(tp),
                   int(tp.weight_layout == "KHWC"), table))


def _phases_program(plan: TransposePlan, tp: TransposeProblem) -> CallProgram:
    """``tp`` with its phases in one launch of ``plan.gemm`` (implicit_gemm_nhwc.phases_plan): every
    phase's weight, KHWC, into the workspace (phase_weights), then the launch, reading the whole of y
    and writing each phase's rows and columns of OUT (with split-K, float32 runs of the whole output
    in the workspace and their ordered sum into OUT), then the phases no tap reaches filled. The
    launch reads y NHWC: an NCHW y is transposed into the workspace first (rounded to TF32 on the way
    in float32), and the launch writes the NCHW output in place (a transpose of the output, the larger
    array, cost about as much again: H200, benchmarks/NOTES.md). A float32 NHWC y that the launch does
    not round (``plan.gemm.round_a``) is rounded by a copy into the workspace. A widened output
    (``plan.channels`` > tp.c) is computed with the phase weights' rows past tp.c unwritten: the launch
    stores none of the channels they make."""
    from .families.common import split_k_reduce
    from .families.implicit_gemm_nhwc import PhaseGemm, pad_channels, phases_launch
    from .layouts import transpose_launch

    gemm, item = plan.gemm, STORAGE_BYTES[tp.dtype]
    channel_step = tp.c if tp.layout == "NHWC" else 1  # output elements between a pixel and the next
    tapped, offsets, used = [], {}, 0
    for index, phase in enumerate(phases(dataclasses.replace(tp, c=plan.channels))):
        if phase.problem is None:
            continue
        p = dataclasses.replace(phase.problem, layout="NHWC", weight_layout="KHWC")
        offsets[index] = used // item
        # The phase reads the whole of y: its window's start becomes negative padding.
        tapped.append(PhaseGemm(p, phase.rows.pad_before - phase.rows.read_start,
                                phase.cols.pad_before - phase.cols.read_start, used // item,
                                (phase.rows.start * tp.w + phase.cols.start) * channel_step))
        used += align(math.prod(p.weight_shape) * item)
    launches = [_phase_weights_launch(tp, offsets, Pointer(WORKSPACE))]
    y, rounding = Pointer(X), tp.dtype == "float32" and not gemm.round_a
    if tp.layout == "NCHW" or rounding:
        y, used = Pointer(WORKSPACE, used), used + align(tp.n * tp.k * tp.hy * tp.wy * item)
        rows = tp.n * tp.hy * tp.wy
        launches.append(transpose_launch(tp.dtype, tp.n, tp.k, tp.hy * tp.wy, Pointer(X), y, rounding)
                        if tp.layout == "NCHW" else pad_channels(tp.dtype, rows, tp.k, tp.k, Pointer(X), y))
    arguments = (gemm, tuple(tapped), (tp.hy, tp.wy), tp.out_array_shape, tp.stride, Pointer(WORKSPACE))
    if gemm.splits == 1:
        launches.append(phases_launch(*arguments, out_layout=tp.layout, y=y))
    else:
        partial = Pointer(WORKSPACE, used)
        used += align(4 * gemm.splits * math.prod(tp.out_array_shape))
        # The reduction's problem: any whose output is the whole of tp's (a 1x1 convolution of y's size).
        whole = dataclasses.replace(tapped[0].problem, k=tp.c, h=tp.h, w=tp.w, kh=1, kw=1, dilation=(1, 1),
                                    pad_top=0, pad_left=0, pad_bottom=0, pad_right=0)
        launches += [phases_launch(*arguments, out=partial, partial=True, out_layout=tp.layout, y=y),
                     split_k_reduce(tp.dtype, "int", whole, gemm.splits, partial, Pointer(OUT),
                                    tp.layout == "NHWC")]
    launches += [_fill(tp, phase) for phase in phases(tp) if phase.problem is None]
    return CallProgram(tuple(launches), used)


def stacked_problem(tp: TransposeProblem) -> ConvProblem | None:
    """Where ``tp``'s kernel is its stride (NHWC, ungrouped, undilated, unpadded, its output exactly
    sh sw times y's pixels; several phases): the 1x1 convolution of y to sh sw C channels its phases make
    together, phase p's channels p C to p C + C-1 (phases()' order); else None."""
    from .families.implicit_gemm_nhwc import MAX_PHASES

    sh, sw = tp.stride
    if tp.layout != "NHWC" or tp.groups != 1 or (tp.kh, tp.kw) != (sh, sw) or tp.dilation != (1, 1) or \
            (tp.pad_top, tp.pad_left) != (0, 0) or (tp.h, tp.w) != (tp.hy * sh, tp.wy * sw) or \
            not 1 < sh * sw <= MAX_PHASES:
        return None
    return ConvProblem(n=tp.n, c=tp.k, h=tp.hy, w=tp.wy, k=sh * sw * tp.c, kh=1, kw=1, stride=(1, 1), dilation=(1, 1),
                       pad_top=0, pad_left=0, pad_bottom=0, pad_right=0, groups=1, dtype=tp.dtype,
                       has_bias=tp.has_bias, layout="NHWC", weight_layout="KHWC")


def _stacked_program(plan: TransposePlan, tp: TransposeProblem) -> CallProgram:
    """``tp`` as its stacked phases' GEMM (``plan.stacked``): every phase's weight (KHWC, C x K) into the
    workspace one after another by phase_weights, making the [sh sw C][K] weight (rounded to TF32 in
    float32); the bias repeated once a phase where there is one; then the family's program for
    stacked_problem(tp), its launch placing each phase's channel tiles (implicit_gemm_nhwc.stacked_launch)."""
    from .families.implicit_gemm_nhwc import KERNEL, STACKED_KERNEL, TMA_KERNEL, program as gemm_program, stacked_launch

    gemm, problem, item = plan.stacked, stacked_problem(tp), STORAGE_BYTES[tp.dtype]
    every = phases(tp)
    launches = [_phase_weights_launch(tp, {p: p * tp.c * tp.k for p in range(len(every))}, Pointer(WORKSPACE))]
    used, bias = align(problem.k * tp.k * item), Pointer(BIAS)
    if tp.has_bias:
        bias, used = Pointer(WORKSPACE, used), used + align(problem.k * item)
        launches.append(_box(tp, STRIDED_COPY, (len(every), tp.c, 1, 1), ((0, 1, 1, 1), (tp.c, 1, 1, 1)),
                             (Pointer(BIAS), bias)))
    call = gemm_program(dataclasses.replace(gemm, kernel=KERNEL), problem)  # the family's launches, then ours
    # The family's prepared weight (float32's, rounded to TF32, in the same layout) is what phase_weights
    # wrote: the stacked weights stand for it, and its preparation is left out.
    moves = {WEIGHT: Pointer(WORKSPACE), PREPARED: Pointer(WORKSPACE), BIAS: bias, WORKSPACE: Pointer(WORKSPACE, used)}
    # Phase p's first pixel, less p C: the GEMM's channel p C + c is the phase's channel c.
    offsets = tuple((phase.rows.start * tp.w + phase.cols.start) * tp.c - p * tp.c for p, phase in enumerate(every))
    for launch in relocated(call.launches, moves):
        launches.append(stacked_launch(gemm, problem, launch, tp.out_array_shape, tp.stride, offsets)
                        if launch.kernel == TMA_KERNEL else launch)
    assert sum(launch.kernel == STACKED_KERNEL for launch in launches) == 1
    return CallProgram(tuple(launches), used + call.workspace_bytes)


def _nhwc(tp: TransposeProblem) -> TransposeProblem:
    """``tp`` on NHWC arrays (its weight as it is: phase_weights reads either layout)."""
    return dataclasses.replace(tp, layout="NHWC")


@functools.lru_cache(maxsize=1024)
def transposed_executable(tp: TransposeProblem, allow_tf32: bool, device_id: int, min_channels: int = 0):
    """``program`` ready to launch on device ``device_id`` (transpose_plan's; an ungrouped output of
    fewer than ``min_channels`` channels widened to that many), or None where
    run_phases must run ``tp`` on CuPy arrays: an empty batch or arrays past 32-bit offsets. Made once
    per problem: the torch adapter's ConvTranspose2d asks on every call."""
    from .compiler import compute_capability
    from .executor import program_executable

    few = transpose_few_channels.pays(tp)
    channels = max(tp.c, min_channels) if tp.groups == 1 and not few else tp.c
    elements = max(tp.n * tp.k * tp.hy * tp.wy, tp.n * channels * tp.h * tp.w,
                   tp.k * channels // tp.groups * tp.kh * tp.kw)
    if tp.n == 0 or elements >= 2**31:
        return None
    return program_executable(program, transpose_plan(tp, allow_tf32, compute_capability(device_id), channels),
                              tp, device_id)


def transpose_plan(tp: TransposeProblem, allow_tf32: bool, compute_capability: int, channels: int) -> TransposePlan:
    """How ``tp`` runs with ``channels`` output channels: an output of few channels (``channels`` ==
    tp.c) in transpose_few_channels' one launch where it pays, a strided depthwise one in
    transpose_depthwise's; one whose kernel is its stride (stacked_problem) as one GEMM on a producer tile
    where implicit_gemm_nhwc.stacked_plan takes it; where it has several stride phases (up to 16, of up to
    MAX_PHASE_TAPS taps a side), every phase with taps in one launch if implicit_gemm_nhwc.phases_plan
    takes them (planned on NHWC arrays: an NCHW y is transposed for it, _phases_program); else each phase
    on the planner's fixed rules."""
    from .families.implicit_gemm_nhwc import MAX_PHASES, phases_plan

    if channels == tp.c and transpose_few_channels.pays(tp):
        return TransposePlan(channels, (), few=transpose_few_channels.make_plan(tp))
    if transpose_depthwise.pays(tp):
        return TransposePlan(channels, (), depthwise=transpose_depthwise.make_plan(tp))
    stacked = stacked_problem(tp) if channels == tp.c else None
    if stacked is not None and (tp.dtype != "float32" or allow_tf32):
        from .families.implicit_gemm_nhwc import stacked_plan

        gemm = stacked_plan(stacked, tp.stride[0] * tp.stride[1], compute_capability)
        if gemm is not None:
            return TransposePlan(channels, (), stacked=gemm)
    every = phases(dataclasses.replace(_nhwc(tp), c=channels))
    tapped = tuple(dataclasses.replace(phase.problem, weight_layout="KHWC") for phase in every if phase.problem)
    if 1 < len(every) <= min(MAX_PHASES, MAX_WEIGHT_PHASES) and max(tp.kh, tp.kw) <= MAX_PHASE_TAPS and tapped:
        gemm = phases_plan(tapped, compute_capability, allow_tf32=allow_tf32, y_rounded=tp.layout == "NCHW")
        if gemm is not None:
            return TransposePlan(channels, (), gemm)
    every = phases(dataclasses.replace(tp, c=channels))
    return TransposePlan(channels, tuple(None if phase.problem is None else
                                         phase_plan(phase.problem, allow_tf32, compute_capability) for phase in every))


def phase_plan(problem: ConvProblem, allow_tf32: bool, compute_capability: int):
    """The planner's plan of a phase's forward ``problem`` (KCHW weight), for its weight in KHWC where
    the chosen family reads an NHWC problem's weight channels-last in place: the phase weight is then
    written in that layout, and the family needs no preparation of its own."""
    from .planner import FAMILIES, make_plan

    plan = make_plan(problem, allow_tf32=allow_tf32, compute_capability=compute_capability)
    if problem.layout == "NHWC" and "KHWC" in getattr(FAMILIES[plan.kernel], "WEIGHT_LAYOUTS", ()):
        plan = make_plan(dataclasses.replace(problem, weight_layout="KHWC"), allow_tf32=allow_tf32,
                         compute_capability=compute_capability)
    return plan


def swapped_weight(weight, tp: TransposeProblem):
    """The forward weight (k, c / groups, kh, kw) (KHWC: (k, kh, kw, c / groups)) with k and c swapped in
    each group: (c, k / groups, kh, kw), the weight of the phases' convolutions before their taps are
    picked. A view where the layout allows."""
    if tp.weight_layout == "KHWC":
        weight = weight.transpose(0, 3, 1, 2)
    g, kg, cg = tp.groups, tp.k // tp.groups, tp.c // tp.groups
    return weight.reshape(g, kg, cg, tp.kh, tp.kw).transpose(0, 2, 1, 3, 4).reshape(tp.c, kg, tp.kh, tp.kw)


def _axes(layout: str) -> tuple[int, int]:
    """The row and column axes of an array in ``layout``."""
    return (1, 2) if layout == "NHWC" else (2, 3)


def run_phases(y, weight, bias, tp: TransposeProblem, out, conv, xp, min_channels: int = 0):
    """Write the transposed convolution of y (``tp.layout``) with ``weight`` (``tp.weight_layout``)
    and ``bias`` into ``out`` (the output's array shape, in ``tp.layout``) through ``conv(x, w, bias,
    problem, out)``, the forward convolution of one phase into a C-contiguous ``out``; ``xp`` is
    numpy or cupy. An ungrouped output of fewer than ``min_channels`` channels (a generator's RGB
    layer, the input gradient of a network's stem) is computed with zero channels added up to
    ``min_channels`` and cut on the way out: the GEMMs take 8 output channels or more, and fewer
    would run on the direct kernel at a tenth of the speed."""
    if tp.n == 0 or out.size == 0:
        return out
    swapped = swapped_weight(weight, tp)
    channels = tp.c
    if tp.groups == 1 and channels < min_channels:
        swapped = xp.concatenate([swapped, xp.zeros((min_channels - channels, *swapped.shape[1:]), swapped.dtype)])
        if bias is not None:
            bias = xp.concatenate([bias, xp.zeros(min_channels - channels, bias.dtype)])
        tp = dataclasses.replace(tp, c=min_channels)
    row_axis, col_axis = _axes(tp.layout)
    channel_axis = 3 if tp.layout == "NHWC" else 1
    every = phases(tp)
    for phase in every:
        index = [slice(None)] * 4
        index[row_axis] = slice(phase.rows.start, None, tp.stride[0])
        index[col_axis] = slice(phase.cols.start, None, tp.stride[1])
        target = out[tuple(index)]
        if phase.problem is None:
            if bias is None:
                target[...] = 0
            else:
                shape = [1, 1, 1, 1]
                shape[channel_axis] = channels
                target[...] = bias[:channels].reshape(shape)
            continue
        window = [slice(None)] * 4
        window[row_axis] = slice(phase.rows.read_start, phase.rows.read_stop)
        window[col_axis] = slice(phase.cols.read_start, phase.cols.read_stop)
        taps = xp.ascontiguousarray(swapped[:, :, phase.rows.tap_slice, phase.cols.tap_slice])
        if len(every) == 1 and tp.c == channels:
            conv(y[tuple(window)], taps, bias, phase.problem, out)
        else:
            part = xp.empty(phase.problem.out_array_shape, dtype=out.dtype)
            conv(y[tuple(window)], taps, bias, phase.problem, part)
            kept = [slice(None)] * 4
            kept[channel_axis] = slice(0, channels)
            target[...] = part[tuple(kept)]
    return out


def _numpy_conv(x, weight, bias, problem: ConvProblem, out):
    from .reference import conv2d_numpy

    if problem.layout == "NHWC":  # the NumPy convolution computes NCHW views
        x, out = x.transpose(0, 3, 1, 2), out.transpose(0, 3, 1, 2)
    return conv2d_numpy(x, weight, bias, dataclasses.replace(problem, layout="NCHW"), out)


def _cupy_conv(allow_tf32: bool):
    from .launch import aligned, conv2d_cupy

    def conv(x, weight, bias, problem, out):
        return conv2d_cupy(aligned(x), weight, None if bias is None else aligned(bias), problem, out,
                           allow_tf32=allow_tf32)

    return conv


def transposed(y, weight, bias, tp: TransposeProblem, backend: str, allow_tf32: bool = False,
               min_channels: int | None = None):
    """The transposed convolution ``tp`` of NumPy or CuPy arrays (``backend``), in a new array.
    ``min_channels``: see run_phases (default: the GEMMs' least output channels on CuPy, none on NumPy)."""
    if backend == "numpy":
        out = np.empty(tp.out_array_shape, dtype=y.dtype)
        return run_phases(y, weight, bias, tp, out, _numpy_conv, np, min_channels or 0)
    import cupy

    from .families.implicit_gemm_conv2d import GEMM_MIN_GROUP_CHANNELS
    from .launch import aligned, run_program

    min_channels = GEMM_MIN_GROUP_CHANNELS if min_channels is None else min_channels
    with cupy.cuda.Device(y.device.id):
        out = cupy.empty(tp.out_array_shape, dtype=y.dtype)
        exe = transposed_executable(tp, allow_tf32, y.device.id, min_channels)
        if exe is None:
            return run_phases(y, weight, bias, tp, out, _cupy_conv(allow_tf32), cupy, min_channels)
        arrays = {"x": aligned(y), "weight": cupy.ascontiguousarray(weight), "out": out}
        if bias is not None:
            arrays["bias"] = aligned(bias)
        run_program(exe, **arrays)
        return out


def _padding_pair(padding, name: str) -> tuple[int, int]:
    if isinstance(padding, str):
        raise ValueError(f"{name} must be an int or a pair of ints (conv_transpose2d takes no {padding!r}), "
                         f"got {padding!r}")
    return _pair(padding, name, 0)


def conv_transpose2d(x, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1, *,
                     allow_tf32=False, layout="NCHW", weight_layout="KCHW"):
    """2-D transposed convolution, as ``torch.nn.functional.conv_transpose2d``: the gradient of a
    conv2d with respect to its input, plus a bias. CuPy arrays run on their GPU (the forward
    kernels, a stride phase at a time; NHWC float16/bfloat16 ones every phase in one launch), NumPy
    arrays on the CPU.

    Args:
        x: (N, C_in, H, W) or unbatched (C_in, H, W); with ``layout="NHWC"``, (N, H, W, C_in) or
            (H, W, C_in). float16, bfloat16, float32 or float64.
        weight: (C_in, C_out // groups, kh, kw), torch's shape for a transposed convolution (the
            weight of the conv2d it transposes); with ``weight_layout="KHWC"``, (C_in, kh, kw,
            C_out // groups). Same dtype and device as x.
        bias: optional (C_out,).
        stride, dilation: int or pair, >= 1. Default 1.
        padding: int or pair, >= 0: dilation (k - 1) - padding zeros are added to each side of the
            input, as torch. Default 0.
        output_padding: int or pair, >= 0 and smaller than the stride or the dilation: extra rows
            and columns at the bottom and right of the output. Default 0.
        groups: >= 1, dividing C_in and C_out. Default 1.
        allow_tf32: float32 on CuPy may run on the tensor cores in TF32, as in conv2d.
        layout, weight_layout: memory orders, as in conv2d.

    Returns:
        (N, C_out, Ho, Wo) (in ``layout``; unbatched without N), Ho = (H - 1) sh - 2 ph +
        dh (kh - 1) + output_padding + 1, likewise Wo; x's dtype and device.

    Raises:
        TypeError, ValueError: as conv2d, naming the argument and the shapes, before any launch.
    """
    backend = check_arrays(x, weight, bias, None)
    check_layouts(layout, weight_layout)
    check_x_dims(x, layout)
    unbatched = x.ndim == 3
    x4 = x[None] if unbatched else x
    tp = make_transpose_problem(x4.shape, weight.shape, None if bias is None else bias.shape, x.dtype, stride,
                                padding, output_padding, groups, dilation, layout, weight_layout)
    out = transposed(x4, weight, bias, tp, backend, allow_tf32)
    return out[0] if unbatched else out


def make_transpose_problem(x_shape, weight_shape, bias_shape, dtype, stride, padding, output_padding, groups,
                           dilation, layout="NCHW", weight_layout="KCHW") -> TransposeProblem:
    """Check conv_transpose2d's shapes and hyper-parameters (ValueError/TypeError naming them) and
    describe the call as a TransposeProblem."""
    check_layouts(layout, weight_layout)
    x_shape, weight_shape = tuple(x_shape), tuple(weight_shape)
    if len(weight_shape) != 4:
        order = "C_in, C_out/groups, kh, kw" if weight_layout == "KCHW" else "C_in, kh, kw, C_out/groups"
        raise ValueError(f"weight must be 4-D ({order}) for weight_layout={weight_layout!r}, got shape {weight_shape}")
    n, h, w, c_in = x_shape if layout == "NHWC" else (x_shape[0], *x_shape[2:], x_shape[1])
    if weight_layout == "KHWC":
        k, kh, kw, cg_out = weight_shape
    else:
        k, cg_out, kh, kw = weight_shape
    if isinstance(groups, (bool, np.bool_)) or not isinstance(groups, numbers.Integral):
        raise TypeError(f"groups must be an int, got {groups!r}")
    if groups < 1:
        raise ValueError(f"groups must be >= 1, got {groups}")
    if c_in < 1 or h < 1 or w < 1:
        raise ValueError(f"x must have C_in, H and W >= 1, got shape {x_shape} (layout {layout!r})")
    if min(cg_out, kh, kw) < 1:
        raise ValueError(f"weight must have C_out/groups, kh and kw >= 1, got shape {weight_shape}")
    if k != c_in:
        raise ValueError(f"weight shape {weight_shape} expects C_in = {k} input channels (its first axis), but x "
                         f"of shape {x_shape} (layout {layout!r}) has {c_in}")
    if c_in % groups:
        raise ValueError(f"groups={groups} must divide the input channels C_in={c_in} (x shape {x_shape})")
    c_out = cg_out * groups
    if bias_shape is not None and tuple(bias_shape) != (c_out,):
        raise ValueError(f"bias must have shape ({c_out},) (C_out = weight.shape[1] * groups) for weight shape "
                         f"{weight_shape}, got {tuple(bias_shape)}")
    stride, dilation = _pair(stride, "stride", 1), _pair(dilation, "dilation", 1)
    pad = _padding_pair(padding, "padding")
    extra = _padding_pair(output_padding, "output_padding")
    for axis in range(2):
        if extra[axis] >= max(stride[axis], dilation[axis]):
            raise ValueError(f"output_padding {output_padding!r} must be smaller than the stride {stride} or the "
                             f"dilation {dilation} along each axis")
    size = [(n_in - 1) * s - 2 * p + d * (kernel - 1) + e + 1
            for n_in, s, p, d, kernel, e in zip((h, w), stride, pad, dilation, (kh, kw), extra)]
    if min(size) < 1:
        raise ValueError(f"the output would be {size[0]}x{size[1]}: padding {padding!r} is too large for x of shape "
                         f"{x_shape} and kernel {kh}x{kw} (stride {stride}, dilation {dilation})")
    return TransposeProblem(n=n, k=k, hy=h, wy=w, c=c_out, h=size[0], w=size[1], kh=kh, kw=kw, stride=stride,
                            dilation=dilation, pad_top=pad[0], pad_left=pad[1], groups=groups, dtype=dtype_name(dtype),
                            has_bias=bias_shape is not None, layout=layout, weight_layout=weight_layout)


def input_gradient_problem(problem: ConvProblem) -> TransposeProblem:
    """The transposed convolution that is conv2d ``problem``'s gradient with respect to its input."""
    return TransposeProblem(n=problem.n, k=problem.k, hy=problem.ho, wy=problem.wo, c=problem.c, h=problem.h,
                            w=problem.w, kh=problem.kh, kw=problem.kw, stride=problem.stride,
                            dilation=problem.dilation, pad_top=problem.pad_top, pad_left=problem.pad_left,
                            groups=problem.groups, dtype=problem.dtype, has_bias=False, layout=problem.layout,
                            weight_layout=problem.weight_layout)
