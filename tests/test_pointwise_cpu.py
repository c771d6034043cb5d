"""The streaming 1x1 kernel's plans without a GPU: what it refuses and why, which layers the planner
gives it (memory-bound 1x1 NHWC layers of few input channels), its tiles' shared memory and its
persistent grid."""
import math

import pytest

from cupyconv.arguments import make_problem
from cupyconv.families import implicit_gemm_nhwc, pointwise_nhwc
from cupyconv.families.common import H100_SMS
from cupyconv.families.pointwise_nhwc import MAX_FLOP_PER_BYTE, MIN_FLOAT32_CHANNELS, POINTWISE_CONFIGS, refusal
from cupyconv.planner import POINTWISE_KERNEL, make_plan

#: Dynamic shared memory a block may opt in to on the H100 (227 KB).
MAX_SHARED_BYTES = 227 * 1024


def nhwc(n, c, k, h, w, dtype="float16", stride=1, padding=0, groups=1):
    return make_problem((n, h, w, c), (k, c // groups, 1, 1), (k,), dtype, stride, padding, 1, groups, layout="NHWC")


def pingpong_first(problem) -> bool:
    """Whether a ping-pong tile's rule, asked before the pointwise kernel's on sm_90, takes ``problem``."""
    return bool(implicit_gemm_nhwc.pingpong_small_pays(problem, 90) or implicit_gemm_nhwc.pingpong_narrow_pays(
        problem, 90) or implicit_gemm_nhwc.pingpong_pays(problem, 90) or implicit_gemm_nhwc.pingpong_64_pixel_runs(
        problem, 90))


@pytest.mark.parametrize("problem,why", [
    (make_problem((2, 64, 8, 8), (128, 64, 1, 1), None, "float16"), "NHWC arrays only"),
    (nhwc(2, 64, 128, 8, 8, "float64"), "not float64"),
    (nhwc(2, 64, 128, 8, 8, stride=2), "1x1, stride-1, unpadded"),
    (nhwc(2, 64, 128, 8, 8, padding=1), "1x1, stride-1, unpadded"),
    (nhwc(2, 64, 128, 8, 8, groups=2), "of one group"),
    (nhwc(2, 12, 128, 8, 8), "12 input channels of float16 are not whole 16-byte pieces"),
    (nhwc(2, 520, 128, 8, 8), "at most 1024 bytes"),
    (nhwc(2, 264, 128, 8, 8, "float32"), "at most 1024 bytes"),
    (nhwc(2, 64, 12, 8, 8), "12 output channels of float16 are not whole 16-byte vectors"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_refusals_name_the_reason(problem, why):
    assert why in refusal(problem)
    with pytest.raises(ValueError, match="cannot run this problem"):
        make_plan(problem, kernel=POINTWISE_KERNEL)


@pytest.mark.parametrize("c,k,dtype,taken", [
    (64, 256, "float16", True),      # ResNet-50's expansion: 51 FLOP/B
    (144, 24, "bfloat16", True),     # MobileNetV2's projection: 21
    (96, 576, "float16", True),      # 82
    (256, 1024, "float16", False),   # 205: the wgmma GEMM is faster
    (64, 256, "float32", True),      # 26 in TF32
    (96, 576, "float32", False),     # 41: the GEMM is faster in TF32
    (144, 24, "float32", True),      # 10: the widest float32 tile
    (384, 64, "float16", True),      # 55: the widest 16-bit tile
    (32, 128, "float32", False),     # float32 of 32 channels: the GEMM is faster (MIN_FLOAT32_CHANNELS)
    (32, 128, "float16", True),
])
def test_planner_takes_it_for_memory_bound_layers(c, k, dtype, taken):
    problem = nhwc(8, c, k, 14, 14, dtype)
    assert not refusal(problem)
    assert pointwise_nhwc.pays(problem) == taken
    assert (pointwise_nhwc.flop_per_byte(problem) <= MAX_FLOP_PER_BYTE[dtype]
            and (dtype != "float32" or c >= MIN_FLOAT32_CHANNELS)) == taken
    plan = make_plan(problem, allow_tf32=True, compute_capability=90)
    assert (plan.kernel == POINTWISE_KERNEL) == (taken and not pingpong_first(problem)), plan
    if dtype == "float32":  # strict float32 stays off the tensor cores
        assert make_plan(problem).kernel != POINTWISE_KERNEL


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_tiles_fit_and_the_rule_picks_by_width_then_channel_bytes(dtype):
    """Every tile fits the H100's shared memory; a plan takes, of the tiles holding C, the narrowest at
    least K wide, and of those the one of the fewest channel bytes; else, of the widest one's rows, the tile that
    leaves the fewest channels of its last tile unused (ties: the wider). The layers make more than a wave of
    tall tiles."""
    item = 4 if dtype == "float32" else 2
    for cfg in POINTWISE_CONFIGS[dtype]:
        assert cfg.shared_bytes(dtype) <= MAX_SHARED_BYTES, cfg
        assert pointwise_nhwc.blocks_per_sm(cfg, dtype) >= 1
    for c in (8, 32, 64, 96, 128, 256, 384, 512):
        for k in (24, 32, 64, 128, 256):
            problem = nhwc(32, c, k, 28, 28, dtype)
            if c * item > 1024:
                assert refusal(problem)
                continue
            plan = make_plan(problem, kernel=POINTWISE_KERNEL)
            holding = [cfg for cfg in POINTWISE_CONFIGS[dtype] if c * item <= cfg.channel_bytes]
            wide_enough = [cfg for cfg in holding if cfg.bn >= k]
            widest = max(holding, key=lambda t: t.bn)
            rows = [cfg for cfg in holding if cfg.channel_bytes == widest.channel_bytes and cfg.bn >= 64]
            best = min(wide_enough, key=lambda t: (t.bn, t.channel_bytes)) if wide_enough else \
                min(rows, key=lambda t: (-k % t.bn, -t.bn))
            assert plan.config == best, (c, k)
            assert plan.shared_bytes == plan.config.shared_bytes(dtype) and plan.block == (plan.config.threads, 1, 1)


@pytest.mark.parametrize("n,k", [(1, 64), (32, 256), (32, 64), (4, 24), (256, 1024)])
def test_persistent_grid_covers_the_tiles_in_about_one_wave(n, k):
    """Every pixel tile of every channel tile has a block (each block takes pixel tiles bx, bx + gridDim.x,
    ...), the blocks fit the SMs' residency, and no block is more than one tile behind another."""
    problem = nhwc(n, 64, k, 56, 56)
    plan = make_plan(problem, kernel=POINTWISE_KERNEL)
    cfg = plan.config
    tiles_m, tiles_n = math.ceil(n * 56 * 56 / cfg.bm), math.ceil(k / cfg.bn)
    assert plan.grid[1] == tiles_n and plan.grid[2] == 1 and 1 <= plan.grid[0] <= tiles_m
    assert plan.grid[0] * plan.grid[1] <= max(tiles_n, H100_SMS * pointwise_nhwc.blocks_per_sm(cfg, problem.dtype))
    per_block = [len(range(b, tiles_m, plan.grid[0])) for b in range(plan.grid[0])]
    assert sum(per_block) == tiles_m and max(per_block) - min(per_block) <= 1 and min(per_block) >= 1


@pytest.mark.parametrize("c,k,dtype,tile", [
    (144, 24, "float16", "pw_c512_m64n32"), (144, 24, "float32", "pw_c1024_m64n32"),
    (144, 40, "float16", "pw_c512_m128n64"), (64, 64, "float16", "pw_c128_m64n64"),
    (64, 256, "float16", "pw_c128_m64n128"), (32, 128, "bfloat16", "pw_c128_m64n128"),
    (24, 144, "float16", "pw_c128_m64n144"), (16, 96, "bfloat16", "pw_c128_m64n96"),
    (320, 32, "bfloat16", "pw_c1024_m64n32")])
def test_the_suites_layers_take_the_tiles_they_were_timed_fastest_on(c, k, dtype, tile):
    plan = make_plan(nhwc(32, c, k, 28, 28, dtype), kernel=POINTWISE_KERNEL)
    assert plan.config.name == tile and f"{plan.config.bn}-channel tile" in plan.reason


@pytest.mark.parametrize("n,c,k,h,dtype,tile,why", [
    (32, 32, 192, 28, "float16", "pw_c128_m64n96", "on 2 96-channel tiles (0 unused in the last)"),
    (8, 32, 272, 28, "bfloat16", "pw_c128_m64n144", "on 2 144-channel tiles (16 unused in the last)"),
    (8, 40, 240, 28, "float16", "pw_c128_m64n128", "on 2 128-channel tiles (16 unused in the last)"),  # ties: wider
    (32, 64, 384, 14, "float16", "pw_c128_m64n128", "on 3 128-channel tiles"),
    (8, 96, 576, 14, "float16", "pw_c256_m64n128", "on 5 128-channel tiles"),  # the only tile of 256-byte rows
    (8, 16, 96, 28, "float32", "pw_c256_m64n64", "on 2 64-channel tiles"),
])
def test_outputs_past_every_tile_take_the_width_that_wastes_fewest_channels(n, c, k, h, dtype, tile, why):
    """MobileNetV2's 32 -> 192: two channel tiles of 96, not two of 128 or 144 whose second is 64 or 48 wide
    (pointwise_nhwc.BALANCED_MIN_WIDTH; narrower tiles are not taken)."""
    plan = make_plan(nhwc(n, c, k, h, h, dtype), kernel=POINTWISE_KERNEL)
    assert plan.config.name == tile and why in plan.reason, plan.reason
    assert plan.grid[1] == math.ceil(k / plan.config.bn)


@pytest.mark.parametrize("n,c,k,h,tile", [
    (8, 192, 64, 14, "pw_c512_m64n32"),    # 13 tiles of 128 pixels
    (32, 192, 64, 14, "pw_c512_m64n32"),   # 49
    (8, 240, 80, 14, "pw_c512_m64n32"),    # 13 x 2
    (32, 240, 80, 28, "pw_c512_m128n64"),  # 196 x 2: more than a wave
    (32, 144, 40, 28, "pw_c512_m128n64"),  # 196
])
def test_a_tall_tile_of_less_than_a_wave_of_blocks_gives_way_to_a_short_one(n, c, k, h, tile):
    """MobileNetV2's 192 -> 64 on 14^2: the 128 x 64 tile's 13 blocks at batch 8 leave most SMs idle; the 64 x
    32 tile of the same rows makes 50 (pointwise_nhwc.SHORT_TILE_PIXELS)."""
    plan = make_plan(nhwc(n, c, k, h, h), kernel=POINTWISE_KERNEL)
    assert plan.config.name == tile, plan.reason
    tall_blocks = math.ceil(n * h * h / 128) * math.ceil(k / 64)
    assert (f"its {tall_blocks} blocks of 128 x 64 (< {H100_SMS} SMs)" in plan.reason) == (tile == "pw_c512_m64n32")


@pytest.mark.parametrize("n,c,k,h,dtype,tile", [
    (1, 64, 384, 14, "float16", "pw_c128_m64n32"),    # 12 blocks of 64 x 128: 48 of 64 x 32
    (1, 24, 144, 56, "bfloat16", "pw_c128_m64n32"),   # 49 of 64 x 144
    (8, 64, 384, 14, "float16", "pw_c128_m64n32"),    # 75 of 64 x 128
    (1, 16, 96, 112, "float16", "pw_c128_m64n96"),    # 196: a wave
    (8, 24, 144, 56, "float16", "pw_c128_m64n144"),   # 392
    (1, 144, 40, 28, "float32", "pw_c1024_m64n64"),   # 13 blocks on wider rows: kept
    (1, 384, 64, 14, "float16", "pw_c1024_m64n64"),   # 4: kept
])
def test_under_a_wave_narrow_rows_take_the_narrowest_tile(n, c, k, h, dtype, tile):
    """A layer of 128-byte rows (16-bit C <= 64) whose tile makes fewer blocks than the SMs takes the 32-channel
    tile of its rows, more and shorter blocks (pointwise_nhwc.NARROW_MAX_CHANNEL_BYTES); wider rows keep theirs."""
    plan = make_plan(nhwc(n, c, k, h, h, dtype), kernel=POINTWISE_KERNEL)
    assert plan.config.name == tile, plan.reason
    assert (f"(< {H100_SMS} SMs): the 64 x 32 tile" in plan.reason) == (tile == "pw_c128_m64n32"), plan.reason


@pytest.mark.parametrize("n,c,k,h,dtype,taken", [
    (8, 256, 64, 56, "float16", False),    # ResNet-50's 256 -> 64 at batch 8: 25088 pixels
    (32, 256, 128, 56, "bfloat16", False),
    (32, 240, 80, 14, "float16", False),   # 6272 pixels: wgmma's 64 x 64 tile (from 4096 in 16 bits)
    (8, 240, 80, 14, "float16", True),     # 1568 pixels
    (8, 144, 40, 28, "bfloat16", False),   # 40 outputs on 6272 pixels
    (8, 144, 32, 28, "float16", True),     # 32 outputs: a 32-channel tile
    (8, 144, 40, 28, "float32", True),     # TF32: from 64 outputs on 16384 pixels
    (8, 128, 64, 56, "float16", True),     # 256 bytes of input channels: the 256-byte tiles
    (8, 256, 32, 56, "float16", True),     # 32 outputs: a 32-channel tile
    (32, 256, 64, 56, "float32", False),   # TF32: 1024 bytes
    (8, 64, 64, 56, "float32", True),      # TF32: 256 bytes
])
def test_wide_large_layers_go_to_wgmma_on_sm90(n, c, k, h, dtype, taken):
    """On sm_90 the wgmma GEMM takes layers of more than 256 bytes of input channels, >= 40 outputs and
    >= 4096 pixels in 16 bits, >= 64 and >= 16384 in TF32 (pointwise_nhwc.WGMMA_MIN_*); any other GPU keeps them
    here."""
    problem = nhwc(n, c, k, h, h, dtype)
    assert not refusal(problem) and pointwise_nhwc.pays(problem)
    assert pointwise_nhwc.pays(problem, compute_capability=90) == taken
    assert (make_plan(problem, allow_tf32=True, compute_capability=90).kernel == POINTWISE_KERNEL) == \
        (taken and not pingpong_first(problem))
    assert make_plan(problem, allow_tf32=True, compute_capability=80).kernel == POINTWISE_KERNEL


def test_forced_tile_must_hold_the_channels():
    problem = nhwc(2, 128, 64, 8, 8)
    with pytest.raises(ValueError, match="holds 128 bytes of input channels"):
        make_plan(problem, config=POINTWISE_CONFIGS["float16"][0].name, kernel=POINTWISE_KERNEL)
    assert make_plan(problem, config="pw_c256_m64n128").kernel == POINTWISE_KERNEL


def test_printed_plan_says_what_it_reads_in_place():
    plan = make_plan(nhwc(32, 64, 256, 56, 56), compute_capability=80)  # sm_90's ping-pong tile takes it there
    text = str(plan)
    assert plan.kernel == POINTWISE_KERNEL and "persistent blocks" in text and "in place" in text
    assert "51 FLOP per byte" in text


def test_narrow_projections_take_a_32_channel_tile():
    """MobileNetV2's and EfficientNet-B0's projections to 16 and 24 channels (H100 sweep, NOTES.md "Narrow
    projections"): a 32-channel tile, of wider rows than the fewest that hold C where that is the only
    one; TF32's 32 -> 16 too, though float32 inputs of 32 channels to wider outputs keep the GEMM."""
    from cupyconv.planner import NHWC_KERNEL

    expected = {(32, 16, "float16"): "pw_c128_m64n32", (96, 24, "float16"): "pw_c512_m64n32",
                (32, 16, "float32"): "pw_c128_m64n32", (96, 24, "float32"): "pw_c512_m64n32"}
    for (c, k, dtype), name in expected.items():
        plan = make_plan(nhwc(32, c, k, 56, 56, dtype), allow_tf32=True, compute_capability=90)
        assert plan.kernel == POINTWISE_KERNEL and plan.config.name == name, (c, k, dtype, str(plan))
    assert make_plan(nhwc(4, 32, 128, 64, 64, "float32"), allow_tf32=True, compute_capability=90).kernel == NHWC_KERNEL
