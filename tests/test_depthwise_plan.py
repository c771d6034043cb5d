"""The depthwise planner without a GPU: every problem the depthwise kernel took before its cp.async
rewrite is still taken by a depthwise kernel, every plan's shared-memory layout is one the kernel can
run, its ring of patch buffers is as deep as the rules allow, and small planes go to the column kernel."""
import itertools
import math

import pytest

from cupyconv.arguments import make_problem
from cupyconv.families import depthwise_column_conv2d, depthwise_conv2d
from cupyconv.families.common import SHARED_MEMORY_BYTES
from cupyconv.families.depthwise_column_conv2d import COLUMN_CONFIGS, COLUMN_MAX_WIDTH
from cupyconv.families.depthwise_conv2d import (DEPTHWISE_BLOCKS, DEPTHWISE_CONFIGS, DEPTHWISE_MAX_BUFFERS,
                                                DEPTHWISE_MAX_CHANNELS_PER_LANE, DEPTHWISE_RING_BYTES, DEPTHWISE_TAPS)
from cupyconv.planner import DEPTHWISE_COLUMN_KERNEL, DEPTHWISE_KERNEL, make_plan, program

ITEM = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}
GEOMETRIES = [  # (kh, kw, stride, dilation, padding)
    (3, 3, 1, 1, 1), (3, 3, 2, 1, 1), (5, 5, 1, 1, 2), (5, 5, 2, 1, 2), (7, 7, 1, 1, 3), (1, 1, 1, 1, 0),
    (3, 5, (2, 1), 1, (1, 2)), (3, 3, 1, (2, 3), 2), (3, 3, 3, 1, 0), (3, 3, 1, (30, 40), 0), (3, 3, 2, 25, 0),
    (5, 5, 4, 9, 0), (1, 9, 1, (1, 14), 0),
]
SIZES = [(7, 7), (14, 14), (13, 20), (56, 56), (112, 112), (75, 149), (300, 320)]


def problems():
    for dtype, (kh, kw, stride, dilation, padding), (h, w), (c, m) in itertools.product(
            ITEM, GEOMETRIES, SIZES, [(3, 1), (6, 2), (144, 1)]):
        try:
            yield make_problem((4, c, h, w), (c * m, 1, kh, kw), None, dtype, stride, padding, dilation, c)
        except ValueError:  # kernel larger than the padded input
            continue


def accepted_before(p) -> bool:
    """The rule before this kernel: one patch of the 32x32 tile (16x16 for outputs <= 16 wide) in the
    accumulator type, plus the weights, in 48 KB."""
    tile = 16 if p.wo <= 16 else 32
    rows = (tile - 1) * p.stride[0] + (p.kh - 1) * p.dilation[0] + 1
    cols = (tile - 1) * p.stride[1] + (p.kw - 1) * p.dilation[1] + 1
    return (rows * cols + p.kh * p.kw) * (8 if p.dtype == "float64" else 4) <= SHARED_MEMORY_BYTES


def test_every_problem_accepted_before_is_still_accepted():
    checked = 0
    for p in problems():
        if accepted_before(p):
            assert make_plan(p).kernel in (DEPTHWISE_KERNEL, DEPTHWISE_COLUMN_KERNEL), p
            checked += 1
    assert checked > 500


@pytest.mark.parametrize("config", [None] + [c.name for c in DEPTHWISE_CONFIGS])
def test_plan_layouts_fit_the_kernel(config):
    specialisations = set(depthwise_conv2d.specialisations())
    for p in problems():
        try:
            plan = make_plan(p, kernel=DEPTHWISE_KERNEL, config=config)
        except ValueError as error:
            assert "cannot run this problem" in str(error)
            continue
        cfg, item = plan.config, ITEM[p.dtype]
        lanes, elements = plan.block[2], plan.vec // item or 1
        rows = (cfg.th - 1) * p.stride[0] + (p.kh - 1) * p.dilation[0] + 1
        cols = (cfg.tw - 1) * p.stride[1] + (p.kw - 1) * p.dilation[1] + 1
        # Pieces divide the input row, start up to a piece left of the patch, and fit in the pitch.
        assert plan.vec in (16, 8, 4, 2) and plan.vec >= item and p.w * item % plan.vec == 0
        assert plan.pitch % elements == 0 and plan.pitch >= cols + elements - 1
        assert plan.shared_bytes == lanes * plan.patch_buffers * rows * plan.pitch * item <= SHARED_MEMORY_BYTES
        assert plan.block == ((cfg.tw // cfg.rpt, 1) if cfg.th == 1 and cfg.rpt > 1 else (cfg.tw, cfg.th // cfg.rpt)) + \
            (lanes,) and 1 <= lanes <= cfg.lanes
        assert plan.channels_per_block % lanes == 0
        per_lane, buffers = plan.channels_per_block // lanes, plan.patch_buffers
        assert 1 <= per_lane <= max(1, min(DEPTHWISE_MAX_CHANNELS_PER_LANE, math.ceil(p.k / lanes)))
        # The ring: no deeper than the lane's channels, past two buffers within its own budget, and
        # as deep as that allows (one more buffer would not fit even with the narrowest pieces).
        assert 1 <= buffers <= min(DEPTHWISE_MAX_BUFFERS, per_lane)
        assert buffers <= 2 or plan.shared_bytes <= DEPTHWISE_RING_BYTES
        if buffers < min(DEPTHWISE_MAX_BUFFERS, per_lane):
            pitch = min(math.ceil((cols + e - 1) / e) * e for e in
                        (v // item for v in (16, 8, 4, 2) if v >= item and p.w * item % v == 0))
            budget = SHARED_MEMORY_BYTES if buffers + 1 <= 2 else DEPTHWISE_RING_BYTES
            assert lanes * (buffers + 1) * rows * pitch * item > budget
        assert plan.grid == (math.ceil(p.ho / cfg.th) * math.ceil(p.wo / cfg.tw),
                             math.ceil(p.k / plan.channels_per_block), p.n)
        unrolled = (p.kh, p.kw, p.stride[0]) in DEPTHWISE_TAPS and p.dilation[0] == 1 and cfg.th > 1
        assert cfg.taps == ((p.kh, p.kw, p.stride[0]) if unrolled else (0, 0, 0))
        assert plan.name_expression in specialisations


def test_mobilenet_layers_plan():
    """The benchmark's MobileNetV2 layers: all three on the column kernel, two columns a thread (pairs:
    their rows are even), 8 rows a thread on the 56 x 56 outputs and 7 on the 14 x 14; with the tile
    kernel forced, unrolled 3x3 taps, the widest pieces the rows allow, and the channels per block that
    ran fastest on the H100 (results/depthwise_sweep.txt): 11-26 KB of input patches per block, 4 lanes
    of 16 x 16 tiles on the 14 x 14 layer."""
    def problem(c, hw, stride, dtype):
        return make_problem((32, c, hw, hw), (c, 1, 3, 3), None, dtype, stride, 1, 1, c)

    expected = {  # (channels per block, patch buffers, blocks) of dw144, dw96s2, dw384 (tiles forced)
        "float32": ((4, 4, 4608), (1, 1, 12288), (16, 4, 768)),
        "float16": ((8, 4, 2304), (2, 2, 6144), (16, 4, 768)),
    }
    for dtype in ("float32", "float16"):
        for c, hw, stride, rpt, block in ((144, 56, 1, 8, (28, 4, 1)), (96, 112, 2, 8, (28, 4, 1)),
                                          (384, 14, 1, 7, (7, 18, 1))):
            columns = make_plan(problem(c, hw, stride, dtype))
            assert columns.kernel == DEPTHWISE_COLUMN_KERNEL and columns.config.rpt == rpt
            assert columns.config.pair_odd == 1 and columns.block == block
            assert "two output columns, loaded as pairs" in str(columns)
        s1, s2 = (depthwise_conv2d.make_plan(problem(144, 56, 1, dtype)),
                  depthwise_conv2d.make_plan(problem(96, 112, 2, dtype)))
        small = depthwise_conv2d.make_plan(problem(384, 14, 1, dtype))
        assert s2.config.taps == (3, 3, 2) and s1.config.taps == (3, 3, 1) and small.config.taps == (3, 3, 1)
        assert s2.vec == s1.vec == 16 and small.vec == (8 if dtype == "float32" else 4)
        assert small.block == (16, 2, 4)
        assert [(p.channels_per_block, p.patch_buffers, math.prod(p.grid)) for p in (s1, s2, small)] == \
            list(expected[dtype])
        assert "3x3 taps at row stride 1 unrolled" in str(s1) and "a ring of 4 input patch(es)" in str(s1)
        columns = depthwise_column_conv2d.make_plan(problem(384, 14, 1, dtype), pairs=False)
        assert columns.config.name == "col_r7" and columns.config.pair_odd == -1
        assert columns.block == (14, 9, 1) and columns.grid == (43, 2, 32)  # 9 channels of 14-wide rows


@pytest.mark.parametrize("dtype", ITEM)
def test_column_kernel_takes_small_planes_with_unrolled_taps(dtype):
    """Outputs at most COLUMN_MAX_WIDTH wide with unrolled taps (kh, kw, row stride in DEPTHWISE_TAPS,
    row dilation 1; any column stride and dilation) go to the column kernel, the rest to the tiles."""
    def plan(hw, k=3, stride=1, dilation=1, multiplier=1):
        return make_plan(make_problem((2, 6, *hw), (6 * multiplier, 1, k, k), None, dtype, stride, k // 2, dilation, 6))

    assert plan((14, 14)).kernel == DEPTHWISE_COLUMN_KERNEL
    assert plan((7, 7), k=7).kernel == DEPTHWISE_COLUMN_KERNEL
    assert plan((28, 28), stride=2).kernel == DEPTHWISE_COLUMN_KERNEL  # 14 x 14 out
    assert plan((9, 20), stride=(1, 2), dilation=(1, 2), multiplier=2).kernel == DEPTHWISE_COLUMN_KERNEL
    assert plan((20, COLUMN_MAX_WIDTH + 1)).kernel == DEPTHWISE_KERNEL
    assert plan((14, 14), dilation=2).kernel == DEPTHWISE_KERNEL  # row dilation: run-time taps
    assert plan((14, 14), k=3, stride=3).kernel == DEPTHWISE_KERNEL  # no unrolled 3x3 at row stride 3
    assert plan((14, 14)).name_expression in depthwise_column_conv2d.specialisations()
    # even outputs up to COLUMN_PAIRS_MAX_WIDTH wide: two columns a thread
    pairs = plan((9, depthwise_column_conv2d.COLUMN_PAIRS_MAX_WIDTH))
    if dtype == "float64":  # no pairs of doubles: the tiles
        assert pairs.kernel == DEPTHWISE_KERNEL
    else:
        assert pairs.kernel == DEPTHWISE_COLUMN_KERNEL and pairs.config.pair_odd == 1
    assert plan((9, depthwise_column_conv2d.COLUMN_PAIRS_MAX_WIDTH + 2)).kernel == DEPTHWISE_KERNEL


def test_column_config_and_grid():
    """The config that computes the fewest rows past Ho, the longest on a tie; one thread per rpt rows
    of a column of each channel and image, whole rows of up to COLUMN_BLOCK // Wo channels a block; a
    forced config or kernel is checked."""
    rows = {c.name: c.rpt for c in COLUMN_CONFIGS}
    for ho, name in ((14, "col_r7"), (7, "col_r7"), (16, "col_r8"), (12, "col_r4"), (56, "col_r8"), (1, "col_r4")):
        p = make_problem((3, 5, ho, 9), (10, 1, 3, 3), None, "float32", 1, 1, 1, 5)
        plan = depthwise_column_conv2d.make_plan(p)
        assert plan.config.name == name, ho
        assert plan.block == (9, 10, 1) and plan.shared_bytes == 0  # all 10 channels' rows in one block
        assert plan.grid == (1, math.ceil(ho / rows[name]), 3)
        assert f"{rows[name]} rows of one output column per thread" in str(plan)
    p = make_problem((1, 4, 14, 14), (4, 1, 3, 3), None, "float16", 1, 1, 1, 4)
    assert make_plan(p, config="col_r4").config.rpt == 4  # a config names its family
    with pytest.raises(ValueError, match="config for depthwise_column_conv2d must be one of"):
        depthwise_column_conv2d.make_plan(p, "dw_16x16")
    dilated = make_problem((1, 4, 14, 14), (4, 1, 3, 3), None, "float16", 1, 2, 2, 4)
    with pytest.raises(ValueError, match="cannot run this problem: 3x3 taps at row stride 1 and row dilation 2"):
        make_plan(dilated, kernel=DEPTHWISE_COLUMN_KERNEL)
    grouped = make_problem((1, 4, 14, 14), (4, 2, 3, 3), None, "float32", 1, 1, 1, 2)
    with pytest.raises(ValueError, match="2 input channels per group"):
        make_plan(grouped, kernel=DEPTHWISE_COLUMN_KERNEL)
    wide = make_problem((1, 2, 3, 1500), (2, 1, 3, 3), None, "float32", 1, 1, 1, 2)
    with pytest.raises(ValueError, match="output 1500 wide: a block holds whole rows, at most 1024"):
        make_plan(wide, kernel=DEPTHWISE_COLUMN_KERNEL)
    long_rows = make_problem((1, 300, 3, 1000), (300, 1, 3, 3), None, "float32", 1, 1, 1, 300)
    # a row wider than COLUMN_BLOCK: one channel a block, a thread for each column or pair of columns
    assert depthwise_column_conv2d.make_plan(long_rows, pairs=False).block == (1000, 1, 1)
    assert depthwise_column_conv2d.make_plan(long_rows).block == (500, 1, 1)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_strided_small_grids_take_the_shortest_rows(dtype):
    """At row stride 2, where the fitting rows' grid has fewer than SHORT_ROWS_MAX_BLOCKS blocks (MobileNetV2's
    strided depthwise layers at batch 1), 4 rows a thread, and the plan says why; at stride 1, on larger grids and
    where the caller forces rows, the fitting rows."""
    def plan(n, c, hw, stride, **options):
        return make_plan(make_problem((n, c, hw, hw), (c, 1, 3, 3), None, dtype, stride, 1, 1, c), **options)

    for c, hw in ((96, 112), (144, 56), (192, 28), (576, 14)):
        strided = plan(1, c, hw, 2)
        assert strided.kernel == DEPTHWISE_COLUMN_KERNEL and strided.config.name == "col_r4", str(strided)
        assert "row stride 2 and" in strided.reason and "the shortest rows" in strided.reason
        assert plan(1, c, hw, 2, config="col_r8").config.name == "col_r8"  # forced
    assert plan(1, 144, 56, 1).config.name == "col_r8"  # stride 1
    assert plan(1, 960, 7, 1).config.name == "col_r7"
    assert plan(32, 576, 14, 2).config.name == "col_r7"  # 1024 blocks
    assert plan(32, 96, 112, 2).config.name == "col_r8"


def test_channels_per_lane():
    """Channels per lane double while DEPTHWISE_BLOCKS blocks remain and a block's patches stay within
    DEPTHWISE_BLOCK_INPUT_BYTES, never past what a lane has; a
    forced count is taken as given, with as many buffers as it has channels up to four."""
    few = depthwise_conv2d.make_plan(make_problem((64, 3, 224, 224), (3, 1, 3, 3), None, "float32", 1, 1, 1, 3))
    assert few.channels_per_block == 3 and few.patch_buffers == 3 and math.prod(few.grid) >= DEPTHWISE_BLOCKS
    one = depthwise_conv2d.make_plan(make_problem((1, 8, 20, 20), (8, 1, 3, 3), None, "float32", 1, 1, 1, 8))
    assert one.channels_per_block == 1 and one.patch_buffers == 1
    problem = make_problem((1, 10, 13, 13), (10, 1, 3, 3), None, "float16", 1, 1, 1, 10)
    for per_lane in range(1, 8):
        forced = depthwise_conv2d.make_plan(problem, "dw_32x32", channels_per_lane=per_lane)
        assert forced.channels_per_block == per_lane and forced.patch_buffers == min(per_lane, DEPTHWISE_MAX_BUFFERS)


def test_every_ring_depth_is_planned():
    """The tile kernel's plan picks each depth from 1 to DEPTHWISE_MAX_BUFFERS somewhere in the sweep (3
    where a lane has 3 channels; that 224 x 224 layer's rows are even, so the planner gives it the
    column kernel's pairs)."""
    three = make_problem((64, 3, 224, 224), (3, 1, 3, 3), None, "float32", 1, 1, 1, 3)
    assert make_plan(three).kernel == DEPTHWISE_COLUMN_KERNEL
    assert {make_plan(p).patch_buffers for p in problems() if make_plan(p).kernel == DEPTHWISE_KERNEL} | \
        {depthwise_conv2d.make_plan(three).patch_buffers} == set(range(1, DEPTHWISE_MAX_BUFFERS + 1))


def test_nhwc_rows_where_compiled_else_per_pixel():
    """NHWC depthwise problems run as rows of pixels where a row instance exists (the kernel width,
    column stride, no column dilation, 16-byte vectors, not float64), walking down output rows where the
    kernel is also square, the strides equal, the rows undilated and WALK_RULE names a walk, else a pixel
    per thread;
    the launch covers every run, walked rows and vector, and forcing rows or walks elsewhere names why not."""
    import dataclasses

    from cupyconv.families import depthwise_nhwc

    for dtype, (kh, kw, stride, dilation, padding), (h, w) in itertools.product(ITEM, GEOMETRIES, SIZES):
        try:
            problem = make_problem((2, 48, h, w), (48, 1, kh, kw), None, dtype, stride, padding, dilation, 48)
        except ValueError:
            continue
        problem = dataclasses.replace(problem, layout="NHWC", weight_layout="KHWC")
        plan = make_plan(problem)
        cfg = plan.config
        rows = (dtype != "float64" and kw in (3, 5, 7) and problem.stride[1] in (1, 2) and problem.dilation[1] == 1)
        walks = rows and kh == kw and problem.stride[0] == problem.stride[1] and problem.dilation[0] == 1
        walked = walks and (dtype, kw, problem.stride[1]) in depthwise_nhwc.WALK_RULE
        assert (cfg.pixels > 1) == rows and (cfg.rows > 1) == walked, (problem, cfg)
        if walked:
            assert cfg.name == depthwise_nhwc.WALK_RULE[dtype, kw, problem.stride[1]]
        elif rows:
            assert cfg.pixels == (2 if problem.stride[1] == 2 and ITEM[dtype] == 2 else 4)
        if rows:
            assert plan.block[0] == depthwise_nhwc.ROW_BLOCK
            for pixels in depthwise_nhwc.ROW_PIXELS:
                forced = make_plan(problem, f"dw_nhwc_v16_row{pixels}", "depthwise_nhwc")
                assert (forced.config.kw, forced.config.sw, forced.config.pixels) == (kw, problem.stride[1], pixels)
                assert f",{kw},{problem.stride[1]},{pixels},1,false>" in depthwise_nhwc.name_expression(forced)
                assert depthwise_nhwc.name_expression(forced) in depthwise_nhwc.specialisations()
        else:
            assert depthwise_nhwc.name_expression(plan).endswith(",0,1,1,1,false>")
            for pixels in depthwise_nhwc.ROW_PIXELS:
                with pytest.raises(ValueError, match="rows are compiled for"):
                    make_plan(problem, f"dw_nhwc_v16_row{pixels}", "depthwise_nhwc")
        for walk in depthwise_nhwc.WALK_CONFIGS:
            if walks and dtype != "float64":
                forced = make_plan(problem, walk.name, "depthwise_nhwc")
                # 16-bit walks of 8-byte vectors read the caller's weight where the launch has few blocks, a block
                # of 128 threads all 48 channels' rows of it (12 vectors) in shared memory; the others read a
                # prepared weight.
                staged = (walk.vec_bytes == depthwise_nhwc.STAGED_VEC_BYTES and ITEM[dtype] == 2
                          and forced.grid[0] <= depthwise_nhwc.STAGED_MAX_BLOCKS)
                assert forced.config.staged == staged
                assert (f",{kw},{problem.stride[1]},{walk.pixels},{walk.rows},{str(staged).lower()}>"
                        in depthwise_nhwc.name_expression(forced))
                assert forced.shared_bytes == (48 * kh * kw * ITEM[dtype] if staged else 0)
                assert (program(forced, problem).weight is None) == staged
                assert depthwise_nhwc.name_expression(forced) in depthwise_nhwc.specialisations()
            else:
                with pytest.raises(ValueError, match="rows are compiled for|walks down rows need"):
                    make_plan(problem, walk.name, "depthwise_nhwc")
        vec = cfg.vec_bytes // ITEM[dtype]
        threads = problem.n * math.ceil(problem.ho / cfg.rows) * math.ceil(problem.wo / cfg.pixels) * problem.c // vec
        assert plan.grid[0] * plan.block[0] >= threads > (plan.grid[0] - 1) * plan.block[0]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_nhwc_walks_read_the_weight_in_place_up_to_a_grid_of_staged_max_blocks(dtype):
    """The rules' 16-bit walk reads the caller's weight (no preparation) on a launch of up to
    STAGED_MAX_BLOCKS blocks and the prepared weight on a larger one (each block's copy of the weight costs
    it a round trip to L2): MobileNetV2's 3x3 of 384 on 14^2 at batch 8 and of 144 on 56^2 at batch 32."""
    import dataclasses

    from cupyconv.families import depthwise_nhwc

    for (n, c, h), staged in (((8, 384, 14), True), ((32, 144, 56), False)):
        problem = dataclasses.replace(make_problem((n, c, h, h), (c, 1, 3, 3), None, dtype, 1, 1, 1, c),
                                      layout="NHWC", weight_layout="KHWC")
        plan = make_plan(problem)
        assert plan.config.name == depthwise_nhwc.WALK_RULE[dtype, 3, 1]
        assert (plan.grid[0] <= depthwise_nhwc.STAGED_MAX_BLOCKS) == staged == plan.config.staged
        assert (program(plan, problem).weight is None) == staged
        assert ("read in place" in plan.reason) == staged
        assert depthwise_nhwc.name_expression(plan) in depthwise_nhwc.specialisations()
