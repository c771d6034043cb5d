"""Gradients of conv2d, named and shaped as ``torch.nn.grad``: with respect to the input
(:func:`conv2d_input`) and to the weight (:func:`conv2d_weight`), on CuPy arrays (GPU) and NumPy
arrays (CPU).

The gradient with respect to the bias is a sum, which needs no kernel of its own:
``grad_bias = grad_output.sum(axis=(0, 2, 3))`` (``axis=(0, 1, 2)`` for NHWC arrays), accumulated
in float32 for 16-bit arrays (``.sum(axis=..., dtype=float32)``, then cast).

Where the kernels are: the input gradient is a transposed convolution (conv_transpose.py: stride
phases on the forward kernels); the weight gradient is an implicit GEMM that reduces over
N x Ho x Wo (wgrad.py, kernels/wgrad_gemm.cu), split across blocks for large planes and summed in a
fixed order, so it is bitwise the same run after run.
"""
from __future__ import annotations

import functools
import numbers

import numpy as np

from .arguments import ConvProblem, check_arrays, check_layouts, check_x_dims, make_problem
from .conv_transpose import input_gradient_problem, transposed

__all__ = ["conv2d_input", "conv2d_weight"]


def _shape(value, name: str, dims: tuple[int, ...]) -> tuple[int, ...]:
    """A shape argument as a tuple of ints (TypeError/ValueError naming ``name``)."""
    if not isinstance(value, (tuple, list)) or not all(
            isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)) for v in value):
        raise TypeError(f"{name} must be a tuple of ints, got {value!r}")
    if len(value) not in dims:
        raise ValueError(f"{name} must have {' or '.join(map(str, dims))} entries, got {tuple(value)}")
    return tuple(int(v) for v in value)


def _check_grad_output(grad_output, problem: ConvProblem, unbatched: bool, what: str) -> None:
    expected = problem.out_array_shape[1:] if unbatched else problem.out_array_shape
    if tuple(grad_output.shape) != expected:
        raise ValueError(f"grad_output must have the convolution's output shape {expected} (layout "
                         f"{problem.layout!r}) for {what}, got {tuple(grad_output.shape)}")


def conv2d_input(input_shape, weight, grad_output, stride=1, padding=0, dilation=1, groups=1, *, allow_tf32=False,
                 layout="NCHW", weight_layout="KCHW"):
    """The gradient of ``conv2d(x, weight, ...)`` with respect to x, as ``torch.nn.grad.conv2d_input``.

    Args:
        input_shape: x's shape, (N, C, H, W) or (C, H, W) ((N, H, W, C) or (H, W, C) for NHWC).
        weight: (K, C // groups, kh, kw) (KHWC: (K, kh, kw, C // groups)); NumPy or CuPy, float16,
            bfloat16, float32 or float64.
        grad_output: the gradient of the convolution's output, of its shape, weight's dtype and device.
        stride, padding, dilation, groups, layout, weight_layout: the convolution's, as conv2d
            (padding 'same' and 'valid' too).
        allow_tf32: float32 on CuPy may run on the tensor cores in TF32, as in conv2d.

    Returns:
        An array of ``input_shape`` (in ``layout``), weight's dtype and device. Computed as a
        transposed convolution on the forward kernels (one stride-1 convolution per stride phase),
        in the forward's precision (float32 accumulation for 16-bit dtypes; strict float32 unless
        allow_tf32).

    Raises:
        TypeError, ValueError: as conv2d, naming the argument and the shapes, before any launch;
            also a grad_output not of the convolution's output shape.
    """
    backend = check_arrays(grad_output, weight, None, None)
    check_layouts(layout, weight_layout)
    shape = _shape(input_shape, "input_shape", (3, 4))
    unbatched = len(shape) == 3
    problem = make_problem((1, *shape) if unbatched else shape, weight.shape, None, grad_output.dtype, stride, padding,
                           dilation, groups, layout, weight_layout)
    _check_grad_output(grad_output, problem, unbatched, f"input_shape {shape} and weight shape {tuple(weight.shape)}")
    dx = input_gradient(problem, weight, grad_output[None] if unbatched else grad_output, backend, allow_tf32)
    return dx[0] if unbatched else dx


def conv2d_weight(x, weight_shape, grad_output, stride=1, padding=0, dilation=1, groups=1, *, allow_tf32=False,
                  layout="NCHW", weight_layout="KCHW"):
    """The gradient of ``conv2d(x, weight, ...)`` with respect to the weight, as
    ``torch.nn.grad.conv2d_weight``.

    Args:
        x: the convolution's input, (N, C, H, W) or (C, H, W) (NHWC: (N, H, W, C) or (H, W, C));
            NumPy or CuPy, float16, bfloat16, float32 or float64.
        weight_shape: the weight's shape, (K, C // groups, kh, kw) (KHWC: (K, kh, kw, C // groups)).
        grad_output: the gradient of the convolution's output, of its shape, x's dtype and device.
        stride, padding, dilation, groups, layout, weight_layout: the convolution's, as conv2d.
        allow_tf32: float32 on CuPy may run on the tensor cores in TF32, as in conv2d.

    Returns:
        An array of ``weight_shape`` (in ``weight_layout``), x's dtype and device, bitwise the same
        on every run. On the GPU, float16, bfloat16 and TF32 ungrouped convolutions run on the
        tensor cores (an implicit GEMM reading channels-last x and dy in place, its N x Ho x Wo
        reduction split into runs added in a fixed order; wgrad_tensor_cores.py);
        the rest, strict float32 and float64 included, on an implicit GEMM on the FMA units that
        accumulates in float32 (float64 for float64) in fixed-length chunks added in a fixed
        order, so that the error does not grow with N Ho Wo as a serial sum's does (wgrad.py). On
        the CPU, BLAS products per tap.

    Raises:
        TypeError, ValueError: as conv2d, naming the argument and the shapes, before any launch;
            also a grad_output not of the convolution's output shape.
    """
    backend = check_arrays(x, grad_output, None, None)
    check_layouts(layout, weight_layout)
    shape = _shape(weight_shape, "weight_shape", (4,))
    unbatched = x.ndim == 3
    check_x_dims(x, layout)
    problem = make_problem((1, *x.shape) if unbatched else x.shape, shape, None, x.dtype, stride, padding, dilation,
                           groups, layout, weight_layout)
    _check_grad_output(grad_output, problem, unbatched, f"x shape {tuple(x.shape)} and weight_shape {shape}")
    x4, dy = (x[None], grad_output[None]) if unbatched else (x, grad_output)
    return weight_gradient(problem, x4, dy, backend, allow_tf32)


def input_gradient(problem: ConvProblem, weight, grad_output, backend: str, allow_tf32: bool = False):
    """conv2d_input of a checked ``problem``: ``weight`` (``problem.weight_layout``) and 4-D
    ``grad_output`` (``problem.layout``) of the ``backend`` ('numpy' or 'cupy'; CuPy runs on its
    current stream and allocator); a new 4-D array in ``problem.layout``. What the torch adapter's
    backward calls."""
    return transposed(grad_output, weight, None, input_gradient_problem(problem), backend, allow_tf32)


def weight_gradient(problem: ConvProblem, x, grad_output, backend: str, allow_tf32: bool = False):
    """conv2d_weight of a checked ``problem``: 4-D ``x`` and ``grad_output`` (``problem.layout``) of
    the ``backend``; a new array of the weight's shape in ``problem.weight_layout``, by
    weight_gradient_executable's program on CuPy."""
    if backend == "numpy":
        from .reference import conv2d_weight_numpy

        if problem.layout == "NHWC":
            x, grad_output = x.transpose(0, 3, 1, 2), grad_output.transpose(0, 3, 1, 2)
        out = np.empty(problem.weight_shape, dtype=x.dtype)
        conv2d_weight_numpy(x, grad_output, problem, out)
        return np.ascontiguousarray(out.transpose(0, 2, 3, 1)) if problem.weight_layout == "KHWC" else out
    import cupy

    from .launch import aligned, run_program

    with cupy.cuda.Device(x.device.id):
        out = cupy.empty(problem.weight_array_shape, dtype=x.dtype)
        run_program(weight_gradient_executable(problem, allow_tf32, x.device.id), x=aligned(x),
                    grad_output=aligned(grad_output), out=out)
        return out


def weight_gradient_plan(problem: ConvProblem, allow_tf32: bool, compute_capability: int = 0):
    """(family module, plan) of ``problem``'s weight gradient on a GPU of ``compute_capability``: the
    tensor cores where wgrad_tensor_cores takes the problem, depthwise layers of 3x3, 5x5 and 7x7
    taps on wgrad_depthwise's kernel, strict-float32 3x3 stride-1 layers of enough channels by
    Winograd (wgrad_winograd), the rest on wgrad.py's FMA GEMM. Each family's ``program(plan,
    problem)`` reads X and GRAD_OUTPUT and writes OUT."""
    from . import wgrad, wgrad_depthwise, wgrad_tensor_cores, wgrad_winograd

    if not wgrad_tensor_cores.refusal(problem, allow_tf32):
        return wgrad_tensor_cores, wgrad_tensor_cores.make_plan(problem, True, None, None, compute_capability)
    if not wgrad_depthwise.refusal(problem):
        return wgrad_depthwise, wgrad_depthwise.make_plan(problem)
    if not wgrad_winograd.refusal(problem) and wgrad_winograd.pays(problem):
        return wgrad_winograd, wgrad_winograd.make_plan(problem)
    return wgrad, wgrad.make_wgrad_plan(problem)


@functools.lru_cache(maxsize=4096)
def weight_gradient_executable(problem: ConvProblem, allow_tf32: bool, device_id: int):
    """weight_gradient_plan's program ready to launch on device ``device_id`` (executor.Executable;
    operands X, GRAD_OUTPUT and OUT, C-contiguous in the problem's layouts). Made once per problem:
    the torch adapter's backward asks on every call."""
    from .compiler import compute_capability
    from .executor import program_executable

    family, plan = weight_gradient_plan(problem, allow_tf32, compute_capability(device_id))
    return program_executable(family.program, plan, problem, device_id)


@functools.lru_cache(maxsize=4096)
def input_gradient_executable(problem: ConvProblem, allow_tf32: bool, device_id: int):
    """The input gradient of ``problem`` as one program ready to launch on device ``device_id``
    (conv_transpose.program; operands X: grad_output, WEIGHT, OUT: the gradient, C-contiguous in the
    problem's layouts), or None where conv_transpose.run_phases must run it on CuPy arrays (see
    conv_transpose.transposed_executable)."""
    from .conv_transpose import transposed_executable
    from .families.implicit_gemm_conv2d import GEMM_MIN_GROUP_CHANNELS

    return transposed_executable(input_gradient_problem(problem), allow_tf32, device_id, GEMM_MIN_GROUP_CHANNELS)
