"""Stream-K on the channels-last GEMM without a GPU: when the planner takes it, what a forced one
refuses, and the launch's schedule replayed in NumPy from its own arguments (kernels/stream_k.cuh and
implicit_gemm_nhwc_stream_k, block by block, each waiting where the kernel waits): every tile's k
tiles are summed once, each by the tile's owner in block order, every tile is stored once, and the
flags are left zero."""
import math

import numpy as np
import pytest

from cupyconv import planner
from cupyconv.arguments import make_problem
from cupyconv.families import implicit_gemm_nhwc
from cupyconv.program import FLAG_COUNT, FLAGS, WORKSPACE, Pointer

#: (x NHWC, weight KHWC, padding): ResNet-50's 3x3 layers at batch 32 (98-196 tiles), and the same
#: at batch 8 (split-K's), 56x56 (a whole number of waves), VGG's 56x56 layer (12 waves) and 14x14
#: layer (196 tiles of 72-144 k tiles).
LAYERS = {
    "r50_l2_3x3_128": ((32, 28, 28, 128), (128, 3, 3, 128), 1),
    "r50_l3_3x3_256": ((32, 14, 14, 256), (256, 3, 3, 256), 1),
    "r50_l4_3x3_512": ((32, 7, 7, 512), (512, 3, 3, 512), 1),
    "r50_b8_l3_3x3_256": ((8, 14, 14, 256), (256, 3, 3, 256), 1),
    "r50_l1_3x3_64": ((32, 56, 56, 64), (64, 3, 3, 64), 1),
    "vgg_conv3_2": ((32, 56, 56, 256), (256, 3, 3, 256), 1),
    "vgg_conv5_2": ((32, 14, 14, 512), (512, 3, 3, 512), 1),
    "vgg_conv5_2_488": ((32, 14, 14, 488), (512, 3, 3, 488), 1),
}
#: Where the rules take stream-K, by dtype: the reductions long enough per block (STREAM_K_MIN_WORK),
#: on the 3-stage 128 x 128 tile or the 64-channel one. r50_l2's TF32 blocks get 27 k tiles of 196
#: tiles (two waves' worth of whole tiles ask 48). VGG's 14x14 layer and r50_l3 take the producer
#: tile instead (its TMA copies need channels that fill whole k tiles: 488 do not), and r50_l4 (52
#: tiles of 128 x 128) the producer tile with split-K (test_the_rule_splits_the_producer_tile_of_few_tiles).
STREAM_K = {"vgg_conv5_2_488": {"float16", "bfloat16", "float32"}}


def nhwc_problem(x_shape, w_shape, padding, dtype="float16", residual=False):
    """A stride-1 NHWC layer with a bias; ``residual``: and a residual added (which keeps the ping-pong tiles'
    rules off a 16-bit call, where a bias alone does not)."""
    n, h, w, _ = x_shape
    out = (n, h + 2 * padding - w_shape[1] + 1, w + 2 * padding - w_shape[2] + 1, w_shape[0])
    return make_problem(x_shape, w_shape, (w_shape[0],), dtype, 1, padding, 1, 1, "NHWC", "KHWC",
                        residual_shape=out if residual else None)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("layer", LAYERS)
def test_the_rule_takes_stream_k_where_whole_tiles_leave_sms_idle(layer, dtype):
    problem = nhwc_problem(*LAYERS[layer], dtype)
    plan = planner.make_plan(problem, allow_tf32=True, compute_capability=90)
    assert bool(plan.stream_k_blocks) == (dtype in STREAM_K.get(layer, ())), str(plan)
    assert planner.make_plan(problem, allow_tf32=True, compute_capability=0).stream_k_blocks == 0  # mma.sync
    if plan.stream_k_blocks:
        assert plan.splits == 1 and "stream-K" in str(plan)
        assert plan.stream_k_blocks <= min(FLAG_COUNT, 3 * implicit_gemm_nhwc.STREAM_K_SMS)
        off = planner.make_plan(problem, plan.config.name, planner.NHWC_KERNEL, compute_capability=90, stream_k=False)
        assert off.stream_k_blocks == 0 and off.grid == plan.grid


#: (layer, x NHWC, weight KHWC, padding) -> (splits on the producer tile, 0: the 64-channel tile, None: the
#: ping-pong tile's split-K, in clusters or not, which 16-bit layers take first (test_pingpong_cpu.SPLIT_RULE_CASES),
#: or the name of the tile another rule takes first).
PRODUCER_SPLITS = {
    "r50_l4_3x3_512": (((32, 7, 7, 512), (512, 3, 3, 512), 1), {"float16": None, "float32": None}),
    "r50_b8_l4_3x3_512": (((8, 7, 7, 512), (512, 3, 3, 512), 1), {"float16": None, "float32": None}),
    "r50_b8_l3_3x3_256": (((8, 14, 14, 256), (256, 3, 3, 256), 1), {"float16": None, "float32": None}),
    "r50_b8_l2_3x3_128": (((8, 28, 28, 128), (128, 3, 3, 128), 1), {"float16": "nhwc_wgmma_m64n128", "float32": 0}),
    "r50_b1_l4_3x3_512": (((1, 7, 7, 512), (512, 3, 3, 512), 1), {"float16": 0, "float32": 0}),
    "vgg_b1_conv5_2": (((1, 14, 14, 512), (512, 3, 3, 512), 1), {"float16": 0, "float32": None}),
}


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("layer", PRODUCER_SPLITS)
def test_the_rule_splits_the_producer_tile_of_few_tiles(layer, dtype):
    """Below WGMMA_WIDE_TILE_BLOCKS tiles of 128 x 128, the producer tile with split-K where the
    reduction is long (>= PRODUCER_SPLIT_MIN_K_TILES), each run too (>= PRODUCER_SPLIT_MIN_RUN) and the
    runs fill three quarters of the SMs; else the 64-channel tile, split by its own rule. 16-bit calls carry a
    residual, which the ping-pong tile's split-K takes (test_pingpong_cpu.SPLIT_RULE_CASES) where the other rules'
    do not."""
    shapes, expected = PRODUCER_SPLITS[layer]
    plan = planner.make_plan(nhwc_problem(*shapes, dtype, residual=dtype != "float32"), allow_tf32=True,
                             compute_capability=90)
    if isinstance(expected[dtype], str):
        assert plan.config.name == expected[dtype], str(plan)
    elif expected[dtype] is None:
        pingpong = (implicit_gemm_nhwc.PINGPONG_CONFIG, implicit_gemm_nhwc.PINGPONG_CLUSTER_CONFIG)
        assert plan.config.name in pingpong and plan.splits > 1, str(plan)
    elif expected[dtype]:
        assert plan.config.producer_warps and plan.splits == expected[dtype] and not plan.stream_k_blocks, str(plan)
        assert "each reduction split" in plan.reason
    else:
        assert not plan.config.producer_warps and plan.config.bn == 64, str(plan)


#: The producer tile the rule takes for LAYERS' layers (PRODUCER_BLOCK_COST: the fewest waves times a
#: block's time), as pixels x channels, by dtype and layout (None: another tile); float32 NHWC inputs
#: (read in place) never take 256 x 128, whose float32 input is a copy. r50_l1_3x3_64's 64 output
#: channels take the channel-row tile, but in float32 NHWC the 256 x 64 producer tile (x in place). The layers
#: carry a bias, and in 16 bits a residual: the ping-pong tile takes 16-bit calls of r50_l3_3x3_256, vgg_conv3_2
#: and r50_l1_3x3_64 without one (test_pingpong_cpu.py), those with one are the producer tiles'.
TALL = {"r50_l2_3x3_128": ("192x128",) * 3, "r50_l3_3x3_256": ("128x128",) * 3,
        "r50_l1_3x3_64": (None, "256x64", None), "vgg_conv3_2": ("256x128", "192x128", "256x128"),
        "vgg_conv5_2": ("192x128",) * 3}


@pytest.mark.parametrize("column,dtype,layout", [(0, "float16", "NHWC"), (1, "float32", "NHWC"),
                                                 (2, "float32", "NCHW")])
@pytest.mark.parametrize("layer", TALL)
def test_the_rule_takes_the_producer_tile_of_fewest_waves(layer, column, dtype, layout):
    x_shape, w_shape, padding = LAYERS[layer]
    if layout == "NCHW":
        x_shape = (x_shape[0], x_shape[3], x_shape[1], x_shape[2])
    residual = (*x_shape[:3], w_shape[0]) if layout == "NHWC" else (x_shape[0], w_shape[0], *x_shape[2:])
    problem = make_problem(x_shape, w_shape, (w_shape[0],), dtype, 1, padding, 1, 1, layout, "KHWC",
                           residual_shape=residual if dtype != "float32" else None)
    plan = planner.make_plan(problem, allow_tf32=True, compute_capability=90)
    tile = TALL[layer][column]
    assert (f"{plan.config.bm}x{plan.config.bn}" if plan.config.producer_warps else None) == tile, str(plan)
    if tile:
        assert plan.splits == 1 and not plan.stream_k_blocks and "copied by TMA" in plan.reason
        assert plan.round_a == (dtype == "float32" and layout == "NHWC" and tile != "256x128")


@pytest.mark.parametrize("x_shape,w_shape,dtype,pixels", [
    ((32, 28, 28, 512), (128, 1, 1, 512), "float16", 192),    # r50_l2_1x1_512to128: 8 k tiles
    ((32, 28, 28, 512), (128, 1, 1, 512), "float32", 192),    # 16 k tiles, x read once: no L2 limit
    ((32, 14, 14, 256), (1024, 1, 1, 256), "float16", None),  # r50_l3_1x1_256to1024: 4 k tiles (ping-pong's)
    ((32, 14, 14, 256), (1024, 1, 1, 256), "float32", 192)])
def test_one_tap_layers_take_the_producer_tiles_from_8_k_tiles(x_shape, w_shape, dtype, pixels):
    plan = planner.make_plan(nhwc_problem(x_shape, w_shape, 0, dtype), allow_tf32=True, compute_capability=90)
    producer = getattr(plan.config, "wgmma", 0) == implicit_gemm_nhwc.WGMMA_PIXEL_ROWS_PRODUCER
    assert (plan.config.bm if producer else None) == pixels, str(plan)


@pytest.mark.parametrize("dtype,layout,pixels,cluster", [("float16", "NHWC", 256, 1), ("float32", "NCHW", 256, 2),
                                                         ("float32", "NHWC", 192, 2)])
def test_the_taller_tiles_keep_a_wave_of_x_in_l2(dtype, layout, pixels, cluster):
    """64 x 28 x 28 x 512: a wave of 256-pixel blocks reads 35 MB of 16-bit x, 69 MB of float32, and of
    192-pixel ones 52 MB of float32 (past TALL_PRODUCER_MAX_WAVE_BYTES): float32 takes them in pairs,
    whose waves read half the pixels -- 256 where x is copied anyway (NCHW), 192 where it is read in
    place (the 256-pixel tile reads float32 from a rounded copy). With a bias and, in 16 bits, a residual: 16-bit
    calls without one take the ping-pong tile."""
    x_shape = (64, 28, 28, 512) if layout == "NHWC" else (64, 512, 28, 28)
    problem = make_problem(x_shape, (512, 512, 3, 3), (512,), dtype, 1, 1, 1, 1, layout, "KCHW",
                           residual_shape=x_shape if dtype != "float32" else None)
    plan = planner.make_plan(problem, allow_tf32=True, compute_capability=90)
    assert plan.config.producer_warps and (plan.config.bm, plan.config.cluster) == (pixels, cluster), str(plan)
    assert (plan.kernel, plan.grid[1] % 2) == (planner.NHWC_KERNEL, 0) and ("in pairs" in plan.reason) == (cluster > 1)


def test_forced_stream_k_refusals():
    problem = nhwc_problem(*LAYERS["r50_l3_3x3_256"])
    mma_sync = next(c.name for c in implicit_gemm_nhwc.NHWC_CONFIGS["float16"] if not c.wgmma)
    with pytest.raises(ValueError, match="stream_k needs a wgmma tile"):
        planner.make_plan(problem, mma_sync, planner.NHWC_KERNEL, compute_capability=90, stream_k=True)
    with pytest.raises(ValueError, match="stream_k needs a wgmma tile, no split-K"):
        planner.make_plan(problem, None, planner.NHWC_KERNEL, compute_capability=90, splits=2, stream_k=True)


def replay(launch, gemm_a, gemm_b, bm, bn, bk):
    """The stream-K launch's blocks run as the kernel runs them, round-robin, each stopping where it
    waits for a flag. Returns (the GEMM's result, the flags after the launch, tiles stored)."""
    blocks = launch.grid[0]
    tiles_m, tiles_n, k_tiles = launch.args[24:27]
    units = tiles_m * tiles_n * k_tiles
    start = lambda b: units * b // blocks
    flags, slots, stores = [0] * blocks, {}, []
    out = np.full((tiles_m * bm, tiles_n * bn), np.nan)

    def sums(tile_m, tile_n, k_begin, k_end):
        acc = np.zeros((bm, bn))
        for kt in range(k_begin, k_end):  # one k tile after another, as the pipeline adds them
            acc += gemm_a[tile_m * bm:(tile_m + 1) * bm, kt * bk:(kt + 1) * bk] @ \
                gemm_b[kt * bk:(kt + 1) * bk, tile_n * bn:(tile_n + 1) * bn]
        return acc

    def block(b):
        unit, end = start(b), start(b + 1)
        while unit < end:
            tile = unit // k_tiles
            k_begin = unit - tile * k_tiles
            k_end = min(k_tiles, k_begin + end - unit)
            tile_m, tile_n = tile % tiles_m, tile // tiles_m % tiles_n
            contributors = b + 1
            while contributors < blocks and start(contributors) < (tile + 1) * k_tiles:
                contributors += 1
            acc = sums(tile_m, tile_n, k_begin, k_end)
            if k_begin > 0:
                assert flags[b] == 0, "a slot published twice"
                slots[b], flags[b] = acc, 1
            else:
                for c in range(b + 1, contributors if k_end < k_tiles else b + 1):
                    while not flags[c]:
                        yield
                    flags[c] = 0
                    acc = acc + slots.pop(c)
                stores.append(tile)
                out[tile_m * bm:(tile_m + 1) * bm, tile_n * bn:(tile_n + 1) * bn] = acc
            unit += k_end - k_begin

    running = [block(b) for b in reversed(range(blocks))]  # the last first: waits must be waited out
    while running:
        for generator in list(running):
            try:
                next(generator)
            except StopIteration:
                running.remove(generator)
    assert not slots, "a published slot was never added"
    return out, flags, stores


@pytest.mark.parametrize("layer", ["r50_l3_3x3_256", "r50_l4_3x3_512", "r50_l2_3x3_128", "r50_b8_l3_3x3_256"])
def test_schedule_replayed(layer):
    """Every tile stored once with the sum of all its k tiles; flags back to zero. The tiles are shrunk
    to 4 x 4 of 2 k rows (the schedule depends on the counts alone) to keep NumPy fast."""
    problem = nhwc_problem(*LAYERS[layer])
    plan = planner.make_plan(problem, None, planner.NHWC_KERNEL, compute_capability=90, stream_k=True)
    (launch,) = [launch for launch in planner.program(plan, problem).launches
                 if launch.kernel == implicit_gemm_nhwc.STREAM_K_KERNEL]
    assert launch.grid == (plan.stream_k_blocks, 1, 1)
    assert launch.args[-1] == Pointer(FLAGS) and launch.args[-2].operand == WORKSPACE
    tiles_m, tiles_n, k_tiles = launch.args[24:27]
    assert (tiles_m, tiles_n) == plan.grid[:2]
    assert k_tiles == math.ceil(9 * problem.c * 2 / 128)  # k rows of 128 bytes
    bm, bn, bk = 4, 4, 2
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((tiles_m * bm, k_tiles * bk)), rng.standard_normal((k_tiles * bk, tiles_n * bn))
    out, flags, stores = replay(launch, a, b, bm, bn, bk)
    assert sorted(stores) == list(range(tiles_m * tiles_n)), "a tile stored twice or never"
    assert flags == [0] * launch.grid[0]
    np.testing.assert_allclose(out, a @ b, rtol=1e-10, atol=1e-10)
