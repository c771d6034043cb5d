"""Transposed convolutions of 1-4 output channels on transpose_few_channels' one launch (the input gradient
of an RGB stem, a generator's RGB layer) against torch in float64: every dtype it takes at its tolerance
(TF32 calls run strict float32), both layouts, stride phases of different taps, phases no tap reaches,
taps up to 8 a phase, channel counts off the 8-channel steps, bias, with every allocation NaN-poisoned."""
import pytest

import cupyconv
from cases import Case
from cupyconv import conv_transpose
from cupyconv import transpose_few_channels as few
from cupyconv.compiler import compute_capability
from cupyconv.conv_transpose import input_gradient_problem, transpose_plan
from test_grad_gpu import check_conv_transpose2d, check_input_gradient

pytestmark = pytest.mark.gpu
pytest.importorskip("torch")
MODES = ["float32", "tf32", "float16", "bfloat16"]


@pytest.fixture(autouse=True)
def taken_wherever_it_runs(monkeypatch):
    """The rules send 16-bit problems of few taps a phase to the tensor cores: here the kernel takes every
    problem it can run, in every dtype."""
    monkeypatch.setattr(conv_transpose.transpose_few_channels, "pays", lambda tp: not few.refusal(tp))
    conv_transpose.transposed_executable.cache_clear()
    cupyconv.grad.input_gradient_executable.cache_clear()
    yield
    conv_transpose.transposed_executable.cache_clear()
    cupyconv.grad.input_gradient_executable.cache_clear()


DGRAD_CASES = [
    Case(2, 3, 64, 30, 34, 7, 7, stride=2, padding=3),                    # ResNet's stem: taps 4 and 3
    Case(3, 1, 20, 17, 19, 3, 3, padding=1),                              # one phase, 20 channels of y
    Case(2, 2, 12, 23, 21, 5, 4, stride=(2, 3), dilation=(2, 1), padding=(2, 1)),
    Case(1, 4, 12, 40, 37, 15, 15, stride=2, padding=7),                  # 8 taps a phase
    Case(2, 3, 9, 26, 18, 2, 2, stride=4),                                # phases no tap reaches
    Case(1, 3, 64, 150, 140, 3, 3, stride=1, padding=1),                  # several tiles of every width
]
TRANSPOSED_CASES = [
    # n, c_in, c_out, h, w, k, stride, padding, output_padding, groups, dilation
    (4, 64, 3, 8, 8, 4, 2, 1, 0, 1, 1),       # DCGAN's RGB layer
    (2, 16, 1, 9, 7, 3, 2, 1, 1, 1, 1),       # output_padding
    (2, 24, 4, 6, 5, 5, 3, 4, 2, 1, 1),       # padding past the kernel's reach on the phases' edges
    (1, 8, 2, 7, 9, 3, 2, 0, 1, 1, 2),        # dilation 2 = stride 2: one tap a phase
]


def _takes_it(tp):
    assert transpose_plan(tp, True, compute_capability(), tp.c).few is not None


@pytest.mark.parametrize("nhwc", [False, True], ids=["NCHW", "NHWC"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", DGRAD_CASES, ids=lambda c: c.id)
def test_input_gradient_of_few_channels(case, mode, nhwc):
    check_input_gradient(case, mode, nhwc, "float32" if mode == "tf32" else mode,
                         lambda problem: _takes_it(input_gradient_problem(problem)))


@pytest.mark.parametrize("nhwc", [False, True], ids=["NCHW", "NHWC"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", TRANSPOSED_CASES, ids=str)
def test_conv_transpose2d_of_few_channels(case, mode, nhwc):
    check_conv_transpose2d(case, mode, nhwc, "float32" if mode == "tf32" else mode, _takes_it)
