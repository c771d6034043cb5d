"""The input scale (conv2d(x * s) with s per image and input channel) without a GPU: the NumPy path in
both layouts, unbatched and with the epilogue, against torch in float64; the torch adapter's CPU path;
the errors that name input_scale; the printed plan."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import cupyconv
import cupyconv.torch as ct
from checks import relative_error

TOLERANCE = {np.float64: 1e-12, np.float32: 1e-5, np.float16: 1e-2}


def arrays(seed: int, dtype, n: int = 2):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 6, 9, 8)).astype(dtype)
    weight = rng.standard_normal((10, 3, 3, 2)).astype(dtype)
    bias = rng.standard_normal(10).astype(dtype)
    scale = rng.uniform(0.1, 2.0, (n, 6)).astype(dtype)
    return x, weight, bias, scale


def reference(x, weight, bias, scale, activation="none"):
    """conv(x * s) in float64 of x * s rounded to x's dtype first, as torch's multiply and the kernels round."""
    scaled = torch.from_numpy(x) * torch.from_numpy(scale)[:, :, None, None]
    t = lambda a: torch.from_numpy(np.asarray(a, dtype=np.float64))
    y = F.conv2d(scaled.double(), t(weight), t(bias), padding=(1, 0), groups=2)
    return F.silu(y) if activation == "silu" else y


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16], ids=lambda d: np.dtype(d).name)
def test_numpy_input_scale_matches_torch(dtype, layout):
    x, weight, bias, scale = arrays(3, dtype)
    ref = reference(x, weight, bias, scale, "silu")
    xin = x.transpose(0, 2, 3, 1).copy() if layout == "NHWC" else x
    out = cupyconv.conv2d(xin, weight, bias, padding=(1, 0), groups=2, layout=layout, activation="silu",
                          input_scale=scale)
    nchw = lambda y: y.transpose(0, 3, 1, 2) if layout == "NHWC" else y
    assert relative_error(torch.from_numpy(nchw(out).astype(np.float64)), ref) < TOLERANCE[dtype]
    # The scale changes the result (it is not ignored), and x is left as it was.
    plain = nchw(cupyconv.conv2d(xin, weight, bias, padding=(1, 0), groups=2, layout=layout, activation="silu"))
    assert relative_error(torch.from_numpy(plain.astype(np.float64)), ref) > 1e-2
    np.testing.assert_array_equal(xin, x.transpose(0, 2, 3, 1) if layout == "NHWC" else x)


def test_unbatched_input_scale_is_per_channel():
    x, weight, bias, scale = arrays(4, np.float64, n=1)
    out = cupyconv.conv2d(x[0], weight, bias, padding=(1, 0), groups=2, input_scale=scale[0])
    torch.testing.assert_close(torch.from_numpy(out), reference(x, weight, bias, scale)[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape,layout", [((2, 6, 1, 1), "NCHW"), ((6,), "NCHW"), ((2, 3), "NCHW"), ((6, 2), "NHWC")])
def test_input_scale_of_another_shape_is_named(shape, layout):
    x, weight, bias, _ = arrays(5, np.float32)
    xin = x.transpose(0, 2, 3, 1).copy() if layout == "NHWC" else x
    with pytest.raises(ValueError, match=r"input_scale must have shape \(N, C\) = \(2, 6\).*" + layout):
        cupyconv.conv2d(xin, weight, bias, padding=(1, 0), groups=2, layout=layout,
                        input_scale=np.ones(shape, np.float32))


def test_input_scale_of_another_dtype_or_kind_is_refused():
    x, weight, bias, scale = arrays(6, np.float32)
    with pytest.raises(TypeError, match="input_scale has dtype float64"):
        cupyconv.conv2d(x, weight, bias, padding=(1, 0), groups=2, input_scale=scale.astype(np.float64))
    with pytest.raises(TypeError, match="input_scale must be a NumPy or CuPy array, got list"):
        cupyconv.conv2d(x, weight, bias, padding=(1, 0), groups=2, input_scale=scale.tolist())


def test_plan_says_how_the_scale_is_applied():
    x = np.zeros((2, 8, 8, 64), np.float16)
    scale = np.ones((2, 64), np.float16)
    pointwise = cupyconv.plan(x, np.zeros((32, 64, 1, 1), np.float16), layout="NHWC", input_scale=scale)
    assert pointwise.kernel == "pointwise_nhwc" and "input scale: x * input_scale[n, c] in the kernel's loads" in str(
        pointwise)
    other = cupyconv.plan(x, np.zeros((32, 64, 3, 3), np.float16), padding=1, layout="NHWC", input_scale=scale)
    assert "copied to the workspace first (scale_channels)" in str(other)
    assert "input scale" not in str(cupyconv.plan(x, np.zeros((32, 64, 3, 3), np.float16), padding=1, layout="NHWC"))


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
def test_torch_cpu_input_scale(channels_last):
    torch.manual_seed(0)
    x, w = torch.randn(2, 6, 9, 8, dtype=torch.float64), torch.randn(10, 3, 3, 2, dtype=torch.float64)
    s = torch.rand(2, 6, 1, 1, dtype=torch.float64) + 0.5
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    out = ct.conv2d(x, w, None, 1, (1, 0), 1, 2, input_scale=s)
    torch.testing.assert_close(out, F.conv2d(x * s, w, None, 1, (1, 0), 1, 2), rtol=1e-12, atol=1e-12)
    unbatched = ct.conv2d(x[0], w, None, 1, (1, 0), 1, 2, input_scale=s[0])
    torch.testing.assert_close(unbatched, out[0], rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match=r"input_scale must have shape \(2, 6, 1, 1\).*got \(1, 6, 1, 1\)"):
        ct.conv2d(x, w, None, 1, (1, 0), 1, 2, input_scale=s[:1])
    with pytest.raises(TypeError, match="input_scale has dtype torch.float32"):
        ct.conv2d(x, w, None, 1, (1, 0), 1, 2, input_scale=s.float())


def test_torch_input_scale_gradients_match_the_multiply():
    torch.manual_seed(1)
    x = torch.randn(2, 4, 7, 7, dtype=torch.float64, requires_grad=True)
    s = (torch.rand(2, 4, 1, 1, dtype=torch.float64) + 0.5).requires_grad_()
    w = torch.randn(5, 4, 3, 3, dtype=torch.float64, requires_grad=True)
    ct.conv2d(x, w, padding=1, activation="relu", input_scale=s).square().sum().backward()
    grads = [t.grad.clone() for t in (x, s, w)]
    for t in (x, s, w):
        t.grad = None
    F.relu(F.conv2d(x * s, w, padding=1)).square().sum().backward()
    for ours, theirs in zip(grads, (x.grad, s.grad, w.grad)):
        torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-10)
