"""The NumPy implementation of conv2d and of its weight gradient: the CPU path and the readable
reference for the kernels.

The convolution is a sum over kernel taps: for each tap (r, s) the strided, dilated view of the
padded input that the tap reads is multiplied by that tap's (K, C/groups) weight matrix, group by
group. Memory stays at one input-sized buffer (no im2col), and each product is a BLAS matmul.
float16 and bfloat16 accumulate in float32, float32 in float32, float64 in float64. The epilogue
(activation(conv + bias + residual)) is computed in that precision too and rounded once, as the
kernels do (kernels/epilogue.cuh).
"""
from __future__ import annotations

import math

import numpy as np

from .arguments import ConvProblem


_ERF = np.frompyfunc(math.erf, 1, 1)


def activate(y: np.ndarray, activation: str) -> np.ndarray:
    """torch's ``activation`` of the float array ``y`` (ACTIVATIONS; relu and relu6 keep NaN), in y's dtype."""
    with np.errstate(over="ignore"):  # exp(-y) of a large negative y is inf, and the result is right
        return _activate(y, activation)


def _activate(y: np.ndarray, activation: str) -> np.ndarray:
    if activation == "relu":
        return np.where(y < 0, 0, y).astype(y.dtype, copy=False)
    if activation == "relu6":
        return np.where(y < 0, 0, np.where(y > 6, 6, y)).astype(y.dtype, copy=False)
    if activation == "silu":
        return y / (1 + np.exp(-y))
    if activation == "gelu":  # the exact (erf) form, torch's default
        return (0.5 * y * (1 + _ERF(y * np.sqrt(0.5, dtype=y.dtype)).astype(y.dtype))).astype(y.dtype, copy=False)
    if activation == "sigmoid":
        return 1 / (1 + np.exp(-y))
    if activation == "tanh":
        return np.tanh(y)
    return y


def _tap_windows(x: np.ndarray, problem: ConvProblem):
    """For each kernel tap (r, s): (r, s, the strided view (N, C, Ho, Wo) of the zero-padded input
    that the tap reads), the input in the accumulator type (float32; float64 for float64)."""
    acc = np.float64 if problem.dtype == "float64" else np.float32
    ho, wo = problem.ho, problem.wo
    (sh, sw), (dh, dw) = problem.stride, problem.dilation
    padded = np.pad(x.astype(acc, copy=False),
                    ((0, 0), (0, 0), (problem.pad_top, problem.pad_bottom), (problem.pad_left, problem.pad_right)))
    for r in range(problem.kh):
        rows = slice(r * dh, r * dh + sh * (ho - 1) + 1, sh)
        for s in range(problem.kw):
            yield r, s, padded[:, :, rows, slice(s * dw, s * dw + sw * (wo - 1) + 1, sw)]


def conv2d_numpy(x: np.ndarray, weight: np.ndarray, bias, problem: ConvProblem, out: np.ndarray,
                 residual: np.ndarray | None = None) -> np.ndarray:
    """Write conv2d(x, weight, bias) described by ``problem``, through its epilogue (``residual``: an
    array of the output's logical shape, or None), into ``out`` and return it."""
    acc = np.float64 if problem.dtype == "float64" else np.float32
    n, g = problem.n, problem.groups
    cg, kg = problem.c // g, problem.k // g
    ho, wo = problem.ho, problem.wo
    taps = weight.astype(acc, copy=False).reshape(g, kg, cg, problem.kh, problem.kw)
    y = np.zeros((n, g, kg, ho * wo), dtype=acc)
    for r, s, window in _tap_windows(x, problem):
        y += np.matmul(taps[None, :, :, :, r, s], window.reshape(n, g, cg, ho * wo))
    y = y.reshape(n, problem.k, ho, wo)
    if bias is not None:
        y += bias.astype(acc).reshape(1, -1, 1, 1)
    if residual is not None:  # read before out is written: it may be out itself
        y += residual.astype(acc)
    out[...] = activate(y, problem.activation).astype(out.dtype)
    return out


def conv2d_weight_numpy(x: np.ndarray, grad_output: np.ndarray, problem: ConvProblem, out: np.ndarray) -> np.ndarray:
    """Write the gradient of conv2d (``problem``) with respect to its weight into ``out`` (K, C/groups,
    kh, kw) and return it: for each tap (r, s), grad_output (per group, Kg x N Ho Wo) times the
    strided view of the padded input that the tap reads (Cg x N Ho Wo) transposed. ``x`` is (N, C, H,
    W), ``grad_output`` (N, K, Ho, Wo). Accumulates in float32 (float64 for float64) by BLAS."""
    acc = np.float64 if problem.dtype == "float64" else np.float32
    n, g = problem.n, problem.groups
    cg, kg = problem.c // g, problem.k // g
    plane = problem.ho * problem.wo
    # (groups, Kg, N Ho Wo): the reduction runs over images and output pixels together.
    dy = grad_output.astype(acc, copy=False).reshape(n, g, kg, plane).transpose(1, 2, 0, 3).reshape(g, kg, -1)
    taps = np.empty((g, kg, cg, problem.kh, problem.kw), dtype=acc)
    for r, s, window in _tap_windows(x, problem):
        window = window.reshape(n, g, cg, plane).transpose(1, 2, 0, 3).reshape(g, cg, -1)
        taps[:, :, :, r, s] = np.matmul(dy, window.transpose(0, 2, 1))
    out[...] = taps.reshape(problem.weight_shape).astype(out.dtype)
    return out
