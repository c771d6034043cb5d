"""The gradients' programs without a GPU: the weight gradient's (grad.weight_gradient_plan's family
and plan, for every dtype, layout, precision and GPU kind) and the input gradient's whole-phase
program (conv_transpose.program). Every launch names a specialisation the compile tests build and
passes what its kernel's signature asks for; the caller's operands are only read; temporaries sit
aligned inside the workspace. The index arithmetic of the kernels these programs add or extend
(phase_weight; wgrad_reduce over padded partial sums; the strided copies and fills) is replayed in
NumPy from the launches' own arguments: it must give what the CuPy-array route computes (run_phases'
sliced weight, the cut of the padded sums), and the phases' fills and copies must write every output
element once."""
import dataclasses
import itertools
import math
import re

import numpy as np
import pytest

from cases import GRID, PHASE_CASES
from test_programs import check_arguments, parameters, problem_of
from cupyconv import conv_transpose, grad, planner, wgrad, wgrad_depthwise, wgrad_tensor_cores, wgrad_winograd
from cupyconv.arguments import make_problem
from cupyconv.compiler import kernel_source
from cupyconv.families.common import STORAGE_BYTES
from cupyconv.families.implicit_gemm_nhwc import (CHANNELS_LAST_PAIRS, MAX_PHASES, PHASES_KERNEL,
                                                  channels_last_specialisations)
from cupyconv.program import (BIAS, FLAGS, GRAD_OUTPUT, INPUT_SCALE, OUT, PREPARED, RESIDUAL, WEIGHT, WORKSPACE,
                              WORKSPACE_ALIGNMENT, X, Pointer)

DTYPES = ("float16", "bfloat16", "float32", "float64")
LAYOUTS = list(itertools.product(("NCHW", "NHWC"), ("KCHW", "KHWC")))
ANY_GPU = set(wgrad.wgrad_specialisations() + wgrad_depthwise.specialisations() + wgrad_tensor_cores.specialisations()
              + channels_last_specialisations() + conv_transpose.phase_weight_specialisations()
              + wgrad_winograd.specialisations() + planner.kernel_specialisations())
ONE_ARCH = {arch: set(a) | set(wgrad_tensor_cores.arch_specialisations().get(arch, ()))
            for arch, a in planner.arch_specialisations().items()}


def check_launches(call, reads: set, writes: set) -> None:
    for launch in call.launches:
        assert launch.name_expression in (ONE_ARCH[launch.arch] if launch.arch else ANY_GPU), launch
        kinds = parameters(launch.kernel)
        assert len(launch.args) == len(kinds), (launch.kernel, launch.args)
        check_arguments(launch, kinds, reads, writes)
        for arg in launch.args:
            if isinstance(arg, Pointer) and arg.operand == WORKSPACE:
                assert arg.offset % WORKSPACE_ALIGNMENT == 0 and arg.offset < call.workspace_bytes, arg
        assert 1 <= launch.grid[0] < 2**31 and max(launch.grid[1:]) <= 65535, launch


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", [c for c in GRID if c.n], ids=lambda c: c.id)
def test_weight_gradient_programs(case, dtype):
    for (layout, weight_layout), tf32, cc in itertools.product(LAYOUTS, (False, True), (0, 90)):
        problem = problem_of(case, dtype, layout, weight_layout)
        family, plan = grad.weight_gradient_plan(problem, tf32, cc)
        call = family.program(plan, problem)
        check_launches(call, {X, GRAD_OUTPUT, WORKSPACE}, {OUT, WORKSPACE, FLAGS})
        if family is wgrad_winograd:
            last = wgrad_winograd.WEIGHT_GRADIENT_TRANSFORM
        elif getattr(plan, "direct", False):
            last = wgrad_tensor_cores.TF32_TMA_KERNEL if plan.config.tf32 else wgrad_tensor_cores.TMA_KERNEL
        elif family is wgrad_depthwise and layout == "NCHW" and plan.splits * plan.grid[0] == problem.k:
            last = wgrad_depthwise.KERNEL  # one run, one column tile: the blocks write the gradient
        else:
            last = wgrad.REDUCE_KERNEL
        assert call.weight is None and call.launches[-1].kernel == last


def replay_reduce(args, partial: np.ndarray) -> np.ndarray:
    """wgrad_reduce's output from its launch arguments (after the two pointers) and the partial sums."""
    splits, elements, cg, taps, ws_channels_last, weight_khwc, ws_cg, ws_elements = args
    e = np.arange(elements)
    k, rest = e // (cg * taps), e % (cg * taps)
    c, tap = (rest % cg, rest // cg) if weight_khwc else (rest // taps, rest % taps)
    source = k * ws_cg * taps + (tap * ws_cg + c if ws_channels_last else c * taps + tap)
    return sum(partial[s * ws_elements + source] for s in range(splits))


@pytest.mark.parametrize("layout,weight_layout", LAYOUTS)
@pytest.mark.parametrize("x_shape,weight_shape", [((2, 3, 9, 11), (8, 3, 3, 3)), ((1, 40, 7, 9), (36, 40, 1, 1)),
                                                  ((2, 12, 8, 8), (5, 12, 3, 3))])
def test_tensor_core_reduction_cuts_the_padded_sums(layout, weight_layout, x_shape, weight_shape):
    problem = dataclasses.replace(make_problem(x_shape, weight_shape, None, "float16", 1, 1, 1, 1), layout=layout,
                                  weight_layout=weight_layout)
    plan = wgrad_tensor_cores.make_plan(problem, True, None, 3)
    reduce = wgrad_tensor_cores.program(plan, problem).launches[-1]
    k, c, taps = problem.k, problem.c, problem.kh * problem.kw
    kp, cp = plan.out_channels, plan.channels
    partial = np.random.default_rng(0).standard_normal((plan.splits, kp, taps, cp))
    expected = partial.sum(0)[:k, :, :c]  # [K][taps][C]
    expected = expected if weight_layout == "KHWC" else expected.transpose(0, 2, 1)
    assert reduce.args[1] == Pointer(OUT)
    np.testing.assert_allclose(replay_reduce(reduce.args[2:], partial.ravel()), expected.ravel(), rtol=1e-12)


def input_gradient_problem(case, dtype, layout="NCHW", weight_layout="KCHW"):
    return conv_transpose.input_gradient_problem(problem_of(case, dtype, layout, weight_layout))


def replay_phase_weight(args, weight: np.ndarray) -> np.ndarray:
    """phase_weight's output, (C, Kg, th, tw) KCHW, from its launch arguments (after the two pointers),
    read back from KHWC memory where the launch writes that; zeros from channel c_read on."""
    c_all, c_read, kg, cg, th, tw, r0, dr, s0, ds, *strides, out_khwc = args
    channel, k, i, j = np.meshgrid(np.arange(c_all), np.arange(kg), np.arange(th), np.arange(tw), indexing="ij")
    if out_khwc:  # the kernel's element e of (C, th, tw, Kg) memory, viewed as (C, Kg, th, tw)
        channel, i, j, k = np.meshgrid(np.arange(c_all), np.arange(th), np.arange(tw), np.arange(kg), indexing="ij")
    g = channel // cg
    read = channel < c_read
    source = ((g * kg + k) * strides[0] + (channel - g * cg) * strides[1] + (r0 + i * dr) * strides[2]
              + (s0 + j * ds) * strides[3])
    written = np.where(read, weight.ravel()[np.where(read, source, 0)], 0.0)
    return written.transpose(0, 3, 1, 2) if out_khwc else written


def transpose_plan(tp, tf32: bool, cc: int, channels: int):
    """Each phase on its own plan (the route of every layout and dtype)."""
    wide = dataclasses.replace(tp, c=channels)
    return conv_transpose.TransposePlan(channels, tuple(
        None if ph.problem is None else conv_transpose.phase_plan(ph.problem, tf32, cc)
        for ph in conv_transpose.phases(wide)))


def box_offsets(launch) -> np.ndarray:
    """The element offsets a strided_copy / strided_fill launch writes (its arguments after the pointers
    and flags: four sizes, then each array's four strides, the written array's last)."""
    args = launch.args[4 if launch.kernel == conv_transpose.STRIDED_FILL else 2:]
    sizes, strides = args[:4], args[-4:]
    index = np.meshgrid(*(np.arange(d) for d in sizes), indexing="ij")
    return sum(i * s for i, s in zip(index, strides)).ravel()


@pytest.mark.parametrize("layout,weight_layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case,widen", [(c, widen) for c in GRID if c.n for widen in (False, True)
                                        if c.groups == 1 or not widen],
                         ids=lambda v: v.id if hasattr(v, "id") else ("widened" if v else "channels"))
def test_input_gradient_program(case, widen, dtype, layout, weight_layout):
    """``widen``: an ungrouped output computed with 8 channels more than it has (zeros, cut on the way
    out), as transposed_executable does for outputs of fewer channels than the GEMMs take."""
    tp = input_gradient_problem(case, dtype, layout, weight_layout)
    channels = tp.c + 8 if widen else tp.c
    item = STORAGE_BYTES[dtype]
    for tf32, cc in itertools.product((False, True), (0, 90)):
        plan = transpose_plan(tp, tf32, cc, channels)
        every = conv_transpose.phases(dataclasses.replace(tp, c=channels))
        call = conv_transpose.program(plan, tp)
        check_launches(call, {X, WEIGHT, BIAS, WORKSPACE, RESIDUAL, INPUT_SCALE}, {OUT, WORKSPACE})
        assert call.weight is None
        # The caller's weight is read by the phase weights alone; the forwards read those, or their own
        # preparations of them, from the workspace.
        kernels = [launch.kernel for launch in call.launches]
        assert all(arg.operand not in (WEIGHT, PREPARED) for launch in call.launches for arg in launch.args
                   if isinstance(arg, Pointer) and launch.kernel != conv_transpose.PHASE_WEIGHT)
        assert kernels.count(conv_transpose.PHASE_WEIGHT) == sum(ph.problem is not None for ph in every)
        # A widened output's forwards read a widened bias from the workspace, never the caller's.
        if widen and tp.has_bias:
            assert all(arg.operand != BIAS for launch in call.launches for arg in launch.args
                       if isinstance(arg, Pointer) and launch.kernel not in conv_transpose.phase_weight_kernels())
        # A family that reads NHWC problems' weights channels-last gets its phase weight written so.
        for phase_plan in plan.phases:
            if phase_plan is not None and layout == "NHWC":
                native = "KHWC" in getattr(planner.FAMILIES[phase_plan.kernel], "WEIGHT_LAYOUTS", ())
                assert phase_plan.weight_layout == ("KHWC" if native else "KCHW"), phase_plan
        # Fills and copies into OUT write every output element once (a lone phase's forward writes it all).
        if len(every) > 1 or widen:
            boxes = (conv_transpose.STRIDED_COPY, conv_transpose.STRIDED_FILL)
            written = np.concatenate([launch.args[1].offset // item + box_offsets(launch) for launch in call.launches
                                      if launch.kernel in boxes and launch.args[1].operand == OUT])
            assert np.array_equal(np.sort(written), np.arange(math.prod(tp.out_array_shape)))
    shape = tp.k, tp.c // tp.groups, tp.kh, tp.kw
    weight = np.random.default_rng(1).standard_normal(shape)
    stored = weight.transpose(0, 2, 3, 1).copy() if weight_layout == "KHWC" else weight
    swapped = conv_transpose.swapped_weight(stored, tp)
    swapped = np.concatenate([swapped, np.zeros((channels - tp.c, *swapped.shape[1:]))])
    launches = [launch for launch in call.launches if launch.kernel == conv_transpose.PHASE_WEIGHT]
    for phase, launch in zip([ph for ph in every if ph.problem is not None], launches):
        expected = swapped[:, :, phase.rows.tap_slice, phase.cols.tap_slice]
        np.testing.assert_array_equal(replay_phase_weight(launch.args[2:], stored), expected)


def test_window_copies_read_inside_y():
    """A 1x1 convolution padded past its kernel: its input gradient's phase reads a window of y."""
    problem = make_problem((2, 8, 6, 7), (8, 8, 1, 1), None, "float32", 1, 2, 1, 1)
    for layout in ("NCHW", "NHWC"):
        tp = conv_transpose.input_gradient_problem(dataclasses.replace(problem, layout=layout))
        (phase,) = conv_transpose.phases(tp)
        assert (phase.rows.read_start, phase.cols.read_start) == (2, 2)
        copy = conv_transpose.program(transpose_plan(tp, False, 0, tp.c), tp).launches[0]
        assert copy.kernel == conv_transpose.STRIDED_COPY and copy.args[0].operand == X
        read = copy.args[0].offset // 4 + box_offsets(dataclasses.replace(copy, args=copy.args[:10]))
        assert read.min() >= 0 and read.max() < math.prod(tp.out_array_shape[:1]) * tp.k * tp.hy * tp.wy
        assert len(np.unique(read)) == math.prod(phase.problem.x_shape)


def replay_phase_weights(args, weight: np.ndarray, out: np.ndarray) -> None:
    """phase_weights' writes into ``out`` (NaN-filled; each element must be written once), from its
    launch arguments after the two pointers."""
    k_all, kg, cg, kh, kw, *strides, w_khwc, table = args
    values = table.values
    cols, rest = values[0], values[1:]
    taps, phases = conv_transpose.MAX_PHASE_TAPS, conv_transpose.MAX_WEIGHT_PHASES
    row_phase, row_index, col_phase, col_index = (rest[i * taps:(i + 1) * taps] for i in range(4))
    th, tw, offset = (rest[4 * taps + i * phases:4 * taps + (i + 1) * phases] for i in range(3))
    flat = weight.ravel()
    for k, c, r, s_ in itertools.product(range(k_all), range(cg), range(kh), range(kw)):
        pr, pc = row_phase[r], col_phase[s_]
        if pr < 0 or pc < 0:
            continue
        p, g = pr * cols + pc, k // kg
        at = offset[p] + (((g * cg + c) * th[p] + row_index[r]) * tw[p] + col_index[s_]) * kg + k % kg
        assert np.isnan(out[at]), "an element written twice"
        out[at] = flat[k * strides[0] + c * strides[1] + r * strides[2] + s_ * strides[3]]


#: PhaseTable's ints before first_tile: count, channels, the output's strides and interleaved.
TABLE_HEAD = 7


def phase_tiles_of_blocks(values) -> list[tuple[int, int]]:
    """The (phase, pixel tile) each block along the phase launch's grid x takes, as the kernel maps them
    from its PhaseTable ``values``."""
    count, interleaved, firsts = values[0], values[TABLE_HEAD - 1], values[TABLE_HEAD:TABLE_HEAD + 1 + values[0]]
    if interleaved:
        return [(b % count, b // count) for b in range(firsts[-1])]
    return [(p, b - firsts[p]) for p in range(count) for b in range(firsts[p], firsts[p + 1])]


def phases_written(launch) -> dict[int, tuple]:
    """The phase launch's output pixels, replayed from its PhaseTable: phase -> (element offset of
    channel 0 of each pixel in OUT, image, row and column of the pixel in the phase)."""
    values = launch.args[-1].values
    count, _, image_stride, row_stride, column_stride, _, _ = values[:TABLE_HEAD]
    rest = values[TABLE_HEAD + MAX_PHASES + 1:]  # after first_tile
    ho, wo = rest[:MAX_PHASES], rest[MAX_PHASES:2 * MAX_PHASES]
    out_offset = rest[9 * MAX_PHASES:10 * MAX_PHASES]
    n = launch.args[8]
    written = {}
    for p in range(count):
        image, oh, ow = (a.ravel() for a in np.meshgrid(np.arange(n), np.arange(ho[p]), np.arange(wo[p]), indexing="ij"))
        written[p] = (out_offset[p] + image * image_stride + oh * row_stride + ow * column_stride, image, oh, ow)
    return written


@pytest.mark.parametrize("layout", ("NHWC", "NCHW"))
@pytest.mark.parametrize("dtype", ("float16", "float32"))
@pytest.mark.parametrize("cc", (0, 90))
@pytest.mark.parametrize("y_shape,weight_shape,stride,padding,output_padding,groups,dilation", PHASE_CASES)
def test_phases_launch_replayed(y_shape, weight_shape, stride, padding, output_padding, groups, dilation, cc, dtype,
                                layout):
    """A 16-bit or TF32 transposed convolution of several stride phases runs them in one launch
    (implicit_gemm_nhwc_phases): replayed in NumPy from the launches' own arguments (the phase weights,
    the PhaseTable's pixels, taps, padding and placements, split-K's ordered sum, the fills), it gives
    the NumPy conv_transpose2d, and every output element is written once. Outputs of fewer than 8
    channels are computed widened to 8 (as transposed_executable asks), the rest never stored. TF32's
    instances round y and the phase weights; strict float32 never takes the route. An NCHW y is
    transposed to NHWC in the workspace first, which the launch reads; its output is written NCHW in place."""
    n, hy, wy, k = y_shape
    shape = y_shape if layout == "NHWC" else (n, k, hy, wy)
    tp = conv_transpose.make_transpose_problem(shape, weight_shape, (weight_shape[1] * groups,), dtype, stride,
                                               padding, output_padding, groups, dilation, layout)
    channels = max(tp.c, 8) if groups == 1 else tp.c
    tf32 = dtype == "float32"
    if tf32:
        assert conv_transpose.transpose_plan(tp, False, cc, channels).gemm is None
    plan = conv_transpose.transpose_plan(tp, tf32, cc, channels)
    assert plan.gemm is not None and plan.phases == () and plan.channels == channels
    call = conv_transpose.program(plan, tp)
    (launch,) = [launch for launch in call.launches if launch.kernel == PHASES_KERNEL]
    flags = launch.name_expression.rstrip(">").split(",")[-3:]
    (pw,) = [launch for launch in call.launches if launch.kernel == conv_transpose.PHASE_WEIGHTS]
    assert flags[0] == str(layout == "NHWC").lower()  # NHWC_OUT
    assert pw.name_expression.rstrip(">").split(",")[-1] == str(tf32).lower()  # the phase weights rounded
    assert flags[1] == str(plan.gemm.round_a).lower() and (tf32 or not plan.gemm.round_a)  # ROUND_A
    if layout == "NHWC" and not (tf32 and not plan.gemm.round_a):
        check_launches(call, {X, WEIGHT, BIAS, WORKSPACE, RESIDUAL, INPUT_SCALE}, {OUT, WORKSPACE})
    kernels = [launch.kernel for launch in call.launches]
    tapped = [ph for ph in conv_transpose.phases(tp) if ph.problem is not None]
    assert kernels.count(conv_transpose.PHASE_WEIGHTS) == 1 and kernels.count(PHASES_KERNEL) == 1
    assert conv_transpose.PHASE_WEIGHT not in kernels
    assert conv_transpose.STRIDED_COPY not in kernels  # no window of y cut, no phase output moved
    rng = np.random.default_rng(7)
    y, weight, bias = (rng.standard_normal(shape) for shape in (y_shape, weight_shape, (tp.c,)))
    item = STORAGE_BYTES[dtype]
    workspace = np.full(call.workspace_bytes // item, np.nan)
    copies = [each for each in call.launches if each.args[:1] == (Pointer(X),) and each.kernel != PHASES_KERNEL]
    if layout == "NHWC" and not (tf32 and not plan.gemm.round_a):
        assert launch.args[0] == Pointer(X) and not copies
    else:  # one copy of y into the workspace, which the launch reads: NCHW's transpose (N, K, HW -> N, HW, K),
        # or TF32's y rounded where the launch does not round it
        (copy,) = copies
        assert copy.args == ((Pointer(X), launch.args[0], tp.k, hy * wy, tp.k) if layout == "NCHW" else
                             (Pointer(X), launch.args[0], tp.k, n * hy * wy, tp.k))
        rounded = copy.kernel != CHANNELS_LAST_PAIRS and copy.name_expression.endswith("true>")  # pairs: 16 bits
        assert rounded == (tf32 and not plan.gemm.round_a)
        at = launch.args[0].offset
        assert launch.args[0].operand == WORKSPACE and at + y.size * item <= call.workspace_bytes
        assert np.isnan(workspace[at // item:at // item + y.size]).all()
        workspace[at // item:at // item + y.size] = np.nan  # (the replay below reads y itself)
    values = launch.args[-1].values
    count, stored, rest = values[0], values[1], values[TABLE_HEAD + MAX_PHASES + 1:]
    kh, kw, pt, pl, dh, dw, weight_offset = (rest[i * MAX_PHASES:(i + 1) * MAX_PHASES] for i in range(2, 9))
    assert count == len(tapped) and values[TABLE_HEAD + count] == launch.grid[0] and stored == tp.c
    channel_stride, interleaved = values[TABLE_HEAD - 2:TABLE_HEAD]
    assert channel_stride == (1 if layout == "NHWC" else tp.h * tp.w)
    firsts = values[TABLE_HEAD:TABLE_HEAD + 1 + count]
    tiles = [math.ceil(ph.problem.n * ph.problem.ho * ph.problem.wo / plan.gemm.config.bm) for ph in tapped]
    assert [b - a for a, b in zip(firsts, firsts[1:])] == tiles
    # Phases of as many tiles take turns along the grid; every (phase, tile) is one block's.
    assert interleaved == (len(set(tiles)) == 1)
    assert sorted(phase_tiles_of_blocks(values)) == [(p, t) for p in range(count) for t in range(tiles[p])]
    assert launch.args[9:13] == (tp.k, tp.hy, tp.wy, channels) and launch.args[-3] == plan.gemm.splits
    reduced, per_group, gemm_per_group = tp.k // groups, tp.c // groups, channels // groups
    assert pw.args[0] == Pointer(WEIGHT) and pw.args[1].operand == WORKSPACE
    replay_phase_weights(pw.args[2:], weight, workspace[pw.args[1].offset // item:])
    for p, ph in enumerate(tapped):  # each phase's weight as run_phases slices it, KHWC; widened rows unwritten
        expected = conv_transpose.swapped_weight(weight, tp)[:, :, ph.rows.tap_slice, ph.cols.tap_slice]
        got = workspace[weight_offset[p]:weight_offset[p] + channels * kh[p] * kw[p] * reduced]
        got = got.reshape(channels, kh[p], kw[p], reduced)
        np.testing.assert_array_equal(got[:tp.c], expected.transpose(0, 2, 3, 1))
        assert np.isnan(got[tp.c:]).all()
    target = launch.args[3]
    sums = np.full(math.prod(tp.out_array_shape), np.nan)
    for p, (offsets, image, oh, ow) in phases_written(launch).items():
        w_p = workspace[weight_offset[p]:weight_offset[p] + channels * kh[p] * kw[p] * reduced]
        w_p = w_p.reshape(channels, kh[p], kw[p], reduced)
        acc = np.zeros((len(offsets), channels))
        for r, s_ in itertools.product(range(kh[p]), range(kw[p])):
            ih, iw = oh - pt[p] + r * dh[p], ow - pl[p] + s_ * dw[p]
            inside = (ih >= 0) & (ih < tp.hy) & (iw >= 0) & (iw < tp.wy)
            taps = np.where(inside[:, None], y[image, ih.clip(0, tp.hy - 1), iw.clip(0, tp.wy - 1)], 0.0)
            for g in range(groups):
                acc[:, g * gemm_per_group:(g + 1) * gemm_per_group] += \
                    taps[:, g * reduced:(g + 1) * reduced] @ w_p[g * gemm_per_group:(g + 1) * gemm_per_group, r, s_].T
        index = offsets[:, None] + np.arange(stored) * channel_stride  # the channels the epilogue stores
        assert np.isnan(sums[index]).all(), "a pixel written twice"
        sums[index] = acc[:, :stored]
    assert per_group * groups == stored
    if plan.gemm.splits > 1:  # the reduction adds the bias to every element, the fills overwrite theirs
        reduce = kernels.index(PHASES_KERNEL) + 1
        assert target.operand == WORKSPACE and launch.args[4] == 0 and kernels[reduce] == "split_k_reduce"
        assert call.launches[reduce].args[-3:] == (math.prod(tp.out_array_shape), tp.c, channel_stride)
    else:
        assert target == Pointer(OUT) and launch.args[4] == 1
    channel_of = np.arange(sums.size) // channel_stride % tp.c  # each output element's channel
    out = sums + bias[channel_of]
    for fill in call.launches:
        if fill.kernel == conv_transpose.STRIDED_FILL:
            offsets = fill.args[1].offset // item + box_offsets(fill)
            assert np.isnan(sums[offsets]).all()
            out[offsets] = bias[channel_of[offsets]] if fill.args[2] else 0.0
    if layout == "NCHW":
        y = y.transpose(0, 3, 1, 2)
    expected = conv_transpose.transposed(y, weight, bias, dataclasses.replace(tp, dtype="float64"), "numpy")
    np.testing.assert_allclose(out.reshape(tp.out_array_shape), expected, rtol=1e-10, atol=1e-10)


#: Transposed convolutions whose kernel is their stride (NHWC): y (n, hy, wy, k), weight (k, c, sh, sw).
STACKED_CASES = [((2, 9, 7, 64), (64, 128, 2, 2)), ((1, 6, 5, 64), (64, 256, 3, 2))]


@pytest.mark.parametrize("bias", (False, True))
@pytest.mark.parametrize("dtype", ("float16", "float32"))
@pytest.mark.parametrize("config", ("nhwc_wgmma_producer_m128n128", "nhwc_wgmma_producer_m256n128",
                                    "nhwc_wgmma_producer_m256n64"))
@pytest.mark.parametrize("y_shape,weight_shape", STACKED_CASES, ids=str)
def test_stacked_phases_replayed(y_shape, weight_shape, config, dtype, bias):
    """A transposed convolution whose kernel is its stride runs as one GEMM of y and its phases' weights
    stacked, on a producer tile (implicit_gemm_nhwc_tma_stacked): replayed in NumPy from the launches' own
    arguments (phase_weights' stacked weights, the bias repeated a phase, the PhaseTable's placements by
    channel tile), it gives the NumPy conv_transpose2d and writes every output element once."""
    from cupyconv.families import implicit_gemm_nhwc

    n, hy, wy, k = y_shape
    c, stride = weight_shape[1], weight_shape[2:]
    tp = conv_transpose.make_transpose_problem(y_shape, weight_shape, (c,) if bias else None, dtype, stride, 0, 0,
                                               1, 1, "NHWC")
    problem = conv_transpose.stacked_problem(tp)
    count = stride[0] * stride[1]
    assert (problem.c, problem.h, problem.w, problem.k, problem.kh) == (k, hy, wy, count * c, 1)
    gemm = implicit_gemm_nhwc.stacked_plan(problem, count, 90, config)
    assert gemm.config.name == config and gemm.kernel == implicit_gemm_nhwc.STACKED_KERNEL
    call = conv_transpose.program(conv_transpose.TransposePlan(c, (), stacked=gemm), tp)
    check_launches(call, {X, WEIGHT, BIAS, WORKSPACE, RESIDUAL, INPUT_SCALE}, {OUT, WORKSPACE})
    (launch,) = [each for each in call.launches if each.kernel == implicit_gemm_nhwc.STACKED_KERNEL]
    (pw,) = [each for each in call.launches if each.kernel == conv_transpose.PHASE_WEIGHTS]
    item = STORAGE_BYTES[dtype]
    rng = np.random.default_rng(3)
    y, weight, b = rng.standard_normal(y_shape), rng.standard_normal(weight_shape), rng.standard_normal(c)
    workspace = np.full(call.workspace_bytes // item, np.nan)
    assert pw.args[1] == Pointer(WORKSPACE)
    replay_phase_weights(pw.args[2:], weight, workspace)
    stacked = workspace[:count * c * k].reshape(count * c, k)  # [phases C][K], no element left unwritten
    assert not np.isnan(stacked).any()
    weight_map = launch.args[-4]
    assert weight_map.pointer == Pointer(WORKSPACE) and (weight_map.rows, weight_map.columns) == (count * c, k)
    assert launch.args[0] == Pointer(X) or launch.args[0].operand == WORKSPACE  # y, or its rounded copy
    repeated = np.zeros(count * c)
    if bias:  # the bias read once a phase (a stride of 0 along the phases) into [phases][C]
        (copy,) = [each for each in call.launches if each.kernel == conv_transpose.STRIDED_COPY]
        assert copy.args[0] == Pointer(BIAS) and launch.args[2] == copy.args[1]
        assert copy.args[2:] == (count, 1, 1, c, 0, 1, 1, 1, c, 1, 1, 1)
        at = copy.args[1].offset // item + box_offsets(copy)
        assert np.isnan(workspace[at]).all() and sorted(at - at.min()) == list(range(count * c))
        repeated = np.tile(b, count)
    assert launch.args[4] == int(bias)
    values = launch.args[-1].values
    assert values[0] == count and values[1] == count * c and values[TABLE_HEAD - 1] == 0  # channel tiles place
    _, h, w, _ = tp.out_array_shape
    image_stride, row_stride, column_stride, channel_stride = values[2:6]
    assert (image_stride, row_stride, column_stride, channel_stride) == (h * w * c, stride[0] * w * c,
                                                                         stride[1] * c, 1)
    out_offset = values[TABLE_HEAD + MAX_PHASES + 1 + 9 * MAX_PHASES:][:count]
    assert c % gemm.config.bn == 0  # a channel tile lies in one phase
    image, i, j = (a.ravel() for a in np.meshgrid(np.arange(n), np.arange(hy), np.arange(wy), indexing="ij"))
    pixel = image * image_stride + i * row_stride + j * column_stride
    channel = np.arange(count * c)
    at = np.asarray(out_offset)[channel // c][None, :] + pixel[:, None] + channel[None, :]
    out = np.full(math.prod(tp.out_array_shape), np.nan)
    assert at.min() >= 0 and len(np.unique(at)) == at.size == out.size  # every element written once
    out[at] = y.reshape(-1, k) @ stacked.T + repeated
    expected = conv_transpose.transposed(y, weight, b if bias else None, dataclasses.replace(tp, dtype="float64"),
                                         "numpy")
    np.testing.assert_allclose(out.reshape(tp.out_array_shape), expected, rtol=1e-10, atol=1e-10)


def test_stacked_phases_take_the_suites_up_sampling():
    """The transposed suite's 2x2 up-sampling layers run as stacked phases on sm_90 where the GEMM takes a
    producer tile (instances the compile test covers): both in TF32; in 16 bits neither (their biased stacked
    GEMMs take the ping-pong tile, as unbiased ones do, and the phase launch); kernels unlike their strides and
    NCHW arrays never."""
    from cupyconv.bench_grad import TRANSPOSED
    from cupyconv.families import implicit_gemm_nhwc

    compiled = set(implicit_gemm_nhwc.arch_specialisations()[implicit_gemm_nhwc.WGMMA_ARCH])
    for name, n, c_in, c_out, hy, wy, k, stride, padding, output_padding in TRANSPOSED:
        for dtype, layout in itertools.product(("float16", "bfloat16", "float32"), ("NHWC", "NCHW")):
            y_shape = (n, hy, wy, c_in) if layout == "NHWC" else (n, c_in, hy, wy)
            tp = conv_transpose.make_transpose_problem(y_shape, (c_in, c_out, k, k), (c_out,), dtype, stride, padding,
                                                       output_padding, 1, 1, layout)
            plan = conv_transpose.transpose_plan(tp, True, 90, max(tp.c, 8))
            takes = name.startswith("unet_up") and layout == "NHWC" and dtype == "float32"
            assert (plan.stacked is not None) == takes, (name, dtype, layout)
            if plan.stacked is not None:
                (launch,) = [each for each in conv_transpose.program(plan, tp).launches
                             if each.kernel == implicit_gemm_nhwc.STACKED_KERNEL]
                assert launch.name_expression in compiled


def struct_ints(filename: str, struct: str, constants: dict[str, int]) -> int:
    """The number of ints in ``struct`` of kernels/``filename``, after checking that the .cu defines
    ``constants`` (name -> value) as the Python side does."""
    source = kernel_source(filename)
    for name, value in constants.items():
        assert re.search(rf"constexpr int {name} = (\d+);", source).group(1) == str(value), name
    body = re.search(rf"struct {struct} \{{(.*?)\}};", source, re.S).group(1)
    sizes = re.findall(r"\w+(?:\[([^\]]+)\])?\s*[,;]", body.replace("int ", " "))
    return sum(eval(size, dict(constants)) if size else 1 for size in sizes)


@pytest.mark.parametrize("layout", ("NHWC", "NCHW"))
@pytest.mark.parametrize("dtype", ("float16", "float32"))
@pytest.mark.parametrize("cc", (0, 90))
def test_phase_launch_plans_name_instances_that_are_compiled(dtype, cc, layout):
    """On the transposed suite's layers and the phase cases, the one-launch route (and the stacked phases'
    GEMM) runs only instances the compile test covers (no producer tile in the phase launch; in TF32 not
    the 3-stage pixel-row tile where the kernel rounds y, which spills there)."""
    from cupyconv.bench_grad import TRANSPOSED
    from cupyconv.families import implicit_gemm_nhwc

    compiled = set(implicit_gemm_nhwc.specialisations()) | set(implicit_gemm_nhwc.arch_specialisations()[
        implicit_gemm_nhwc.WGMMA_ARCH])
    cases = [((n, h, w, c_in), (c_in, c_out, k, k), stride, padding, output_padding, 1, 1)
             for _, n, c_in, c_out, h, w, k, stride, padding, output_padding in TRANSPOSED] + PHASE_CASES
    planned = 0
    for (n, hy, wy, k), weight_shape, stride, padding, output_padding, groups, dilation in cases:
        y_shape = (n, hy, wy, k) if layout == "NHWC" else (n, k, hy, wy)
        tp = conv_transpose.make_transpose_problem(y_shape, weight_shape, None, dtype, stride, padding, output_padding,
                                                   groups, dilation, layout)
        plan = conv_transpose.transpose_plan(tp, True, cc, max(tp.c, 8) if groups == 1 else tp.c)
        for launch in conv_transpose.program(plan, tp).launches if plan.gemm or plan.stacked else ():
            if launch.kernel in (PHASES_KERNEL, implicit_gemm_nhwc.STACKED_KERNEL):
                assert launch.name_expression in compiled, (y_shape, weight_shape, launch.name_expression)
                planned += 1
    assert planned >= len(cases) - 2  # all but the suite's 1x1-input layer and its RGB layer in TF32


def test_tables_have_the_kernel_structs_fields():
    """The Tables the one-launch route passes are PhaseTable (kernels/implicit_gemm_nhwc.cu) and PhaseTaps
    (kernels/phase_weight.cu), int for int."""
    tp = conv_transpose.make_transpose_problem(*PHASE_CASES[0][:2], None, "float16", *PHASE_CASES[0][2:], "NHWC")
    call = conv_transpose.program(conv_transpose.transpose_plan(tp, False, 90, tp.c), tp)
    tables = {launch.kernel: launch.args[-1] for launch in call.launches}
    assert len(tables[PHASES_KERNEL].values) == struct_ints("implicit_gemm_nhwc.cu", "PhaseTable",
                                                             {"MAX_PHASES": MAX_PHASES}) > MAX_PHASES
    constants = {"MAX_PHASE_TAPS": conv_transpose.MAX_PHASE_TAPS, "MAX_WEIGHT_PHASES": conv_transpose.MAX_WEIGHT_PHASES}
    assert len(tables[conv_transpose.PHASE_WEIGHTS].values) == struct_ints("phase_weight.cu", "PhaseTaps", constants)
