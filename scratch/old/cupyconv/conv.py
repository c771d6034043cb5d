"""The public conv2d: one call for NumPy (CPU) and CuPy (GPU) arrays, and the plan it would use.

A CuPy call is checked once per call signature (shapes, strides, dtypes, devices, hyper-parameters):
the checked problem and its ready-to-launch executable are kept under that signature, so a call seen
before costs a dictionary lookup, the output's allocation and the launches. Anything not in the
signature (whether ``out`` overlaps an input) is checked on every call.
"""
from __future__ import annotations

import dataclasses
import math
import os

import numpy as np

from . import tuning
from .arguments import (check_arrays, check_input_scale, check_layouts, check_out, check_x_dims, check_output_size,
                        check_residual, check_residual_overlap, extent, make_problem, overlaps)
from .launch import aligned, run
from .planner import LaunchPlan, as_planned, make_plan
from .program import OPERAND_ALIGNMENT
from .reference import conv2d_numpy
from .weights import PreparedWeight

#: Call signature -> _CupyCall, for CuPy calls that passed every check once (emptied when autotuning
#: is switched: its executable was planned under the mode of its time).
_CUPY_CALLS: dict = tuning.cleared_on_mode_change({})
#: cupy and cupy.ndarray, once a CuPy call has been seen (import cupyconv must not import CuPy).
_cupy = _cupy_ndarray = None


def _problem(x, weight, bias, stride, padding, dilation, groups, out, layout, weight_layout, activation=None,
             residual=None, input_scale=None):
    backend = check_arrays(x, weight, bias, out)
    check_layouts(layout, weight_layout)
    check_x_dims(x, layout)
    unbatched = x.ndim == 3
    residual_shape = None
    if residual is not None:
        check_residual(residual, x, out)
        residual_shape = (1, *residual.shape) if unbatched else residual.shape
    input_scale_shape = None
    if input_scale is not None:
        check_input_scale(input_scale, x, out)
        input_scale_shape = (1, *input_scale.shape) if unbatched else input_scale.shape
    problem = make_problem((1, *x.shape) if unbatched else x.shape, weight.shape,
                           None if bias is None else bias.shape, x.dtype, stride, padding, dilation, groups,
                           layout, weight_layout, activation, residual_shape, input_scale_shape)
    return backend, unbatched, problem


def _out_shape(problem, unbatched: bool) -> tuple[int, ...]:
    """The output array's shape: in the problem's layout, without the batch for an unbatched x."""
    shape = problem.out_array_shape
    return shape[1:] if unbatched else shape


class _CupyCall:
    """A checked CuPy call signature: its output shape, its executable, what must be copied first."""

    __slots__ = ("shape", "exe", "device_id", "x_copy", "weight_copy", "bias_copy", "extents")

    def __init__(self, problem, shape, exe, device_id, x, weight, bias, input_scale):
        self.shape, self.exe, self.device_id = shape, exe, device_id
        self.x_copy, self.weight_copy = not x.flags.c_contiguous, not weight.flags.c_contiguous
        self.bias_copy = bias is not None and not bias.flags.c_contiguous
        self.extents = tuple(None if a is None else extent(a) for a in (x, weight, bias, input_scale))


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _cupy_call(x, weight, bias, stride, padding, dilation, groups, out, allow_tf32, layout, weight_layout, activation,
               residual, input_scale) -> _CupyCall:
    """Every check of a CuPy call (raising before anything is allocated or launched), then its executable."""
    from .executor import executable
    from .launch import device_memory

    _, unbatched, problem = _problem(x, weight, bias, stride, padding, dilation, groups, out, layout, weight_layout,
                                     activation, residual, input_scale)
    shape = _out_shape(problem, unbatched)
    device_id = x.device.id
    check_output_size(shape, x.dtype.itemsize, device_memory(device_id), f"GPU {device_id}")
    if out is not None:
        check_out(out, problem, shape, x, weight, bias)
    exe = executable(problem, allow_tf32, device_id) if math.prod(shape) else None
    return _CupyCall(problem, shape, exe, device_id, x, weight, bias, input_scale)


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *, out=None, allow_tf32=False,
           layout="NCHW", weight_layout="KCHW", activation=None, residual=None, input_scale=None):
    """2-D convolution (cross-correlation) over NCHW or NHWC arrays, as ``torch.nn.functional.conv2d``.

    CuPy arrays run on their GPU, on CuPy's current stream; NumPy arrays run on the CPU.

    Args:
        x: input, (N, C, H, W), or (C, H, W) for one unbatched image; with ``layout="NHWC"``,
            (N, H, W, C) or (H, W, C). float16, bfloat16, float32 or float64; any strides
            (non-contiguous inputs are copied first).
        weight: (K, C // groups, kh, kw), or (K, kh, kw, C // groups) with ``weight_layout="KHWC"``;
            same dtype and device as ``x``; or a :class:`~cupyconv.PreparedWeight` of one
            (:func:`cupyconv.prepare_weight`), whose transformed forms are made once instead of on
            every call.
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
        layout: the memory order of ``x`` and of the output: "NCHW" (default) or "NHWC" (channels
            last, as torch's channels_last; the tensor-core GEMM reads and writes it in place, the
            other kernels transpose around an NCHW computation).
        weight_layout: the memory order of ``weight``: "KCHW" (default) or "KHWC".
        activation: None (default), "relu", "relu6", "silu", "gelu" (exact), "sigmoid" or "tanh",
            applied in the kernel's epilogue, as torch's functions of those names.
        residual: optional array of the output's shape (in ``layout``), dtype and device, added in
            the epilogue; it may be ``out`` itself (in-place accumulate). The result is
            ``activation(conv(x, weight) + bias + residual)``, computed in float32 (float64 for
            float64) and rounded once.
        input_scale: optional (N, C) array (or (C,) for unbatched input) of x's dtype and device, in
            either layout: x is multiplied by ``input_scale[n, c]`` per image and input channel before
            the convolution, the product rounded to x's dtype, as ``conv(x * s[:, :, None, None])``
            (squeeze-and-excitation's gate). The 1x1 channels-last kernel (pointwise_nhwc) scales as
            it loads x; other kernels read a scaled copy of x made first (one more pass over x).

    Returns:
        (N, K, Ho, Wo) array (or (K, Ho, Wo) for unbatched input; (N, Ho, Wo, K) or (Ho, Wo, K) for
        layout "NHWC") of x's dtype on x's device, with Ho = (H + 2 ph - dh (kh - 1) - 1) // sh + 1
        and likewise Wo. float32 is computed in IEEE float32 (no TF32 unless ``allow_tf32``);
        float16 and bfloat16 accumulate in float32.

    Raises:
        TypeError: arrays of another kind, mixed NumPy/CuPy, unsupported or differing dtypes.
        ValueError: inconsistent shapes (naming the layouts they were read in), bad
            stride/padding/dilation/groups/layout, a kernel larger than the padded input, an output
            larger than the device's memory, arrays on different GPUs, a bad ``out``, an unknown
            activation, or a residual of another shape, or overlapping ``out`` without being it, an
            input_scale not (N, C).
            Raised before anything is allocated or launched.
    """
    prepared = weight if type(weight) is PreparedWeight else None
    if prepared is not None:
        weight = prepared.array
    if type(x) is not _cupy_ndarray:
        if check_arrays(x, weight, bias, out) == "numpy":
            return _numpy_conv2d(x, weight, bias, stride, padding, dilation, groups, out, layout, weight_layout,
                                 activation, residual, input_scale)
        _remember_cupy()  # the first CuPy call: from now on its arrays take the lookup below first
    try:
        key = (x.shape, x.strides, x.dtype, x.data.device_id, type(weight), weight.shape, weight.strides,
               weight.dtype, weight.data.device_id,
               None if bias is None else (type(bias), bias.shape, bias.strides, bias.dtype, bias.data.device_id),
               stride, padding, dilation, groups, bool(allow_tf32),
               None if out is None else (type(out), out.shape, out.strides, out.dtype, out.data.device_id),
               layout, weight_layout, activation,
               None if residual is None else (type(residual), residual.shape, residual.strides, residual.dtype,
                                              residual.data.device_id, residual is out),
               None if input_scale is None else (type(input_scale), input_scale.shape, input_scale.strides,
                                                 input_scale.dtype, input_scale.data.device_id))
        call = _CUPY_CALLS.get(key)
    except (AttributeError, TypeError):  # not CuPy arrays, or unhashable arguments: the full checks say which
        key = call = None
    if call is None:
        call = _cupy_call(x, weight, bias, stride, padding, dilation, groups, out, allow_tf32, layout, weight_layout,
                          activation, residual, input_scale)
        if key is not None:
            _CUPY_CALLS[key] = call
    return _run_cupy(call, x, weight, bias, out, prepared, residual, input_scale)


def _numpy_conv2d(x, weight, bias, stride, padding, dilation, groups, out, layout, weight_layout, activation, residual,
                  input_scale):
    """The CPU path (the reference): every check, then conv2d_numpy on NCHW views of the arrays (x
    multiplied by the input scale first, the product in x's dtype)."""
    _, unbatched, problem = _problem(x, weight, bias, stride, padding, dilation, groups, out, layout, weight_layout,
                                     activation, residual, input_scale)
    shape = _out_shape(problem, unbatched)
    check_output_size(shape, x.dtype.itemsize, _physical_memory(), "this machine")
    if out is not None:
        check_out(out, problem, shape, x, weight, bias)
    out = np.empty(shape, dtype=x.dtype) if out is None else out
    x, out4 = (x[None], out[None]) if unbatched else (x, out)
    if residual is not None and unbatched:
        residual = residual[None]
    if layout == "NHWC":
        x, out4 = x.transpose(0, 3, 1, 2), out4.transpose(0, 3, 1, 2)
        residual = None if residual is None else residual.transpose(0, 3, 1, 2)
    if weight_layout == "KHWC":
        weight = weight.transpose(0, 3, 1, 2)
    if input_scale is not None:
        x = x * input_scale.reshape(problem.n, problem.c, 1, 1)
    conv2d_numpy(x, weight, bias, problem, out4, residual)
    return out


def _remember_cupy() -> None:
    global _cupy, _cupy_ndarray
    import cupy

    _cupy, _cupy_ndarray = cupy, cupy.ndarray


def _run_cupy(call: _CupyCall, x, weight, bias, out, prepared, residual, input_scale):
    cupy = _cupy
    if out is not None:
        for name, a, span in (("x", x, call.extents[0]), ("weight", weight, call.extents[1]),
                              ("bias", bias, call.extents[2]), ("input_scale", input_scale, call.extents[3])):
            if a is not None and overlaps(out.data.ptr, (0, out.nbytes), a.data.ptr, span):
                raise ValueError(f"out shares memory with {name}; conv2d never modifies its inputs")
        if residual is not None:
            check_residual_overlap(residual, out)
    if cupy.cuda.runtime.getDevice() != call.device_id:
        with cupy.cuda.Device(call.device_id):
            return _run_cupy(call, x, weight, bias, out, prepared, residual, input_scale)
    if out is None:
        out = cupy.empty(call.shape, dtype=x.dtype)
    if call.exe is None:  # an empty output: nothing to compute
        return out
    if out.data.ptr % OPERAND_ALIGNMENT:  # vector stores: compute into an aligned output, then copy
        out[...] = _run_cupy(call, x, weight, bias, None, prepared, residual, input_scale)
        return out
    if residual is not None and (not residual.flags.c_contiguous or residual.data.ptr % OPERAND_ALIGNMENT):
        residual = residual.copy() if residual.flags.c_contiguous else cupy.ascontiguousarray(residual)
    if x.data.ptr % OPERAND_ALIGNMENT:
        x = x.copy()
    if input_scale is not None:
        input_scale = aligned(input_scale)
    if weight.data.ptr % OPERAND_ALIGNMENT and prepared is None:
        weight = weight.copy()
    run(call.exe, cupy.ascontiguousarray(x) if call.x_copy else x,
        cupy.ascontiguousarray(weight) if call.weight_copy else weight,
        cupy.ascontiguousarray(bias) if call.bias_copy else bias, out,
        prepared, residual, input_scale)
    return out


def plan(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *, allow_tf32=False, layout="NCHW",
         weight_layout="KCHW", activation=None, residual=None, input_scale=None) -> LaunchPlan:
    """The GPU launch plan conv2d would use for these arguments (printable: kernel, tiles, grid, why,
    what is read in place or transposed for the layouts, and whether it was tuned).

    Takes the same arguments as :func:`conv2d`. On CuPy arrays it plans for their GPU, and with
    autotuning on (:func:`cupyconv.autotune`) it tunes the problem there as conv2d would (once: the
    winner is cached); NumPy arrays give the plan for any GPU, untuned (only shapes and dtypes matter).
    Bad arguments raise as in conv2d, before anything is timed.
    """
    if type(weight) is PreparedWeight:
        weight = weight.array
    backend, _, problem = _problem(x, weight, bias, stride, padding, dilation, groups, None, layout, weight_layout,
                                   activation, residual, input_scale)
    if backend == "numpy":
        why = "NumPy arrays: plans are tuned on the GPU that runs them" if tuning.enabled() else "autotune off"
        return dataclasses.replace(make_plan(as_planned(problem, allow_tf32), allow_tf32=allow_tf32),
                                   tuning=f"no ({why})")
    from .compiler import compute_capability

    problem = as_planned(problem, allow_tf32, compute_capability(x.device.id))
    if tuning.enabled():
        return tuning.tuned_plan(problem, allow_tf32, x.device.id)
    chosen = make_plan(problem, allow_tf32=allow_tf32, compute_capability=compute_capability(x.device.id))
    return dataclasses.replace(chosen, tuning="no (autotune off)")
