"""Gradients, transposed and 1-D convolution on the NumPy path against torch's CPU functions in
float64: cupyconv.grad.conv2d_input / conv2d_weight against torch.nn.grad, conv_transpose2d against
F.conv_transpose2d, conv1d against F.conv1d; the stride-phase decomposition itself; the errors."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

import cupyconv
from cases import GRID
from checks import relative_error
from cupyconv.conv_transpose import axis_phases

TOLERANCE = {np.float64: 1e-12, np.float32: 1e-5, np.float16: 3e-3}
DTYPES = [np.float64, np.float32, np.float16]
LAYOUTS = [("NCHW", "KCHW"), ("NHWC", "KHWC"), ("NHWC", "KCHW")]


def t64(a):
    return None if a is None else torch.from_numpy(np.asarray(a, dtype=np.float64))


def nhwc(a):
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1))


def nchw(a):
    return a.transpose(0, 3, 1, 2)


def torch_gradients(x, weight, dy, stride, padding, dilation, groups):
    """(grad x, grad weight) by torch's autograd in float64 (torch.nn.grad takes no 'same' padding)."""
    xt, wt = t64(x).requires_grad_(), t64(weight).requires_grad_()
    F.conv2d(xt, wt, None, stride, padding, dilation, groups).backward(t64(dy))
    return xt.grad.numpy(), wt.grad.numpy()


def grad_case(case, dtype, seed):
    """x, weight and a random grad_output of the case's output shape (never zeros)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((case.n, case.c, case.h, case.w)).astype(dtype)
    weight = rng.standard_normal((case.k, case.c // case.groups, case.kh, case.kw)).astype(dtype)
    out_shape = F.conv2d(t64(x), t64(weight), None, case.stride, case.padding, case.dilation, case.groups).shape
    return x, weight, rng.standard_normal(out_shape).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", GRID, ids=lambda c: c.id)
def test_input_and_weight_gradients_match_torch(case, dtype):
    x, weight, dy = grad_case(case, dtype, seed=len(case.id))
    args = (case.stride, case.padding, case.dilation, case.groups)
    dx = cupyconv.grad.conv2d_input(x.shape, weight, dy, *args)
    dw = cupyconv.grad.conv2d_weight(x, weight.shape, dy, *args)
    ref_dx, ref_dw = torch_gradients(x, weight, dy, *args)
    assert dx.dtype == dtype and dx.shape == x.shape and dw.dtype == dtype and dw.shape == weight.shape
    assert not np.isnan(dx).any() and not np.isnan(dw).any()
    assert relative_error(dx, ref_dx) < TOLERANCE[dtype]
    assert relative_error(dw, ref_dw) < TOLERANCE[dtype]


@pytest.mark.parametrize("layouts", LAYOUTS, ids="-".join)
@pytest.mark.parametrize("case", GRID[:10], ids=lambda c: c.id)
def test_gradients_in_layouts(case, layouts):
    layout, weight_layout = layouts
    x, weight, dy = grad_case(case, np.float64, seed=3)
    args = (case.stride, case.padding, case.dilation, case.groups)
    ref_dx, ref_dw = torch_gradients(x, weight, dy, *args)
    xl, dyl = (nhwc(x), nhwc(dy)) if layout == "NHWC" else (x, dy)
    wl = nhwc(weight) if weight_layout == "KHWC" else weight
    dx = cupyconv.grad.conv2d_input(xl.shape, wl, dyl, *args, layout=layout, weight_layout=weight_layout)
    dw = cupyconv.grad.conv2d_weight(xl, wl.shape, dyl, *args, layout=layout, weight_layout=weight_layout)
    assert dx.shape == xl.shape and dw.shape == wl.shape
    assert relative_error(nchw(dx) if layout == "NHWC" else dx, ref_dx) < 1e-12
    assert relative_error(nchw(dw) if weight_layout == "KHWC" else dw, ref_dw) < 1e-12


def test_unbatched_gradients():
    x, weight, dy = grad_case(GRID[2], np.float64, seed=4)
    dx = cupyconv.grad.conv2d_input(x.shape[1:], weight, dy[0], stride=2, padding=(1, 2))
    dw = cupyconv.grad.conv2d_weight(x[0], weight.shape, dy[0], stride=2, padding=(1, 2))
    assert dx.shape == x.shape[1:]
    assert relative_error(dx, torch.nn.grad.conv2d_input(x.shape, t64(weight), t64(dy), 2, (1, 2))[0].numpy()) < 1e-12
    assert relative_error(dw, torch.nn.grad.conv2d_weight(t64(x), weight.shape, t64(dy), 2, (1, 2)).numpy()) < 1e-12


def test_bias_gradient_is_the_documented_sum():
    x, weight, dy = grad_case(GRID[0], np.float64, seed=5)
    xt, wt, bt = t64(x).requires_grad_(), t64(weight), t64(np.ones(weight.shape[0])).requires_grad_()
    F.conv2d(xt, wt, bt).backward(t64(dy))
    np.testing.assert_allclose(dy.sum(axis=(0, 2, 3)), bt.grad.numpy(), rtol=1e-12)


TRANSPOSED = [
    # n, c_in, c_out, h, w, kh, kw, stride, padding, output_padding, groups, dilation
    (2, 4, 3, 5, 6, 4, 4, 2, 1, 0, 1, 1),        # DCGAN's up-sampling layer
    (1, 6, 4, 7, 5, 3, 3, 2, 1, 1, 2, 1),        # U-Net decoder: 3x3 stride 2, output_padding 1, groups
    (2, 3, 5, 4, 4, 3, 3, 1, 0, 0, 1, 1),        # stride 1: one phase
    (1, 3, 2, 5, 4, 3, 2, (3, 2), (2, 0), (1, 1), 1, (1, 2)),
    (1, 4, 4, 6, 6, 3, 3, 2, 1, 1, 4, 1),        # depthwise
    (1, 2, 3, 3, 3, 2, 2, 3, 0, 2, 1, 1),        # stride past the kernel: phases no tap reaches
    (1, 2, 2, 4, 5, 3, 3, 2, 0, 2, 1, 3),        # output_padding below the dilation, past the stride
    (1, 2, 3, 3, 3, 5, 5, 2, 4, 1, 1, 1),        # padding past the kernel's reach at the edges
]


@pytest.mark.parametrize("layouts", LAYOUTS, ids="-".join)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("case", TRANSPOSED, ids=str)
def test_conv_transpose2d_matches_torch(case, bias, layouts):
    n, c_in, c_out, h, w, kh, kw, stride, padding, output_padding, groups, dilation = case
    rng = np.random.default_rng(sum(map(hash, map(str, case))) % 2**32)
    x = rng.standard_normal((n, c_in, h, w))
    weight = rng.standard_normal((c_in, c_out // groups, kh, kw))
    b = rng.standard_normal(c_out) if bias else None
    ref = F.conv_transpose2d(t64(x), t64(weight), t64(b), stride, padding, output_padding, groups, dilation).numpy()
    layout, weight_layout = layouts
    xl = nhwc(x) if layout == "NHWC" else x
    wl = nhwc(weight) if weight_layout == "KHWC" else weight
    out = cupyconv.conv_transpose2d(xl, wl, b, stride, padding, output_padding, groups, dilation, layout=layout,
                                    weight_layout=weight_layout)
    assert relative_error(nchw(out) if layout == "NHWC" else out, ref) < 1e-12


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_conv_transpose2d_dtypes_and_unbatched(dtype):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((3, 5, 6)).astype(dtype)
    weight = rng.standard_normal((3, 4, 3, 3)).astype(dtype)
    b = rng.standard_normal(4).astype(dtype)
    out = cupyconv.conv_transpose2d(x, weight, b, stride=2, padding=1, output_padding=1)
    ref = F.conv_transpose2d(t64(x)[None], t64(weight), t64(b), 2, 1, 1)[0].numpy()
    assert out.dtype == dtype and out.shape == ref.shape
    assert relative_error(out, ref) < TOLERANCE[dtype]


@given(st.data())
@settings(max_examples=60, deadline=None)
def test_phases_cover_each_output_once_and_match_torch(data):
    """Fuzz: random geometry; every output index in exactly one phase; the result is torch's."""
    draw = lambda lo, hi: data.draw(st.integers(lo, hi))
    stride, dilation, kernel, pad = (draw(1, 4), draw(1, 4)), (draw(1, 3), draw(1, 3)), (draw(1, 5), draw(1, 5)), \
        (draw(0, 4), draw(0, 4))
    hy, wy = draw(1, 6), draw(1, 6)
    extra = tuple(draw(0, max(s, d) - 1) for s, d in zip(stride, dilation))
    size = [(i - 1) * s - 2 * p + d * (k - 1) + e + 1 for i, s, p, d, k, e in zip((hy, wy), stride, pad, dilation,
                                                                                   kernel, extra)]
    if min(size) < 1:
        return
    for axis in range(2):
        covered = sorted(p.start + i * stride[axis] for p in axis_phases(size[axis], (hy, wy)[axis], kernel[axis],
                                                                           stride[axis], dilation[axis], pad[axis])
                         for i in range(p.count))
        assert covered == list(range(size[axis]))
    rng = np.random.default_rng(draw(0, 1000))
    x, weight = rng.standard_normal((1, 2, hy, wy)), rng.standard_normal((2, 3, *kernel))
    out = cupyconv.conv_transpose2d(x, weight, None, stride, pad, extra, 1, dilation)
    ref = F.conv_transpose2d(t64(x), t64(weight), None, stride, pad, extra, 1, dilation).numpy()
    assert relative_error(out, ref) < 1e-12


CONV1D = [
    # n, c, k, length, taps, stride, padding, dilation, groups
    (2, 3, 8, 50, 3, 1, 1, 1, 1),
    (1, 8, 8, 33, 5, 2, 2, 1, 8),       # depthwise
    (2, 4, 6, 40, 4, 1, "same", 2, 2),  # even taps: asymmetric 'same'
    (1, 16, 32, 100, 1, 1, 0, 1, 1),    # pointwise
    (3, 2, 4, 17, 7, 3, "valid", 1, 1),
]


@pytest.mark.parametrize("layouts", [("NCL", "KCL"), ("NLC", "KLC"), ("NLC", "KCL")], ids="-".join)
@pytest.mark.parametrize("case", CONV1D, ids=str)
def test_conv1d_matches_torch(case, layouts):
    n, c, k, length, taps, stride, padding, dilation, groups = case
    rng = np.random.default_rng(7)
    x = rng.standard_normal((n, c, length))
    weight = rng.standard_normal((k, c // groups, taps))
    b = rng.standard_normal(k)
    ref = F.conv1d(t64(x), t64(weight), t64(b), stride, padding, dilation, groups).numpy()
    layout, weight_layout = layouts
    xl = np.ascontiguousarray(x.transpose(0, 2, 1)) if layout == "NLC" else x
    wl = np.ascontiguousarray(weight.transpose(0, 2, 1)) if weight_layout == "KLC" else weight
    out = cupyconv.conv1d(xl, wl, b, stride, padding, dilation, groups, layout=layout, weight_layout=weight_layout)
    assert relative_error(out.transpose(0, 2, 1) if layout == "NLC" else out, ref) < 1e-12
    unbatched = cupyconv.conv1d(xl[0], wl, b, (stride,), padding if isinstance(padding, str) else (padding,),
                                (dilation,), groups, layout=layout, weight_layout=weight_layout)
    np.testing.assert_array_equal(unbatched, out[0])


def test_conv1d_fused_epilogue_and_out():
    rng = np.random.default_rng(8)
    x, weight = rng.standard_normal((2, 3, 20)), rng.standard_normal((4, 3, 3))
    residual = rng.standard_normal((2, 4, 18))
    out = np.full((2, 4, 18), np.nan)
    cupyconv.conv1d(x, weight, out=out, activation="relu", residual=residual)
    ref = F.relu(F.conv1d(t64(x), t64(weight)) + t64(residual)).numpy()
    assert relative_error(out, ref) < 1e-12


@pytest.mark.parametrize("call,message", [
    (lambda: cupyconv.grad.conv2d_input((1, 3, 8, 8, 1), np.ones((4, 3, 3, 3)), np.ones((1, 4, 6, 6))), "input_shape"),
    (lambda: cupyconv.grad.conv2d_input([1, 3, 8, 8.0], np.ones((4, 3, 3, 3)), np.ones((1, 4, 6, 6))),
     "input_shape"),
    (lambda: cupyconv.grad.conv2d_input((1, 3, 8, 8), np.ones((4, 3, 3, 3)), np.ones((1, 4, 5, 6))),
     r"grad_output must have the convolution's output shape \(1, 4, 6, 6\)"),
    (lambda: cupyconv.grad.conv2d_input((1, 2, 8, 8), np.ones((4, 3, 3, 3)), np.ones((1, 4, 6, 6))), "groups"),
    (lambda: cupyconv.grad.conv2d_weight(np.ones((1, 3, 8, 8)), (4, 3, 3, 3), np.ones((1, 4, 6, 7))),
     "grad_output"),
    (lambda: cupyconv.grad.conv2d_weight(np.ones((1, 3, 8, 8)), (4, 3, 3), np.ones((1, 4, 6, 6))), "weight_shape"),
    (lambda: cupyconv.grad.conv2d_weight(np.ones((1, 3, 8, 8)), (4, 3, 3, 3), np.ones((1, 4, 6, 6), np.float32)),
     "dtype"),
    (lambda: cupyconv.conv_transpose2d(np.ones((1, 3, 4, 4)), np.ones((2, 3, 3, 3))), "C_in"),
    (lambda: cupyconv.conv_transpose2d(np.ones((1, 3, 4, 4)), np.ones((3, 2, 3, 3)), stride=2, output_padding=2),
     "output_padding"),
    (lambda: cupyconv.conv_transpose2d(np.ones((1, 3, 4, 4)), np.ones((3, 2, 3, 3)), padding="same"), "padding"),
    (lambda: cupyconv.conv_transpose2d(np.ones((1, 3, 1, 1)), np.ones((3, 2, 3, 3)), padding=2), "too large"),
    (lambda: cupyconv.conv_transpose2d(np.ones((1, 3, 4, 4)), np.ones((3, 2, 3, 3)), np.ones(3)), "bias"),
    (lambda: cupyconv.conv_transpose2d(np.ones((1, 4, 4, 4)), np.ones((4, 2, 3, 3)), groups=3), "groups"),
    (lambda: cupyconv.conv1d(np.ones((1, 3, 4, 4)), np.ones((2, 3, 3))), "x must be 2-D or 3-D"),
    (lambda: cupyconv.conv1d(np.ones((1, 3, 8)), np.ones((2, 3, 3)), layout="NCHW"), "layout"),
    (lambda: cupyconv.conv1d(np.ones((1, 3, 8)), np.ones((2, 3, 3)), stride=(1, 1)), "stride"),
])
def test_errors_name_the_argument(call, message):
    with pytest.raises((TypeError, ValueError), match=message):
        call()


@given(st.integers(1, 6), st.integers(1, 4), st.integers(1, 4), st.integers(0, 5), st.integers(1, 30))
@settings(max_examples=200, deadline=None)
def test_tap_slices_pick_the_phase_taps(kernel, stride, dilation, pad, size):
    """A phase's taps are evenly spaced, so a slice (a view, capturable in a CUDA graph) picks them."""
    for phase in axis_phases(size * stride + kernel, size, kernel, stride, dilation, pad):
        if phase.taps:
            assert tuple(range(kernel)[phase.tap_slice]) == phase.taps


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("stride", [1, 2])
def test_few_output_channels_padded_to_a_gemm_tile(layout, bias, stride):
    """Outputs of fewer than 8 channels are computed with zero channels added (as the GPU does, for
    its GEMMs) and cut: the result is torch's."""
    from cupyconv.conv_transpose import make_transpose_problem, transposed

    rng = np.random.default_rng(9)
    x, weight = rng.standard_normal((2, 16, 5, 6)), rng.standard_normal((16, 3, 4, 4))
    b = rng.standard_normal(3) if bias else None
    ref = F.conv_transpose2d(t64(x), t64(weight), t64(b), stride, 1).numpy()
    xl = nhwc(x) if layout == "NHWC" else x
    tp = make_transpose_problem(xl.shape, weight.shape, None if b is None else b.shape, "float64", stride, 1, 0, 1, 1,
                                layout)
    out = transposed(xl, weight, b, tp, "numpy", min_channels=8)
    assert relative_error(nchw(out) if layout == "NHWC" else out, ref) < 1e-12
