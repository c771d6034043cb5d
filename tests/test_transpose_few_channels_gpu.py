"""Transposed convolutions of 1-4 output channels on transpose_few_channels' one launch (the input gradient
of an RGB stem, a generator's RGB layer) against torch in float64: every dtype it takes at its tolerance
(TF32 calls run strict float32), both layouts, stride phases of different taps, phases no tap reaches,
taps up to 8 a phase, channel counts off the 8-channel steps, bias, with every allocation NaN-poisoned."""
import pytest

import cupyconv
from cases import Case
from checks import relative_error
from cupyconv import conv_transpose
from cupyconv import transpose_few_channels as few
from cupyconv.arguments import make_problem
from cupyconv.compiler import compute_capability
from cupyconv.conv_transpose import input_gradient_problem, make_transpose_problem, transpose_plan, transposed
from test_grad_gpu import TORCH_DTYPES, bound, from_cupy, nan_poisoned_memory, precision, to_cupy

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
F = torch.nn.functional
MODES = ["float32", "tf32", "float16", "bfloat16"]


@pytest.fixture(autouse=True)
def taken_wherever_it_runs(monkeypatch):
    """The rules send 16-bit problems of few taps a phase to the tensor cores: here the kernel takes every
    problem it can run, in every dtype."""
    monkeypatch.setattr(conv_transpose.transpose_few_channels, "pays", lambda tp, tf32: not few.refusal(tp))
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
    # n, c_in, c_out, h, w, k, stride, padding, output_padding, dilation
    (4, 64, 3, 8, 8, 4, 2, 1, 0, 1),       # DCGAN's RGB layer
    (2, 16, 1, 9, 7, 3, 2, 1, 1, 1),       # output_padding
    (2, 24, 4, 6, 5, 5, 3, 4, 2, 1),       # padding past the kernel's reach on the phases' edges
    (1, 8, 2, 7, 9, 3, 2, 0, 1, 2),        # dilation 2 = stride 2: one tap a phase
]


@pytest.mark.parametrize("nhwc", [False, True], ids=["NCHW", "NHWC"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", DGRAD_CASES, ids=lambda c: c.id)
def test_input_gradient_of_few_channels(case, mode, nhwc):
    dtype = TORCH_DTYPES[mode]
    gen = torch.Generator(device="cuda").manual_seed(len(case.id))
    x = torch.randn(case.n, case.c, case.h, case.w, device="cuda", dtype=torch.float64, generator=gen)
    w = torch.randn(case.k, case.c, case.kh, case.kw, device="cuda", dtype=torch.float64, generator=gen)
    args = (case.stride, case.padding, case.dilation, 1)
    xr = x.clone().requires_grad_()
    y = F.conv2d(xr, w, None, *args)
    dy = torch.randn(y.shape, device="cuda", dtype=torch.float64, generator=gen)
    y.backward(dy)
    layout = ("NHWC", "KHWC") if nhwc else ("NCHW", "KCHW")
    problem = make_problem(tuple(x.permute(0, 2, 3, 1).shape) if nhwc else tuple(x.shape),
                           tuple(w.permute(0, 2, 3, 1).shape) if nhwc else tuple(w.shape), None,
                           "float32" if mode == "tf32" else mode, *args, *layout)
    tp = input_gradient_problem(problem)
    assert transpose_plan(tp, mode == "tf32", compute_capability(), tp.c).few is not None
    with nan_poisoned_memory(), precision(mode):
        out = cupyconv.grad.input_gradient(problem, to_cupy(w.to(dtype), nhwc), to_cupy(dy.to(dtype), nhwc), "cupy",
                                           allow_tf32=mode == "tf32")
        got = from_cupy(out, dtype, nhwc)
        xo = x.to(dtype).requires_grad_()
        F.conv2d(xo, w.to(dtype), None, *args).backward(dy.to(dtype))
    assert got.shape == x.shape and not got.isnan().any()
    assert relative_error(got, xr.grad) <= bound("float32" if mode == "tf32" else mode, xo.grad, xr.grad)


@pytest.mark.parametrize("nhwc", [False, True], ids=["NCHW", "NHWC"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", TRANSPOSED_CASES, ids=str)
def test_conv_transpose2d_of_few_channels(case, mode, nhwc):
    n, c_in, c_out, h, w_, k, stride, padding, output_padding, dilation = case
    dtype = TORCH_DTYPES[mode]
    gen = torch.Generator(device="cuda").manual_seed(sum(case))
    x = torch.randn(n, c_in, h, w_, device="cuda", dtype=torch.float64, generator=gen)
    w = torch.randn(c_in, c_out, k, k, device="cuda", dtype=torch.float64, generator=gen)
    b = torch.randn(c_out, device="cuda", dtype=torch.float64, generator=gen)
    args = (stride, padding, output_padding, 1, dilation)
    ref = F.conv_transpose2d(x, w, b, *args)
    tp = make_transpose_problem(tuple(x.permute(0, 2, 3, 1).shape) if nhwc else tuple(x.shape),
                                tuple(w.permute(0, 2, 3, 1).shape) if nhwc else tuple(w.shape), (c_out,),
                                "float32" if mode == "tf32" else mode, stride, padding, output_padding, 1,
                                dilation, "NHWC" if nhwc else "NCHW", "KHWC" if nhwc else "KCHW")
    assert transpose_plan(tp, mode == "tf32", compute_capability(), tp.c).few is not None
    with nan_poisoned_memory(), precision(mode):
        out = transposed(to_cupy(x.to(dtype), nhwc), to_cupy(w.to(dtype), nhwc), to_cupy(b.to(dtype)), tp, "cupy",
                         allow_tf32=mode == "tf32")
        got = from_cupy(out, dtype, nhwc)
        own = F.conv_transpose2d(x.to(dtype), w.to(dtype), b.to(dtype), *args)
    assert got.shape == ref.shape and not got.isnan().any()
    assert relative_error(got, ref) <= bound("float32" if mode == "tf32" else mode, own, ref)
