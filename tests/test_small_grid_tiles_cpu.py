"""The small-grid tiles without a GPU: where the fixed rules take the FMA GEMM's 4 x 4-output tile
(families/simt_gemm_conv2d.py SIMT_SMALL_TILE_MAX_BLOCKS, and its split-K, SIMT_SMALL_TILE_SPLIT_BLOCKS) and
the 64 x 64 mma.sync tiles of NCHW 1x1 layers (families/implicit_gemm_nhwc.py SMALL_POINTWISE_MAX_TILES).
Their GPU results are in test_simt_gpu.py (every FMA tile) and the whole GPU suite."""
import math

import pytest

from cupyconv import planner
from cupyconv.arguments import make_problem
from cupyconv.families import implicit_gemm_nhwc, simt_gemm_conv2d
from cupyconv.families.common import gemm_grid

#: (input channels, output channels, plane) of MobileNetV2's and EfficientNet-B0's 1x1 layers.
POINTWISE = [(32, 16, 112), (16, 96, 112), (96, 24, 56), (24, 144, 56), (144, 24, 56), (144, 32, 28), (32, 192, 28),
             (192, 32, 28), (192, 64, 14), (64, 384, 14), (384, 64, 14), (384, 96, 14), (96, 576, 14),
             (576, 96, 14), (576, 160, 7), (160, 960, 7), (960, 160, 7), (960, 320, 7), (320, 1280, 7),
             (1152, 192, 7), (672, 112, 14), (96, 4, 1), (1152, 48, 1)]
SMALL = simt_gemm_conv2d._SIMT_BY_NAME["simt_m32n64t4"]


def pointwise(n, c, k, h, dtype="float32", layout="NCHW"):
    x = (n, c, h, h) if layout == "NCHW" else (n, h, h, c)
    w = (k, c, 1, 1) if layout == "NCHW" else (k, 1, 1, c)
    return make_problem(x, w, None, dtype, layout=layout, weight_layout="KCHW" if layout == "NCHW" else "KHWC")


def k_tiles(problem, cfg):
    return math.ceil(problem.c // problem.groups * problem.kh * problem.kw / cfg.bk)


@pytest.mark.parametrize("n", [1, 8, 32])
@pytest.mark.parametrize("c, k, h", POINTWISE)
def test_the_fma_gemm_takes_the_4x4_tile_exactly_where_its_grid_fits_a_wave(n, c, k, h):
    problem = pointwise(n, c, k, h)
    plan = simt_gemm_conv2d.make_plan(problem)
    tiles = math.prod(gemm_grid(problem, SMALL))
    assert (plan.config is SMALL) == (tiles <= simt_gemm_conv2d.SIMT_SMALL_TILE_MAX_BLOCKS)
    if plan.config is SMALL:
        assert "4x4 outputs per thread" in simt_gemm_conv2d.describe(plan)
        # Split-K: at most four blocks an SM, each run at least SPLIT_K_MIN_TILES k tiles long.
        assert plan.splits == 1 or (tiles * plan.splits <= simt_gemm_conv2d.SIMT_SMALL_TILE_SPLIT_BLOCKS and
                                    k_tiles(problem, SMALL) // plan.splits >= simt_gemm_conv2d.SPLIT_K_MIN_TILES)
        assert plan.grid == (*gemm_grid(problem, SMALL)[:2], plan.splits)


def test_the_4x4_tile_where_the_rules_were_timed():
    """H200 timings behind the rule (benchmarks/NOTES.md): MobileNetV2's batch-1 1x1 layers take the 4 x 4 tile,
    split where the grid is small; the batch-1 16 -> 96 on 112^2 (784 tiles) and batch-32 layers of 56^2 do not."""
    plan = planner.make_plan(pointwise(1, 960, 160, 7), allow_tf32=False)
    assert plan.kernel == simt_gemm_conv2d.KERNEL and plan.config is SMALL and plan.splits == 15
    assert planner.make_plan(pointwise(32, 960, 160, 7), allow_tf32=False).splits == 3  # 147 tiles: 3 runs
    assert planner.make_plan(pointwise(1, 16, 96, 112), allow_tf32=False).config is not SMALL
    assert planner.make_plan(pointwise(32, 144, 24, 56), allow_tf32=False).config is not SMALL


def test_grouped_problems_keep_the_8x8_tiles():
    """Grouped problems (Winograd's batched GEMM among them) were not timed on the 4 x 4 tile."""
    grouped = make_problem((1, 64, 14, 14), (64, 32, 1, 1), None, "float32", groups=2)
    assert math.prod(gemm_grid(grouped, SMALL)) <= simt_gemm_conv2d.SIMT_SMALL_TILE_MAX_BLOCKS
    assert simt_gemm_conv2d.make_plan(grouped).config is not SMALL


@pytest.mark.parametrize("dtype, allow_tf32", [("float32", True), ("float16", False), ("bfloat16", False)])
@pytest.mark.parametrize("n", [1, 8, 32])
@pytest.mark.parametrize("c, k, h", POINTWISE)
def test_nchw_pointwise_layers_of_few_tiles_take_the_64x64_mma_sync_tiles(dtype, allow_tf32, n, c, k, h):
    plan = planner.make_plan(pointwise(n, c, k, h, dtype), allow_tf32=allow_tf32, compute_capability=90)
    if plan.kernel != implicit_gemm_nhwc.KERNEL or plan.config.wgmma:
        return  # another family or a wgmma tile took the layer first
    problem = pointwise(n, c, k, h, dtype)
    item = 4 if dtype == "float32" else 2
    small = [cfg for cfg in implicit_gemm_nhwc.NHWC_CONFIGS[dtype] if cfg.bm == 64 and not cfg.wgmma]
    tiles = math.prod(gemm_grid(problem, small[0]))
    if implicit_gemm_nhwc._nchw_a_mode(problem) == implicit_gemm_nhwc.NCHW_A_POINTWISE and \
            tiles <= implicit_gemm_nhwc.SMALL_POINTWISE_MAX_TILES:
        assert plan.config in small and "tiles of 64 x 64" in plan.reason
        deep_k_tiles = math.ceil(c * item / 128)
        assert (plan.config.bk * item == 128) == (deep_k_tiles >= implicit_gemm_nhwc.MIN_DEEP_K_TILES)
    else:
        assert plan.config.bm == 128


@pytest.mark.parametrize("dtype, allow_tf32", [("float32", True), ("float16", False)])
def test_channels_last_layers_keep_the_128_pixel_tiles(dtype, allow_tf32):
    for c, k, h in POINTWISE:
        plan = planner.make_plan(pointwise(1, c, k, h, dtype, "NHWC"), allow_tf32=allow_tf32, compute_capability=90)
        assert plan.kernel != implicit_gemm_nhwc.KERNEL or plan.config.bm != 64 or plan.config.wgmma, \
            (c, k, h, plan.config)


def test_the_timed_tf32_layers_take_the_64x64_tile():
    """H200, TF32 NCHW batch 1 (benchmarks/NOTES.md): 160 -> 960 on 7^2 and 192 -> 64 on 14^2 fastest on the
    64 x 64 tile with k rows of 128 bytes, 960 -> 160 on 7^2 with split-K too."""
    for c, k, h in ((160, 960, 7), (192, 64, 14), (960, 160, 7)):
        plan = planner.make_plan(pointwise(1, c, k, h), allow_tf32=True, compute_capability=90)
        assert plan.config.name == "nhwc_m64n64k32", (c, k, h, plan.config.name)
    assert planner.make_plan(pointwise(1, 960, 160, 7), allow_tf32=True, compute_capability=90).splits > 1
