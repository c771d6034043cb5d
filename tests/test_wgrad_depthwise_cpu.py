"""The depthwise weight gradient's choice and runs, without a GPU."""
import dataclasses
import math

import pytest

from cupyconv import wgrad_depthwise
from cupyconv.arguments import make_problem


@pytest.mark.parametrize("shape,groups,kernel,reason", [
    ((8, 8), 4, 3, "2 input channels per group"),
    ((8, 8), 8, 4, "a 4x4 kernel"),
])
def test_refusals(shape, groups, kernel, reason):
    problem = make_problem((2, shape[0], 9, 9), (shape[1], shape[0] // groups, kernel, kernel), None, "float32", 1, 1,
                           1, groups)
    assert reason in wgrad_depthwise.refusal(problem)


def test_nchw_lanes_are_output_columns_of_a_channel():
    # fp16, even rows: 28 lanes of two columns (9 of them), a block per channel; 144 blocks (two runs
    # would make 288, past one wave of 264), whole columns
    nchw = make_problem((32, 144, 56, 56), (144, 1, 3, 3), None, "float16", 1, 1, 1, 144)
    assert tuple(wgrad_depthwise.make_plan(nchw)) == ((144, 1, 1), 1, 28, 56, 2)
    # one column a lane: 56 lanes across, 4 down
    assert tuple(wgrad_depthwise.make_plan(nchw, columns=1)) == ((144, 1, 1), 1, 56, 56, 1)
    # MobileNetV2's stride 2: 96 channels in two runs (192 blocks), whole columns
    s2 = make_problem((32, 96, 112, 112), (96, 1, 3, 3), None, "bfloat16", 2, 1, 1, 96)
    assert tuple(wgrad_depthwise.make_plan(s2)) == ((96, 2, 1), 2, 28, 56, 2)
    wide = make_problem((2, 8, 20, 600), (8, 1, 3, 3), None, "float32", 1, 1, 1, 8)
    plan = wgrad_depthwise.make_plan(wide)
    assert plan.across == wgrad_depthwise.MAX_COLUMNS and plan.grid[0] == 8 * 2  # two tiles of 256 pairs a channel
    assert wgrad_depthwise.make_plan(wide, columns=1).grid[0] == 8 * 3
    tiny = make_problem((1, 8, 7, 7), (8, 1, 3, 3), None, "float16", 1, 1, 1, 8)
    assert wgrad_depthwise.make_plan(tiny).splits == 1


@pytest.mark.parametrize("dtype,x_shape,kernel,stride,padding,dilation,pair_odd", [
    ("float16", (2, 8, 56, 56), 3, 1, 1, 1, 1),
    ("bfloat16", (2, 8, 112, 112), 3, 2, 1, 1, 1),   # MobileNetV2's stride 2
    ("float32", (2, 8, 56, 56), 7, 1, 3, 1, 1),      # ConvNeXt's 7x7
    ("float16", (2, 8, 20, 20), 5, 1, 2, 1, 0),      # even left padding: the pairs start at the window
    ("float16", (2, 8, 14, 14), 3, 2, 0, 1, 0),
    ("float16", (2, 8, 12, 12), 3, 1, (2, 1), 1, 1),  # the left padding's parity, not the top's
    ("float64", (2, 8, 56, 56), 3, 1, 1, 1, -1),     # no pairs of doubles
    ("float16", (2, 8, 15, 15), 3, 1, 1, 1, -1),     # odd rows: pairs would straddle them
    ("float16", (2, 8, 16, 16), 3, 2, 0, 1, -1),     # 7 output columns
    ("float16", (2, 8, 16, 16), 3, (2, 1), 1, 1, -1),  # the walks differ
    ("float16", (2, 8, 16, 16), 3, 1, 2, 2, -1),     # a walk at run time
])
def test_column_pairs(dtype, x_shape, kernel, stride, padding, dilation, pair_odd):
    """NCHW lanes take two output columns where rows and output rows have even lengths and both axes
    walk the same compiled (stride, dilation); the kernel is compiled for the left padding's parity."""
    c = x_shape[1]
    problem = make_problem(x_shape, (c, 1, kernel, kernel), None, dtype, stride, padding, dilation, c)
    assert wgrad_depthwise.column_pairs(problem) == (pair_odd >= 0)
    plan = wgrad_depthwise.make_plan(problem)
    assert plan.columns == (2 if pair_odd >= 0 else 1)
    expression = wgrad_depthwise.specialisation(dtype, kernel, kernel, wgrad_depthwise.walk(problem), pair_odd)
    assert expression in wgrad_depthwise.specialisations()
    assert wgrad_depthwise.program(plan, problem).launches[0].name_expression == expression
    if pair_odd < 0:
        with pytest.raises(ValueError, match="pairs of output columns"):
            wgrad_depthwise.make_plan(problem, columns=2)
    nhwc = make_problem((x_shape[0], *x_shape[2:], c), (c, kernel, kernel, 1), None, dtype, stride, padding,
                        dilation, c, "NHWC", "KHWC")
    assert not wgrad_depthwise.column_pairs(nhwc)


@pytest.mark.parametrize("shape,stride,plan", [
    # 144 channels in vectors of 4: two blocks of 18 vectors x 14 row lanes; whole rows, one a lane
    ((32, 56, 56, 144), 1, ((2, 128, 1), 128, 18, 56, 1)),
    # 24 vectors x 10 lanes, 264 runs: rows of 28 would leave lanes 2 items or 1; segments of 8 deal 4-5
    ((32, 112, 112, 96), 2, ((1, 264, 1), 264, 24, 8, 1)),
])
def test_nhwc_plans_of_mobilenet_rows(shape, stride, plan):
    problem = make_problem(shape, (shape[3], 3, 3, 1), None, "float16", stride, 1, 1, shape[3], "NHWC", "KHWC")
    assert tuple(wgrad_depthwise.make_plan(problem)) == plan


@pytest.mark.parametrize("shape", [(32, 56, 56, 144), (32, 14, 14, 384), (2, 9, 9, 2048), (1, 2, 4096, 96),
                                   (256, 56, 56, 96), (3, 7, 300, 40)])
def test_nhwc_segment_leaves_the_busiest_lane_the_fewest_loads(shape):
    """Every lane has an item, runs stay within TARGET_BLOCKS, and no other segment's busiest lane loads
    fewer input columns (its pixels' and the windows' overlap, 2 for 3x3 windows)."""
    n, h, w, c = shape
    problem = make_problem(shape, (c, 3, 3, 1), None, "float16", 1, 1, 1, c, "NHWC", "KHWC")
    plan = wgrad_depthwise.make_plan(problem)
    lanes = 256 // plan.across

    def busiest(segment, splits):
        items = n * h * math.ceil(w / segment)
        return math.ceil(math.ceil(items / splits) / lanes) * (min(segment, w) + 2)

    items = n * h * math.ceil(w / plan.segment)
    assert plan.splits == 1 or items // plan.splits >= lanes
    assert plan.grid[0] * plan.splits <= max(wgrad_depthwise.TARGET_BLOCKS, plan.grid[0])
    step, least = wgrad_depthwise.ROW_STEP, wgrad_depthwise.MIN_SEGMENT
    candidates = [math.ceil(w / step) * step]  # a whole row, then halvings
    while candidates[-1] > least:
        candidates.append(max(least, math.ceil(candidates[-1] / 2 / step) * step))
    assert plan.segment in candidates
    for segment in candidates:
        other_items = n * h * math.ceil(w / segment)
        splits = max(1, min(wgrad_depthwise.TARGET_BLOCKS // plan.grid[0], other_items // lanes))
        assert busiest(plan.segment, plan.splits) <= busiest(segment, splits)


@pytest.mark.parametrize("layout,stride,dilation,walk", [
    ("NHWC", 1, 1, (1, 1)), ("NHWC", 2, 1, (2, 1)), ("NHWC", (2, 1), 1, (1, 1)), ("NHWC", 1, 2, (0, 0)),
    ("NHWC", 3, 1, (0, 0)), ("NCHW", (2, 1), 1, (2, 1)), ("NCHW", (1, 3), 1, (1, 1)), ("NCHW", 1, (2, 1), (0, 0)),
])
def test_walk(layout, stride, dilation, walk):
    """The walk's stride and dilation (NHWC: the columns'; NCHW: the rows') compiled into the kernel
    where they are (1, 1) or (2, 1); others at run time."""
    nhwc = layout == "NHWC"
    problem = make_problem((2, 20, 20, 8) if nhwc else (2, 8, 20, 20), (8, 3, 3, 1) if nhwc else (8, 1, 3, 3), None,
                           "float16", stride, 1, dilation, 8, layout, "KHWC" if nhwc else "KCHW")
    assert wgrad_depthwise.walk(problem) == walk
    expression = (wgrad_depthwise.nhwc_specialisation("float16", 3, 3, 4, walk) if nhwc
                  else wgrad_depthwise.specialisation("float16", 3, 3, walk))
    assert expression in wgrad_depthwise.specialisations()


@pytest.mark.parametrize("dtype,c,k,kernel,layout,vector", [
    ("float16", 144, 144, 3, "NHWC", 4),    # 8-byte loads
    ("bfloat16", 36, 36, 3, "NHWC", 4),
    ("bfloat16", 34, 34, 3, "NHWC", 2),     # 34 channels: the widest vector that divides them
    ("float32", 96, 96, 3, "NHWC", 2),
    ("float64", 96, 96, 3, "NHWC", 1),
    ("float16", 96, 96, 5, "NHWC", 2),      # 25 taps: two channels keep 50 sums
    ("float16", 96, 96, 7, "NHWC", 1),
    ("float16", 33, 33, 3, "NHWC", 1),      # odd channels
    ("float16", 32, 96, 3, "NHWC", 1),      # a channel multiplier: its channels are not consecutive
    ("float16", 144, 144, 3, "NCHW", 1),    # one element a thread
])
def test_vector_channels(dtype, c, k, kernel, layout, vector):
    nhwc = layout == "NHWC"
    problem = make_problem((2, 9, 9, c) if nhwc else (2, c, 9, 9), (k, kernel, kernel, 1) if nhwc else (k, 1, kernel, kernel),
                           None, dtype, 1, 1, 1, c, layout, "KHWC" if nhwc else "KCHW")
    assert wgrad_depthwise.vector_channels(problem) == vector
    expression = (wgrad_depthwise.nhwc_specialisation(dtype, kernel, kernel, vector, (1, 1)) if nhwc
                  else wgrad_depthwise.specialisation(dtype, kernel, kernel, (1, 1)))
    assert expression in wgrad_depthwise.specialisations()


def test_refuses_steps_past_32_bit_offsets():
    """A step's input positions are 32-bit offsets: 8003 NHWC columns of 2^20 channels, or 11 NCHW rows of
    2^28 elements, pass 2^31 elements."""
    c = 2**20
    problem = make_problem((1, 1, 3000, c), (c, 3, 3, 1), None, "float16", (1, 1000), 1, 1, c, "NHWC", "KHWC")
    assert "8003 input columns" in wgrad_depthwise.refusal(problem)
    assert wgrad_depthwise.refusal(dataclasses.replace(problem, layout="NCHW", weight_layout="KCHW")) == ""
    long_rows = make_problem((1, 1, 3, 2**28), (1, 1, 3, 3), None, "float16", 1, 1, 1, 1)
    assert "11 input rows" in wgrad_depthwise.refusal(long_rows)
