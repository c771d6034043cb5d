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
    grid, splits = wgrad_depthwise.make_plan(nchw)
    assert grid == (144, splits, 1) and splits == 4 and 32 * 56 * 56 // splits >= wgrad_depthwise.MIN_RUN_PIXELS["NCHW"]
    nhwc = make_problem((32, 56, 56, 144), (144, 3, 3, 1), None, "float16", 1, 1, 1, 144, "NHWC", "KHWC")
    grid, splits = wgrad_depthwise.make_plan(nhwc)
    assert grid[0] == 5 and grid[0] * splits >= wgrad_depthwise.TARGET_BLOCKS
    tiny = make_problem((1, 8, 7, 7), (8, 1, 3, 3), None, "float16", 1, 1, 1, 8)
    assert wgrad_depthwise.make_plan(tiny)[1] == 1
