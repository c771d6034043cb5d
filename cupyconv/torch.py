"""The PyTorch adapter: a drop-in ``Conv2d``, a functional ``conv2d`` and ``convert`` for whole models.

    from cupyconv.torch import Conv2d, conv2d, convert
    layer = Conv2d(3, 96, 11, stride=4, padding=2, device="cuda")  # nn.Conv2d's signature, parameters, init
    y = conv2d(x, weight, bias, stride=4, padding=2)                 # torch tensors in and out
    model = convert(model)                                           # every plain nn.Conv2d runs on cupyconv

How a CUDA call runs: the arguments are checked (cupyconv.arguments.make_problem) before anything
is launched; the tensors cross to CuPy through DLPack without a copy (bfloat16 as an int16 view,
since CuPy has no bfloat16); the output is allocated by torch, so torch's caching allocator owns
it; the kernel runs on torch's current stream of the input's device, so no host synchronisation
is needed and the call can be captured in a CUDA graph. The convolution is registered as the custom
op ``cupyconv::conv2d`` with a fake (meta) implementation and an autograd formula, so
``torch.compile(fullgraph=True)`` traces it without graph breaks.

Precision follows torch's switch for convolutions, as nn.Conv2d does: float32 runs on cupyconv's
TF32 tensor-core path when ``torch.backends.cudnn.allow_tf32`` is true (torch's default) and in
strict IEEE float32 when it is false; the switch is read at each call (at capture, for a CUDA
graph). float16 and bfloat16 accumulate in float32 and are rounded once on output; float64 is
float64 throughout.

CPU tensors (and any non-CUDA device) are computed by torch.nn.functional.conv2d after the same
argument checks, so a model converted on the CPU gives torch's results there.

This is the only cupyconv module that imports torch; ``import cupyconv`` never does.
"""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

from .arguments import ConvProblem, make_problem
from .launch import conv2d_cupy

__all__ = ["Conv2d", "conv2d", "convert"]

#: torch dtype -> cupyconv's name for it.
DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32",
               torch.float64: "float64"}


def _dtype_name(dtype: torch.dtype, name: str) -> str:
    if dtype not in DTYPE_NAMES:
        raise TypeError(f"{name} has dtype {dtype}; cupyconv computes in "
                        f"{', '.join(str(d) for d in DTYPE_NAMES)} (cast integer, bool and complex tensors first)")
    return DTYPE_NAMES[dtype]


def _allow_tf32(dtype: torch.dtype) -> bool:
    """Whether float32 may run as TF32: torch's switch for convolutions (the one nn.Conv2d follows)."""
    return dtype == torch.float32 and torch.backends.cudnn.allow_tf32


def _check_tensors(x, weight, bias) -> None:
    """Kinds, dtypes and devices; shapes are make_problem's job."""
    tensors = {"x": x, "weight": weight}
    if bias is not None:
        tensors["bias"] = bias
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        _dtype_name(t.dtype, name)
        if t.dtype != x.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but x has dtype {x.dtype}; they must match")
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}; they must be on one device")
    if bias is not None and bias.dim() != 1:
        raise ValueError(f"bias must be 1-D (K,), got shape {tuple(bias.shape)}")


def _problem(x, weight, bias, stride, padding, dilation, groups) -> ConvProblem:
    """Check every argument of a conv2d call (a 3-D x counts as one image); raises before any launch."""
    _check_tensors(x, weight, bias)
    if x.dim() not in (3, 4):
        raise ValueError(f"x must be 4-D (N, C, H, W) or 3-D (C, H, W), got shape {tuple(x.shape)}")
    x_shape = (1, *x.shape) if x.dim() == 3 else tuple(x.shape)
    return make_problem(x_shape, tuple(weight.shape), None if bias is None else tuple(bias.shape),
                        _dtype_name(x.dtype, "x"), stride, padding, dilation, groups)


def _op_problem(x, weight, bias, stride, padding, dilation, groups) -> ConvProblem:
    """The ConvProblem of the custom op's explicit arguments (padding = (top, left, bottom, right))."""
    n, c, h, w = x.shape
    k, _, kh, kw = weight.shape
    top, left, bottom, right = padding
    return ConvProblem(n=n, c=c, h=h, w=w, k=k, kh=kh, kw=kw, stride=tuple(stride), dilation=tuple(dilation),
                       pad_top=top, pad_left=left, pad_bottom=bottom, pad_right=right, groups=groups,
                       dtype=_dtype_name(x.dtype, "x"), has_bias=bias is not None)


def _as_cupy(tensor: torch.Tensor):
    """A CuPy view of a CUDA tensor: same memory, no copy."""
    import cupy

    if tensor.dtype == torch.bfloat16:
        # CuPy has no bfloat16; the launch reads the element type from the problem, not the array.
        tensor = tensor.view(torch.int16)
    # stream=-1: the kernel runs on the stream that produced the tensor, so no event is needed.
    return cupy.from_dlpack(tensor.detach().__dlpack__(stream=-1))


def _torch_allocator(size: int):
    """CuPy memory from torch's caching allocator on the current device and stream: the temporary
    copies some kernels read (channels-last input, transposed weight) then follow torch's stream
    ordering and, inside a CUDA-graph capture, come from the graph's private pool, so a replay never
    reads memory that was handed to someone else after the capture."""
    import cupy

    tensor = torch.empty(max(size, 1), dtype=torch.uint8, device=torch.device("cuda", cupy.cuda.Device().id))
    return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(tensor.data_ptr(), size, tensor), 0)


def _cupy_stream(stream: torch.cuda.Stream):
    """The CuPy handle of a torch stream, to make it CuPy's current stream."""
    import cupy

    # CuPy 14 deprecates ExternalStream in favour of the CUDA stream protocol, which recent torch
    # streams implement; older pairs only have ExternalStream.
    if hasattr(cupy.cuda.Stream, "from_external") and hasattr(stream, "__cuda_stream__"):
        return cupy.cuda.Stream.from_external(stream)
    return cupy.cuda.ExternalStream(stream.cuda_stream, stream.device.index)


@torch.library.custom_op("cupyconv::conv2d", mutates_args=(), device_types="cuda")
def _conv2d_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: list[int],
               padding: list[int], dilation: list[int], groups: int) -> torch.Tensor:
    """cupyconv's kernel on torch's current stream of x's device. padding is (top, left, bottom, right)."""
    import cupy

    problem = _op_problem(x, weight, bias, stride, padding, dilation, groups)
    # Made contiguous by torch, so that any copy comes from torch's allocator, never CuPy's pool.
    x, weight = x.contiguous(), weight.contiguous()
    bias = None if bias is None else bias.contiguous()
    out = torch.empty(problem.out_shape, device=x.device, dtype=x.dtype)
    if out.numel() == 0:
        return out
    device = x.device
    with torch.cuda.device(device), cupy.cuda.Device(device.index), \
            _cupy_stream(torch.cuda.current_stream(device)), cupy.cuda.using_allocator(_torch_allocator):
        conv2d_cupy(_as_cupy(x), _as_cupy(weight), None if bias is None else _as_cupy(bias), problem,
                    _as_cupy(out), allow_tf32=_allow_tf32(x.dtype))
    return out


@_conv2d_op.register_kernel("cpu")
def _conv2d_op_cpu(x, weight, bias, stride, padding, dilation, groups):
    # Makes the op total over devices (and testable in CPU-only CI); conv2d() itself sends CPU
    # tensors to F.conv2d directly.
    top, left, bottom, right = padding
    return F.conv2d(F.pad(x, (left, right, top, bottom)), weight, bias, stride, 0, dilation, groups)


@_conv2d_op.register_fake
def _conv2d_op_fake(x, weight, bias, stride, padding, dilation, groups):
    return x.new_empty(_op_problem(x, weight, bias, stride, padding, dilation, groups).out_shape)


def _conv2d_op_setup_context(ctx, inputs, output):
    x, weight, bias, stride, padding, dilation, groups = inputs
    needs_x, needs_weight = ctx.needs_input_grad[:2]
    # Each gradient needs only the other operand; keep just what a needed gradient reads.
    ctx.save_for_backward(x if needs_weight else None, weight if needs_x else None)
    ctx.x_shape, ctx.weight_shape = x.shape, weight.shape
    ctx.conv = (tuple(stride), tuple(padding), tuple(dilation), groups)


def _conv2d_op_backward(ctx, grad_out):
    """Gradients by torch's convolution-gradient functions, for each input that needs one."""
    x, weight = ctx.saved_tensors
    stride, (top, left, bottom, right), dilation, groups = ctx.conv
    needs_x, needs_weight, needs_bias = ctx.needs_input_grad[:3]
    n, c, h, w = ctx.x_shape
    # torch's gradient functions take symmetric padding; an asymmetric one ('same' with an even
    # extent) is handled as a convolution of the explicitly padded input.
    symmetric = (top, left) == (bottom, right)
    pad = (top, left) if symmetric else (0, 0)
    grad_x = grad_weight = grad_bias = None
    if needs_x:
        padded_shape = (n, c, h, w) if symmetric else (n, c, h + top + bottom, w + left + right)
        grad_x = torch.nn.grad.conv2d_input(padded_shape, weight, grad_out, stride, pad, dilation, groups)
        if not symmetric:
            grad_x = grad_x[:, :, top:top + h, left:left + w]
    if needs_weight:
        x_read = x if symmetric else F.pad(x, (left, right, top, bottom))
        grad_weight = torch.nn.grad.conv2d_weight(x_read, ctx.weight_shape, grad_out, stride, pad, dilation, groups)
    if needs_bias:
        grad_bias = grad_out.sum((0, 2, 3))
    return grad_x, grad_weight, grad_bias, None, None, None, None


torch.library.register_autograd("cupyconv::conv2d", _conv2d_op_backward, setup_context=_conv2d_op_setup_context)


def _conv2d(x, weight, bias, problem: ConvProblem):
    """Run a checked problem through the custom op, keeping x's batching and memory format."""
    unbatched = x.dim() == 3
    x4 = x.unsqueeze(0) if unbatched else x
    channels_last = x4.is_contiguous(memory_format=torch.channels_last) and not x4.is_contiguous()
    y = torch.ops.cupyconv.conv2d(
        x4, weight, bias, list(problem.stride),
        [problem.pad_top, problem.pad_left, problem.pad_bottom, problem.pad_right],
        list(problem.dilation), problem.groups)
    if channels_last:
        y = y.contiguous(memory_format=torch.channels_last)
    return y.squeeze(0) if unbatched else y


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """2-D convolution (cross-correlation) of torch tensors, as ``torch.nn.functional.conv2d``.

    CUDA tensors run cupyconv's kernel on torch's current stream of x's device, with no copy in
    or out; other devices run ``torch.nn.functional.conv2d``. Differentiable, and traceable by
    ``torch.compile(fullgraph=True)``.

    Args:
        x: (N, C, H, W) or unbatched (C, H, W); float16, bfloat16, float32 or float64; any
            strides. A channels_last x gives a channels_last output.
        weight: (K, C // groups, kh, kw), x's dtype and device.
        bias: optional (K,), x's dtype and device.
        stride: int or (sh, sw), >= 1. Default 1.
        padding: int or (ph, pw) zeros on both sides, 'valid' (none) or 'same' (output as large as
            the input, stride 1 only; an odd total puts the extra row/column at the bottom/right,
            as torch). Default 0.
        dilation: int or (dh, dw), >= 1. Default 1.
        groups: >= 1, dividing C and K. Default 1.

    Returns:
        (N, K, Ho, Wo) tensor (or (K, Ho, Wo)) of x's dtype on x's device, allocated by torch.
        float32 is TF32 when torch.backends.cudnn.allow_tf32 is true (torch's default), else strict
        IEEE float32; float16 and bfloat16 accumulate in float32.

    Raises:
        TypeError: a non-tensor argument, or an unsupported or mismatched dtype.
        ValueError: tensors on different devices, inconsistent shapes, bad stride, padding,
            dilation or groups, or a kernel larger than the padded input.
    """
    problem = _problem(x, weight, bias, stride, padding, dilation, groups)
    if x.device.type != "cuda":
        return F.conv2d(x, weight, bias, stride, padding, dilation, groups)
    return _conv2d(x, weight, bias, problem)


class Conv2d(nn.Conv2d):
    """``torch.nn.Conv2d`` computed by cupyconv on CUDA tensors (torch's conv2d elsewhere).

    Same constructor arguments, parameters (``weight``, ``bias``), initialisation and state_dict as
    nn.Conv2d, so the two load each other's checkpoints. padding_mode 'reflect', 'replicate' and
    'circular' pad with torch.nn.functional.pad and then run an unpadded cupyconv convolution, as
    nn.Conv2d does with its own kernel. See :func:`conv2d` for precision and devices.
    """

    def _conv_forward(self, input, weight, bias):
        if self.padding_mode != "zeros":
            return conv2d(F.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode),
                          weight, bias, self.stride, 0, self.dilation, self.groups)
        return conv2d(input, weight, bias, self.stride, self.padding, self.dilation, self.groups)

    def _get_name(self):
        return "cupyconv.Conv2d"


def _left_alone(module: nn.Module, inverse: bool) -> bool:
    """A convolution convert() would be expected to switch but cannot: a subclass it does not know."""
    if inverse:
        return isinstance(module, Conv2d) and type(module) is not Conv2d
    return isinstance(module, nn.Conv2d) and type(module) is not nn.Conv2d and not isinstance(module, Conv2d)


def convert(model: nn.Module, inverse: bool = False) -> nn.Module:
    """Make every plain ``nn.Conv2d`` in ``model`` a cupyconv :class:`Conv2d`, in place.

    Each module keeps its identity: its class is switched, so parameters (the same Parameter
    objects), buffers, hooks, device, dtype and training flag are untouched, and optimizers or
    other references to it stay valid. Only modules whose type is exactly nn.Conv2d are switched:
    a subclass may override forward in ways cupyconv cannot honour, so subclasses (LazyConv2d,
    parametrized or quantized convolutions, user classes), and convolutions whose dtype cupyconv
    does not compute in, are left alone and listed in one UserWarning.

    Args:
        model: any module; it may itself be an nn.Conv2d.
        inverse: switch cupyconv Conv2d modules back to plain nn.Conv2d instead.

    Returns:
        ``model``, converted.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    source, target = (Conv2d, nn.Conv2d) if inverse else (nn.Conv2d, Conv2d)
    skipped = []
    for name, module in model.named_modules():
        if type(module) is source:
            if not inverse and module.weight.dtype not in DTYPE_NAMES:
                skipped.append(f"{name or '(model)'} (dtype {module.weight.dtype})")
                continue
            module.__class__ = target
        elif _left_alone(module, inverse):
            skipped.append(f"{name or '(model)'} ({type(module).__qualname__})")
    if skipped:
        warnings.warn(f"cupyconv.torch.convert left {len(skipped)} module(s) unchanged: {', '.join(skipped)}",
                      UserWarning, stacklevel=2)
    return model
