"""The weight gradient on the tensor cores (float16, bfloat16, and float32 as TF32): the forward
channels-last implicit GEMM (families/implicit_gemm_nhwc.py) computing it as a convolution.

    dW[k, c, r, s] = sum over n, p, q of dy[n, k, p, q] x[n, c, p sh + r dh - pt, q sw + s dw - pl]

is a forward convolution with the roles moved: its batch is the C input channels, its channels the
N images, its kernel taps the Ho x Wo output pixels (dy as a weight [K][Ho][Wo][N]), its output
pixels the kh x kw taps of the weight, its stride the dilation and its dilation the stride, with
the same padding. Its input x' = x as [C][H][W][N] and its weight dy' = dy as [K][Ho][Wo][N] are
made by the tiled transpose of kernels/nchw_to_nhwc.cu (N padded with zeros to whole 16-byte
pieces); it writes [C][kh'][kw'][K] (kh' > kh only where the input has rows that no tap reads: those are cut)
and that is transposed into the weight's layout. The N Ho Wo reduction runs in split-K runs (float32
partial sums added in a fixed order by split_k_reduce), enough to fill the GPU with blocks: the
result is bitwise the same on every run. Ungrouped convolutions only; the rest take wgrad.py's FMA
kernel.
"""
from __future__ import annotations

import dataclasses
import functools
import math

from .arguments import ConvProblem
from .families import implicit_gemm_nhwc
from .families.common import MAX_GRID_Y, SPLIT_K_MAX_WORKSPACE_BYTES

#: Blocks wanted (two waves of the H100's 132 SMs) and k tiles each run of the reduction keeps at
#: least (a shorter run spends its time filling the pipeline).
TARGET_BLOCKS = 264
MIN_RUN_K_TILES = 16


def _padded_images(problem: ConvProblem) -> int:
    """The images N rounded up to whole 16-byte pieces (the copies' zero channels)."""
    per_piece = 16 // (4 if problem.dtype == "float32" else 2)
    return math.ceil(problem.n / per_piece) * per_piece


def dual_problem(problem: ConvProblem) -> ConvProblem:
    """The forward convolution whose output is ``problem``'s weight gradient (as [C][kh'][kw'][K])."""
    p = problem
    # Trailing padding that makes the output exactly kh x kw where no input row must be cut for it.
    bottom = max(0, p.dilation[0] * (p.kh - 1) + p.stride[0] * (p.ho - 1) + 1 - p.h - p.pad_top)
    right = max(0, p.dilation[1] * (p.kw - 1) + p.stride[1] * (p.wo - 1) + 1 - p.w - p.pad_left)
    return ConvProblem(n=p.c, c=_padded_images(p), h=p.h, w=p.w, k=p.k, kh=p.ho, kw=p.wo,
                       stride=p.dilation, dilation=p.stride, pad_top=p.pad_top, pad_left=p.pad_left,
                       pad_bottom=bottom, pad_right=right, groups=1, dtype=p.dtype, has_bias=False,
                       layout="NHWC", weight_layout="KHWC")


@functools.lru_cache(maxsize=1024)
def refusal(problem: ConvProblem, allow_tf32: bool) -> str:
    """Why the tensor cores cannot compute ``problem``'s weight gradient ("" when they can). Kept per
    problem: every backward of a layer asks it again."""
    if problem.dtype == "float64" or (problem.dtype == "float32" and not allow_tf32):
        return f"{problem.dtype}{'' if problem.dtype == 'float64' else ' (strict, allow_tf32=False)'} has no tensor-core path"
    if problem.groups != 1:
        return f"{problem.groups} groups"
    if problem.n == 0:
        return "an empty batch"
    dual = dual_problem(problem)
    if max(dual.n * dual.h * dual.w * dual.c, dual.k * dual.kh * dual.kw * dual.c) >= 2**31 or dual.n > MAX_GRID_Y or \
            (problem.layout == "NHWC" and math.ceil(problem.n * problem.h * problem.w / 32) > MAX_GRID_Y):
        return "the transposed copies pass 2^31 elements or the grid's limits"
    return implicit_gemm_nhwc.refusal(dual)


@functools.lru_cache(maxsize=1024)
def make_plan(problem: ConvProblem, compute_capability: int = 0):
    """The dual problem and the channels-last GEMM's plan for it, split into runs of the reduction:
    as many as give about TARGET_BLOCKS blocks, each of at least MIN_RUN_K_TILES k tiles, within the
    partial sums' workspace cap and 32-bit indices."""
    dual = dual_problem(problem)
    whole = implicit_gemm_nhwc.make_plan(dual, None, "weight gradient as a forward convolution", compute_capability,
                                         splits=1)
    tiles = math.prod(whole.grid)
    k_tiles = math.ceil(dual.kh * dual.kw * dual.c / whole.config.bk)
    elements = math.prod(dual.out_shape)
    splits = min(math.ceil(TARGET_BLOCKS / tiles), max(1, k_tiles // MIN_RUN_K_TILES), MAX_GRID_Y,
                 max(1, SPLIT_K_MAX_WORKSPACE_BYTES // (4 * elements)), max(1, (2**31 - 1) // elements))
    if whole.index_type != "int" or splits <= 1:
        splits = 1
    plan = implicit_gemm_nhwc.make_plan(dual, None, "weight gradient as a forward convolution", compute_capability,
                                        splits=splits)
    return dual, dataclasses.replace(plan, layout="NHWC", weight_layout="KHWC")


def _transposed_copy(source, rows: int, columns: int, columns_padded: int, out, batches: int = 1):
    """out[b][j][i] = source[b][i][j] for each of ``batches`` matrices of ``columns`` x ``rows``
    (i < columns; zeros for columns <= i < columns_padded): the tiled transpose of
    kernels/nchw_to_nhwc.cu, which copies bits (16-bit types as float16)."""
    import numpy as np

    from .compiler import get_kernel
    from .families.common import CTYPES

    kernel = implicit_gemm_nhwc.CHANNELS_LAST_TILED
    dtype = {2: "float16", 4: "float32", 8: "float64"}[source.dtype.itemsize]
    function = get_kernel(kernel, f"cupyconv::{kernel}<{CTYPES[dtype]},false>")
    function((math.ceil(rows / 32), math.ceil(columns_padded / 32), batches), (32, 8, 1),
             (source, out, np.int32(columns), np.int32(rows), np.int32(columns_padded)))


def _images_last(a, problem: ConvProblem, images_padded: int):
    """x (N, C, H, W) or dy (N, K, Ho, Wo), in ``problem.layout``, as [channels][plane][images_padded]."""
    import cupy

    n = a.shape[0]
    plane_channels = a.size // max(n, 1)
    channels = a.shape[3] if problem.layout == "NHWC" else a.shape[1]
    plane = plane_channels // channels
    out = cupy.empty((channels, plane, images_padded), dtype=a.dtype)
    if problem.layout == "NCHW":  # [N][C plane] -> [C plane][Np]: one transpose
        _transposed_copy(a, plane_channels, n, images_padded, out)
    else:  # [N plane][C] -> [C][N plane] -> [C][plane][Np]: two
        middle = cupy.empty((channels, n * plane), dtype=a.dtype)
        _transposed_copy(a, channels, n * plane, n * plane, middle)
        _transposed_copy(middle, plane, n, images_padded, out, batches=channels)
    return out


def conv2d_weight_cupy(x, grad_output, problem: ConvProblem, out):
    """Write ``problem``'s weight gradient into ``out`` (C-contiguous, ``problem.weight_array_shape``)
    from C-contiguous CuPy ``x`` and ``grad_output`` in ``problem.layout``, on CuPy's current stream
    (refusal(problem, ...) must be ""; float32 runs as TF32)."""
    import cupy

    from .compiler import compute_capability
    from .executor import executable_for_plan
    from .launch import run

    dual, plan = make_plan(problem, compute_capability())
    images = dual.c
    x_t = _images_last(x, problem, images)
    dy_t = _images_last(grad_output, problem, images)
    dual_out = cupy.empty(dual.out_array_shape, dtype=x.dtype)
    run(executable_for_plan(plan, dual, cupy.cuda.Device().id), x_t, dy_t, None, dual_out)
    taps = dual_out[:, :problem.kh, :problem.kw, :]  # [C][kh][kw][K]
    out[...] = taps.transpose(3, 1, 2, 0) if problem.weight_layout == "KHWC" else taps.transpose(3, 0, 1, 2)
    return out

