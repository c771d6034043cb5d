"""The planner's choice for layers of one input channel per group that are not depthwise layers of 2-D
planes, without a GPU: one input channel in one group to >= ONE_CHANNEL_GEMM_MIN_CHANNELS channels takes
the NCHW-gather GEMM on the tensor cores (in place in either layout), in NCHW from
ONE_CHANNEL_GEMM_MIN_TAPS taps on, in NHWC at any number of taps; fewer channels, fewer taps in NCHW and
strict float32 a depthwise kernel; outputs one row high take the depthwise
kernel's runs along rows of 1024 (rows of 256 for column strides past 1), and in NHWC long kernels
the runs of run-time taps (benchmarks/NOTES.md, "conv1d's problems" and "Runs along rows")."""
import pytest

from cupyconv.arguments import make_problem
from cupyconv.families.depthwise_conv2d import ROW_CONFIG, ROW_RUNS_CONFIG
from cupyconv.families.depthwise_nhwc import RUN_CONFIG
from cupyconv.planner import (DEPTHWISE_COLUMN_KERNEL, DEPTHWISE_KERNEL, DEPTHWISE_NHWC_KERNEL, GEMM_KERNEL,
                              ONE_CHANNEL_GEMM_MIN_TAPS, make_plan)

#: (x NCHW, weight, stride, padding, groups)
W2V_CONV0 = ((8, 1, 1, 16000), (512, 1, 1, 10), (1, 5), 0, 1)       # wav2vec 2.0's first layer, as conv1d runs it
GRAY_7X7 = ((4, 1, 224, 224), (64, 1, 7, 7), 2, 3, 1)               # a grayscale image's first layer
GRAY_3X3 = ((4, 1, 224, 224), (32, 1, 3, 3), 1, 1, 1)               # 9 taps: fewer than the rule's 10
CONFORMER_DW = ((16, 512, 1, 1000), (512, 1, 1, 31), 1, (0, 15), 512)  # depthwise, one row high


def plan_of(layer, dtype, layout, tf32=True):
    x, w, stride, padding, groups = layer
    if layout == "NHWC":
        x = (x[0], x[2], x[3], x[1])
    problem = make_problem(x, w, None, dtype, stride, padding, 1, groups, layout)
    return make_plan(problem, allow_tf32=tf32, compute_capability=90)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("layer", [W2V_CONV0, GRAY_7X7], ids=["w2v_conv0", "gray_7x7"])
def test_one_input_channel_of_many_taps_takes_the_tensor_cores(layer, dtype, layout):
    plan = plan_of(layer, dtype, layout)
    assert layer[1][2] * layer[1][3] >= ONE_CHANNEL_GEMM_MIN_TAPS
    assert plan.kernel == GEMM_KERNEL and f"the {layout} input gathered in place" in plan.reason, str(plan)
    assert plan.name_expression.endswith(",true>") == (layout == "NHWC")
    # 512 channels: wav2vec 2.0's reduction of 10 fits one k tile, which takes 64-channel tiles, two blocks an SM
    assert plan.config.bn == (64 if layer is W2V_CONV0 else layer[1][0]), str(plan)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_one_input_channel_of_few_taps_in_nhwc_takes_the_gemm_in_place(dtype):
    assert plan_of(GRAY_3X3, dtype, "NHWC").kernel == GEMM_KERNEL
    # NCHW: a depthwise kernel; 224-wide even rows take the column kernel's pairs
    assert plan_of(GRAY_3X3, dtype, "NCHW").kernel == DEPTHWISE_COLUMN_KERNEL


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_few_channels_and_strict_float32_keep_the_depthwise_kernel(layout):
    assert plan_of(W2V_CONV0, "float32", layout, tf32=False).kernel == DEPTHWISE_KERNEL
    one_filter = (W2V_CONV0[0], (1, 1, 1, 15), 1, (0, 7), 1)  # a single-channel filter of 15 taps
    assert plan_of(one_filter, "float16", layout).kernel in (DEPTHWISE_KERNEL, DEPTHWISE_NHWC_KERNEL)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_rows_one_high_take_the_runs_along_rows(dtype):
    nchw = plan_of(CONFORMER_DW, dtype, "NCHW")
    assert nchw.kernel == DEPTHWISE_KERNEL and nchw.config.name == ROW_RUNS_CONFIG, str(nchw)
    assert nchw.block == (128, 1, 1) and nchw.grid[0] == 1  # 1000 outputs a row: one row of 1024
    nhwc = plan_of(CONFORMER_DW, dtype, "NHWC")
    assert nhwc.kernel == DEPTHWISE_NHWC_KERNEL
    if dtype == "float64":  # per pixel: its runs are not compiled
        assert nhwc.config.pixels == 1, str(nhwc)
    else:  # the dtype's runs of run-time taps
        assert nhwc.config is RUN_CONFIG[dtype], str(nhwc)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_rows_one_high_of_column_stride_two_take_the_row_tile(layout):
    strided = (CONFORMER_DW[0], CONFORMER_DW[1], (1, 2), CONFORMER_DW[3], CONFORMER_DW[4])
    plan = plan_of(strided, "float32", layout)
    if layout == "NCHW":
        assert plan.kernel == DEPTHWISE_KERNEL and plan.config.name == ROW_CONFIG, str(plan)
    else:  # the runs of any width read columns one apart
        assert plan.kernel == DEPTHWISE_NHWC_KERNEL and plan.config.kw >= 0, str(plan)


def test_kernels_one_column_wide_stay_per_pixel():
    column = (CONFORMER_DW[0], (CONFORMER_DW[1][0], 1, 31, 1), 1, (15, 0), CONFORMER_DW[4])
    assert plan_of(((16, 512, 1000, 1),) + column[1:], "float16", "NHWC").config.name == "dw_nhwc_v16"
