"""The tensor-core weight gradient's plan, without a GPU: the channels and pieces it reads (copies only
where NCHW or channel counts need them), the tile choice, the split-K runs and their limits, the
refusals and the printed plan. The kernel's results are checked on the GPU (test_grad_gpu.py)."""
import math

import pytest

from cupyconv import wgrad, wgrad_tensor_cores as tc
from cupyconv.arguments import make_problem
from cupyconv.program import GRAD_OUTPUT, OUT, X, Pointer


def _problem(n, c, k, hw, kernel, dtype="float16", stride=1, padding=0, layout="NHWC", groups=1):
    x = (n, hw, hw, c) if layout == "NHWC" else (n, c, hw, hw)
    w = (k, kernel, kernel, c // groups) if layout == "NHWC" else (k, c // groups, kernel, kernel)
    weight_layout = "KHWC" if layout == "NHWC" else "KCHW"
    return make_problem(x, w, None, dtype, stride, padding, 1, groups, layout, weight_layout)


@pytest.mark.parametrize("dtype,c,k,expected", [
    ("float16", 64, 64, (64, 64, 16, "", "")),
    ("float16", 3, 64, (4, 64, 8, "pad", "")),       # the stem: 4 channels in 8-byte pieces, not 8 in 16
    ("float16", 12, 64, (12, 64, 8, "", "")),        # 24 bytes: whole 8-byte pieces, no copy
    ("float16", 6, 3, (8, 8, 16, "pad", "pad")),      # 16-byte pieces cost no more channels than 8-byte ones
    ("bfloat16", 5, 12, (8, 16, 16, "pad", "pad")),
    ("float32", 3, 64, (3, 64, 4, "", "")),          # float32 reads any channel count in 4-byte pieces
    ("float32", 64, 6, (64, 8, 16, "", "pad")),
])
def test_channels_and_copies(dtype, c, k, expected):
    plan = tc.make_plan(_problem(2, c, k, 9, 3, dtype, padding=1))
    assert (plan.channels, plan.out_channels, plan.x_vec, plan.x_copy, plan.dy_copy) == expected


def test_nchw_inputs_are_transposed():
    plan = tc.make_plan(_problem(2, 64, 64, 9, 3, layout="NCHW"))
    assert (plan.x_copy, plan.dy_copy, plan.weight_layout) == ("transpose", "transpose", "KCHW")


def test_tiles_fit_the_gemm():
    assert tc.make_plan(_problem(32, 256, 256, 56, 3)).config.name == "tc_m128j128"  # long: the largest tile
    assert tc.make_plan(_problem(32, 64, 64, 112, 1)).config.name == "tc_m64j64"  # J = 64: half a 128 column
    assert tc.make_plan(_problem(8, 256, 256, 14, 3)).config.name != "tc_m128j128"  # short: more, smaller tiles


def test_runs_fill_the_gpu_and_respect_the_limits():
    plan = tc.make_plan(_problem(32, 64, 64, 56, 3, padding=1))
    tiles = plan.grid[0] * plan.grid[1]
    assert plan.splits == plan.grid[2] > 1 and tiles * plan.splits >= tc.MODEL_SMS // 2  # a few tiles, many runs
    assert math.ceil(32 * 56 * 56 / plan.config.bl) / plan.splits >= tc.MIN_RUN_TILES
    assert plan.workspace_bytes == plan.splits * 64 * 9 * 64 * 4
    assert tc.make_plan(_problem(1, 64, 64, 7, 1)).splits == 1   # 49 pixels: one l tile
    big = tc.make_plan(_problem(256, 512, 2048, 14, 3, padding=1))
    assert big.workspace_bytes <= wgrad.MAX_WORKSPACE_BYTES
    runs = tc.make_plan(_problem(32, 64, 64, 56, 3, padding=1), True, None, 5)
    assert runs.splits == 5 and runs.grid[2] == 5


def test_the_model_weighs_waves_against_runs():
    """A second wave of blocks costs a whole run's time; more runs cost partial sums."""
    problem = _problem(32, 256, 256, 14, 3, padding=1)
    cfg = tc.WGMMA_CONFIGS[0]
    tiles = math.prod(tc._tiles(problem, cfg))
    one_wave = cfg.blocks_per_sm * tc.MODEL_SMS // tiles
    assert tc._model_us(problem, cfg, one_wave) < tc._model_us(problem, cfg, one_wave + 1)
    assert tc._model_us(problem, cfg, one_wave) < tc._model_us(problem, cfg, 1)
    plan = tc.make_plan(problem, True, None, None, 90)
    assert plan.config.wgmma and "modelled time" in plan.reason


@pytest.mark.parametrize("splits", [0, True, 2.0, 70000])
def test_forced_splits_are_checked(splits):
    with pytest.raises(ValueError, match="splits"):
        tc.make_plan(_problem(2, 64, 64, 9, 3), True, None, splits)


def test_unknown_config_is_refused():
    with pytest.raises(ValueError, match="tc_m1j1"):
        tc.make_plan(_problem(2, 64, 64, 9, 3), True, "tc_m1j1")


@pytest.mark.parametrize("dtype,allow_tf32,groups,n,reason", [
    ("float32", False, 1, 2, "strict"),
    ("float64", True, 1, 2, "float64"),
    ("float16", False, 2, 2, "groups"),
    ("float16", False, 1, 0, "empty"),
])
def test_refusals(dtype, allow_tf32, groups, n, reason):
    problem = make_problem((n, 8, 9, 9), (8, 8 // groups, 3, 3), None, dtype, 1, 1, 1, groups)
    assert reason in tc.refusal(problem, allow_tf32)
    with pytest.raises(ValueError, match=reason):
        tc.make_plan(problem, allow_tf32)


def test_takes_16_bit_and_tf32():
    for dtype, tf32 in (("float16", False), ("bfloat16", False), ("float32", True)):
        assert tc.refusal(make_problem((3, 8, 9, 9), (8, 8, 3, 3), None, dtype, 2, 1), tf32) == ""


def test_large_tensors_take_64_bit_indices():
    assert tc.make_plan(_problem(2, 64, 64, 9, 3)).index_type == "int"
    assert tc.make_plan(_problem(64, 512, 64, 256, 1)).index_type == "long long"  # 2^31 elements of x


def test_every_plan_uses_a_listed_specialisation():
    listed = set(tc.specialisations())
    for dtype in ("float16", "bfloat16", "float32"):
        for c in (3, 12, 64):
            plan = tc.make_plan(_problem(2, c, 32, 9, 3, dtype))
            assert plan.expression in listed


def test_printed_plan_says_what_runs():
    text = str(tc.make_plan(_problem(2, 3, 64, 9, 3, layout="NCHW")))
    assert "wgrad_tensor_cores" in text and "transpose" in text and "why:" in text and "8-byte pieces" in text


def test_hopper_takes_wgmma_where_it_applies():
    listed = set(tc.arch_specialisations()[tc.WGMMA_ARCH])
    plan = tc.make_plan(_problem(32, 96, 256, 56, 3), True, None, None, 90)  # 96 channels: panels across taps
    assert plan.config.wgmma and not plan.config.tma and plan.arch == "sm_90a" and plan.expression in listed
    assert plan.config.name == "tc_wgmma_m256j128" and plan.shared_bytes == 4 * 64 * 384 * 2 + 1024
    assert not tc.make_plan(_problem(8, 12, 64, 14, 3), True, None, None, 90).config.wgmma  # 8-byte pieces
    tf32 = tc.make_plan(_problem(8, 40, 64, 14, 3, "float32"), True, None, None, 90)  # panels across taps
    assert not tf32.config.wgmma and tf32.arch == ""
    assert not tc.make_plan(_problem(8, 256, 256, 14, 3), True, None, None, 80).config.wgmma
    with pytest.raises(ValueError, match="tc_wgmma_m128j128"):
        tc.make_plan(_problem(8, 256, 256, 14, 3), True, "tc_wgmma_m128j128", None, 80)


def test_hopper_takes_the_tma_tiles_where_they_apply():
    """16-bit layers whose x panels lie in one tap and whose windows the im2col map walks take the TMA
    tiles on sm_90a: a launch with dy's 2-D map and x's im2col map, its expression listed."""
    from cupyconv.program import Im2colMap, TensorMap

    listed = set(tc.arch_specialisations()[tc.WGMMA_ARCH])
    problem = _problem(32, 256, 256, 56, 3, padding=1)
    plan = tc.make_plan(problem, True, None, None, 90)
    assert plan.config.tma and plan.arch == "sm_90a" and plan.expression in listed and "fed by TMA" in str(plan)
    assert plan.config.name == "tc_tma_m128j256" and plan.shared_bytes == 4 * 64 * 384 * 2 + 1024 + 64
    launch = next(launch for launch in tc.program(plan, problem).launches if launch.kernel == tc.TMA_KERNEL)
    dy_map, x_map = launch.args[-2:]
    assert isinstance(dy_map, TensorMap) and (dy_map.rows, dy_map.columns) == (32 * 56 * 56, 256)
    assert isinstance(x_map, Im2colMap) and x_map.shape == (32, 56, 56, 256) and x_map.lower == (-1, -1)
    assert x_map.upper == (-1, -1) and x_map.pixels_per_column == 64
    for applies, case in ((True, _problem(8, 96, 64, 14, 1)),                # one tap: a panel past C reads zeros
                          (True, _problem(8, 64, 64, 14, 1, stride=8)),
                          (False, _problem(8, 64, 64, 40, 1, stride=9)),      # past the im2col map's strides
                          (False, _problem(8, 64, 64, 40, 3, padding=130)),   # corners past its bounds
                          (False, _problem(8, 96, 64, 14, 3))):               # 96 channels: panels across taps
        assert tc.make_plan(case, True, None, None, 90).config.tma == applies, case
    assert not tc.make_plan(problem, True, None, None, 80).config.wgmma
    with pytest.raises(ValueError, match="tc_tma_m128j128"):
        tc.make_plan(problem, True, "tc_tma_m128j128", None, 80)


def test_tf32_takes_the_transposing_tma_tiles_where_they_apply():
    """float32 (TF32) layers whose 32-channel x panels lie in one tap take wgrad_tensor_cores_tma_tf32 on sm_90a:
    l tiles of 32 pixels, boxes of 32 channels, a transposing warpgroup (its threads, its landing stages in the
    shared memory); one run writes a KHWC weight in place. Elsewhere mma.sync's tiles, as before."""
    from cupyconv.program import Im2colMap, TensorMap

    listed = set(tc.arch_specialisations()[tc.WGMMA_ARCH])
    problem = _problem(32, 256, 256, 14, 3, "float32", padding=1)
    for cfg in tc.TF32_TMA_CONFIGS:
        plan = tc.make_plan(problem, True, cfg.name, 1, 90)
        assert plan.expression in listed and plan.direct and plan.workspace_bytes == 0
        assert plan.block == (2 * cfg.bm + 160, 1, 1)
        assert plan.grid == (256 * 9 // cfg.bj, 256 // cfg.bm, 1)
        stages = cfg.stages + cfg.landing
        # x's stages, and the landing stages of both (the warpgroups read dy where it landed)
        assert plan.shared_bytes == (cfg.stages * cfg.bj + cfg.landing * (cfg.bm + cfg.bj)) * 32 * 4 + 1024 + \
            16 * stages <= 227 * 1024
        (launch,) = tc.program(plan, problem).launches
        assert launch.kernel == tc.TF32_TMA_KERNEL and len(launch.args) == 22 and launch.args[2:4] == (1, 0)
        dy_map, x_map, x_tail_map = launch.args[-3:]
        assert x_tail_map == x_map  # the K-major tiles' parameter, unread here
        assert isinstance(dy_map, TensorMap) and (dy_map.box_rows, dy_map.box_columns) == (32, 32)
        assert isinstance(x_map, Im2colMap) and (x_map.channels_per_pixel, x_map.pixels_per_column) == (32, 32)
    chosen = tc.make_plan(problem, True, None, None, 90)
    assert chosen.config in tc.TF32_TMA_CONFIGS and "fed by TMA" in str(chosen)
    for applies, case in ((True, _problem(8, 96, 64, 14, 3, "float32")),   # 96 = 3 panels of 32
                          (True, _problem(8, 40, 64, 14, 1, "float32")),   # one tap: a panel past C reads zeros
                          (False, _problem(8, 48, 64, 14, 3, "float32")),  # 48: panels across taps
                          (False, _problem(8, 64, 64, 40, 1, "float32", stride=9))):
        assert (tc.make_plan(case, True, None, None, 90).config in tc.TF32_TMA_CONFIGS) == applies, case
    assert tc.make_plan(problem, True, None, None, 80).config in tc.CONFIGS[4]
    padded = tc.make_plan(_problem(8, 64, 30, 14, 3, "float32"), True, "tc_tma_tf32_m64j128", 1, 90)
    assert not padded.direct  # 30 output channels: dy through a copy of 32


def test_tf32_nchw_stride_1_layers_take_the_k_major_tiles():
    """float32 (TF32) NCHW layers at stride 1 with Wo == W, on sm_90a: x and dy read in place as [N C][H W] and
    [N K][Ho Wo] through 2-D maps (boxes of bm rows of dy, 32 of x, of 32 pixels), no copies, four rounding warps;
    one run writes a 1x1 layer's weight of unpadded channels in place in either weight layout. Elsewhere, as
    before."""
    from cupyconv.program import TensorMap

    listed = set(tc.arch_specialisations()[tc.WGMMA_ARCH])
    problem = _problem(32, 256, 64, 56, 1, "float32", layout="NCHW")
    for cfg in tc.TF32_K_MAJOR_CONFIGS:
        plan = tc.make_plan(problem, True, cfg.name, 1, 90)
        assert plan.expression in listed and plan.expression.endswith(f"<{cfg.bm},{cfg.bj},0,{cfg.stages},false>")
        assert (plan.x_copy, plan.dy_copy, plan.direct, plan.workspace_bytes) == ("", "", True, 0)
        assert plan.block == (2 * cfg.bm + 288, 1, 1) and plan.shared_bytes <= 227 * 1024
        (launch,) = tc.program(plan, problem).launches
        assert launch.kernel == tc.TF32_TMA_KERNEL and launch.args[:4] == (Pointer(OUT), Pointer(OUT), 1, 0)
        assert launch.args[6:10] == (32 * 56 * 56, 256, 256, 64)  # L, x's rows an image, J, dy's rows an image
        dy_map, x_map, x_tail_map = launch.args[-3:]
        assert dy_map == TensorMap(Pointer(GRAD_OUTPUT), "float32", 32 * 64, 3136, 3136 * 4, cfg.bm, 32)
        assert x_map == TensorMap(Pointer(X), "float32", 32 * 256, 3136, 3136 * 4, 32, 32)
        assert x_tail_map == TensorMap(Pointer(X), "float32", 32 * 256, 3136, 3136 * 4, 32, 4, False)
    assert tc.make_plan(problem, True, None, None, 90).config in tc.TF32_K_MAJOR_CONFIGS
    split = tc.make_plan(_problem(8, 96, 30, 28, 1, "float32", layout="NCHW"), True, "tc_tma_tf32_nchw_m64j128", 3, 90)
    assert (split.out_channels, split.channels, split.x_copy, split.dy_copy) == (30, 96, "", "") and not split.direct
    for applies, case in ((False, _problem(8, 64, 64, 7, 1, "float32", layout="NCHW")),   # 49 pixels: rows of 196 B
                          (False, _problem(8, 63, 64, 14, 1, "float32", layout="NCHW")),  # odd channels
                          (False, _problem(8, 64, 64, 14, 1, "float32", stride=2, layout="NCHW")),
                          (False, _problem(8, 64, 64, 14, 1, "float32", padding=1, layout="NCHW")),
                          (False, _problem(8, 48, 64, 14, 3, "float32", padding=1, layout="NCHW")),  # 48: panels
                          (False, _problem(8, 64, 64, 14, 3, "float32", layout="NCHW")),  # Wo 12 < W 14
                          (False, _problem(8, 64, 64, 7, 3, "float32", padding=1, layout="NCHW")),  # 49 pixels
                          (False, _problem(8, 64, 64, 14, 1, "float32")),                 # NHWC
                          (True, _problem(8, 64, 64, 14, 3, "float32", padding=1, layout="NCHW")),
                          (True, _problem(8, 64, 64, 14, 1, "float32", layout="NCHW"))):
        assert (tc.make_plan(case, True, None, None, 90).config in tc.TF32_K_MAJOR_CONFIGS) == applies, case
    taps = tc.make_plan(_problem(4, 64, 128, 28, 3, "float32", padding=1, layout="NCHW"), True, None, 1, 90)
    assert (taps.x_copy, taps.dy_copy, taps.direct) == ("", "", False)  # a KCHW weight: the reduction permutes
    dy_map, x_map, _ = tc.program(taps, _problem(4, 64, 128, 28, 3, "float32", padding=1, layout="NCHW")).launches[0].args[-3:]
    assert x_map == TensorMap(Pointer(X), "float32", 4 * 64, 784, 784 * 4, 32, 32)
    assert dy_map == TensorMap(Pointer(GRAD_OUTPUT), "float32", 4 * 128, 784, 784 * 4, taps.config.bm, 32)
    assert tc.make_plan(problem, True, None, None, 80).config in tc.CONFIGS[4]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16_bit_nchw_1x1_layers_take_the_k_major_tiles(dtype):
    """16-bit NCHW 1x1 layers at stride 1 without padding, on sm_90a: x and dy read in place as [N C][H W] and
    [N K][Ho Wo] (boxes of bm rows of dy, 64 of x, of 64 pixels) by wgrad_tensor_cores_tma's K_MAJOR instances, no
    copies; one run writes the weight in place. Other layers keep the channels-last copies."""
    from cupyconv.program import TensorMap

    listed = set(tc.arch_specialisations()[tc.WGMMA_ARCH])
    problem = _problem(32, 256, 64, 56, 1, dtype, layout="NCHW")
    for cfg in tc.K_MAJOR_CONFIGS[2]:
        plan = tc.make_plan(problem, True, cfg.name, 1, 90)
        assert plan.expression in listed and plan.expression.endswith(",false,true>") and not cfg.tf32
        assert (plan.x_copy, plan.dy_copy, plan.direct, plan.workspace_bytes) == ("", "", True, 0)
        assert plan.block == (2 * cfg.bm + 32, 1, 1) and plan.shared_bytes <= 227 * 1024
        (launch,) = tc.program(plan, problem).launches
        assert launch.kernel == tc.TMA_KERNEL and len(launch.args) == 21
        assert launch.args[6:10] == (32 * 56 * 56, 256, 256, 64)  # L, x's rows an image, J, dy's rows an image
        dy_map, x_map = launch.args[-2:]
        assert dy_map == TensorMap(Pointer(GRAD_OUTPUT), dtype, 32 * 64, 3136, 3136 * 2, cfg.bm, 64)
        assert x_map == TensorMap(Pointer(X), dtype, 32 * 256, 3136, 3136 * 2, 64, 64)
    assert tc.make_plan(problem, True, None, None, 90).config in tc.K_MAJOR_CONFIGS[2]
    streamed = tc.make_plan(problem, True, "tc_tma_nchw_m64j256", None, 90, True)
    assert streamed.stream_k_blocks and streamed.expression.endswith(",true,true>") and streamed.expression in listed
    for case in (_problem(8, 64, 64, 14, 1, dtype, layout="NCHW"),              # 196 pixels: rows of 392 bytes
                 _problem(8, 63, 64, 16, 1, dtype, layout="NCHW"),              # odd channels
                 _problem(8, 64, 64, 16, 1, dtype, stride=2, layout="NCHW"),
                 _problem(8, 64, 64, 16, 1, dtype, padding=1, layout="NCHW"),
                 _problem(8, 64, 64, 16, 3, dtype, padding=1, layout="NCHW"),   # taps: TF32's alone
                 _problem(8, 64, 64, 16, 1, dtype)):                            # NHWC
        assert not tc.make_plan(case, True, None, None, 90).config.k_major, case


def test_tf32_nchw_choice_weighs_both_tma_families_with_the_copies():
    """Where the K-major tiles and the transposing ones both apply (NCHW, stride 1, Wo == W), the choice weighs
    both, the transposing tiles at the price of x's and dy's channels-last copies (read and written once each at
    COPY_BANDWIDTH; the K-major tiles and channels-last arrays pay none), the K-major tiles' l tiles K_MAJOR_TAPS
    longer where the rounders shift x by a tap."""
    nchw = _problem(32, 512, 512, 14, 3, "float32", padding=1, layout="NCHW")
    nhwc = _problem(32, 512, 512, 14, 3, "float32", padding=1)
    assert set(tc.configs(nchw, 90)) >= set(tc.TF32_K_MAJOR_CONFIGS + tc.TF32_TMA_CONFIGS)
    moved = 2 * 32 * (512 * 14 * 14 + 512 * 14 * 14) * 4
    transposing, k_major = tc.TF32_TMA_CONFIGS[0], tc.TF32_K_MAJOR_CONFIGS[0]
    assert tc._copies_us(nchw, transposing) == pytest.approx(moved / tc.COPY_BANDWIDTH * 1e6)
    assert tc._copies_us(nchw, k_major) == 0 and tc._copies_us(nhwc, transposing) == 0
    assert tc._schedule_us(nchw, transposing, 4) == pytest.approx(tc._model_us(nchw, transposing, 4) +
                                                                  tc._copies_us(nchw, transposing))
    one_by_one = _problem(32, 512, 512, 14, 1, "float32", layout="NCHW")
    assert tc._tile_us(nchw, k_major) == pytest.approx(tc.K_MAJOR_TAPS * tc._tile_us(one_by_one, k_major))
    assert tc._tile_us(nchw, transposing) == tc._tile_us(one_by_one, transposing)
    reason = tc.make_plan(nchw, True, None, None, 90).reason
    assert all(cfg.name in reason for cfg in tc.TF32_K_MAJOR_CONFIGS + tc.TF32_TMA_CONFIGS), reason


def test_one_tma_run_writes_the_weight_itself():
    """A TMA tile's single run writes a KHWC weight of unpadded channels in place: no partial sums, no
    reduction launch; NCHW arrays (a KCHW weight) and padded channels keep the reduction."""
    problem = _problem(32, 512, 512, 7, 3, padding=1)
    plan = tc.make_plan(problem, True, None, 1, 90)
    launches = tc.program(plan, problem).launches
    assert plan.direct and plan.workspace_bytes == 0 and [launch.kernel for launch in launches] == [tc.TMA_KERNEL]
    assert "the GEMM writes the weight" in str(plan) and launches[0].args[2] == 1
    for other, splits in ((problem, 2), (_problem(32, 512, 512, 7, 3, padding=1, layout="NCHW"), 1),
                          (_problem(32, 512, 500, 7, 3, padding=1), 1)):  # 500 channels of dy padded to 504
        plan = tc.make_plan(other, True, "tc_tma_m128j256", splits, 90)
        assert not plan.direct and tc.program(plan, other).launches[-1].kernel == "wgrad_reduce"


def test_stream_k_shares_a_wave_of_blocks():
    """Stream-K (TMA tiles): one wave of blocks, at most one a unit (tile x l tile), passed with its slots
    (after the copies, one tile of float32 sums a block) and the FLAGS operand; one run, so a KHWC weight of
    unpadded channels is written in place. Forcing it where it cannot run says why."""
    from cupyconv.program import FLAGS, Pointer

    problem = _problem(32, 512, 512, 7, 3, padding=1)  # ResNet-50's last 3x3: 4 x 18 tiles of 128 x 256
    plan = tc.make_plan(problem, True, "tc_tma_m128j256", None, 90, True)
    units = 4 * 18 * math.ceil(32 * 7 * 7 / 64)
    assert plan.stream_k_blocks == min(tc.MODEL_SMS, units) == plan.grid[0] and plan.grid[1:] == (1, 1)
    assert plan.splits == 1 and plan.direct and "stream-K" in str(plan) and "stream-K" in plan.reason
    slots = plan.stream_k_blocks * 128 * 256 * 4
    assert plan.workspace_bytes == slots
    call = tc.program(plan, problem)
    (launch,) = call.launches
    assert launch.grid == plan.grid and call.workspace_bytes == slots
    direct, blocks, slot_pointer, flags = launch.args[2:6]
    assert (direct, blocks) == (1, plan.stream_k_blocks)
    assert slot_pointer == Pointer("workspace", 0) and flags == Pointer(FLAGS)
    few = _problem(1, 128, 64, 4, 3, padding=1)  # one l tile: a block a tile, no shared tiles
    assert tc.make_plan(few, True, "tc_tma_m64j128", None, 90, True).stream_k_blocks == \
        math.prod(tc._tiles(few, tc.TMA_CONFIGS[2]))
    nchw = tc.make_plan(_problem(32, 512, 512, 7, 3, padding=1, layout="NCHW"), True, None, None, 90, True)
    assert nchw.stream_k_blocks and not nchw.direct  # the reduction turns the one run into KCHW
    assert not tc.make_plan(problem, True, None, None, 90, False).stream_k_blocks
    for kwargs, match in (({"splits": 2, "stream_k": True}, "splits=2"),
                          ({"config": "tc_wgmma_m128j128", "stream_k": True}, "fed by TMA"),
                          ({"config": "tc_tma_m128j128", "stream_k": True}, "stream-K instance"),
                          ({"stream_k": "yes"}, "stream_k must be")):
        with pytest.raises(ValueError, match=match):
            tc.make_plan(problem, True, compute_capability=90, **kwargs)
    with pytest.raises(ValueError, match="fed by TMA"):
        tc.make_plan(problem, True, None, None, 80, True)


def test_tf32_stream_k_on_the_transposing_tiles():
    """TF32's transposing tiles have stream-K instances (the same arguments: slots after the copies, FLAGS); the
    K-major tiles have none (theirs spill), so forcing it there says so. ResNet-50's last 3x3 (144 tiles of 128 x
    128 over 49 l tiles: runs of two leave the second wave a sixth full) takes it in TF32 in either layout, VGG's
    14^2 3x3 in either (STREAM_K_MARGIN's TF32 entry; on NCHW arrays over the K-major tiles, on copies); VGG's 56^2
    3x3, whose runs fill the SMs, does not."""
    from cupyconv.program import FLAGS, Pointer

    listed = set(tc.arch_specialisations()[tc.WGMMA_ARCH])
    last = _problem(32, 512, 512, 7, 3, "float32", padding=1)
    for cfg in tc.TF32_TMA_CONFIGS:
        plan = tc.make_plan(last, True, cfg.name, None, 90, True)
        assert plan.expression in listed and plan.expression.endswith(",true>") and plan.stream_k_blocks
        (launch,) = tc.program(plan, last).launches
        assert launch.args[3:6] == (plan.stream_k_blocks, Pointer("workspace", 0), Pointer(FLAGS))
    for layout in ("NHWC", "NCHW"):
        plan = tc.make_plan(_problem(32, 512, 512, 7, 3, "float32", padding=1, layout=layout), True, None, None, 90)
        assert plan.config in tc.TF32_TMA_CONFIGS and plan.stream_k_blocks, layout
    for layout in ("NHWC", "NCHW"):
        plan = tc.make_plan(_problem(32, 512, 512, 14, 3, "float32", padding=1, layout=layout), True, None, None, 90)
        assert plan.config is tc.TF32_TMA_CONFIGS[0] and plan.stream_k_blocks, layout
    assert not tc.make_plan(_problem(32, 256, 256, 56, 3, "float32", padding=1), True, None, None, 90).stream_k_blocks
    k_major = _problem(8, 64, 64, 14, 3, "float32", padding=1, layout="NCHW")
    assert not any(cfg.stream_k for cfg in tc.TF32_K_MAJOR_CONFIGS)
    with pytest.raises(ValueError, match="stream-K instance"):
        tc.make_plan(k_major, True, tc.TF32_K_MAJOR_CONFIGS[0].name, None, 90, True)
    forced = tc.make_plan(k_major, True, None, None, 90, True)  # the transposing tiles, on copies
    assert forced.stream_k_blocks and forced.config in tc.TF32_TMA_CONFIGS and forced.x_copy == "transpose"


def test_the_model_weighs_stream_k_against_runs():
    """Stream-K's one wave costs each block its share of the units, two segments' fill and its slots, times
    STREAM_K_MARGIN (16 bits: 1.4); it is taken where one run of whole tiles leaves half the SMs idle over a long
    reduction (VGG's 14^2 3x3: 72 tiles of 128 x 256, 98 l tiles), not on a short one (ResNet-50's 7^2 3x3: 25 l
    tiles) nor where runs fill the SMs; the cp.async tiles have runs alone."""
    cfg = tc.TMA_CONFIGS[1]  # 128 x 256, one block an SM
    vgg = _problem(32, 512, 512, 14, 3, padding=1)
    assert tc._stream_k_model_us(vgg, cfg) < min(tc._model_us(vgg, cfg, s) for s in tc._split_choices(vgg, cfg))
    assert tc._best_schedule(vgg, cfg, None) == tc.STREAM_K and tc._best_schedule(vgg, cfg, False) != tc.STREAM_K
    plan = tc.make_plan(vgg, True, None, None, 90)
    assert plan.stream_k_blocks and plan.config is cfg and plan.direct
    assert not tc.make_plan(_problem(32, 512, 512, 7, 3, padding=1), True, None, None, 90).stream_k_blocks
    assert not tc.make_plan(_problem(32, 256, 256, 56, 3, padding=1), True, None, None, 90).stream_k_blocks
    assert tc._best_schedule(vgg, tc.WGMMA_CONFIGS[0], None) != tc.STREAM_K  # cp.async tiles: runs alone
