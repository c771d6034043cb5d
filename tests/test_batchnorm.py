"""cupyconv.fold_batchnorm: a convolution with the folded weight and bias equals the convolution
followed by torch's BatchNorm2d in eval mode (float64 reference), on NumPy arrays and (GPU marker)
CuPy arrays; its errors name the argument."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import cupyconv
from checks import relative_error
from devices import gpu_count

TOLERANCE = {np.float64: 1e-12, np.float32: 1e-5, np.float16: 2e-3}


def batchnorm_case(seed: int, k: int = 12, c: int = 5, bias: bool = True, affine: bool = True):
    """Random x, weight, bias and BatchNorm parameters (variances of 0.01 to 4: the scales vary)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, c, 9, 8))
    weight = rng.standard_normal((k, c, 3, 3))
    params = {"bias": rng.standard_normal(k) if bias else None,
              "running_mean": rng.standard_normal(k), "running_var": rng.uniform(0.01, 4.0, k),
              "gamma": rng.standard_normal(k) if affine else None, "beta": rng.standard_normal(k) if affine else None}
    return x, weight, params


def reference(x, weight, params, eps):
    """torch's conv2d then batch_norm (eval mode), in float64."""
    t = lambda a: None if a is None else torch.from_numpy(np.asarray(a, dtype=np.float64))
    y = F.conv2d(t(x), t(weight), t(params["bias"]), padding=1)
    return F.batch_norm(y, t(params["running_mean"]), t(params["running_var"]), t(params["gamma"]),
                        t(params["beta"]), training=False, eps=eps)


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16], ids=lambda d: np.dtype(d).name)
def test_fold_matches_conv_then_batchnorm(dtype, bias, affine):
    x, weight, params = batchnorm_case(seed=int(bias) + 2 * int(affine), bias=bias, affine=affine)
    eps = 1e-3
    cast = {name: None if a is None else a.astype(dtype) for name, a in params.items()}
    w_folded, b_folded = cupyconv.fold_batchnorm(weight.astype(dtype), eps=eps, **cast)
    assert w_folded.dtype == dtype and b_folded.dtype == dtype
    assert w_folded.shape == weight.shape and b_folded.shape == (weight.shape[0],)
    # The fold itself against float64 of the rounded inputs: one rounding of exact values.
    up = {name: None if a is None else a.astype(np.float64) for name, a in cast.items()}
    ref = reference(x, weight.astype(dtype).astype(np.float64), up, eps)
    folded = F.conv2d(torch.from_numpy(x), torch.from_numpy(w_folded.astype(np.float64)),
                      torch.from_numpy(b_folded.astype(np.float64)), padding=1)
    assert relative_error(folded, ref) < TOLERANCE[dtype]
    # Through cupyconv's own conv2d on the NumPy path.
    if dtype != np.float16:
        out = cupyconv.conv2d(x.astype(dtype), w_folded, b_folded, padding=1)
        assert relative_error(torch.from_numpy(out.astype(np.float64)), ref) < max(TOLERANCE[dtype], 1e-12) * 10


def test_fold_is_per_output_channel_in_any_weight_layout():
    """A KHWC weight folds to the KHWC form of the KCHW weight's fold."""
    _, weight, params = batchnorm_case(seed=7)
    kchw, bias = cupyconv.fold_batchnorm(weight, **params)
    khwc, bias_khwc = cupyconv.fold_batchnorm(np.ascontiguousarray(weight.transpose(0, 2, 3, 1)), **params)
    np.testing.assert_array_equal(khwc, kchw.transpose(0, 2, 3, 1))
    np.testing.assert_array_equal(bias, bias_khwc)


def test_inputs_are_not_modified():
    _, weight, params = batchnorm_case(seed=8)
    saved = weight.copy(), {name: a.copy() for name, a in params.items()}
    cupyconv.fold_batchnorm(weight, **params)
    np.testing.assert_array_equal(weight, saved[0])
    for name, a in params.items():
        np.testing.assert_array_equal(a, saved[1][name])


@pytest.mark.parametrize("change,message", [
    (dict(running_mean=np.zeros(11)), r"running_mean must have shape \(12,\)"),
    (dict(gamma=np.ones((12, 1))), r"gamma must have shape \(12,\)"),
    (dict(bias=np.zeros(13)), r"bias must have shape \(12,\)"),
    (dict(eps=-1e-5), "eps must be a finite number >= 0"),
    (dict(eps=float("nan")), "eps must be a finite number >= 0"),
    (dict(running_var=np.zeros(12), eps=0.0), "running_var \\+ eps must be > 0"),
    (dict(running_var=np.full(12, np.nan)), "running_var \\+ eps must be > 0"),
])
def test_bad_arguments_raise_value_error(change, message):
    _, weight, params = batchnorm_case(seed=9)
    with pytest.raises(ValueError, match=message):
        cupyconv.fold_batchnorm(weight, **{**params, **change})


@pytest.mark.parametrize("change,message", [
    (dict(running_mean=None), "running_mean must be an array"),
    (dict(beta=[0.0] * 12), "beta must be a NumPy or CuPy array"),
    (dict(eps="1e-5"), "eps must be a number"),
    (dict(eps=True), "eps must be a number"),
])
def test_bad_types_raise_type_error(change, message):
    _, weight, params = batchnorm_case(seed=10)
    with pytest.raises(TypeError, match=message):
        cupyconv.fold_batchnorm(weight, **{**params, **change})


def test_integer_weight_is_a_type_error():
    _, weight, params = batchnorm_case(seed=10)
    with pytest.raises(TypeError, match="computes in"):
        cupyconv.fold_batchnorm(weight.astype(np.int32), **params)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_count(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16], ids=lambda d: np.dtype(d).name)
def test_fold_on_cupy_arrays(dtype):
    """CuPy in, CuPy out (same device, dtype), bitwise the NumPy fold's result, and a mixed call refused."""
    import cupy

    _, weight, params = batchnorm_case(seed=11)
    cast = {name: a.astype(dtype) for name, a in params.items()}
    w_np, b_np = cupyconv.fold_batchnorm(weight.astype(dtype), **cast)
    w_cp, b_cp = cupyconv.fold_batchnorm(cupy.asarray(weight.astype(dtype)),
                                         **{name: cupy.asarray(a) for name, a in cast.items()})
    assert isinstance(w_cp, cupy.ndarray) and w_cp.dtype == dtype and b_cp.dtype == dtype
    np.testing.assert_allclose(cupy.asnumpy(w_cp).astype(np.float64), w_np.astype(np.float64), rtol=1e-15, atol=0)
    np.testing.assert_allclose(cupy.asnumpy(b_cp).astype(np.float64), b_np.astype(np.float64), rtol=1e-15, atol=0)
    with pytest.raises(TypeError, match="running_var must be a cupy array like weight"):
        cupyconv.fold_batchnorm(cupy.asarray(weight), **{**{n: cupy.asarray(a) for n, a in params.items()},
                                                        "running_var": params["running_var"]})
