"""Running a planned convolution on the GPU: operand preparation and the kernel launch."""
from __future__ import annotations

import math

import numpy as np

from .arguments import ConvProblem
from .compiler import compute_capability, get_kernel
from .planner import (DEPTHWISE_KERNEL, DIRECT_KERNEL, NHWC_KERNEL, SIMT_KERNEL, WINOGRAD_BLOCK, WINOGRAD_KERNEL,
                      LaunchPlan, channels_last_copy, make_plan, winograd_blocks, winograd_channels,
                      winograd_gemm_problem, winograd_name_expression)


def conv2d_cupy(x, weight, bias, problem: ConvProblem, out, plan: LaunchPlan | None = None,
                allow_tf32: bool = False):
    """Launch ``plan`` (by default make_plan(problem, allow_tf32=allow_tf32) for the current device)
    on CuPy's current stream and device, writing ``out``.

    ``problem.dtype`` names the element type, so 16-bit arrays may come as any 2-byte dtype view
    (bfloat16 tensors cross from torch as int16). ``out`` must be C-contiguous. Inputs that are not
    C-contiguous are copied first; the inputs themselves are never written.
    """
    import cupy

    if problem.n == 0:
        return out
    plan = plan or make_plan(problem, allow_tf32=allow_tf32, compute_capability=compute_capability())
    x = cupy.ascontiguousarray(x)
    weight = cupy.ascontiguousarray(weight)
    bias = weight if bias is None else cupy.ascontiguousarray(bias)
    if plan.kernel == WINOGRAD_KERNEL:
        _winograd(x, weight, bias, problem, out, plan)
        return out
    p = problem
    channels = p.c
    if plan.kernel == NHWC_KERNEL and not plan.a_from_nchw:
        channels = plan.channels_padded
        x = _channels_last(x, p.dtype, p.n, p.c, p.h * p.w, channels, round_tf32=True)
        weight = _channels_last(weight, p.dtype, p.k, p.c // p.groups, p.kh * p.kw, channels // p.groups,
                                round_tf32=True)
    elif plan.kernel == SIMT_KERNEL:  # B as [groups][Cg kh kw][K / groups, padded]: the weight transposed
        weight = _channels_last(weight, p.dtype, p.groups, p.k // p.groups, p.c // p.groups * p.kh * p.kw,
                                plan.weight_columns, round_tf32=False)
    _launch(plan, p, x, weight, bias, out, channels)
    return out


def _launch(plan: LaunchPlan, p: ConvProblem, x, weight, bias, out, channels: int):
    """The kernel of ``plan`` on prepared operands; ``channels`` is x's (p.c, or the padded count of a
    channels-last copy)."""
    problem_ints = (int(p.has_bias), p.n, channels, p.h, p.w, p.k, p.ho, p.wo, p.kh, p.kw, p.stride[0], p.stride[1],
                    p.pad_top, p.pad_left, p.dilation[0], p.dilation[1], p.groups)
    # direct_conv2d also takes its stage and tiling, depthwise_conv2d its tiles per output row,
    # channels per block and patch layout, simt_gemm_conv2d the columns of its weight copy; the
    # tensor-core GEMMs and depthwise_column_conv2d derive their tiling from the problem and the grid.
    plan_ints = {DIRECT_KERNEL: (plan.stage_channels, plan.stage_rows, plan.stage_cols, plan.pitch, plan.tiles_w,
                                 plan.tiles, plan.ktiles),
                 DEPTHWISE_KERNEL: (plan.tiles_w, plan.channels_per_block, plan.vec, plan.pitch, plan.patch_buffers),
                 SIMT_KERNEL: (plan.weight_columns,)}.get(plan.kernel, ())
    kernel = get_kernel(plan.kernel, plan.name_expression, plan.arch)
    kernel(plan.grid, plan.block, (x, weight, bias, out, *(np.int32(v) for v in problem_ints + plan_ints)),
           shared_mem=plan.shared_bytes)


def _winograd(x, weight, bias, p: ConvProblem, out, plan: LaunchPlan):
    """Winograd F(m x m, 3x3) (kernels/winograd_conv2d.cu): the weight transform (of the C' phase
    channels) into a new array U, then per pass of plan.winograd_images images the input transform
    into V, the GEMMs into M (plan.gemm, or plan.gemm_last for a shorter last pass), the output
    transform into that pass's images of ``out``."""
    import cupy

    m, positions, images = plan.winograd_tile, (plan.winograd_tile + 2) ** 2, plan.winograd_images
    tiles_h, tiles_w = plan.tiles // plan.tiles_w, plan.tiles_w
    channels, (bh, bw), (sh, sw) = winograd_channels(p), winograd_blocks(p), p.stride
    u = cupy.empty(positions * channels * plan.weight_columns, dtype=cupy.float32)
    v = cupy.empty(positions * channels * images * plan.tiles, dtype=cupy.float32)
    y = cupy.empty(positions * p.k * images * plan.tiles, dtype=cupy.float32)

    def transform(kernel: str, blocks: int, *args):
        get_kernel(kernel, winograd_name_expression(kernel, m, plan.index_type))(
            (blocks,), (WINOGRAD_BLOCK,), tuple(np.int32(a) if isinstance(a, int) else a for a in args))

    def blocks(threads: int) -> int:
        return math.ceil(threads / WINOGRAD_BLOCK)

    transform("winograd_weight_transform", blocks(channels * plan.weight_columns), weight, u, p.c, p.k,
              plan.weight_columns, p.kh, p.kw, sh, sw, bh, bw)
    x, out = x.reshape(p.n, -1), out.reshape(p.n, -1)  # a pass's images are rows
    for first in range(0, p.n, images):
        count = min(images, p.n - first)
        tiles = count * plan.tiles
        # Each block takes WINOGRAD_BLOCK tiles of one phase channel.
        transform("winograd_input_transform", channels * blocks(tiles), x[first:first + count], v, count, p.c, p.h,
                  p.w, p.pad_top, p.pad_left, sh, sw, bh, bw, tiles_h, tiles_w)
        gemm = winograd_gemm_problem(p, m, count)
        # No bias: any array stands in for it.
        _launch(plan.gemm if count == images else plan.gemm_last, gemm, v, u, u, y, gemm.c)
        transform("winograd_output_transform", blocks(p.k * tiles), y, bias, out[first:first + count],
                  int(p.has_bias), count, p.k, p.ho, p.wo, tiles_h, tiles_w)


def _channels_last(a, dtype: str, n: int, c: int, positions: int, channels_padded: int, round_tf32: bool):
    """A new [n][positions][channels_padded] copy of the C-contiguous [n][c][positions] array ``a``
    (zero channels past c; float32 rounded to TF32 where ``round_tf32``), made on the current stream."""
    import cupy

    copy = channels_last_copy(dtype, n, c, positions, channels_padded, round_tf32)
    out = cupy.empty(n * positions * channels_padded, dtype=a.dtype)
    get_kernel(copy.kernel, copy.name_expression)(
        copy.grid, copy.block, (a, out, np.int32(c), np.int32(positions), np.int32(channels_padded)))
    return out
