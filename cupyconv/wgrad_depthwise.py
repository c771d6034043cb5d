"""The weight gradient of depthwise convolutions (kernels/wgrad_depthwise.cu): refusal, runs of the
reduction, specialisations and launch. Each block sums a run of one channel's (NCHW) or 32
channels' (NHWC) output pixels for every tap in registers; wgrad.py's ordered reduction adds the
runs (a weight of one input channel per group has the same memory in KCHW and KHWC)."""
from __future__ import annotations

import functools
import math

import numpy as np

from .arguments import ConvProblem
from .families.common import CTYPES, MAX_GRID_Y
from .wgrad import ACC_BYTES, REDUCE_BLOCK, REDUCE_KERNEL, reduce_specialisation

KERNEL = "wgrad_depthwise"
#: The kernel sizes it is compiled for (its sums live in registers, one per tap).
KERNEL_SIZES = ((3, 3), (5, 5), (7, 7))
#: Blocks wanted (four per SM of the H100's 132) and the fewest output pixels a run keeps: 16 per
#: thread for one channel per block (NCHW), 64 per lane of 32 channels (NHWC).
TARGET_BLOCKS = 528
MIN_RUN_PIXELS = {"NCHW": 4096, "NHWC": 512}


@functools.lru_cache(maxsize=1024)
def refusal(problem: ConvProblem) -> str:
    """Why this kernel cannot compute ``problem``'s weight gradient ("" when it can). Kept per problem:
    every backward of a layer asks it again."""
    if problem.c // problem.groups != 1:
        return f"{problem.c // problem.groups} input channels per group (not depthwise)"
    if (problem.kh, problem.kw) not in KERNEL_SIZES:
        return f"a {problem.kh}x{problem.kw} kernel (compiled for {', '.join(f'{h}x{w}' for h, w in KERNEL_SIZES)})"
    if max(problem.h * problem.w, problem.ho * problem.wo) >= 2**31 or problem.k > MAX_GRID_Y * 32:
        return "a plane past 2^31 elements or too many channels for the grid"
    return ""


def specialisation(dtype: str, channels_last: bool, kh: int, kw: int) -> str:
    return f"cupyconv::{KERNEL}<{CTYPES[dtype]},{str(channels_last).lower()},{kh},{kw}>"


def specialisations() -> list[str]:
    return [specialisation(dtype, channels_last, kh, kw) for dtype in CTYPES for channels_last in (False, True)
            for kh, kw in KERNEL_SIZES]


@functools.lru_cache(maxsize=1024)
def make_plan(problem: ConvProblem) -> tuple[tuple[int, int, int], int]:
    """(grid, runs): blocks of one channel (NCHW) or 32 (NHWC), the pixels cut into as many runs as
    give about TARGET_BLOCKS blocks, each of at least MIN_RUN_PIXELS pixels (by layout)."""
    channels_last = problem.layout == "NHWC"
    blocks = math.ceil(problem.k / 32) if channels_last else problem.k
    pixels = problem.n * problem.ho * problem.wo
    splits = max(1, min(math.ceil(TARGET_BLOCKS / blocks), pixels // MIN_RUN_PIXELS[problem.layout], MAX_GRID_Y))
    return (blocks, splits, 1), splits


def conv2d_weight_cupy(x, grad_output, problem: ConvProblem, out):
    """Write ``problem``'s weight gradient into ``out`` (C-contiguous, ``problem.weight_array_shape``)
    from C-contiguous CuPy ``x`` and ``grad_output`` in ``problem.layout``, on CuPy's current stream
    (refusal(problem) must be "")."""
    import cupy

    from .compiler import get_kernel

    p = problem
    grid, splits = make_plan(p)
    taps = p.kh * p.kw
    workspace = cupy.empty(splits * p.k * taps, dtype=np.float64 if ACC_BYTES[p.dtype] == 8 else np.float32)
    i32 = np.int32
    kernel = get_kernel(KERNEL, specialisation(p.dtype, p.layout == "NHWC", p.kh, p.kw))
    kernel(grid, (256, 1, 1), (x, grad_output, workspace, *(i32(v) for v in (
        p.n, p.c, p.h, p.w, p.k, p.ho, p.wo, p.stride[0], p.stride[1], p.pad_top, p.pad_left, p.dilation[0],
        p.dilation[1]))))
    reduce = get_kernel(REDUCE_KERNEL, reduce_specialisation(p.dtype))
    reduce((math.ceil(p.k * taps / REDUCE_BLOCK), 1, 1), (REDUCE_BLOCK, 1, 1),
           (workspace, out, i32(splits), i32(p.k * taps), i32(1), i32(taps), i32(0), i32(0)))
    return out

