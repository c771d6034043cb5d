"""Folding an inference-mode BatchNorm into the convolution before it.

For a convolution y = conv(x, w) + b followed by BatchNorm with running statistics (mean, var), scale
gamma, shift beta and eps, the composition is one convolution with

    w' = w * s,   b' = (b - mean) * s + beta,   s = gamma / sqrt(var + eps)   (per output channel)

computed here in float64 and rounded once to the weight's dtype. It freezes the statistics: it is
for evaluation, not for training.
"""
from __future__ import annotations

import math
import numbers

from .arguments import array_backend, dtype_name

_PER_CHANNEL = ("bias", "running_mean", "running_var", "gamma", "beta")


def fold_batchnorm(weight, bias, running_mean, running_var, gamma=None, beta=None, eps: float = 1e-5):
    """The weight and bias of the convolution ``weight``, ``bias`` followed by BatchNorm in eval mode.

    Args:
        weight: the convolution's weight, NumPy or CuPy, K output channels on axis 0 (KCHW or KHWC:
            the fold scales each output channel, whatever the order of the other axes).
        bias: its bias (K,), or None (zeros).
        running_mean, running_var: the BatchNorm's running statistics (K,).
        gamma, beta: its affine scale and shift (K,), or None (BatchNorm2d(affine=False): 1 and 0).
        eps: its eps, a finite number >= 0.

    Returns:
        (folded weight, folded bias): new arrays of ``weight``'s kind, device and dtype (the bias
        too), computed in float64 and rounded once.

    Raises:
        TypeError: an argument is not a NumPy or CuPy array of the weight's kind, or eps not a number.
        ValueError: a per-channel argument is not (K,), its device differs, eps is negative or not
            finite, or running_var + eps has an entry <= 0 (the fold would divide by zero or NaN).
    """
    backend = array_backend(weight, "weight")
    dtype_name(weight.dtype)  # TypeError for dtypes conv2d does not compute in
    if weight.ndim < 1 or weight.shape[0] == 0:
        raise ValueError(f"weight must have K >= 1 output channels on axis 0, got shape {tuple(weight.shape)}")
    k = weight.shape[0]
    given = {"bias": bias, "running_mean": running_mean, "running_var": running_var, "gamma": gamma, "beta": beta}
    for name in _PER_CHANNEL:
        array = given[name]
        if array is None:
            if name in ("running_mean", "running_var"):
                raise TypeError(f"{name} must be an array of shape ({k},), got None")
            continue
        if array_backend(array, name) != backend:
            raise TypeError(f"{name} must be a {backend} array like weight, got {type(array).__name__}")
        if tuple(array.shape) != (k,):
            raise ValueError(f"{name} must have shape ({k},) for weight of shape {tuple(weight.shape)}, "
                             f"got {tuple(array.shape)}")
        if backend == "cupy" and array.device != weight.device:
            raise ValueError(f"{name} is on device {array.device.id}, weight on device {weight.device.id}")
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"eps must be a number, got {type(eps).__name__}")
    if not math.isfinite(eps) or eps < 0:
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
    if backend == "cupy":
        import cupy as xp

        device = xp.cuda.Device(weight.device.id)
    else:
        import contextlib

        import numpy as xp

        device = contextlib.nullcontext()
    with device:
        up = {name: None if array is None else array.astype(xp.float64) for name, array in given.items()}
        denominator = up["running_var"] + float(eps)
        if not bool((denominator > 0).all()):  # also False for NaN
            raise ValueError(f"running_var + eps must be > 0 in every channel (eps={eps!r}); the fold would divide "
                             "by zero or NaN")
        scale = xp.reciprocal(xp.sqrt(denominator))
        if up["gamma"] is not None:
            scale = scale * up["gamma"]
        shift = -up["running_mean"] if up["bias"] is None else up["bias"] - up["running_mean"]
        folded_bias = shift * scale + (0.0 if up["beta"] is None else up["beta"])
        folded_weight = weight.astype(xp.float64) * scale.reshape((k,) + (1,) * (weight.ndim - 1))
        return folded_weight.astype(weight.dtype), folded_bias.astype(weight.dtype)
