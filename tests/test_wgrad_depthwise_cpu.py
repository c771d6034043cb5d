"""The depthwise weight gradient's choice and runs, without a GPU."""
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


def test_runs_fill_the_gpu_and_keep_long_runs():
    nchw = make_problem((32, 144, 56, 56), (144, 1, 3, 3), None, "float16", 1, 1, 1, 144)
    grid, splits, vectors = wgrad_depthwise.make_plan(nchw)
    assert grid == (144, splits, 1) and splits == 4 and 32 * 56 * 56 // splits >= wgrad_depthwise.MIN_RUN_PIXELS["NCHW"]
    assert vectors == 1
    nhwc = make_problem((32, 56, 56, 144), (144, 3, 3, 1), None, "float16", 1, 1, 1, 144, "NHWC", "KHWC")
    grid, splits, vectors = wgrad_depthwise.make_plan(nhwc)
    assert (grid[0], vectors) == (1, 18) and splits == wgrad_depthwise.TARGET_BLOCKS  # 18 vectors x 14 pixel lanes
    wide = make_problem((2, 9, 9, 2048), (2048, 3, 3, 1), None, "float16", 1, 1, 1, 2048, "NHWC", "KHWC")
    assert wgrad_depthwise.make_plan(wide)[0][0] == 8 and wgrad_depthwise.make_plan(wide)[2] == 32
    tiny = make_problem((1, 8, 7, 7), (8, 1, 3, 3), None, "float16", 1, 1, 1, 8)
    assert wgrad_depthwise.make_plan(tiny)[1] == 1


@pytest.mark.parametrize("dtype,c,k,kernel,layout,vector", [
    ("float16", 144, 144, 3, "NHWC", 8),    # 16-byte loads
    ("bfloat16", 36, 36, 3, "NHWC", 4),     # 36 channels: the widest vector that divides them
    ("float32", 96, 96, 3, "NHWC", 4),
    ("float64", 96, 96, 3, "NHWC", 2),
    ("float16", 96, 96, 5, "NHWC", 2),      # 25 taps: two channels keep 50 sums
    ("float16", 96, 96, 7, "NHWC", 1),
    ("float16", 33, 33, 3, "NHWC", 1),      # odd channels
    ("float16", 32, 96, 3, "NHWC", 1),      # a channel multiplier: its channels are not consecutive
    ("float16", 144, 144, 3, "NCHW", 1),    # one channel a block
])
def test_vector_channels(dtype, c, k, kernel, layout, vector):
    nhwc = layout == "NHWC"
    problem = make_problem((2, 9, 9, c) if nhwc else (2, c, 9, 9), (k, kernel, kernel, 1) if nhwc else (k, 1, kernel, kernel),
                           None, dtype, 1, 1, 1, c, layout, "KHWC" if nhwc else "KCHW")
    assert wgrad_depthwise.vector_channels(problem) == vector
    assert wgrad_depthwise.specialisation(dtype, nhwc, kernel, kernel, vector) in wgrad_depthwise.specialisations()
