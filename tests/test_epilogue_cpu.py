"""The epilogue on the NumPy path (activation(conv + bias + residual), every activation, both layouts)
against torch in float64; the residual as the output itself; the errors that name the activation or
the residual; the printed plan."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import cupyconv
from cupyconv.arguments import ACTIVATIONS
from checks import relative_error

TORCH_ACTIVATIONS = {"none": lambda y: y, "relu": F.relu, "relu6": F.relu6, "silu": F.silu, "gelu": F.gelu,
                     "sigmoid": torch.sigmoid, "tanh": torch.tanh}
TOLERANCE = {np.float64: 1e-12, np.float32: 1e-5}


def arrays(seed: int, dtype, n: int = 2):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 6, 9, 8)).astype(dtype)
    weight = rng.standard_normal((10, 3, 3, 2)).astype(dtype)
    bias = rng.standard_normal(10).astype(dtype)
    residual = (3 * rng.standard_normal((n, 10, 9, 7))).astype(dtype)  # wide enough to reach relu6's 6
    return x, weight, bias, residual


def reference(x, weight, bias, residual, activation):
    t = lambda a: None if a is None else torch.from_numpy(np.asarray(a, dtype=np.float64))
    y = F.conv2d(t(x), t(weight), t(bias), padding=(1, 0), groups=2)
    return TORCH_ACTIVATIONS[activation](y if residual is None else y + t(residual))


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("residual", [False, True], ids=["no_residual", "residual"])
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=lambda d: np.dtype(d).name)
def test_numpy_epilogue_matches_torch(dtype, activation, residual, layout):
    x, weight, bias, r = arrays(ACTIVATIONS.index(activation), dtype)
    r = r if residual else None
    ref = reference(x, weight, bias, r, activation)
    last = (lambda a: np.ascontiguousarray(a.transpose(0, 2, 3, 1))) if layout == "NHWC" else (lambda a: a)
    out = cupyconv.conv2d(last(x), weight, bias, padding=(1, 0), groups=2, layout=layout,
                          activation=None if activation == "none" else activation,
                          residual=None if r is None else last(r))
    out = torch.from_numpy(out.transpose(0, 3, 1, 2).astype(np.float64) if layout == "NHWC" else out.astype(np.float64))
    assert relative_error(out, ref) < TOLERANCE[dtype]


def test_relu_keeps_nan_as_torch():
    x, weight, bias, r = arrays(1, np.float64)
    r[0, 0, 0, 0] = np.nan
    out = cupyconv.conv2d(x, weight, bias, padding=(1, 0), groups=2, activation="relu", residual=r)
    assert np.isnan(out[0, 0, 0, 0]) and not np.isnan(np.delete(out.ravel(), 0)).any()


def test_residual_may_be_out_and_unbatched():
    x, weight, bias, r = arrays(2, np.float64)
    ref = reference(x, weight, bias, r, "relu6").numpy()
    out = r.copy()
    cupyconv.conv2d(x, weight, bias, padding=(1, 0), groups=2, activation="relu6", residual=out, out=out)
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)
    one = cupyconv.conv2d(x[1], weight, bias, padding=(1, 0), groups=2, activation="relu6", residual=r[1])
    np.testing.assert_allclose(one, ref[1], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kwargs,error,message", [
    (dict(activation="leaky_relu"), ValueError, r"activation must be None or one of \('none', 'relu'"),
    (dict(activation=1), TypeError, "activation must be None or one of"),
    (dict(residual=np.zeros((2, 10, 9, 8))), ValueError, r"residual must have the output's shape \(2, 10, 9, 7\)"),
    (dict(residual=np.zeros((2, 10, 9, 7), np.float32)), TypeError, "residual has dtype float32 but x has dtype float64"),
    (dict(residual=[[0.0]]), TypeError, "residual must be a NumPy or CuPy array"),
])
def test_bad_epilogue_arguments(kwargs, error, message):
    x, weight, bias, _ = arrays(3, np.float64)
    with pytest.raises(error, match=message):
        cupyconv.conv2d(x, weight, bias, padding=(1, 0), groups=2, **kwargs)
    with pytest.raises(error, match=message):
        cupyconv.plan(x, weight, bias, padding=(1, 0), groups=2, **kwargs)


def test_residual_overlapping_out_is_refused():
    x, weight, bias, r = arrays(4, np.float64)
    out = np.empty_like(r)
    with pytest.raises(ValueError, match="residual shares memory with out"):
        cupyconv.conv2d(x, weight, bias, padding=(1, 0), groups=2, residual=out[::-1], out=out)


def test_plan_prints_the_epilogue():
    x, weight, bias, r = arrays(5, np.float32)
    text = str(cupyconv.plan(x, weight, bias, padding=(1, 0), groups=2, activation="gelu", residual=r))
    assert "epilogue: gelu(conv + bias + residual)" in text
    assert "epilogue" not in str(cupyconv.plan(x, weight, bias, padding=(1, 0), groups=2))
