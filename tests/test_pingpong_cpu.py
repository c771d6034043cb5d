"""The ping-pong tile (families/implicit_gemm_nhwc.py PINGPONG_CONFIG) without a GPU: its plan (persistent
blocks, at most one per SM), the problems it refuses with a reason, and its instances."""
import dataclasses
import math

import pytest

from cupyconv import planner
from cupyconv.arguments import make_problem
from cupyconv.families import implicit_gemm_nhwc
from cupyconv.families.common import BLOCK_RESERVED_SHARED_BYTES, H100_SMS, gemm_grid
from cupyconv.program import Im2colMap, PixelStripMap
from cupyconv.tuning import candidates, label

PINGPONG = implicit_gemm_nhwc.PINGPONG_CONFIG
PIXELS_64 = implicit_gemm_nhwc.PINGPONG_64_PIXEL_CONFIG
COPY_AVOIDING = implicit_gemm_nhwc.TF32_COPY_AVOIDING_CONFIG
STRIPS = implicit_gemm_nhwc.PIXEL_STRIPS_CONFIG


def problem(n=32, c=256, k=1024, h=14, dtype="float16", kernel=1, stride=1, padding=0, groups=1, layout="NHWC"):
    x = (n, h, h, c) if layout == "NHWC" else (n, c, h, h)
    w = (k, kernel, kernel, c // groups) if layout == "NHWC" else (k, c // groups, kernel, kernel)
    return make_problem(x, w, (k,), dtype, stride=stride, padding=padding, groups=groups, layout=layout,
                        weight_layout="KHWC" if layout == "NHWC" else "KCHW")


def layer(n, c, k, h, kernel, stride, fused=False, residual=False):
    """A ResNet-like 16-bit NHWC layer, padded to keep its plane; ``fused``: with a bias and ReLU; ``residual``: and a
    residual added."""
    out = (h + 2 * (kernel // 2) - kernel) // stride + 1
    return make_problem((n, h, h, c), (k, kernel, kernel, c), (k,) if fused or residual else None, "float16",
                        stride=stride, padding=kernel // 2, layout="NHWC", weight_layout="KHWC",
                        **({"activation": "relu"} if fused or residual else {}),
                        residual_shape=(n, out, out, k) if residual else None)


def plan_of(p, config=PINGPONG, **options):
    return planner.make_plan(p, config=config, kernel=planner.NHWC_KERNEL, compute_capability=90, **options)


@pytest.mark.parametrize("n", [1, 8, 32])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_persistent_grid(n, dtype):
    """At most one block per SM, never more blocks than tiles; 384 threads; its shared memory fits."""
    p = problem(n=n, dtype=dtype)
    plan = plan_of(p)
    tiles = gemm_grid(p, plan.config)[0] * gemm_grid(p, plan.config)[1]
    assert plan.grid == (min(tiles, H100_SMS), 1, 1) and plan.block == (384, 1, 1) and plan.splits == 1
    assert plan.shared_bytes + BLOCK_RESERVED_SHARED_BYTES <= 228 * 1024
    assert "ping-pong" in str(plan)
    assert implicit_gemm_nhwc.name_expression(plan) in implicit_gemm_nhwc.arch_specialisations()["sm_90a"]


@pytest.mark.parametrize("p,options,reason", [
    (dataclasses.replace(problem(dtype="float32"), has_residual=True),
     {"config": implicit_gemm_nhwc.PINGPONG_64_PIXEL_CONFIG, "splits": 1}, "adds a residual only through split-K"),
    (problem(dtype="float64"), {}, "implicit_gemm_nhwc"),
    (problem(layout="NCHW"), {}, "wgmma's nhwc_wgmma_m128n128 tile alone|16-bit and"),
    (problem(c=96, kernel=3, padding=1), {}, "whole k tiles of 64 channels of one tap"),
    (problem(c=48, kernel=3, padding=1, dtype="float32"), {}, "whole k tiles of 32 channels of one tap"),
    (problem(c=96, stride=2), {}, "whole k tiles of 64 channels of one tap"),
    (problem(groups=2), {}, "one group"),
    (problem(k=100), {}, "8-channel vectors"),
    (problem(n=8), {"stream_k": True}, "no stream-K|stream_k needs"),
    (problem(n=8), {"splits": 0}, "splits must be"),
], ids=["float32_64_pixels_residual", "float64", "nchw", "3x3", "3x3_float32", "strided", "groups", "k", "stream_k",
        "splits"])
def test_refusals(p, options, reason):
    with pytest.raises(ValueError, match=reason):
        plan_of(p, **options)


@pytest.mark.parametrize("splits", [2, 5])
def test_split_k_runs_are_work_items(splits):
    """Split-K's (run, tile) work items on at most one block per SM, the split instance writing float32
    sums to the workspace, then split_k_reduce adding the runs and the bias into the output."""
    p = problem(n=32, c=512, k=512, h=7, kernel=3, padding=1)
    plan = plan_of(p, splits=splits)
    tiles = gemm_grid(p, plan.config)[0] * gemm_grid(p, plan.config)[1]
    assert plan.splits == splits and plan.grid == (min(tiles * splits, H100_SMS), 1, 1)
    assert implicit_gemm_nhwc.name_expression(plan).endswith(",false,true,false>")  # split, no ROUND_A
    assert implicit_gemm_nhwc.name_expression(plan) in implicit_gemm_nhwc.arch_specialisations()["sm_90a"]
    program = implicit_gemm_nhwc.program(plan, p)
    gemm, reduce = program.launches
    assert gemm.kernel == implicit_gemm_nhwc.PINGPONG_KERNEL and reduce.kernel == "split_k_reduce"
    assert gemm.args[4] == 0 and program.workspace_bytes >= 4 * splits * 32 * 7 * 7 * 512  # no bias in the runs


@pytest.mark.parametrize("splits", implicit_gemm_nhwc.PINGPONG_CLUSTER_SPLITS)
def test_split_k_in_clusters(splits):
    """Clusters of 2, 4 or 8 blocks a tile, one a run: one launch of the cluster instance, tiles x splits blocks,
    no workspace and no reduction; the bias and epilogue are the kernel's own."""
    p = problem(n=32, c=512, k=512, h=7, kernel=3, padding=1)
    plan = planner.make_plan(p, config=implicit_gemm_nhwc.PINGPONG_CLUSTER_CONFIG, kernel=planner.NHWC_KERNEL,
                             compute_capability=90, splits=splits)
    tiles = gemm_grid(p, plan.config)[0] * gemm_grid(p, plan.config)[1]
    assert plan.splits == splits and plan.grid == (tiles * splits, 1, 1) and "distributed shared memory" in str(plan)
    expression = implicit_gemm_nhwc.name_expression(plan)
    assert expression.endswith(f",{splits},false>") and expression in implicit_gemm_nhwc.arch_specialisations()["sm_90a"]
    program = implicit_gemm_nhwc.program(plan, p)
    (launch,) = program.launches
    assert launch.kernel == implicit_gemm_nhwc.PINGPONG_CLUSTER_KERNEL and program.workspace_bytes == 0
    assert launch.args[4] == 1  # the bias added by the kernel
    assert planner.make_plan(p, config=implicit_gemm_nhwc.PINGPONG_CLUSTER_CONFIG, kernel=planner.NHWC_KERNEL,
                             compute_capability=90).splits == implicit_gemm_nhwc.PINGPONG_CLUSTER_SPLITS[0]


def test_64_pixel_tile():
    """The tile 64 pixels tall: twice the 128-pixel tile's pixel tiles, persistent blocks, 7 stages of 24 KB, a
    residual only through split-K's reduction (refused whole, with the reason), its whole and split-K instances
    for sm_90a, and the tuner's whole and split candidates."""
    p = problem(n=8, c=1024, k=256, h=14)
    plan = planner.make_plan(p, config=implicit_gemm_nhwc.PINGPONG_64_PIXEL_CONFIG, kernel=planner.NHWC_KERNEL,
                             compute_capability=90)
    tiles = gemm_grid(p, plan.config)[0] * gemm_grid(p, plan.config)[1]
    assert (plan.config.bm, plan.config.bn, plan.config.stages) == (64, 128, 7) and tiles == 25 * 2
    assert plan.grid == (tiles, 1, 1) and plan.splits == 1
    assert plan.shared_bytes + BLOCK_RESERVED_SHARED_BYTES <= 228 * 1024
    instances = implicit_gemm_nhwc.arch_specialisations()["sm_90a"]
    assert implicit_gemm_nhwc.name_expression(plan) in instances
    split = planner.make_plan(p, config=implicit_gemm_nhwc.PINGPONG_64_PIXEL_CONFIG, kernel=planner.NHWC_KERNEL,
                              compute_capability=90, splits=2)
    assert implicit_gemm_nhwc.name_expression(split).endswith(",false,true,false>") and \
        implicit_gemm_nhwc.name_expression(split) in instances
    with_residual = dataclasses.replace(p, has_residual=True)
    with pytest.raises(ValueError, match="adds a residual only through split-K"):
        planner.make_plan(with_residual, config=implicit_gemm_nhwc.PINGPONG_64_PIXEL_CONFIG, kernel=planner.NHWC_KERNEL,
                          compute_capability=90)
    assert planner.make_plan(with_residual, config=implicit_gemm_nhwc.PINGPONG_64_PIXEL_CONFIG,
                             kernel=planner.NHWC_KERNEL, compute_capability=90, splits=2).splits == 2
    labels = [label(c) for _, c in candidates(p, compute_capability=90)]
    assert "implicit_gemm_nhwc nhwc_wgmma_pingpong_m64n128" in labels
    assert "implicit_gemm_nhwc nhwc_wgmma_pingpong_m64n128 split-K 2" in labels
    small = "implicit_gemm_nhwc nhwc_wgmma_pingpong_m64n64"  # 100 tiles: at most two items a block in 2 runs
    assert small in labels and f"{small} split-K 2" in labels and f"{small} split-K 3" not in labels


@pytest.mark.parametrize("splits", [1, 3, 16])
def test_split_k_in_clusters_refusals(splits):
    with pytest.raises(ValueError, match="runs clusters of"):
        planner.make_plan(problem(n=8, c=64, k=256, h=14), config=implicit_gemm_nhwc.PINGPONG_CLUSTER_CONFIG,
                          kernel=planner.NHWC_KERNEL, compute_capability=90, splits=splits)
    with pytest.raises(ValueError, match="at most one a k tile"):  # 1 k tile
        planner.make_plan(problem(n=8, c=64, k=256, h=14), config=implicit_gemm_nhwc.PINGPONG_CLUSTER_CONFIG,
                          kernel=planner.NHWC_KERNEL, compute_capability=90, splits=2)


def test_channels_past_the_last_k_tile():
    """Input channels need not fill whole k tiles: TMA fills the last one's columns past C with zeros, in
    x and w alike."""
    assert plan_of(problem(c=96)).channels_padded == 96


@pytest.mark.parametrize("p", [problem(kernel=3, padding=1), problem(stride=2), problem(kernel=3, stride=2, padding=1)],
                         ids=["3x3", "strided_1x1", "strided_3x3"])
def test_taps_and_strides_copy_by_im2col(p):
    """Layers other than 1x1, stride-1, unpadded ones read x by the im2col map (whole k tiles a tap), the
    weight's kh kw C columns as a matrix."""
    plan = plan_of(p)
    maps = implicit_gemm_nhwc.program(plan, p).launches[-1].args[-3:]
    assert isinstance(maps[1], Im2colMap) and maps[2] == 0 and maps[0].columns == p.kh * p.kw * p.c


@pytest.mark.parametrize("config", implicit_gemm_nhwc.PAIRED_TAP_CONFIGS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("p", [problem(n=8, c=32, k=64, h=64, kernel=5, padding=2), problem(n=8, c=32, k=64, stride=2)],
                         ids=["5x5", "strided_1x1"])
def test_two_taps_a_k_tile_for_32_channels(p, dtype, config):
    """16-bit layers of 32 channels by im2col copies: two taps' 64-byte pixels a k tile (half the k tiles of one tap
    a tile), each tap's copy 32 channels wide, the instance compiled; no split-K."""
    p = dataclasses.replace(p, dtype=dtype)
    plan = plan_of(p, config=config)
    assert plan.taps_per_k_tile == 2 and "2 taps of 32 channels a k tile" in plan.reason
    assert implicit_gemm_nhwc.reduction_tiles(p, plan.config, plan.channels_padded) == math.ceil(p.kh * p.kw / 2)
    x_map = implicit_gemm_nhwc.program(plan, p).launches[-1].args[-2]
    assert isinstance(x_map, Im2colMap) and x_map.channels_per_pixel == 32
    assert f",{plan.config.stages},2," in implicit_gemm_nhwc.name_expression(plan)
    assert implicit_gemm_nhwc.name_expression(plan) in implicit_gemm_nhwc.arch_specialisations()["sm_90a"]
    with pytest.raises(ValueError, match="two taps run without split-K"):
        plan_of(p, config=config, splits=2)


@pytest.mark.parametrize("p,config", [
    (problem(n=8, c=32, k=64, h=64, kernel=3, padding=1, dtype="float32"), PINGPONG),  # 128 bytes: a whole k tile
    (problem(n=8, c=32, k=64), PINGPONG),                                              # 1x1: x is the matrix
    (problem(n=8, c=32, k=64, h=64, kernel=3, padding=1), PIXELS_64),                  # no instance of two taps
], ids=["float32", "1x1", "64_pixel_tile"])
def test_one_tap_a_k_tile_elsewhere(p, config):
    if config == PIXELS_64:
        with pytest.raises(ValueError, match="two taps of 32 16-bit channels"):
            plan_of(p, config=config)
        return
    assert plan_of(p, config=config).taps_per_k_tile == 1


@pytest.mark.parametrize("n,k,h,taps,padding,taken", [
    (32, 64, 112, (3, 3), 1, STRIPS),                                      # 56.9 us against paired taps' 72.2
    (32, 128, 56, (3, 3), 1, PINGPONG),                                    # paired, 784 tiles: 28.3 against 29.2
    (32, 32, 112, (3, 3), 1, None),                                        # 32 channels: the 128 x 32 mma.sync tile
    (32, 256, 56, (3, 3), 1, PINGPONG),                                    # paired: 39.7 against 54.7
    (32, 128, 56, (5, 5), 2, PINGPONG),                                    # paired, 13 k tiles: 44.1 against 56.2
    (8, 128, 112, (7, 7), 3, PINGPONG),                                    # paired, 25 k tiles: 77.6 against 99.2
    (8, 64, 56, (3, 3), 1, STRIPS),                                        # 9.4 against 10.3
    (16, 64, 56, (5, 5), 2, STRIPS),
    (8, 64, 512, (5, 9), 0, STRIPS),                                       # the 5x9 seed: 663.6 against 988.0
    (32, 64, 28, (3, 3), 1, None),                                         # rows of 28: segments 44 % used
], ids=["3x3_64_b32", "3x3_128_b32", "3x3_32_b32", "3x3_256_b32", "5x5_128", "7x7_128", "3x3_64_b8", "5x5",
        "wide_5x9", "rows_of_28"])
def test_rules_take_strips_or_two_taps_where_measured_faster(n, k, h, taps, padding, taken):
    """The fixed rules' pixel strips (pixel_strips_config: 16-bit layers of 32 -> 33-64 channels, rows whose 64-pixel
    segments are 75 % used, fused or not) and two taps a k tile (paired_taps_config: such layers of more than 32
    output channels elsewhere, up to 7x7 kernels, on four waves of tiles), as measured on the H200
    (benchmarks/results/candidates_c32_h200.txt, candidates_pixel_strips_shapes_h200.txt,
    candidates_k32_paired_h200.txt); neither on sm_80, paired taps not with a residual, neither with 48 channels."""
    def p(**options):
        return make_problem((n, h, h, options.pop("c", 32)), (k, *taps, options.pop("wc", 32)), None, "float16",
                            padding=padding, layout="NHWC", weight_layout="KHWC", **options)

    plan = planner.make_plan(p(), compute_capability=90)
    assert (plan.config.name if plan.taps_per_k_tile != 1 else None) == taken, str(plan)
    if taken == STRIPS:
        assert "read from strips of pixels" in plan.reason
        assert implicit_gemm_nhwc.pixel_strips_config(p(), 80) is None
        assert implicit_gemm_nhwc.pixel_strips_config(p(activation="relu"), 90) is not None
        assert implicit_gemm_nhwc.pixel_strips_config(p(c=48, wc=48), 90) is None
    elif taken:
        assert "two taps a k tile" in plan.reason
        assert implicit_gemm_nhwc.paired_taps_config(p(), 80) is None
        assert implicit_gemm_nhwc.paired_taps_config(p(activation="relu"), 90) == plan.config
        out = (h + 2 * padding - taps[0]) + 1
        assert implicit_gemm_nhwc.paired_taps_config(p(residual_shape=(n, out, out, k)), 90) is None
        assert implicit_gemm_nhwc.paired_taps_config(p(c=48, wc=48), 90) is None


@pytest.mark.parametrize("n,h,w,taps,padding,taken", [
    (32, 56, 56, (5, 5), 2, STRIPS),                                          # 43.5 us against 52.1
    (8, 512, 512, (5, 9), 0, implicit_gemm_nhwc.PIXEL_STRIPS_WIDE_CONFIG),    # 1355.9 against 1530.2
    (32, 56, 56, (3, 3), 1, None),                                            # level: 22.9 against 23.5
    (32, 224, 224, (3, 3), 1, None),                                          # vgg_conv1_2: 280.3 against 278.1
    (8, 224, 224, (7, 7), 3, None),                                           # 372.7 against 335.8
], ids=["5x5", "5x9", "r50_3x3", "vgg_3x3", "7x7"])
def test_rules_take_64_channel_strips_where_measured_faster(n, h, w, taps, padding, taken):
    """64 -> 64-channel layers on the pixel strips where the H200 ran them faster (PIXEL_STRIPS_RULE_TAPS;
    benchmarks/results/candidates_pixel_strips_c64_templated_h200.txt): 5x5 on the 3-stage tile, 5x9 on the 2-stage
    one; 3x3 and 7x7 stay on the 128 x 64 ping-pong tile."""
    p = make_problem((n, h, w, 64), (64, *taps, 64), (64,), "float16", padding=padding, layout="NHWC",
                     weight_layout="KHWC", activation="relu")
    plan = planner.make_plan(p, compute_capability=90)
    assert (plan.config.name if plan.taps_per_k_tile == implicit_gemm_nhwc.PIXEL_STRIPS else None) == taken, str(plan)
    if taken is None:
        assert plan.config.name == implicit_gemm_nhwc.PINGPONG_NARROW_CONFIG, str(plan)
    else:
        assert "read from strips of pixels" in plan.reason and "of 128 bytes" in plan.reason
        assert implicit_gemm_nhwc.pixel_strips_config(p, 80) is None


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("n,c,k,h,taken", [
    (32, 32, 32, 112, True),    # 60.6 us against the paired 128 x 64 tile's 75.5
    (8, 32, 32, 112, True),     # 20.7 against 22.1
    (32, 32, 16, 56, True),
    (32, 64, 32, 56, False),    # 29.5 on the 256 x 64 wgmma tile; 28.9 and 31.0 on the 128 x 32 ones
    (32, 128, 32, 28, False),   # 17.5 there, 20.4 on this one
])
def test_rules_take_the_32_channel_tile_for_32_channel_taps(n, c, k, h, taken, dtype):
    """16-bit 3x3 layers of 32 -> at most 32 channels on the 128 x 32 mma.sync tile of 64-byte k rows, fused or not
    (narrow_out_taps_config; benchmarks/results/candidates_k32_paired_h200.txt); not on sm_80, not for 1x1 layers
    read in place, not in NCHW."""
    p = make_problem((n, h, h, c), (k, 3, 3, c), (k,), dtype, padding=1, layout="NHWC", weight_layout="KHWC",
                     activation="relu")
    plan = planner.make_plan(p, compute_capability=90)
    assert (plan.config.name == implicit_gemm_nhwc.NARROW_OUT_TAPS_CONFIG) == taken, str(plan)
    if taken:
        assert "one 32-channel tile, a tap's 32 channels a k row of 64 bytes" in plan.reason
        assert plan.config.bk * 2 == 64 and plan.config.bn == 32 and not plan.config.wgmma
        assert implicit_gemm_nhwc.narrow_out_taps_config(p, 80) is None
        pointwise = make_problem((n, h, h, c), (k, 1, 1, c), None, dtype, layout="NHWC", weight_layout="KHWC")
        assert implicit_gemm_nhwc.narrow_out_taps_config(pointwise, 90) is None
        nchw = make_problem((n, c, h, h), (k, c, 3, 3), None, dtype, padding=1)
        assert implicit_gemm_nhwc.narrow_out_taps_config(nchw, 90) is None


#: VGG-16's and ResNet-50's layers with a bias (fp16 channels_last, H200, GPU time behind a spin, us;
#: benchmarks/results/candidates_fused_h200.txt): the ping-pong rules take 16-bit calls with a bias or activation as
#: they take unfused ones, but not with a residual, nor in TF32.
@pytest.mark.parametrize("n,c,k,h,expected", [
    (32, 64, 64, 224, implicit_gemm_nhwc.PINGPONG_NARROW_CONFIG),  # vgg_conv1_2: 283.2 against 426.7
    (32, 256, 256, 56, PINGPONG),                                  # vgg_conv3_2: 168.8 against 186.9
    (32, 64, 64, 56, implicit_gemm_nhwc.PINGPONG_NARROW_CONFIG),   # ResNet-50's 3x3 of 64: 24.2 against 31.2
], ids=["vgg_conv1_2", "vgg_conv3_2", "r50_3x3_64"])
def test_pingpong_rules_take_calls_with_a_bias(n, c, k, h, expected):
    for fused in (False, True):
        plan = planner.make_plan(layer(n, c, k, h, 3, 1, fused=fused), compute_capability=90)
        assert plan.config.name == expected, str(plan)
    residual = planner.make_plan(layer(n, c, k, h, 3, 1, residual=True), compute_capability=90)
    assert residual.config.name not in implicit_gemm_nhwc.PAIRED_TAP_CONFIGS, str(residual)
    tf32 = make_problem((n, h, h, c), (k, 3, 3, c), (k,), "float32", padding=1, layout="NHWC", weight_layout="KHWC")
    assert planner.make_plan(tf32, allow_tf32=True, compute_capability=90).config.name != PINGPONG


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("channels,config", [(32, STRIPS), (64, STRIPS),
                                             (64, implicit_gemm_nhwc.PIXEL_STRIPS_WIDE_CONFIG)])
@pytest.mark.parametrize("shape", [(8, 512, 512, 5, 9, 0), (32, 112, 112, 3, 3, 1), (2, 13, 70, 3, 3, 1)],
                         ids=["5x9_seed", "3x3_112", "rows_of_70"])
def test_pixel_strips_plan(shape, channels, config, dtype):
    """A k tile a kernel row: kh k tiles, tiles of two 64-pixel segments of output rows, a strip map of 64 + kw - 1
    pixels of 64 or 128 bytes rounded to whole swizzle patterns, shared memory that fits (64 channels of 9 taps:
    two stages), the instance compiled; no split-K."""
    n, h, w, kh, kw, pad = shape
    p = make_problem((n, h, w, channels), (64, kh, kw, channels), None, dtype, padding=pad, layout="NHWC",
                     weight_layout="KHWC")
    if channels == 64 and kw == 9 and config == STRIPS:
        with pytest.raises(ValueError, match="its 3 stages hold a kernel row's 9 taps of 64 channels"):
            plan_of(p, config=config)
        return
    plan = plan_of(p, config=config)
    assert plan.taps_per_k_tile == implicit_gemm_nhwc.PIXEL_STRIPS and \
        f"its {kw} taps read from strips of 64 + {kw - 1} pixels of {2 * channels} bytes" in plan.reason
    segments = n * p.ho * math.ceil(p.wo / 64)
    assert implicit_gemm_nhwc.strip_tiles(p, plan.config) == math.ceil(segments / 2)
    assert plan.grid == (min(math.ceil(segments / 2), H100_SMS), 1, 1)
    stage = 2 * math.ceil((63 + kw) / 8) * 8 * 2 * channels + math.ceil(kw * channels / 64) * 64 * 128
    assert plan.shared_bytes >= plan.config.stages * stage
    assert plan.shared_bytes + BLOCK_RESERVED_SHARED_BYTES <= 228 * 1024
    launch = implicit_gemm_nhwc.program(plan, p).launches[-1]
    weight_map, x_map, _ = launch.args[-3:]
    assert launch.kernel == implicit_gemm_nhwc.PIXEL_STRIPS_KERNEL
    assert isinstance(x_map, PixelStripMap) and x_map.shape == (n, h, w, channels)
    assert x_map.pixels == math.ceil((63 + kw) / 8) * 8 and weight_map.columns == kh * kw * channels
    expression = implicit_gemm_nhwc.name_expression(plan)
    assert expression.startswith(f"cupyconv::{implicit_gemm_nhwc.PIXEL_STRIPS_KERNEL}<") and \
        expression.endswith(f",{plan.config.stages},{2 * channels},false>")
    assert expression in implicit_gemm_nhwc.arch_specialisations()["sm_90a"]


@pytest.mark.parametrize("channels", [32, 64])
def test_pixel_strips_copy_1x1_layers_by_strips(channels):
    """A 1x1 unpadded layer (the other tiles' 2-D matrix map) on the strips' tile still gets the strips' 4-D map:
    its kernel copies by that alone (a matrix map stopped it with an illegal instruction, H200)."""
    p = make_problem((3, 7, 9, channels), (72, 1, 1, channels), None, "float16", layout="NHWC", weight_layout="KHWC")
    plan = plan_of(p, config=STRIPS)
    _, x_map, x_is_matrix = implicit_gemm_nhwc.program(plan, p).launches[-1].args[-3:]
    assert isinstance(x_map, PixelStripMap) and x_map.pixels == 64 and x_is_matrix == 0


@pytest.mark.parametrize("x,w,options,reason", [
    ((8, 64, 64, 48), (64, 3, 3, 48), {"padding": 1}, "pixels of 32 or 64 16-bit channels"),
    ((8, 64, 64, 32), (64, 3, 3, 32), {"padding": 1, "dtype": "float32"}, "must be one of"),  # no float32 tile
    ((8, 64, 64, 32), (60, 3, 3, 32), {"padding": 1}, "8-channel vectors"),
    ((8, 64, 64, 32), (64, 3, 3, 32), {"stride": (1, 2)}, "stride and dilation 1 along w"),
    ((8, 64, 64, 32), (64, 3, 3, 32), {"dilation": (1, 2)}, "stride and dilation 1 along w"),
    ((8, 64, 64, 32), (64, 1, 13, 32), {}, "its 3 stages hold a kernel row's 13 taps of 32 channels"),
    ((8, 64, 64, 64), (64, 1, 7, 64), {}, "its 3 stages hold a kernel row's 7 taps of 64 channels"),
    ((8, 64, 64, 32), (64, 3, 3, 32), {"splits": 2}, "whole reductions"),
    ((8, 64, 64, 32), (64, 3, 3, 32), {"config": implicit_gemm_nhwc.PIXEL_STRIPS_WIDE_CONFIG}, "rows of 64 channels"),
    ((8, 64, 64, 64), (64, 1, 11, 64), {"config": implicit_gemm_nhwc.PIXEL_STRIPS_WIDE_CONFIG}, "11 taps of 64"),
], ids=["48_channels", "float32", "k60", "stride_w", "dilation_w", "kw13", "c64_kw7", "split_k", "wide_c32",
        "wide_kw11"])
def test_pixel_strips_refusals(x, w, options, reason):
    options = dict(options)
    dtype, splits = options.pop("dtype", "float16"), options.pop("splits", None)
    config = options.pop("config", STRIPS)
    p = make_problem(x, w, None, dtype, layout="NHWC", weight_layout="KHWC", **options)
    with pytest.raises(ValueError, match=reason):
        plan_of(p, config=config, **({"splits": splits} if splits else {}))


def test_wgmma_only():
    with pytest.raises(ValueError, match="wgmma needs compute capability"):
        planner.make_plan(problem(), config=PINGPONG, kernel=planner.NHWC_KERNEL, compute_capability=80)


def test_tuner_tries_it():
    labels = [plan.config.name for _, plan in candidates(problem(), compute_capability=90)]
    assert PINGPONG in labels
    assert PINGPONG in [plan.config.name for _, plan in candidates(problem(kernel=3, padding=1), compute_capability=90)]
    assert PINGPONG not in [plan.config.name for _, plan in candidates(problem(c=96, kernel=3, padding=1),
                                                                      compute_capability=90)]
    splits = [plan.splits for _, plan in candidates(problem(n=32, c=512, k=512, h=7, kernel=3, padding=1),
                                                    compute_capability=90) if plan.config.name == PINGPONG]
    assert sorted(splits) == [1, 2, 3, 4, 5]  # whole, and 52 tiles in runs of at most two work items a block
    clusters = [plan.splits for _, plan in candidates(problem(n=32, c=512, k=512, h=7, kernel=3, padding=1),
                                                      compute_capability=90)
                if plan.config.name == implicit_gemm_nhwc.PINGPONG_CLUSTER_CONFIG]
    assert sorted(clusters) == [2, 4]  # 8 a tile would make 416 blocks


#: (batch, input channels, output channels, plane height, width, whether the rules take the ping-pong tile):
#: each as measured on the H200 (benchmarks/results/pingpong_first_h200.txt).
RULE_CASES = [
    (32, 256, 1024, 14, 14, True),    # 11.9 -> 8.2 us
    (32, 512, 256, 28, 28, True),     # 16.6 -> 12.1, in place of the 192-pixel producer tile (2 waves of it)
    (32, 64, 256, 56, 56, True),      # 22.2 -> 20.2, in place of the pointwise kernel
    (8, 512, 2048, 7, 7, True),       # 64 tiles: 6.9 -> 5.6
    (16, 512, 1024, 1, 1000, True),   # conformer's pointwise conv1d: 39.5 -> 29.9
    (32, 1024, 512, 14, 14, False),   # one wave of 192-pixel producer blocks: 12.6 against 13.6
    (32, 512, 128, 28, 28, False),    # the same: 8.8 against 9.1
    (8, 2048, 512, 7, 7, False),      # 52 tiles, the rules split the reduction: 7.7 against 12.2
    (8, 96, 576, 14, 14, False),      # two k tiles, half a wave: 3.5 against 3.9
    (32, 256, 64, 56, 56, False),     # 64 output channels
    (32, 24, 144, 56, 56, False),     # 24 input channels: 17.5 against 26.4
    (1, 256, 1024, 14, 14, False),    # 16 tiles
]


#: (batch, input channels, output channels, plane, kernel, stride, taken): ResNet-50's layers with taps or
#: strides as measured on the H200 (benchmarks/results/pingpong_im2col_candidates_a756a74_h200.txt).
IM2COL_RULE_CASES = [
    (32, 256, 512, 56, 1, 2, True),     # 23.7 -> 16.4 us
    (32, 256, 256, 14, 3, 1, True),     # 20.4 -> 17.1
    (32, 256, 256, 28, 3, 2, True),     # 20.3 -> 17.1
    (32, 512, 1024, 28, 1, 2, True),    # 16.5 -> 14.5
    (8, 512, 1024, 28, 1, 2, True),     # 7.3 -> 6.4
    (32, 128, 128, 28, 3, 1, False),    # one wave of 192-pixel producer blocks: 15.3 against 18.3
    (32, 512, 512, 7, 3, 1, False),     # 52 tiles: split-K's runs (SPLIT_RULE_CASES), 30.4 whole
    (32, 1024, 2048, 14, 1, 2, False),  # 16 k tiles, one wave of 256-pixel producer blocks: 15.8 against 17.6
    (8, 256, 256, 14, 3, 1, False),     # 26 tiles: split-K's runs, 16.6 whole
    (32, 64, 64, 56, 3, 1, False),      # 64 output channels: 26.5 against 44.9
]


@pytest.mark.parametrize("n,c,k,h,kernel,stride,taken", IM2COL_RULE_CASES, ids=lambda v: str(v))
def test_rules_on_layers_with_taps_and_strides(n, c, k, h, kernel, stride, taken):
    p = layer(n, c, k, h, kernel, stride)
    plan = planner.make_plan(p, compute_capability=90)
    assert (plan.config.name == PINGPONG and plan.splits == 1) == taken
    assert implicit_gemm_nhwc.pingpong_pays(p, 90) == taken


@pytest.mark.parametrize("n,c,k,h,w,taken", RULE_CASES, ids=lambda v: str(v))
def test_rules_take_it_where_measured_faster(n, c, k, h, w, taken):
    p = make_problem((n, h, w, c), (k, 1, 1, c), None, "float16", layout="NHWC", weight_layout="KHWC")
    plan = planner.make_plan(p, compute_capability=90)
    # The 64 x 128 tile goes first where it makes a wave of short reductions (SMALL_WIDE_*: 512 -> 2048 on 7^2 at
    # batch 8 5.8 -> 5.3 us).
    taken_here = taken and not implicit_gemm_nhwc._small_wide_tile(p, 90)
    assert (plan.config.name == PINGPONG) == taken_here, str(plan)
    assert implicit_gemm_nhwc.pingpong_pays(p, 90) == taken
    assert not implicit_gemm_nhwc.pingpong_pays(p, 80) and planner.make_plan(p).config.name != PINGPONG


@pytest.mark.parametrize("epilogue", [{"bias_shape": (1024,)}, {"activation": "relu"},
                                      {"residual_shape": (32, 14, 14, 1024)}], ids=["bias", "relu", "residual"])
def test_rules_leave_calls_with_a_residual_to_the_other_tiles(epilogue):
    """Its epilogue with a residual outlasted the other consumer's MMAs (ResNet-50 fused: 1.310 -> 1.364 ms); a
    bias or activation alone did not (this layer with a bias 18.8 -> 12.9 us). The tuner may still take it, the
    residual's calls on an instance of their own."""
    p = make_problem((32, 14, 14, 256), (1024, 1, 1, 256), epilogue.pop("bias_shape", None), "float16",
                     layout="NHWC", weight_layout="KHWC", **epilogue)
    assert implicit_gemm_nhwc.pingpong_pays(p, 90) == (not p.has_residual)
    assert (planner.make_plan(p, compute_capability=90).config.name == PINGPONG) == (not p.has_residual)
    forced = plan_of(p)
    assert implicit_gemm_nhwc.name_expression(forced).endswith(",true,false,false>" if p.has_residual
                                                              else ",false,false,false>")


def test_rules_leave_it_to_forced_splits():
    """A caller forcing split-K's runs on a layer the rules give the ping-pong tile gets another tile."""
    plan = planner.make_plan(problem(n=8, c=512, k=2048, h=7), compute_capability=90, splits=2)
    assert plan.config.name != PINGPONG and plan.splits == 2


SPLIT_RULE_CASES = [  # (n, c, k, h, kernel, stride, split-K's runs, the clusters' runs; 1: the rule does not take it)
    (32, 512, 512, 7, 3, 1, 2, 2),     # 52 tiles of 72 k tiles: two runs a tile fill 104 SMs, in clusters
    (32, 512, 512, 14, 3, 2, 2, 2),
    (32, 2048, 512, 7, 1, 1, 1, 2),    # 52 tiles of 32 k tiles: runs of 16 in clusters, too short for split-K
    (16, 512, 512, 7, 3, 1, 4, 1),     # 28 tiles: 112 items of 18 k tiles; two runs fill under 3/4 of a wave
    (8, 256, 256, 14, 3, 1, 5, 1),     # 26 tiles of 36 k tiles: 130 items, runs of 8 (the last 4)
    (8, 512, 512, 7, 3, 1, 8, 1),      # 16 tiles: 128 items of 9 k tiles
    (8, 1024, 256, 14, 1, 1, 1, 1),    # 16 k tiles: the 1x1 reductions lost
    (8, 2048, 512, 7, 1, 1, 1, 1),     # 32 k tiles
    (1, 512, 512, 7, 3, 1, 1, 1),      # 4 tiles: 9 runs of 8 make 36 items, under three quarters of a wave
    (32, 256, 256, 14, 3, 1, 1, 1),    # 98 tiles: the ping-pong tile whole
]


@pytest.mark.parametrize("n,c,k,h,kernel,stride,runs,cluster", SPLIT_RULE_CASES, ids=lambda v: str(v))
def test_rules_split_it_where_measured_faster(n, c, k, h, kernel, stride, runs, cluster):
    p = problem(n=n, c=c, k=k, h=h, kernel=kernel, stride=stride, padding=kernel // 2)
    assert implicit_gemm_nhwc.pingpong_split_runs(p, 90) == runs
    assert implicit_gemm_nhwc.pingpong_cluster_runs(p, 90) == cluster
    plan = planner.make_plan(p, compute_capability=90)
    tiles = gemm_grid(p, plan.config)[0] * gemm_grid(p, plan.config)[1]
    if cluster > 1 and not implicit_gemm_nhwc.pingpong_64_pixel_runs(p, 90):  # asked first; the bias here: the
        # clusters' blocks run the epilogue
        assert plan.config.name == implicit_gemm_nhwc.PINGPONG_CLUSTER_CONFIG and plan.splits == cluster, str(plan)
        assert plan.grid == (tiles * cluster, 1, 1) and "in a cluster of two blocks" in plan.reason
    elif runs > 1 and not implicit_gemm_nhwc.pingpong_64_pixel_runs(p, 90) and \
            not implicit_gemm_nhwc.pingpong_small_pays(p, 90):  # the reduction runs the epilogue
        assert plan.config.name == PINGPONG and plan.splits == runs and "split-K: " in plan.reason, str(plan)
        assert plan.grid == (tiles * runs, 1, 1)
    assert implicit_gemm_nhwc.pingpong_split_runs(p, 80) == 1 and implicit_gemm_nhwc.pingpong_cluster_runs(p, 80) == 1
    unsplit = planner.make_plan(p, compute_capability=90, kernel=planner.NHWC_KERNEL, splits=1)
    assert unsplit.splits == 1 and unsplit.config.name != implicit_gemm_nhwc.PINGPONG_CLUSTER_CONFIG


#: (batch, input channels, output channels, plane, kernel, stride, taken): where the rules take the 64 x 64 ping-pong
#: tile, as ResNet-50's layers measured on the H200 (benchmarks/results/pingpong_small_sweep_h200.txt, and
#: pointwise_small_rule_candidates_h200.txt for MobileNetV2's and EfficientNet-B0's; us before -> on it).
SMALL_RULE_CASES = [
    (8, 1024, 256, 14, 1, 1, True),    # 100 tiles, 16 k tiles: 6.5 -> 5.7
    (8, 256, 256, 14, 3, 1, True),     # 36 k tiles on 100 tiles: 10.1 -> 9.6
    (1, 64, 64, 56, 3, 1, True),       # 49 tiles, 9 k tiles: 5.2 -> 4.3
    (1, 512, 128, 28, 1, 1, True),     # 26 tiles, 8 k tiles: 4.4 -> 4.0
    (8, 384, 64, 14, 1, 1, True),      # MobileNetV2's, 25 tiles, 6 k tiles: 4.3 -> 3.7
    (8, 672, 192, 7, 1, 1, True),      # EfficientNet-B0's, 21 tiles, 11 k tiles: 5.5 -> 4.6
    (8, 2048, 512, 7, 1, 1, False),    # 56 tiles of 32 k tiles: 8.3 against split-K's 7.4
    (1, 1024, 256, 14, 1, 1, False),   # 16 tiles: 5.4 against 5.0
    (8, 1024, 512, 14, 1, 1, False),   # 200 tiles: 8.7 against 6.8
    (1, 128, 512, 28, 1, 1, False),    # 2 k tiles: 3.1 against 2.9
    (32, 2048, 512, 7, 1, 1, False),   # 200 tiles: 14.4 against 10.2
    # Outputs of part of a last 64-channel tile (pingpong_partial_tiles_candidates_h200.txt):
    (8, 384, 96, 14, 1, 1, True),      # MobileNetV2's, 50 tiles, 6 k tiles: 4.9 -> 3.6
    (8, 576, 160, 7, 1, 1, True),      # 21 tiles, 9 k tiles: 4.7 -> 4.1
    (8, 240, 80, 14, 1, 1, True),      # EfficientNet-B0's, 4 k tiles: 4.2 -> 3.2
    (32, 960, 160, 7, 1, 1, True),     # 75 tiles, 15 k tiles: 6.8 -> 5.2
    (8, 960, 160, 7, 1, 1, False),     # 21 tiles of 15 k tiles: 5.1 against split-K's 4.8
    (8, 80, 480, 14, 1, 1, False),     # 200 tiles: 3.6 against 3.3
]


@pytest.mark.parametrize("n,c,k,h,kernel,stride,taken", SMALL_RULE_CASES, ids=lambda v: str(v))
def test_rules_take_the_small_tile_where_measured_faster(n, c, k, h, kernel, stride, taken):
    p = layer(n, c, k, h, kernel, stride)
    assert implicit_gemm_nhwc.pingpong_small_pays(p, 90) == taken
    plan = planner.make_plan(p, compute_capability=90)
    assert (plan.config.name == implicit_gemm_nhwc.PINGPONG_SMALL_CONFIG) == taken, str(plan)
    if taken:
        assert plan.splits == 1 and "64 x 64" in plan.reason and plan.grid[0] == math.prod(gemm_grid(p, plan.config))
        assert plan.shared_bytes + BLOCK_RESERVED_SHARED_BYTES <= 227 * 1024
        assert implicit_gemm_nhwc.name_expression(plan) in implicit_gemm_nhwc.arch_specialisations()["sm_90a"]
    assert not implicit_gemm_nhwc.pingpong_small_pays(p, 80)
    assert implicit_gemm_nhwc.pingpong_small_pays(layer(n, c, k, h, kernel, stride, fused=True), 90) == taken
    assert not implicit_gemm_nhwc.pingpong_small_pays(layer(n, c, k, h, kernel, stride, residual=True), 90)


#: (batch, input channels, output channels, plane, kernel, stride, split-K's runs; 0: not taken): where the rules take
#: the 64-pixel ping-pong tile, as ResNet-50's layers measured on the H200 (benchmarks/results/
#: pingpong_64_pixel_sweep_h200.txt; us before -> on it).
PIXEL_64_RULE_CASES = [
    (8, 1024, 256, 14, 1, 1, 1),    # 50 tiles, 16 k tiles: 6.8 -> 6.3 whole (2 runs of 8: 7.3)
    (8, 256, 256, 14, 3, 1, 2),     # 36 k tiles: 10.4 -> 9.9 in 2 runs
    (8, 2048, 512, 7, 1, 1, 3),     # 28 tiles, 32 k tiles: 7.9 -> 7.1 in 3 runs of 11 (4 of 8: 7.3)
    (8, 512, 512, 7, 3, 1, 4),      # 72 k tiles: 10.3 -> 9.8 in 4
    (8, 128, 128, 28, 3, 1, 1),     # 98 tiles: 7.7 -> 7.2
    (32, 2048, 512, 7, 1, 1, 1),    # 100 tiles: 11.0 -> 10.1
    (1, 256, 128, 56, 1, 1, 1),     # 49 tiles, 4 k tiles: 4.2 -> 3.6
    (32, 512, 512, 7, 3, 1, 0),     # 72 k tiles whole: 19.1 against the clusters' 18.6
    (32, 1024, 256, 14, 1, 1, 0),   # 98 tiles of 128 x 128: 8.2 against 10.3
    (8, 256, 1024, 14, 1, 1, 0),    # 104 of them: 4.7 against 5.0
    (1, 1024, 256, 14, 1, 1, 0),    # 8 tiles: 4.8 against 6.1
    (1, 128, 512, 28, 1, 1, 0),     # 2 k tiles: 2.8 against 3.2
    (1, 256, 64, 56, 1, 1, 0),      # half a tile of output channels: other widths untimed
]


@pytest.mark.parametrize("n,c,k,h,kernel,stride,runs", PIXEL_64_RULE_CASES, ids=lambda v: str(v))
def test_rules_take_the_64_pixel_tile_where_measured_faster(n, c, k, h, kernel, stride, runs):
    p = layer(n, c, k, h, kernel, stride)
    assert implicit_gemm_nhwc.pingpong_64_pixel_runs(p, 90) == runs
    plan = planner.make_plan(p, compute_capability=90)
    taken = plan.config.name == implicit_gemm_nhwc.PINGPONG_64_PIXEL_CONFIG
    if implicit_gemm_nhwc.pingpong_small_pays(p, 90):  # the 64 x 64 tile's rule is asked first
        assert plan.config.name == implicit_gemm_nhwc.PINGPONG_SMALL_CONFIG, str(plan)
        return
    assert taken == bool(runs) and (not taken or plan.splits == runs), str(plan)
    if taken:
        assert "64 pixels tall" in plan.reason and plan.grid == (min(plan.splits * math.prod(gemm_grid(
            p, plan.config)), H100_SMS), 1, 1)
        unsplit = planner.make_plan(p, compute_capability=90, kernel=planner.NHWC_KERNEL, splits=1)
        assert (unsplit.config.name == implicit_gemm_nhwc.PINGPONG_64_PIXEL_CONFIG) == (runs == 1)
    assert not implicit_gemm_nhwc.pingpong_64_pixel_runs(p, 80)
    assert implicit_gemm_nhwc.pingpong_64_pixel_runs(layer(n, c, k, h, kernel, stride, fused=True), 90) == runs
    residual = layer(n, c, k, h, kernel, stride, residual=True)
    assert not implicit_gemm_nhwc.pingpong_64_pixel_runs(residual, 90)
    assert planner.make_plan(residual, compute_capability=90).config.name != \
        implicit_gemm_nhwc.PINGPONG_64_PIXEL_CONFIG


#: (batch, input channels, output channels, plane, kernel, stride, taken): where the rules take the 64-channel
#: ping-pong tile, as ResNet-50's layers measured on the H200 (benchmarks/results/pingpong_narrow_layers_h200.txt;
#: us before -> on it).
NARROW_RULE_CASES = [
    (32, 64, 64, 56, 3, 1, True),       # 26.1 -> 19.8
    (32, 256, 64, 56, 1, 1, True),      # 22.1 -> 18.9
    (32, 64, 64, 56, 1, 1, True),       # one k tile, 784 tiles: 7.8 -> 6.9
    (8, 64, 64, 56, 1, 1, False),       # one k tile, 196 tiles: 3.5 against 3.8
    (32, 2048, 512, 7, 1, 1, True),     # 104 tiles, 32 k tiles: 12.4 -> 10.9
    (8, 128, 128, 28, 3, 1, True),      # 98 tiles: 9.1 -> 7.6
    (8, 1024, 512, 14, 1, 1, True),     # 104 tiles: 7.9 -> 6.9
    (8, 512, 256, 28, 1, 1, False),     # two waves where the 128-channel tile makes one: 5.8 against 7.1
    (32, 512, 512, 7, 3, 1, False),     # 72 k tiles: split-K's 18.8 against 21.6
    (8, 1024, 2048, 14, 1, 2, False),   # 64 tiles of 128 x 128: 8.5 against 9.2
    (8, 2048, 512, 7, 1, 1, False),     # 32 tiles: 7.9 against 10.9
    (1, 64, 256, 56, 1, 1, False),      # one k tile: untimed
    # Outputs of part of a last tile, short reductions (pingpong_partial_tiles_candidates_h200.txt):
    (32, 384, 96, 14, 1, 1, True),      # MobileNetV2's, 98 tiles, 6 k tiles: 7.0 -> 4.7
    (32, 240, 80, 14, 1, 1, True),      # EfficientNet-B0's, 4 k tiles: 4.7 -> 4.0
    (32, 576, 96, 14, 1, 1, True),      # 9 k tiles: 5.4 (taken before)
    (32, 80, 480, 14, 1, 1, False),     # 2 k tiles: untimed
]


@pytest.mark.parametrize("n,c,k,h,kernel,stride,taken", NARROW_RULE_CASES, ids=lambda v: str(v))
def test_rules_take_the_narrow_tile_where_measured_faster(n, c, k, h, kernel, stride, taken):
    p = layer(n, c, k, h, kernel, stride)
    plan = planner.make_plan(p, compute_capability=90)
    assert implicit_gemm_nhwc.pingpong_narrow_pays(p, 90) == taken
    if not implicit_gemm_nhwc.pingpong_64_pixel_runs(p, 90) and not implicit_gemm_nhwc.pingpong_small_pays(p, 90):
        # the 64-pixel tiles' rules are asked first
        assert (plan.config.name == implicit_gemm_nhwc.PINGPONG_NARROW_CONFIG and plan.splits == 1) == taken, str(plan)
    assert not implicit_gemm_nhwc.pingpong_narrow_pays(p, 80)
    assert implicit_gemm_nhwc.pingpong_narrow_pays(layer(n, c, k, h, kernel, stride, fused=True), 90) == taken
    assert not implicit_gemm_nhwc.pingpong_narrow_pays(layer(n, c, k, h, kernel, stride, residual=True), 90)


def test_space_to_depth_nchw_output_is_not_pingpong():
    """The space-to-depth copies' GEMM writes the caller's layout: of an NCHW layer (4 channels at stride 4 make
    64), never on the ping-pong tile, which writes NHWC alone -- forced, a ValueError names why; an NHWC one takes
    it."""
    nchw = make_problem((32, 4, 128, 128), (256, 4, 8, 8), None, "float16", stride=4)
    nhwc = make_problem((32, 128, 128, 4), (256, 8, 8, 4), None, "float16", stride=4, layout="NHWC",
                        weight_layout="KHWC")
    plan = planner.make_plan(nchw, compute_capability=90)
    assert plan.space_to_depth == (4, 4) and plan.config.wgmma != implicit_gemm_nhwc.WGMMA_PINGPONG, str(plan)
    assert planner.make_plan(nhwc, compute_capability=90).config.name == PINGPONG
    with pytest.raises(ValueError, match="writes NHWC outputs alone"):
        plan_of(nchw)


@pytest.mark.parametrize("shapes,expected", [
    (((32, 14, 14, 256), (1024, 1, 1, 256), 0, 1), PINGPONG),                                # 8 k tiles
    (((32, 14, 14, 256), (256, 3, 3, 256), 1, 1), COPY_AVOIDING),  # 98 tiles from a copy: 66 of 192 pixels, 2 runs
    (((32, 7, 7, 512), (512, 3, 3, 512), 1, 1), COPY_AVOIDING),    # 52 tiles (clusters) from a copy: 36, 3 runs
    (((16, 14, 14, 512), (512, 3, 3, 512), 1, 1), PINGPONG),       # 100 from a copy; 68 of 192 pixels: too many
    (((8, 14, 14, 256), (256, 3, 3, 256), 1, 1), PINGPONG),                                  # 26 tiles: in place
    (((32, 28, 28, 256), (256, 3, 3, 256), 2, 2), "nhwc_wgmma_producer_m192n128"),           # a taller producer
    (((32, 14, 14, 96), (576, 1, 1, 96), 0, 1), "nhwc_wgmma_m128n128"),                      # 3 k tiles
    (((32, 56, 56, 64), (64, 1, 1, 64), 0, 1), "pw_c256_m64n64"),                            # the pointwise kernel's
    (((8, 14, 14, 1024), (256, 1, 1, 1024), 0, 1), PINGPONG),                                # 26 tiles, 32 k tiles
    (((32, 56, 56, 64), (256, 1, 1, 64), 0, 1), implicit_gemm_nhwc.PINGPONG_NARROW_CONFIG),  # the pointwise kernel's
    (((32, 56, 56, 144), (24, 1, 1, 144), 0, 1), implicit_gemm_nhwc.PINGPONG_NARROW_CONFIG),  # ones, more channels
    (((8, 28, 28, 128), (128, 3, 3, 128), 1, 1), PIXELS_64),  # 98 of its tiles, 36 k tiles, x in place
    (((8, 28, 28, 128), (512, 1, 1, 128), 0, 1), PIXELS_64),  # 196 tiles of 128 x 128 (2 waves), 392 of 64 x 128 (3)
    (((8, 7, 7, 512), (2048, 1, 1, 512), 0, 1), PIXELS_64),   # 64 tiles (a wave), 112 of its own
    (((8, 14, 14, 1024), (512, 1, 1, 1024), 0, 1), PIXELS_64),  # 52 tiles, 100 of its own: whole
    (((8, 14, 14, 256), (1024, 1, 1, 256), 0, 1), PINGPONG),  # 104 tiles (a wave), 208 of its own (two)
    (((1, 14, 14, 256), (256, 3, 3, 256), 1, 1), PIXELS_64),  # 8 of its tiles in 7 runs
    (((1, 28, 28, 128), (512, 1, 1, 128), 0, 1), "nhwc_wgmma_m64n64"),  # 52 of its tiles, under half a wave
    (((8, 56, 56, 64), (64, 3, 3, 64), 1, 1), "nhwc_wgmma_producer_m256n64"),  # 196 64-channel tiles (< 4 waves)
    (((32, 56, 56, 64), (64, 3, 3, 64), 1, 1), implicit_gemm_nhwc.PINGPONG_NARROW_CONFIG),  # 784 (4 waves or more)
], ids=["1x1_256to1024", "3x3_256", "3x3_512_7sq", "3x3_512_b16", "3x3_256_b8", "dilated", "1x1_96to576", "1x1_64",
        "1x1_1024to256_b8", "1x1_64to256", "1x1_144to24", "3x3_128_b8", "1x1_128to512_b8", "1x1_512to2048_b8",
        "1x1_1024to512_b8", "1x1_256to1024_b8", "3x3_256_b1", "1x1_128to512_b1", "3x3_64_b8", "3x3_64"])
def test_the_tf32_rules(shapes, expected):
    """In TF32 the rules take the ping-pong tiles where they do in 16 bits, but for layers of more than one tap
    that a taller producer tile takes, reductions of PINGPONG_TF32_SHORT_K_TILES k tiles or fewer, and the
    pointwise kernel's 1x1 layers (implicit_gemm_nhwc.PINGPONG_TF32_SHORT_K_TILES' comment); split-K's runs from
    fewer k tiles (PINGPONG_TF32_SPLIT_MIN_K_TILES) in shorter runs (PINGPONG_TF32_SPLIT_MIN_RUN); the 64-channel tile
    for the pointwise kernel's layers of more channels (PINGPONG_TF32_NARROW_CHANNELS) and pixels
    (PINGPONG_TF32_NARROW_MIN_WAVES), unfused alone, for reductions of PINGPONG_TF32_NARROW_K_TILES k tiles, and for
    layers of 64 output channels and more taps from PINGPONG_TF32_NARROW_MIN_WAVES waves; the 64-pixel tile
    (PINGPONG_TF32_64_PIXEL_*) whole where its tiles make half a wave, for 1x1 layers also a fuller last wave, for
    layers of more taps in many runs of split-K; the 192-pixel producer tile in split-K's runs where the 128 x 128
    ping-pong tiles would read a rounded copy (TF32_COPY_AVOIDING_CONFIG)."""
    (x, w, padding, dilation) = shapes
    p = make_problem(x, w, None, "float32", padding=padding, dilation=dilation, layout="NHWC", weight_layout="KHWC")
    plan = planner.make_plan(p, allow_tf32=True, compute_capability=90)
    assert plan.config.name == expected, str(plan)
    if expected == implicit_gemm_nhwc.PINGPONG_NARROW_CONFIG and p.kh == 1:  # fused, or at batch 8, pointwise
        fused = make_problem(x, w, (w[0],), "float32", layout="NHWC", weight_layout="KHWC", activation="relu")
        batch_8 = make_problem((8, *x[1:]), w, None, "float32", layout="NHWC", weight_layout="KHWC")
        for other in (fused, batch_8):
            assert planner.make_plan(other, allow_tf32=True, compute_capability=90).kernel == planner.POINTWISE_KERNEL
    if expected == PIXELS_64:
        assert plan.splits == max(implicit_gemm_nhwc.pingpong_64_pixel_runs(p, 90), 1)
        assert plan.splits == 1 or (p.kh > 1 and plan.splits >= implicit_gemm_nhwc.PINGPONG_TF32_64_PIXEL_MIN_RUNS)
        assert plan.round_a, "the 64-pixel tiles read float32 x in place"
        assert implicit_gemm_nhwc.name_expression(plan) in implicit_gemm_nhwc.arch_specialisations()["sm_90a"]
    if implicit_gemm_nhwc.tf32_copy_avoided(p, 90):  # x rounded in place, split-K's runs filling a wave
        assert expected == COPY_AVOIDING and plan.round_a and plan.splits > 1 and math.prod(plan.grid) <= H100_SMS
        assert implicit_gemm_nhwc.name_expression(plan) in implicit_gemm_nhwc.arch_specialisations()["sm_90a"]
    if (x, w) == ((8, 14, 14, 1024), (256, 1, 1, 1024)):  # from PINGPONG_TF32_SPLIT_MIN_K_TILES, runs of _MIN_RUN
        assert plan.splits == implicit_gemm_nhwc.pingpong_split_runs(p, 90) == 5, str(plan)  # runs of 7 k tiles
        sixteen = dataclasses.replace(p, dtype="float16")  # 16 k tiles of 64: the 64 x 64 tile's, unsplit
        assert implicit_gemm_nhwc.pingpong_split_runs(sixteen, 90) == 1
    if getattr(plan.config, "wgmma", 0) == implicit_gemm_nhwc.WGMMA_PINGPONG:  # PINGPONG_TF32_COPY
        copied = p.kh * p.kw > 1 and plan.config.bn >= implicit_gemm_nhwc.PINGPONG_TF32_COPY_CHANNELS and \
            plan.config.bm == 128 and \
            math.prod(gemm_grid(p, plan.config)) >= implicit_gemm_nhwc.PINGPONG_TF32_COPY_MIN_TILES
        assert plan.round_a != copied and "<float," in implicit_gemm_nhwc.name_expression(plan)
        assert implicit_gemm_nhwc.name_expression(plan).endswith(f",{str(plan.round_a).lower()}>")
        launches = [launch.kernel for launch in implicit_gemm_nhwc.program(plan, p).launches]
        assert (implicit_gemm_nhwc.PAD_CHANNELS in launches) == copied, launches
