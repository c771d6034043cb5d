"""The NumPy implementation of conv2d: the CPU path and the readable reference for the kernels.

The convolution is a sum over kernel taps: for each tap (r, s) the strided, dilated view of the
padded input that the tap reads is multiplied by that tap's (K, C/groups) weight matrix, group by
group. Memory stays at one input-sized buffer (no im2col), and each product is a BLAS matmul.
float16 and bfloat16 accumulate in float32, float32 in float32, float64 in float64.
"""
from __future__ import annotations

import numpy as np

from .arguments import ConvProblem


def conv2d_numpy(x: np.ndarray, weight: np.ndarray, bias, problem: ConvProblem, out: np.ndarray) -> np.ndarray:
    """Write conv2d(x, weight, bias) described by ``problem`` into ``out`` and return it."""
    acc = np.float64 if problem.dtype == "float64" else np.float32
    n, g = problem.n, problem.groups
    cg, kg = problem.c // g, problem.k // g
    ho, wo = problem.ho, problem.wo
    (sh, sw), (dh, dw) = problem.stride, problem.dilation
    padded = np.pad(x.astype(acc, copy=False),
                    ((0, 0), (0, 0), (problem.pad_top, problem.pad_bottom), (problem.pad_left, problem.pad_right)))
    taps = weight.astype(acc, copy=False).reshape(g, kg, cg, problem.kh, problem.kw)
    y = np.zeros((n, g, kg, ho * wo), dtype=acc)
    for r in range(problem.kh):
        rows = slice(r * dh, r * dh + sh * (ho - 1) + 1, sh)
        for s in range(problem.kw):
            cols = slice(s * dw, s * dw + sw * (wo - 1) + 1, sw)
            window = padded[:, :, rows, cols].reshape(n, g, cg, ho * wo)
            y += np.matmul(taps[None, :, :, :, r, s], window)
    y = y.reshape(n, problem.k, ho, wo)
    if bias is not None:
        y += bias.astype(acc).reshape(1, -1, 1, 1)
    out[...] = y.astype(out.dtype)
    return out
