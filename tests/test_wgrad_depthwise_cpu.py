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
    # 56 columns a block (4 lanes of them), a block per channel; 288 blocks, whole columns
    nchw = make_problem((32, 144, 56, 56), (144, 1, 3, 3), None, "float16", 1, 1, 1, 144)
    assert tuple(wgrad_depthwise.make_plan(nchw)) == ((144, 2, 1), 2, 56, 56)
    wide = make_problem((2, 8, 20, 600), (8, 1, 3, 3), None, "float32", 1, 1, 1, 8)
    plan = wgrad_depthwise.make_plan(wide)
    assert plan.across == wgrad_depthwise.MAX_COLUMNS and plan.grid[0] == 8 * 3  # three column tiles a channel
    tiny = make_problem((1, 8, 7, 7), (8, 1, 3, 3), None, "float16", 1, 1, 1, 8)
    assert wgrad_depthwise.make_plan(tiny).splits == 1


@pytest.mark.parametrize("shape,stride,plan", [
    # 144 channels in vectors of 4: two blocks of 18 vectors x 14 row lanes; whole rows, one a lane
    ((32, 56, 56, 144), 1, ((2, 128, 1), 128, 18, 56)),
    # 24 vectors x 10 lanes, 264 runs: rows of 28 would leave lanes 2 items or 1; segments of 8 deal 4-5
    ((32, 112, 112, 96), 2, ((1, 264, 1), 264, 24, 8)),
])
def test_nhwc_plans_of_mobilenet_rows(shape, stride, plan):
    problem = make_problem(shape, (shape[3], 3, 3, 1), None, "float16", stride, 1, 1, shape[3], "NHWC", "KHWC")
    assert tuple(wgrad_depthwise.make_plan(problem)) == plan


@pytest.mark.parametrize("shape", [(32, 56, 56, 144), (32, 14, 14, 384), (2, 9, 9, 2048), (1, 2, 4096, 96),
                                   (256, 56, 56, 96), (3, 7, 300, 40)])
def test_nhwc_segment_leaves_the_busiest_lane_the_fewest_pixels(shape):
    """Every lane has an item, runs stay near TARGET_BLOCKS, and no other segment's busiest lane walks
    fewer pixels."""
    n, h, w, c = shape
    problem = make_problem(shape, (c, 3, 3, 1), None, "float16", 1, 1, 1, c, "NHWC", "KHWC")
    plan = wgrad_depthwise.make_plan(problem)
    lanes = 256 // plan.across

    def busiest(segment, splits):
        items = n * h * math.ceil(w / segment)
        return math.ceil(math.ceil(items / splits) / lanes) * min(segment, w)

    items = n * h * math.ceil(w / plan.segment)
    assert plan.splits == 1 or items // plan.splits >= lanes
    assert plan.grid[0] * plan.splits <= wgrad_depthwise.TARGET_BLOCKS + plan.grid[0]
    step, least = wgrad_depthwise.ROW_STEP, wgrad_depthwise.MIN_SEGMENT
    candidates = [math.ceil(w / step) * step]  # a whole row, then halvings
    while candidates[-1] > least:
        candidates.append(max(least, math.ceil(candidates[-1] / 2 / step) * step))
    assert plan.segment in candidates
    for segment in candidates:
        other_items = n * h * math.ceil(w / segment)
        splits = max(1, min(math.ceil(wgrad_depthwise.TARGET_BLOCKS / plan.grid[0]), other_items // lanes))
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
