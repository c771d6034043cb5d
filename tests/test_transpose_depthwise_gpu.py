"""Strided depthwise transposed convolutions and input gradients on transpose_depthwise's one launch against
torch in float64: every dtype at its tolerance (TF32 calls run strict float32 sums), both layouts, channel
multipliers, strides past the kernel, dilation, output_padding, channel counts on and off the 16-byte vectors,
bias, NCHW stride-2 layers on the cells kernel, with every allocation NaN-poisoned."""
import pytest

from cases import Case
from cupyconv.compiler import compute_capability
from cupyconv.conv_transpose import input_gradient_problem, transpose_plan
from test_grad_gpu import MODES, check_conv_transpose2d, check_input_gradient

pytestmark = pytest.mark.gpu
pytest.importorskip("torch")

DGRAD_CASES = [
    Case(2, 96, 96, 28, 28, 3, 3, stride=2, padding=1, groups=96),         # MobileNetV2's stride-2 3x3
    Case(2, 40, 40, 15, 17, 5, 5, stride=2, padding=2, groups=40),         # EfficientNet's 5x5, odd planes
    Case(1, 6, 12, 13, 11, 3, 3, stride=2, padding=1, groups=6),           # multiplier 2
    Case(2, 7, 7, 16, 19, 3, 3, stride=(3, 2), padding=(0, 2), dilation=(2, 1), groups=7),
    Case(3, 16, 16, 5, 5, 3, 3, stride=4, groups=16),                      # phases no tap reaches
    Case(2, 8, 8, 20, 24, 5, 5, stride=2, padding=(1, 2), groups=8),       # NCHW cells: residues 1 and 0, pairs
    Case(1, 4, 4, 80, 70, 3, 3, stride=2, groups=4),                       # NCHW cells: two tiles each way
]
TRANSPOSED_CASES = [
    # n, c_in, c_out, h, w, k, stride, padding, output_padding, groups, dilation
    (2, 32, 32, 9, 9, 3, 2, 1, 1, 32, 1),     # output_padding, 16-byte vectors of channels
    (2, 24, 8, 6, 7, 4, 2, 1, 0, 8, 1),       # 3 channels of y a group
    (1, 5, 5, 1, 1, 3, 2, 0, 0, 5, 1),        # a 1x1 y
    (1, 4, 4, 5, 6, 3, 3, 2, 2, 4, 2),        # stride 3, dilation 2, output_padding 2
    (2, 12, 6, 7, 8, 5, 2, 2, 1, 6, 1),       # NCHW cells of a 5x5 layer, 2 channels of y a group
]


def _takes_it(tp):
    assert transpose_plan(tp, True, compute_capability(), tp.c).depthwise is not None


@pytest.mark.parametrize("nhwc", [False, True], ids=["NCHW", "NHWC"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", DGRAD_CASES, ids=lambda c: c.id)
def test_input_gradient_of_depthwise_layers(case, mode, nhwc):
    check_input_gradient(case, mode, nhwc, "float32" if mode == "tf32" else mode,
                         lambda problem: _takes_it(input_gradient_problem(problem)))


@pytest.mark.parametrize("nhwc", [False, True], ids=["NCHW", "NHWC"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", TRANSPOSED_CASES, ids=str)
def test_depthwise_conv_transpose2d(case, mode, nhwc):
    check_conv_transpose2d(case, mode, nhwc, "float32" if mode == "tf32" else mode, _takes_it)
