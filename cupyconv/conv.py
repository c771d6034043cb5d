"""The public conv2d: one call for NumPy (CPU) and CuPy (GPU) arrays, and the plan it would use."""
from __future__ import annotations

import numpy as np

from .arguments import check_arrays, check_out, make_problem
from .planner import LaunchPlan, make_plan
from .reference import conv2d_numpy


def _problem(x, weight, bias, stride, padding, dilation, groups, out):
    backend = check_arrays(x, weight, bias, out)
    if x.ndim not in (3, 4):
        raise ValueError(f"x must be 4-D (N, C, H, W) or 3-D (C, H, W), got shape {tuple(x.shape)}")
    unbatched = x.ndim == 3
    problem = make_problem((1, *x.shape) if unbatched else x.shape, weight.shape,
                           None if bias is None else bias.shape, x.dtype, stride, padding, dilation, groups)
    return backend, unbatched, problem


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *, out=None, allow_tf32=False):
    """2-D convolution (cross-correlation) over NCHW arrays, as ``torch.nn.functional.conv2d``.

    CuPy arrays run on their GPU, on CuPy's current stream; NumPy arrays run on the CPU.

    Args:
        x: input, (N, C, H, W), or (C, H, W) for one unbatched image. float16, bfloat16, float32 or
            float64; any strides (non-contiguous inputs are copied first).
        weight: (K, C // groups, kh, kw), same dtype and device as ``x``.
        bias: optional (K,), same dtype and device as ``x``.
        stride: int or (sh, sw), >= 1. Default 1.
        padding: int or (ph, pw) zero padding on both sides, or 'valid' (none) or 'same' (output as
            large as the input; stride 1 only; an odd total puts the extra row/column at the
            bottom/right, as torch). Default 0.
        dilation: int or (dh, dw), >= 1. Default 1.
        groups: >= 1, dividing C and K. groups == C is a depthwise convolution. Default 1.
        out: optional C-contiguous array of the output shape, dtype and device to write into.
        allow_tf32: let float32 CuPy inputs run on the tensor cores in TF32 (products of operands
            rounded to 10 mantissa bits, float32 accumulation; relative error about 1e-4 to 1e-3
            instead of about 1e-6), much faster for large channel counts. Like
            ``torch.backends.cudnn.allow_tf32``, but off by default. No effect on other dtypes or
            on NumPy inputs. Default False.

    Returns:
        (N, K, Ho, Wo) array (or (K, Ho, Wo) for unbatched input) of x's dtype on x's device, with
        Ho = (H + 2 ph - dh (kh - 1) - 1) // sh + 1 and likewise Wo. float32 is computed in IEEE
        float32 (no TF32 unless ``allow_tf32``); float16 and bfloat16 accumulate in float32.

    Raises:
        TypeError: arrays of another kind, mixed NumPy/CuPy, unsupported or differing dtypes.
        ValueError: inconsistent shapes, bad stride/padding/dilation/groups, a kernel larger than the
            padded input, arrays on different GPUs, or a bad ``out``. Raised before any launch.
    """
    backend, unbatched, problem = _problem(x, weight, bias, stride, padding, dilation, groups, out)
    shape = problem.out_shape[1:] if unbatched else problem.out_shape
    if out is not None:
        check_out(out, problem, shape, x, weight, bias)
    x4 = x[None] if unbatched else x
    if backend == "numpy":
        out = np.empty(shape, dtype=x.dtype) if out is None else out
        conv2d_numpy(x4, weight, bias, problem, out.reshape(problem.out_shape))
        return out
    import cupy

    from .launch import conv2d_cupy

    with cupy.cuda.Device(x.device.id):
        out = cupy.empty(shape, dtype=x.dtype) if out is None else out
        conv2d_cupy(x4, weight, bias, problem, out.reshape(problem.out_shape), allow_tf32=allow_tf32)
    return out


def plan(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *, allow_tf32=False) -> LaunchPlan:
    """The GPU launch plan conv2d would use for these arguments (printable: kernel, tiles, grid, why).

    Takes the same arguments as :func:`conv2d` (NumPy arrays too: only shapes and dtypes matter).
    """
    _, _, problem = _problem(x, weight, bias, stride, padding, dilation, groups, None)
    return make_plan(problem, allow_tf32=allow_tf32)
