"""One warpgroup's 64 x 64 wgmma tile without a GPU: where the fixed rules take it (families/
implicit_gemm_nhwc.py SMALL_TILE_CONFIG): layers whose larger wgmma tiles make less than a wave of
blocks, where it makes no fewer -- ResNet-50's at batch 1 -- and never in place of a producer tile's
plan."""
import math

import pytest

from cupyconv import planner
from cupyconv.arguments import make_problem
from cupyconv.families import implicit_gemm_nhwc
from cupyconv.families.common import gemm_grid

#: (input channels, output channels, plane, kernel, stride) of ResNet-50's convolutions after the stem.
RESNET50 = [(64, 64, 56, 1, 1), (64, 64, 56, 3, 1), (64, 256, 56, 1, 1), (256, 64, 56, 1, 1), (256, 128, 56, 1, 1),
            (128, 128, 56, 3, 2), (128, 512, 28, 1, 1), (256, 512, 56, 1, 2), (512, 128, 28, 1, 1),
            (128, 128, 28, 3, 1), (512, 256, 28, 1, 1), (256, 256, 28, 3, 2), (256, 1024, 14, 1, 1),
            (512, 1024, 28, 1, 2), (1024, 256, 14, 1, 1), (256, 256, 14, 3, 1), (1024, 512, 14, 1, 1),
            (512, 512, 14, 3, 2), (512, 2048, 7, 1, 1), (1024, 2048, 14, 1, 2), (2048, 512, 7, 1, 1),
            (512, 512, 7, 3, 1)]
DTYPES = ("float16", "bfloat16", "float32")


def problem(n, c, k, h, kh, s, dtype, layout="NHWC"):
    """A layer with a bias, and in 16-bit NHWC a residual: the ping-pong tiles' rules leave such calls to the tiles
    tested here (implicit_gemm_nhwc._fused)."""
    x = (n, h, h, c) if layout == "NHWC" else (n, c, h, h)
    w = (k, kh, kh, c) if layout == "NHWC" else (k, c, kh, kh)
    out = (h + 2 * (kh // 2) - kh) // s + 1
    residual = (n, out, out, k) if layout == "NHWC" and dtype != "float32" else None
    return make_problem(x, w, (k,), dtype, stride=s, padding=kh // 2, layout=layout,
                        weight_layout="KHWC" if layout == "NHWC" else "KCHW", residual_shape=residual)


@pytest.mark.parametrize("dtype,layout", [("float16", "NHWC"), ("bfloat16", "NHWC"), ("float32", "NCHW")])
def test_resnet50_batch_1_layers_take_it(dtype, layout):
    """At batch 1 the 3x3 layer of 64 channels on 56^2 (13 blocks of the 256 x 64 tile) and the 7^2 and
    14^2 layers take the 64 x 64 tile (fp16 channels_last 1.05-1.74x there, TF32 NCHW ResNet-50 0.899 ->
    0.868 ms, H200), with split-K by its own rule; TF32's 1x1 NCHW layers are read in place on other tiles."""
    layers = [(64, 64, 56, 3, 1), (512, 512, 7, 3, 1)]
    if dtype != "float32":
        layers += [(256, 1024, 14, 1, 1), (1024, 256, 14, 1, 1)]
    for c, k, h, kh, s in layers:
        p = problem(1, c, k, h, kh, s, dtype, layout)
        plan = planner.make_plan(p, allow_tf32=True, compute_capability=90)
        assert plan.config.name == implicit_gemm_nhwc.SMALL_TILE_CONFIG and plan.arch == "sm_90a", str(plan)
        assert "one warpgroup's 64 pixels x 64 channels" in plan.reason
        assert math.prod(gemm_grid(p, plan.config)) <= implicit_gemm_nhwc.SMALL_TILE_MAX_BLOCKS


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch", [8, 32])
def test_resnet50_batch_8_and_32_layers_keep_the_larger_tiles(batch, dtype):
    """At batch 8 the 64 x 64 tile would make fewer blocks than the split plans of the 3x3 layers of 256
    and 512 channels (which ran 0.87-0.93x on it): none of those takes it -- only, in 16 bits, the 1x1 layers
    on 14^2 and 7^2 whose reductions the larger tiles split (SMALL_TILE_FEWER_BLOCKS: 1024 -> 256 8.0 -> 6.8 us)."""
    fewer = {(1024, 256, 14, 1, 1), (2048, 512, 7, 1, 1)} if batch == 8 and dtype != "float32" else set()
    for c, k, h, kh, s in RESNET50:
        plan = planner.make_plan(problem(batch, c, k, h, kh, s, dtype), allow_tf32=True, compute_capability=90)
        assert (plan.config.name == implicit_gemm_nhwc.SMALL_TILE_CONFIG) == ((c, k, h, kh, s) in fewer), \
            (c, k, h, kh, s, str(plan))


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch", [1, 2, 8])
def test_the_rule_as_documented(batch, dtype, layout):
    """On ResNet-50's and VGG-16's layers: the 64 x 64 tile exactly where the larger wgmma tile's plan is
    not a producer tile's, makes fewer than a wave of blocks, and the 64 x 64 tile makes at most a wave
    of tiles and no fewer blocks (split-K's runs counted on both sides; 16-bit 1x1 channels-last layers with
    fewer blocks too); the 64 x 128 tile's rule goes first."""
    vgg = [(c, c, h, 3, 1) for c, h in ((64, 224), (128, 112), (256, 56), (512, 28), (512, 14))]
    most = implicit_gemm_nhwc.SMALL_TILE_MAX_BLOCKS
    for shape in RESNET50 + vgg:
        kh = shape[3]
        p = problem(batch, *shape, dtype, layout)
        plan = planner.make_plan(p, allow_tf32=True, compute_capability=90)
        if plan.kernel != planner.NHWC_KERNEL or not plan.config.wgmma or plan.a_from_nchw:
            continue
        if plan.config.name == implicit_gemm_nhwc.SMALL_WIDE_CONFIG:  # the 64 x 128 tile's rule, first
            assert implicit_gemm_nhwc._small_wide_tile(p, 90) == plan.config
            continue
        larger, _ = implicit_gemm_nhwc._larger_wgmma_config(p)
        small = next(c for c in implicit_gemm_nhwc.NHWC_CONFIGS[dtype] if c.name == implicit_gemm_nhwc.SMALL_TILE_CONFIG)
        blocks, small_blocks = implicit_gemm_nhwc._blocks(p, larger), implicit_gemm_nhwc._blocks(p, small)
        fewer_pay = kh == 1 and dtype != "float32" and layout == "NHWC"
        takes = not larger.producer_warps and blocks < most and math.prod(gemm_grid(p, small)) <= most and \
            (small_blocks >= blocks or fewer_pay)
        assert (plan.config == small) == takes, (batch, shape, str(plan))
        if plan.config == small:
            assert math.prod(plan.grid) == small_blocks


def test_a_producer_plan_is_kept():
    """VGG-16's 3x3 layer of 512 channels on 14^2 at batch 1 in TF32 ran 12.1 us on the producer tile
    split 16 ways and 14.8 on the 64 x 64 tile split 4 ways (H200): the producer's plan stays."""
    plan = planner.make_plan(problem(1, 512, 512, 14, 3, 1, "float32"), allow_tf32=True, compute_capability=90)
    assert plan.config.producer_warps and plan.splits == 16, str(plan)


def test_the_new_tiles_are_compiled_for_sm90a_alone():
    """Both one-warpgroup tiles, every dtype, in the sm_90a instances (split-K, stream-K and stride phases
    included) and none in the any-GPU ones."""
    wgmma = set(implicit_gemm_nhwc.arch_specialisations()[implicit_gemm_nhwc.WGMMA_ARCH])
    anywhere = set(implicit_gemm_nhwc.specialisations())
    for dtype in implicit_gemm_nhwc.GEMM_DTYPES:
        for name in (implicit_gemm_nhwc.SMALL_TILE_CONFIG, "nhwc_wgmma_m64n128"):
            cfg = next(c for c in implicit_gemm_nhwc.NHWC_CONFIGS[dtype] if c.name == name)
            for split_k in (False, True):
                expression = implicit_gemm_nhwc.specialisation(dtype, "int", cfg, 16, 0, True, False, split_k)
                assert expression in wgmma and expression not in anywhere
            assert implicit_gemm_nhwc.stream_k_specialisation(dtype, cfg, True, False) in wgmma


#: (batch, input channels, output channels, plane, kernel, stride, taken): the 64 x 128 tile's rule (SMALL_WIDE_*)
#: on ResNet-50's layers, H200 fp16 channels_last graph times (the rules' plan before -> it).
SMALL_WIDE_CASES = [
    (8, 128, 128, 56, 3, 2, True),     # 98 tiles, 18 k tiles: 9.8 -> 9.0 us
    (8, 128, 128, 28, 3, 1, True),     # 9.6 -> 9.1
    (8, 1024, 512, 14, 1, 1, True),    # 100 tiles, 16 k tiles: 8.1 -> 7.9
    (8, 512, 2048, 7, 1, 1, True),     # 112 tiles, 8 k tiles: 5.8 (ping-pong) -> 5.3
    (8, 1024, 2048, 14, 1, 2, True),   # 9.3 -> 8.7
    (32, 512, 512, 7, 3, 1, False),    # 72 k tiles: not among the three fastest
    (32, 2048, 512, 7, 1, 1, False),   # 32 k tiles: likewise
    (8, 1024, 256, 14, 1, 1, False),   # 256 output channels, 50 tiles: the 64 x 64 tile (6.8 us)
    (32, 256, 1024, 14, 1, 1, False),  # 200 tiles: more than a wave
]


@pytest.mark.parametrize("n,c,k,h,kh,s,taken", SMALL_WIDE_CASES, ids=lambda v: str(v))
def test_the_64_by_128_tile_where_measured_faster(n, c, k, h, kh, s, taken):
    for dtype in ("float16", "bfloat16"):
        plan = planner.make_plan(problem(n, c, k, h, kh, s, dtype), compute_capability=90)
        assert (plan.config.name == implicit_gemm_nhwc.SMALL_WIDE_CONFIG) == taken, str(plan)
        if taken:
            assert plan.splits == 1 and "one warpgroup's 64 x 128 tile" in plan.reason
    for dtype, layout in (("float32", "NHWC"), ("float16", "NCHW")):  # measured in 16-bit channels-last alone
        assert not implicit_gemm_nhwc._small_wide_tile(problem(n, c, k, h, kh, s, dtype, layout), 90)
    assert not implicit_gemm_nhwc._small_wide_tile(problem(n, c, k, h, kh, s, "float16"), 80)
