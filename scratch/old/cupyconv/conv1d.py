"""1-D convolution, as ``torch.nn.functional.conv1d``: a conv2d of height 1 on views of the arrays.

A length-L signal is a 1 x L image and a k-tap kernel a 1 x k one, so the planner sees one row of
output pixels: the GEMMs tile N x Lo pixels as they tile N x Ho x Wo (no padded 2-D tile), and
plans, caches and kernels are conv2d's. The views cost nothing: (N, C, L) is (N, C, 1, L) in the
same memory, (N, L, C) is (N, 1, L, C).
"""
from __future__ import annotations

import numbers

import numpy as np

from .conv import conv2d

#: 1-D memory orders and the 2-D ones they are: x and the output, and the weight.
LAYOUTS_1D = {"NCL": "NCHW", "NLC": "NHWC"}
WEIGHT_LAYOUTS_1D = {"KCL": "KCHW", "KLC": "KHWC"}


def _single(value, name: str, strings: tuple[str, ...] = ()):
    """An int, a 1-tuple of one, or one of ``strings``, as conv2d's (1, value) pair (or the string)."""
    if isinstance(value, str) and value in strings:
        return value
    if isinstance(value, (tuple, list)) and len(value) == 1:
        value = value[0]
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        choices = f", {' or '.join(repr(s) for s in strings)}" if strings else ""
        raise TypeError(f"{name} must be an int or a 1-tuple of one{choices}, got {value!r}")
    return (1 if name != "padding" else 0, int(value))


def _row(a, layout: str):
    """The 2-D view of a 1-D array in ``layout`` ('NCL'-like: a row axis before the last; 'NLC'-like:
    before the length)."""
    if a is None:
        return None
    axis = a.ndim - 1 if layout in ("NCL", "KCL") else a.ndim - 2
    return a.reshape(*a.shape[:axis], 1, *a.shape[axis:])


def conv1d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *, out=None, allow_tf32=False,
           layout="NCL", weight_layout="KCL", activation=None, residual=None):
    """1-D convolution (cross-correlation) over NCL or NLC arrays, as ``torch.nn.functional.conv1d``.

    Args:
        x: (N, C, L), or (C, L) unbatched; with ``layout="NLC"``, (N, L, C) or (L, C). float16,
            bfloat16, float32 or float64, NumPy (CPU) or CuPy (GPU).
        weight: (K, C // groups, k), or (K, k, C // groups) with ``weight_layout="KLC"``.
        bias: optional (K,).
        stride, dilation: int (or a 1-tuple), >= 1. Default 1.
        padding: int (or a 1-tuple) zeros on both ends, 'valid' or 'same' (stride 1). Default 0.
        groups, out, allow_tf32, activation, residual: as :func:`cupyconv.conv2d` (out and residual
            of the output's shape, in ``layout``).

    Returns:
        (N, K, Lo) (or (K, Lo); in NLC (N, Lo, K)), Lo = (L + 2 p - d (k - 1) - 1) // s + 1; x's
        dtype and device.

    Raises:
        TypeError, ValueError: as conv2d, naming the argument; errors about shapes name the 2-D
            view they were read in (height 1).
    """
    if layout not in LAYOUTS_1D:
        raise ValueError(f"layout must be one of {tuple(LAYOUTS_1D)}, got {layout!r}")
    if weight_layout not in WEIGHT_LAYOUTS_1D:
        raise ValueError(f"weight_layout must be one of {tuple(WEIGHT_LAYOUTS_1D)}, got {weight_layout!r}")
    for name, a, dims in (("x", x, (2, 3)), ("weight", weight, (3,)), ("out", out, (2, 3)),
                          ("residual", residual, (2, 3))):
        if a is not None and getattr(a, "ndim", None) not in dims:
            raise ValueError(f"{name} must be {' or '.join(f'{d}-D' for d in dims)} for conv1d "
                             f"(layout {layout!r}, weight_layout {weight_layout!r}), got shape "
                             f"{tuple(getattr(a, 'shape', ()))}")
    y = conv2d(_row(x, layout), _row(weight, weight_layout), bias, _single(stride, "stride"),
               _single(padding, "padding", ("same", "valid")), _single(dilation, "dilation"), groups,
               out=_row(out, layout), allow_tf32=allow_tf32, layout=LAYOUTS_1D[layout],
               weight_layout=WEIGHT_LAYOUTS_1D[weight_layout], activation=activation, residual=_row(residual, layout))
    return y.reshape(*y.shape[:-3], *y.shape[-2:]) if layout == "NLC" else y.reshape(*y.shape[:-2], y.shape[-1])
