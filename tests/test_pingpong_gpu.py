"""The ping-pong tile (families/implicit_gemm_nhwc.py PINGPONG_CONFIG) on the GPU: 16-bit and TF32 NHWC layers (1x1
ones read as matrices, the others by im2col copies)
against torch in float64 with NaN-poisoned outputs -- partial pixel and channel tiles, reductions of one
to eight k tiles, bias, residual and activations, and grids of a few blocks whose two consumer
warpgroups take many tiles in turns (the ring's phases wrap many times) -- and the same bits run after
run."""
import dataclasses

import pytest

from cases import Case
from checks import relative_error
from devices import gpu_count

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_count(), reason="needs a CUDA GPU (cupy finds none)")]
torch = pytest.importorskip("torch", reason="the GPU tests compare with torch")
cupy = pytest.importorskip("cupy")

from cupyconv import planner  # noqa: E402
from cupyconv.compiler import compute_capability  # noqa: E402
from cupyconv.families import implicit_gemm_nhwc  # noqa: E402
from test_epilogue_gpu import problem_of, reference, run, tensors  # noqa: E402

if gpu_count() and compute_capability() != 90:
    pytestmark.append(pytest.mark.skip(reason="the ping-pong tile is wgmma's: compute capability 9.0 (sm_90a) alone"))

CASES = [
    Case(2, 128, 136, 12, 12, 1, 1),             # 288 pixels (a partial tile), K 136: a partial channel tile
    Case(3, 64, 200, 7, 9, 1, 1, bias=False),    # one k tile a tile: the consumers' stages interleave
    Case(4, 256, 256, 14, 14, 1, 1),             # 784 pixels, 4 k tiles (the ring's depth)
    Case(1, 512, 64, 5, 5, 1, 1),                # 8 k tiles, one channel tile narrower than the tile
    Case(2, 96, 128, 10, 10, 1, 1),              # 96 channels: the second k tile half zeros (TMA's fill)
    Case(2, 64, 136, 11, 13, 3, 3, padding=1),   # im2col: 9 taps of one k tile, windows across rows and images
    Case(3, 128, 128, 9, 9, 3, 3, stride=2, padding=(1, 0), dilation=(1, 2)),  # strides, dilation, uneven padding
    Case(2, 64, 256, 15, 15, 1, 1, stride=2),    # a strided 1x1: im2col, one tap
]
EPILOGUES = [("none", False), ("relu", True), ("silu", True), ("relu", False)]
#: The dtypes of the tiles (float32: TF32, x rounded in the consumers' registers).
DTYPES = ["float32", "float16", "bfloat16"]
#: Relative error against float64: TF32's operands keep 10 bits of mantissa, 16 bits' 7-10.
TOLERANCE = {"float32": 2e-3, "float16": 1e-2, "bfloat16": 1e-2}


#: The 128- and 64-channel ping-pong tiles (4 and 7 stages: the rings' phases wrap at other k tiles).
WHOLE_TILES = [implicit_gemm_nhwc.PINGPONG_CONFIG, implicit_gemm_nhwc.PINGPONG_NARROW_CONFIG]


@pytest.mark.parametrize("config", WHOLE_TILES)
@pytest.mark.parametrize("blocks", [None, 1, 2, 3], ids=lambda b: "rules_grid" if b is None else f"{b}_blocks")
@pytest.mark.parametrize("epilogue", EPILOGUES, ids=[f"{a}-{'residual' if r else 'no_residual'}" for a, r in EPILOGUES])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_pingpong_against_float64(case, dtype, epilogue, blocks, config):
    """Every output written and within the dtype's tolerance, on the plan's grid and on grids of 1-3 persistent
    blocks (each consumer then takes every other of many tiles); a second run gives the same bits."""
    check_forced(case, dtype, epilogue, blocks, None, seed=case.c + case.k + len(epilogue[0]), config=config)


#: The ping-pong tiles 64 pixels tall: 128 channels (7 stages; float32 6) and 64 (12; float32 11); no residual
#: instance.
PIXEL_64_TILES = [implicit_gemm_nhwc.PINGPONG_64_PIXEL_CONFIG, implicit_gemm_nhwc.PINGPONG_SMALL_CONFIG]


@pytest.mark.parametrize("config", PIXEL_64_TILES)
@pytest.mark.parametrize("blocks", [None, 1, 3], ids=lambda b: "rules_grid" if b is None else f"{b}_blocks")
@pytest.mark.parametrize("epilogue", [e for e in EPILOGUES if not e[1]], ids=lambda e: e[0])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_pingpong_64_pixels_against_float64(case, dtype, epilogue, blocks, config):
    """The tiles 64 pixels tall (one 64-row half a consumer, rings of 8 KB input boxes): every output written,
    within the dtype's tolerance, the same bits twice, on their grid and on 1-3 blocks."""
    check_forced(case, dtype, epilogue, blocks, None, seed=case.c + case.k + 7, config=config)


def check_forced(case, dtype, epilogue, blocks, splits, seed, config=implicit_gemm_nhwc.PINGPONG_CONFIG):
    """The ping-pong tile forced (``splits`` runs; None: as the rules would split it), on ``blocks`` persistent
    blocks (None: the plan's grid): every output written, within the dtype's tolerance, the same bits twice."""
    activation, residual = epilogue
    problem = problem_of(case, dtype, "NHWC", "KHWC", activation, residual)
    plan = planner.make_plan(problem, config=config, kernel=planner.NHWC_KERNEL, compute_capability=90, splits=splits)
    assert splits is None or plan.splits == splits
    if blocks is not None:
        plan = dataclasses.replace(plan, grid=(blocks, 1, 1))
    x, weight, bias, r = tensors(case, problem, dtype, seed=seed)
    r = r if residual else None
    out = run(plan, problem, x, weight, bias, r)
    assert not out.isnan().any(), f"an output element was never written: {plan}"
    assert relative_error(out, reference(case, x, weight, bias, r, activation)) < TOLERANCE[dtype], str(plan)
    again = run(plan, problem, x, weight, bias, r)
    assert torch.equal(out, again), "two runs gave different bits"


def test_pingpong_residual_as_output():
    """The residual may be the output itself (ResNet's fused expansions write over it)."""
    case = CASES[2]
    problem = problem_of(case, "float16", "NHWC", "KHWC", "relu", True)
    plan = planner.make_plan(problem, config=implicit_gemm_nhwc.PINGPONG_CONFIG, kernel=planner.NHWC_KERNEL,
                             compute_capability=90)
    x, weight, bias, r = tensors(case, problem, "float16", seed=5)
    wanted = reference(case, x, weight, bias, r, "relu")
    out = run(plan, problem, x, weight, bias, r.clone(), in_place=True)
    assert relative_error(out, wanted) < 1e-2


SPLIT_CASES = [CASES[3], CASES[5], CASES[6], Case(2, 512, 256, 7, 7, 3, 3, padding=1)]


@pytest.mark.parametrize("blocks", [None, 1, 3], ids=lambda b: "rules_grid" if b is None else f"{b}_blocks")
@pytest.mark.parametrize("splits", [2, 3, 5, 12])
@pytest.mark.parametrize("epilogue", EPILOGUES[:3], ids=[f"{a}-{'residual' if r else 'no_residual'}"
                                                          for a, r in EPILOGUES[:3]])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", SPLIT_CASES, ids=lambda c: c.id)
def test_pingpong_split_k_against_float64(case, dtype, epilogue, splits, blocks):
    """Split-K's runs as work items: runs of unequal length, and empty ones (5 runs of 8 k tiles: 2, 2, 2,
    2, 0; 12 runs of 9), on one to three blocks and the plan's grid, bias, residual and activation added by
    the reduction; the same bits on a second run."""
    check_forced(case, dtype, epilogue, blocks, splits, seed=case.c + splits + len(epilogue[0]))


@pytest.mark.parametrize("splits", [2, 5])
@pytest.mark.parametrize("case", SPLIT_CASES, ids=lambda c: c.id)
@pytest.mark.parametrize("config,dtype", [(implicit_gemm_nhwc.PINGPONG_NARROW_CONFIG, d) for d in DTYPES] +
                         [(c, d) for c in PIXEL_64_TILES for d in DTYPES])
def test_pingpong_narrow_split_k_against_float64(case, dtype, splits, config):
    """The 64-channel and 64-pixel tiles' split-K instances: their runs' sums added by the reduction with bias
    and ReLU, and with a residual (the 64-pixel tiles' only way to one)."""
    check_forced(case, dtype, ("relu", False), None, splits, seed=case.k + splits, config=config)
    if config in PIXEL_64_TILES:
        check_forced(case, dtype, ("relu", True), None, splits, seed=case.k + splits + 1, config=config)


@pytest.mark.parametrize("splits", implicit_gemm_nhwc.PINGPONG_CLUSTER_SPLITS)
@pytest.mark.parametrize("epilogue", EPILOGUES, ids=[f"{a}-{'residual' if r else 'no_residual'}" for a, r in EPILOGUES])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", SPLIT_CASES, ids=lambda c: c.id)
def test_pingpong_split_k_in_clusters_against_float64(case, dtype, epilogue, splits):
    """Clusters of 2-8 blocks adding their runs' sums through distributed shared memory (runs of one k tile
    at 8 of 8; partial pixel tiles; bias, residual and activation in the kernel); the same bits twice."""
    check_forced(case, dtype, epilogue, None, splits, seed=case.k + splits + len(epilogue[0]),
                 config=implicit_gemm_nhwc.PINGPONG_CLUSTER_CONFIG)


@pytest.mark.parametrize("epilogue", EPILOGUES[:2], ids=["none", "relu-residual"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_pingpong_narrow_few_output_channels_against_float64(dtype, epilogue):
    """The 64-channel tile on a 1x1 layer of 24 output channels and 144 input channels (MobileNetV2's projection,
    which the TF32 rules give it): the tile's columns past K never stored, TMA's zeros past C in the last k tile."""
    check_forced(Case(2, 144, 24, 9, 11, 1, 1), dtype, epilogue, None, None, seed=23,
                 config=implicit_gemm_nhwc.PINGPONG_NARROW_CONFIG)


#: Outputs that fill part of their last channel tile, on the ping-pong tiles the fixed rules give them (MobileNetV2's
#: and EfficientNet-B0's projections; implicit_gemm_nhwc.pingpong_small_pays and PINGPONG_NARROW_K_TILES).
PARTIAL_RULE_CASES = [(Case(8, 384, 96, 14, 14, 1, 1, bias=False), implicit_gemm_nhwc.PINGPONG_SMALL_CONFIG),
                      (Case(32, 960, 160, 7, 7, 1, 1, bias=False), implicit_gemm_nhwc.PINGPONG_SMALL_CONFIG),
                      (Case(8, 240, 80, 14, 14, 1, 1, bias=False), implicit_gemm_nhwc.PINGPONG_SMALL_CONFIG),
                      (Case(32, 384, 96, 14, 14, 1, 1, bias=False), implicit_gemm_nhwc.PINGPONG_NARROW_CONFIG)]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case,config", PARTIAL_RULE_CASES, ids=lambda v: getattr(v, "id", v))
def test_pingpong_rules_partial_channel_tiles_against_float64(case, config, dtype):
    """The rules' plan of a layer whose last channel tile is partly used (no bias: a model's convolution before batch
    norm; a bias is an epilogue the rules give other tiles): that tile's unused columns never stored."""
    problem = problem_of(case, dtype, "NHWC", "KHWC", "none", False)
    plan = planner.make_plan(problem, compute_capability=90)
    assert plan.config.name == config and plan.splits == 1, str(plan)
    x, weight, bias, _ = tensors(case, problem, dtype, seed=case.c + case.k)
    out = run(plan, problem, x, weight, bias, None)
    assert not out.isnan().any(), f"an output element was never written: {plan}"
    assert relative_error(out, reference(case, x, weight, bias, None, "none")) < TOLERANCE[dtype], str(plan)


#: A 3x3 layer of 98 tiles of 128 x 128, which the TF32 128-channel tiles read from a rounded copy of x (A from shared
#: memory; implicit_gemm_nhwc.PINGPONG_TF32_COPY_MIN_TILES), whole and in clusters of 2.
COPY_CASE = Case(8, 64, 256, 28, 28, 3, 3, padding=1)


@pytest.mark.parametrize("config,splits", [(implicit_gemm_nhwc.PINGPONG_CONFIG, None),
                                           (implicit_gemm_nhwc.PINGPONG_CONFIG, 3),
                                           (implicit_gemm_nhwc.PINGPONG_CLUSTER_CONFIG, 2)])
@pytest.mark.parametrize("epilogue", EPILOGUES[:2], ids=["none", "relu-residual"])
def test_pingpong_tf32_on_a_rounded_copy_against_float64(config, splits, epilogue):
    """float32 x copied rounded to TF32 and multiplied from shared memory (no ROUND_A): within TF32's tolerance,
    every output written, the same bits twice."""
    problem = problem_of(COPY_CASE, "float32", "NHWC", "KHWC", *epilogue)
    plan = planner.make_plan(problem, config=config, kernel=planner.NHWC_KERNEL, compute_capability=90, splits=splits)
    assert not plan.round_a and implicit_gemm_nhwc.program(plan, problem).launches[0].kernel == \
        implicit_gemm_nhwc.PAD_CHANNELS, str(plan)
    check_forced(COPY_CASE, "float32", epilogue, None, splits, seed=17, config=config)


#: Two taps a k tile (implicit_gemm_nhwc.taps_per_k_tile: 16-bit layers of 32 channels by im2col copies): an odd
#: number of taps (the last k tile's second half neither copied nor multiplied), an even number with strides,
#: dilation and a partial channel tile, and one tap (a strided 1x1).
PAIRED_TAP_CASES = [Case(2, 32, 64, 13, 17, 5, 9, padding=(2, 4)),
                    Case(3, 32, 136, 11, 9, 3, 4, stride=2, padding=1, dilation=(1, 2)),
                    Case(2, 32, 64, 15, 15, 1, 1, stride=2)]


@pytest.mark.parametrize("config", implicit_gemm_nhwc.PAIRED_TAP_CONFIGS)
@pytest.mark.parametrize("blocks", [None, 1, 3], ids=lambda b: "rules_grid" if b is None else f"{b}_blocks")
@pytest.mark.parametrize("epilogue", EPILOGUES, ids=[f"{a}-{'residual' if r else 'no_residual'}" for a, r in EPILOGUES])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", PAIRED_TAP_CASES, ids=lambda c: c.id)
def test_pingpong_two_taps_a_k_tile_against_float64(case, dtype, epilogue, blocks, config):
    """Two taps' 64-byte pixels a k tile: every output written, within the dtype's tolerance, the same bits twice,
    on the plan's grid and on 1-3 blocks (the ring's stages refilled across tiles)."""
    problem = problem_of(case, dtype, "NHWC", "KHWC", *epilogue)
    assert planner.make_plan(problem, config=config, kernel=planner.NHWC_KERNEL,
                             compute_capability=90).taps_per_k_tile == 2
    check_forced(case, dtype, epilogue, blocks, None, seed=case.k + case.kw + len(epilogue[0]), config=config)


@pytest.mark.parametrize("config", implicit_gemm_nhwc.PAIRED_TAP_CONFIGS)
def test_pingpong_two_taps_odd_last_tap_reads_nothing_stale(config):
    """An infinite input pixel makes infinities or NaNs in exactly the outputs whose windows hold it, as in torch's
    float64: the odd last k tile's second half, multiplied by the weight's zero columns, holds that tile's own tap
    again (an earlier tile's pixels there, inf x 0 would make NaNs elsewhere)."""
    check_inf_reaches_its_windows_alone(PAIRED_TAP_CASES[0], config, (1, 5, 6, 8), seed=31)


def check_inf_reaches_its_windows_alone(case, config, at, seed):
    """fp16, ``config`` forced on 2 blocks, an inf at x[``at``] (N, C, H, W): non-finite outputs exactly where torch's
    float64 has them, the others within tolerance."""
    problem = problem_of(case, "float16", "NHWC", "KHWC", "none", False)
    plan = dataclasses.replace(planner.make_plan(problem, config=config, kernel=planner.NHWC_KERNEL,
                                                 compute_capability=90), grid=(2, 1, 1))
    x, weight, bias, _ = tensors(case, problem, "float16", seed=seed)
    x[at] = float("inf")
    out = run(plan, problem, x, weight, bias, None)
    wanted = reference(case, x, weight, bias, None, "none")
    assert torch.equal(out.isfinite(), wanted.isfinite()), str(plan)
    finite = wanted.isfinite()
    assert relative_error(out[finite], wanted[finite]) < TOLERANCE["float16"], str(plan)


@pytest.mark.parametrize("config", WHOLE_TILES)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", [CASES[5], PAIRED_TAP_CASES[0]], ids=lambda c: c.id)
def test_pingpong_gelu_against_float64(case, dtype, config):
    """gelu without a residual on the 128-pixel tiles (16 bits: their float sums staged a 64-row half at a time,
    where its erf on every sum at once spilled), one tap and two a k tile."""
    check_forced(case, dtype, ("gelu", False), None, None, seed=case.k + 3, config=config)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("k", [64, 128])
def test_pingpong_rules_strips_or_two_taps_against_float64(k, dtype):
    """The fixed rules' plans for a 3x3 of 32 channels on 96^2 at batch 8: the pixel strips for 64 output channels
    (pixel_strips_config), two taps a k tile on the 128 x 128 tile for 128 (paired_taps_config): every output
    written, within the dtype's tolerance."""
    case = Case(8, 32, k, 96, 96, 3, 3, padding=1, bias=False)
    problem = problem_of(case, dtype, "NHWC", "KHWC", "none", False)
    plan = planner.make_plan(problem, compute_capability=90)
    assert plan.taps_per_k_tile == (implicit_gemm_nhwc.PIXEL_STRIPS if k == 64 else 2), str(plan)
    x, weight, bias, _ = tensors(case, problem, dtype, seed=k)
    out = run(plan, problem, x, weight, bias, None)
    assert not out.isnan().any(), f"an output element was never written: {plan}"
    assert relative_error(out, reference(case, x, weight, bias, None, "none")) < TOLERANCE[dtype], str(plan)


STRIPS, WIDE_STRIPS = implicit_gemm_nhwc.PIXEL_STRIPS_CONFIG, implicit_gemm_nhwc.PIXEL_STRIPS_WIDE_CONFIG
#: Pixel strips (implicit_gemm_nhwc.PIXEL_STRIPS_CONFIGS: 16-bit layers of 32 or 64 channels, stride 1 and no dilation
#: along w), with the tile that runs each: output rows of 70 pixels (a segment of 64 and one of 6, the last tile's
#: second half past the last segment), padding on both sides; 5x9 (5x5 in 64 channels) unpadded on rows of 32 pixels;
#: stride and dilation along h, an even kw, a partial channel tile; the widest kw with padding (in 64 channels on the
#: 2-stage tile, and a 5x7 there).
PIXEL_STRIP_CASES = [(Case(2, 32, 64, 13, 70, 3, 3, padding=1), STRIPS),
                     (Case(3, 32, 64, 12, 40, 5, 9), STRIPS),
                     (Case(3, 32, 136, 11, 9, 3, 4, stride=(2, 1), padding=(1, 2), dilation=(2, 1)), STRIPS),
                     (Case(2, 32, 72, 9, 131, 2, 11, padding=(1, 5), bias=False), STRIPS),
                     (Case(2, 64, 64, 13, 70, 3, 3, padding=1), STRIPS),
                     (Case(3, 64, 64, 12, 40, 5, 5), STRIPS),
                     (Case(3, 64, 136, 11, 9, 3, 4, stride=(2, 1), padding=(1, 2), dilation=(2, 1)), STRIPS),
                     (Case(2, 64, 72, 9, 131, 2, 9, padding=(1, 4), bias=False), WIDE_STRIPS),
                     (Case(2, 64, 64, 12, 40, 5, 7), WIDE_STRIPS)]


@pytest.mark.parametrize("blocks", [None, 1, 3], ids=lambda b: "rules_grid" if b is None else f"{b}_blocks")
@pytest.mark.parametrize("epilogue", EPILOGUES + [("gelu", False)],
                         ids=[f"{a}-{'residual' if r else 'no_residual'}" for a, r in EPILOGUES + [("gelu", False)]])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case,config", PIXEL_STRIP_CASES, ids=lambda v: v.id if isinstance(v, Case) else v)
def test_pingpong_pixel_strips_against_float64(case, config, dtype, epilogue, blocks):
    """A kernel row's taps read from one strip of pixels a 64-pixel half: every output written (segments that end
    rows early, tiles past the last segment), within the dtype's tolerance, the same bits twice, on the plan's grid
    and on 1-3 blocks."""
    problem = problem_of(case, dtype, "NHWC", "KHWC", *epilogue)
    assert planner.make_plan(problem, config=config, kernel=planner.NHWC_KERNEL,
                             compute_capability=90).taps_per_k_tile == implicit_gemm_nhwc.PIXEL_STRIPS
    check_forced(case, dtype, epilogue, blocks, None, seed=case.k + case.kw + len(epilogue[0]), config=config)


@pytest.mark.parametrize("case,config", [PIXEL_STRIP_CASES[1], PIXEL_STRIP_CASES[8]], ids=["c32_5x9", "c64_5x7"])
def test_pingpong_pixel_strips_inf_reaches_its_windows_alone(case, config):
    """An infinite input pixel makes infinities or NaNs in exactly the outputs whose windows hold it: a strip's rows
    past its taps' reach and (32 channels) an odd kw's half k row of the next kernel row's weight are never
    multiplied."""
    check_inf_reaches_its_windows_alone(case, config, (1, 5, 6, 30), seed=37)
