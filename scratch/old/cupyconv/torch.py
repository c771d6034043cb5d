"""The PyTorch adapter: drop-in ``Conv2d``, ``ConvTranspose2d`` and ``Conv1d``, their functional forms
and ``convert`` for whole models.

    from cupyconv.torch import Conv2d, conv2d, convert
    layer = Conv2d(3, 96, 11, stride=4, padding=2, device="cuda")  # nn.Conv2d's signature, parameters, init
    y = conv2d(x, weight, bias, stride=4, padding=2)                 # torch tensors in and out
    model = convert(model)      # every plain nn.Conv2d, nn.ConvTranspose2d and nn.Conv1d runs on cupyconv

How a CUDA call runs: the arguments are checked (cupyconv.arguments.make_problem) before anything
is launched, once per call signature (shapes, strides, dtypes, devices, hyper-parameters, the TF32
switch): a signature seen before costs a dictionary lookup, torch's allocations and the launches,
which go to the CUDA driver with the tensors' addresses (no DLPack exchange, no CuPy arrays). The
output, the temporaries and the prepared weights come from torch's caching allocator, and the
kernels run on torch's current stream of the input's device, so no host synchronisation is needed
and the call can be captured in a CUDA graph (inside a capture the weight is prepared in the graph,
so a replay reads the weight as it is then). Autograd runs through a torch.autograd.Function, and
only where a gradient is needed. Under torch.compile the convolution is the custom op
``cupyconv::conv2d``, with a fake (meta) implementation and the same autograd formula, so
``torch.compile(fullgraph=True)`` traces it without graph breaks.

Precision follows torch's switch for convolutions, as nn.Conv2d does: float32 runs on cupyconv's
TF32 tensor-core path when ``torch.backends.cudnn.allow_tf32`` is true (torch's default) and in
strict IEEE float32 when it is false; the switch is read at each call (at capture, for a CUDA
graph). float16 and bfloat16 accumulate in float32 and are rounded once on output; float64 is
float64 throughout.

Gradients: the backward of a CUDA call runs cupyconv's gradient kernels (cupyconv.grad: the input
gradient as a transposed convolution, the weight gradient as a deterministic implicit GEMM, bitwise
the same run after run) on torch's current stream. Each is a program made once per problem
(grad.input_gradient_executable, weight_gradient_executable) and launched as a forward call is,
with the tensors' addresses and torch's allocator, so a backward can be captured in a CUDA graph
too. (Input gradients of arrays past 32-bit offsets go through cupyconv.grad on CuPy arrays that
share the tensors' memory by DLPack, CuPy allocating from torch's caching allocator.) The bias
gradient is a sum. ``set_backward("torch")`` (or the environment variable
``CUPYCONV_TORCH_BACKWARD=torch`` at import) computes the gradients with torch's functions instead.
A backward that records a graph (``create_graph=True``, for second derivatives) always uses torch's
differentiable functions, as do the custom op's formula under torch.compile and CPU tensors.

``ConvTranspose2d`` / ``conv_transpose2d`` compute CUDA tensors with cupyconv.conv_transpose's
program (the forward kernels, one stride phase at a time, launched as one call); their gradients are a cupyconv conv2d (input) and
cupyconv's weight gradient with the roles of input and output swapped. ``Conv1d`` / ``conv1d`` are
conv2d of height 1 (views, no copies) through this module's conv2d, so they share its autograd,
torch.compile support and channels handling. Under torch.compile the transposed convolution is
torch's own (no custom op is registered for it).

CPU tensors (and any non-CUDA device) are computed by torch.nn.functional's conv2d,
conv_transpose2d and conv1d after the same argument checks, so a model converted on the CPU gives
torch's results there.

This is the only cupyconv module that imports torch; ``import cupyconv`` never does.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from . import tuning
from .arguments import ConvProblem, check_output_size, make_problem
from .conv1d import _single
from .conv_transpose import TransposeProblem, make_transpose_problem, transposed, transposed_executable
from .executor import Workspaces
from .grad import input_gradient, input_gradient_executable, weight_gradient, weight_gradient_executable
from .families.common import STORAGE_BYTES
from .program import OPERAND_ALIGNMENT

__all__ = ["Conv2d", "ConvTranspose2d", "Conv1d", "conv2d", "conv_transpose2d", "conv1d", "convert", "set_backward",
           "clear_weight_caches", "refresh_weight_caches", "release_workspaces", "WeightCache"]

#: torch dtype -> cupyconv's name for it.
DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32",
               torch.float64: "float64"}


def _dtype_name(dtype: torch.dtype, name: str) -> str:
    if dtype not in DTYPE_NAMES:
        raise TypeError(f"{name} has dtype {dtype}; cupyconv computes in "
                        f"{', '.join(str(d) for d in DTYPE_NAMES)} (cast integer, bool and complex tensors first)")
    return DTYPE_NAMES[dtype]


#: torch.backends.cudnn.allow_tf32's getter itself (the attribute goes through a flags object: 0.5 us
#: a read, on every float32 call's path); the attribute where this torch lacks it.
_cudnn_allow_tf32 = getattr(torch._C, "_get_cudnn_allow_tf32", lambda: torch.backends.cudnn.allow_tf32)


def _allow_tf32(dtype: torch.dtype) -> bool:
    """Whether float32 may run as TF32: torch's switch for convolutions (the one nn.Conv2d follows)."""
    return dtype == torch.float32 and _cudnn_allow_tf32()


#: Who computes the gradients of CUDA calls: cupyconv's kernels or torch's functions (set_backward).
BACKWARDS = ("cupyconv", "torch")
BACKWARD_VARIABLE = "CUPYCONV_TORCH_BACKWARD"


def _checked_backward(kind, where: str) -> str:
    if not isinstance(kind, str) or kind not in BACKWARDS:
        raise ValueError(f"{where} must be one of {BACKWARDS}, got {kind!r}")
    return kind


_BACKWARD = _checked_backward(os.environ.get(BACKWARD_VARIABLE) or "cupyconv",
                              f"the environment variable {BACKWARD_VARIABLE}")


def set_backward(kind: str) -> str:
    """Choose who computes the gradients of this module's convolutions on CUDA tensors.

    Args:
        kind: 'cupyconv' (the default): cupyconv's gradient kernels (cupyconv.grad), the weight
            gradient deterministic (bitwise the same run after run); 'torch': torch's gradient
            functions (torch.nn.grad, cuDNN). The environment variable CUPYCONV_TORCH_BACKWARD
            (same values) sets the initial choice when cupyconv.torch is imported.

        Either way, a backward that records its own graph (``create_graph=True``) runs torch's
        differentiable functions, so second derivatives exist; so do CPU tensors and the custom op
        under torch.compile. Read at each backward.

    Returns:
        The previous choice.

    Raises:
        ValueError: ``kind`` is not one of 'cupyconv', 'torch'.
    """
    global _BACKWARD
    previous, _BACKWARD = _BACKWARD, _checked_backward(kind, "set_backward's kind")
    return previous


#: cupyconv's activations as torch computes them (gelu in its exact erf form, torch's default).
ACTIVATION_FUNCTIONS = {"none": None, "relu": F.relu, "relu6": F.relu6, "silu": F.silu, "gelu": F.gelu,
                        "sigmoid": torch.sigmoid, "tanh": torch.tanh}


def _epilogue(y: torch.Tensor, residual: torch.Tensor | None, activation: str) -> torch.Tensor:
    """activation(y + residual) by torch's operations: the CPU path, and calls that need gradients."""
    if residual is not None:
        y = y + residual
    function = ACTIVATION_FUNCTIONS[activation]
    return y if function is None else function(y)


def _check_tensors(x, weight, bias, residual=None, input_scale=None) -> None:
    """Kinds, dtypes and devices; shapes are make_problem's job."""
    tensors = {"x": x, "weight": weight}
    if bias is not None:
        tensors["bias"] = bias
    if residual is not None:
        tensors["residual"] = residual
    if input_scale is not None:
        tensors["input_scale"] = input_scale
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


def _problem(x, weight, bias, stride, padding, dilation, groups, activation=None, residual=None,
             input_scale=None) -> ConvProblem:
    """Check every argument of a conv2d call (a 3-D x counts as one image); raises before any launch.
    The problem's layouts follow the tensors' memory formats (_layouts)."""
    _check_tensors(x, weight, bias, residual, input_scale)
    if x.dim() not in (3, 4):
        raise ValueError(f"x must be 4-D (N, C, H, W) or 3-D (C, H, W), got shape {tuple(x.shape)}")
    x_shape = (1, *x.shape) if x.dim() == 3 else tuple(x.shape)
    residual_shape = None
    if residual is not None:
        if residual.dim() != x.dim():
            raise ValueError(f"residual must have the output's shape ({x.dim()}-D like x), got shape "
                             f"{tuple(residual.shape)}")
        residual_shape = (1, *residual.shape) if x.dim() == 3 else tuple(residual.shape)
    input_scale_shape = None
    if input_scale is not None:
        gate = (*x_shape[:2], 1, 1)[x.dim() == 3:]
        if tuple(input_scale.shape) != gate:
            raise ValueError(f"input_scale must have shape {gate} (one factor per image and channel of x "
                             f"{tuple(x.shape)}, as x * input_scale broadcasts), got {tuple(input_scale.shape)}")
        input_scale_shape = x_shape[:2]
    problem = make_problem(x_shape, tuple(weight.shape), None if bias is None else tuple(bias.shape),
                           _dtype_name(x.dtype, "x"), stride, padding, dilation, groups, activation=activation,
                           residual_shape=residual_shape, input_scale_shape=input_scale_shape)
    layout, weight_layout = _layouts(x, weight)
    return dataclasses.replace(problem, layout=layout, weight_layout=weight_layout)


def _channels_last(t: torch.Tensor) -> bool:
    """Whether a 4-D tensor is channels_last and not also contiguous (a C = 1 or 1 x 1 tensor is both)."""
    return t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()


def _layouts(x: torch.Tensor, weight: torch.Tensor) -> tuple[str, str]:
    """(layout, weight_layout) of a call, as torch's CUDA convolution picks its memory format: the
    output (and so x) is channels_last when x or the weight is, but never in float64; the weight is
    read as it is stored."""
    if x.dtype == torch.float64:
        return "NCHW", "KCHW"
    weight_channels_last = _channels_last(weight)
    return ("NHWC" if _channels_last(x) or weight_channels_last else "NCHW",
            "KHWC" if weight_channels_last else "KCHW")


def _op_problem(x, weight, bias, stride, padding, dilation, groups, residual=None, activation="none") -> ConvProblem:
    """The ConvProblem of the custom op's explicit arguments (padding = (top, left, bottom, right)),
    its layouts following the tensors' memory formats as in eager calls."""
    n, c, h, w = x.shape
    k, _, kh, kw = weight.shape
    top, left, bottom, right = padding
    layout, weight_layout = _layouts(x, weight)
    return ConvProblem(n=n, c=c, h=h, w=w, k=k, kh=kh, kw=kw, stride=tuple(stride), dilation=tuple(dilation),
                       pad_top=top, pad_left=left, pad_bottom=bottom, pad_right=right, groups=groups,
                       dtype=_dtype_name(x.dtype, "x"), has_bias=bias is not None, layout=layout,
                       weight_layout=weight_layout, activation=activation, has_residual=residual is not None)


def _memory_format(problem: ConvProblem) -> torch.memory_format:
    """The memory format of the problem's x and output."""
    return torch.channels_last if problem.layout == "NHWC" else torch.contiguous_format


def _raw_stream(device_index: int) -> int:
    """The handle of torch's current stream on ``device_index``."""
    if _get_raw_stream is not None:
        return _get_raw_stream(device_index)
    return torch.cuda.current_stream(device_index).cuda_stream


# torch's own fast accessor of the current stream's handle (what its generated code calls); the
# public torch.cuda.current_stream makes a Stream object each call.
_get_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


class _Call:
    """A checked CUDA call signature: the problem, its executable (None for an empty output), the
    output's shape and device, and the memory formats x, the weight and the output take (those of
    the problem's layouts)."""

    __slots__ = ("problem", "exe", "shape", "device", "device_index", "x_format", "weight_format")

    def __init__(self, problem: ConvProblem, device: torch.device, allow_tf32: bool):
        from .executor import executable
        from .launch import device_memory

        self.problem, self.device, self.device_index = problem, device, device.index
        self.shape = problem.out_shape
        check_output_size(self.shape, STORAGE_BYTES[problem.dtype], device_memory(self.device_index),
                          f"GPU {self.device_index}")
        self.exe = executable(problem, allow_tf32, self.device_index) if math.prod(self.shape) else None
        self.x_format = _memory_format(problem)
        self.weight_format = torch.channels_last if problem.weight_layout == "KHWC" else torch.contiguous_format


#: Call signature (shapes, strides, dtypes, devices, hyper-parameters, TF32 switch) -> _Call, for
#: CUDA calls that passed every check once (emptied when autotuning is switched: its executable was
#: planned under the mode of its time).
_CALLS: dict = tuning.cleared_on_mode_change({})


class WeightCache:
    """The prepared forms of one module's weight (transposed, channels-last, TF32-rounded or
    Winograd-transformed, as the chosen kernels read it), made once and kept while the weight's
    storage and version counter are unchanged: an in-place update, an optimizer step or
    load_state_dict bumps the version, and the next call prepares the weight again.

    Changes made through ``weight.data`` bypass the version counter (torch's own rule for
    ``.data``); call :meth:`clear` (``cupyconv.torch.clear_weight_caches(model)``) after those.
    Copies of a module (deepcopy, pickling) start empty.

    A cache ``kept_in_graphs`` (a fused module's folded weight: a tensor the module owns and refolds
    in place; any module's with ``convert(..., static_weights=True)``) is also read by CUDA graphs
    captured after its forms were made, as the folded weight itself is: :meth:`refresh` rewrites the
    forms in their buffers when the module refolds or its weight changed in place, and they are never
    freed under a graph that reads them. Any other cache is not read inside a capture: the
    graph prepares the weight itself, so that a replay reads the weight as it is then.
    """

    __slots__ = ("_stamp", "_forms", "kept_in_graphs", "_retired")

    def __init__(self, kept_in_graphs: bool = False):
        self._stamp, self._forms, self.kept_in_graphs = None, {}, kept_in_graphs
        # A kept cache's forms of a weight tensor it no longer follows (the module was given another):
        # graphs captured before may still read them, as they read the tensor they were captured with.
        self._retired = []

    def clear(self) -> None:
        """Forget the forms (a cache kept in graphs keeps their buffers, to be refreshed)."""
        if self.kept_in_graphs:
            self._mark_stale()
        else:
            self._stamp, self._forms = None, {}

    def _mark_stale(self) -> None:
        # The forms' weight tensor is kept (its address and strides), its version forgotten: the next
        # call outside a capture rewrites the forms in their buffers, which graphs may still read.
        if self._stamp is not None:
            self._stamp = (self._stamp[0], None, self._stamp[2])

    def __deepcopy__(self, memo):
        return WeightCache(self.kept_in_graphs)

    def __reduce__(self):
        return WeightCache, (self.kept_in_graphs,)

    @staticmethod
    def _stamp_of(weight: torch.Tensor) -> tuple:
        # The shape and dtype are in the preparation's key; the strides say how the storage is read.
        return weight.data_ptr(), weight._version, weight.stride()

    def address(self, weight: torch.Tensor, exe, stream: int, capturing: bool = False) -> int | None:
        """The address of the form ``exe`` reads, made on ``stream`` if new; None where ``weight``
        cannot be cached (an inference tensor has no version counter) or, inside a capture, where the
        graph must prepare it (a cache not kept in graphs; a form not made and current before)."""
        if weight.is_inference():
            return None
        stamp = self._stamp_of(weight)
        if capturing:  # launch nothing here and keep no stream of the capture
            form = self._forms.get(exe.weight.key) if self.kept_in_graphs and stamp == self._stamp else None
            return None if form is None else form[0].data_ptr()
        if stamp != self._stamp:
            if self.kept_in_graphs and self._stamp is not None and stamp[::2] == self._stamp[::2]:
                self.refresh(weight, stream)  # the same tensor, changed in place: the same buffers
            else:
                if self.kept_in_graphs:
                    self._retired += [form[0] for form in self._forms.values()]
                self._stamp, self._forms = stamp, {}
        preparation = exe.weight
        form = self._forms.get(preparation.key)
        if form is None:
            buffer = torch.empty(preparation.nbytes, dtype=torch.uint8, device=weight.device)
            exe.prepare_weight(weight.data_ptr(), buffer.data_ptr(), stream)
            form = self._forms[preparation.key] = (buffer, stream, exe)
        elif form[1] != stream:
            self._follow(form, weight.device)
            form = self._forms[preparation.key] = (form[0], stream, exe)
        return form[0].data_ptr()

    def refresh(self, weight: torch.Tensor, stream: int) -> None:
        """Prepare every kept form again from ``weight`` (changed in place), in its own buffer, on
        ``stream``. Inside a capture nothing is launched: the forms are marked stale, and the graph
        prepares the weight itself."""
        if torch.cuda.is_current_stream_capturing():
            self._mark_stale()
            return
        for key, (buffer, made_on, exe) in self._forms.items():
            if made_on != stream:
                self._follow((buffer, made_on), weight.device)
            exe.prepare_weight(weight.data_ptr(), buffer.data_ptr(), stream)
            self._forms[key] = (buffer, stream, exe)
        self._stamp = self._stamp_of(weight)

    @staticmethod
    def _follow(form, device) -> None:
        """The current stream waits for the work queued on the stream the form was last used on, and
        the allocator keeps its buffer until the current stream's work on it is done."""
        current = torch.cuda.current_stream(device)
        made = torch.cuda.Event()
        made.record(torch.cuda.ExternalStream(form[1], device=device))
        current.wait_event(made)
        form[0].record_stream(current)


def _allocate(nbytes: int):
    workspace = torch.empty(nbytes, dtype=torch.uint8, device=torch.cuda.current_device())
    return workspace, workspace.data_ptr()


#: The workspaces of the adapter's calls, from torch's caching allocator (inside a CUDA-graph
#: capture, from the graph's pool).
_WORKSPACES = Workspaces(_allocate)


def release_workspaces() -> None:
    """Give the workspaces kept per stream back to torch's caching allocator."""
    _WORKSPACES.clear()


def _forward(call: _Call, x, weight, bias, cache: WeightCache | None, residual=None, input_scale=None) -> torch.Tensor:
    """Run a checked CUDA call on torch's current stream of x's device; every allocation (output,
    workspace, prepared weight) from torch's caching allocator, so that it follows torch's stream
    order and, inside a CUDA-graph capture, comes from the graph's pool."""
    if torch.cuda.current_device() != call.device_index:
        with torch.cuda.device(call.device_index):
            return _forward(call, x, weight, bias, cache, residual, input_scale)
    out = torch.empty(call.shape, dtype=x.dtype, device=call.device, memory_format=call.x_format)
    exe = call.exe
    if exe is None:
        return out
    x = _in_format(x, call.x_format)
    cached_weight = weight
    weight = _in_format(weight, call.weight_format)
    bias = bias if bias is None or bias.is_contiguous() else bias.contiguous()
    # Read at the output's positions, so in the output's memory format (a copy, if one is made, must
    # live until the launch is queued: the workspace may otherwise get its memory).
    residual = None if residual is None else _in_format(residual, call.x_format)
    # (N, C, 1, 1) is dense (N, C) memory in either format.
    input_scale = None if input_scale is None else _in_format(input_scale, torch.contiguous_format)
    stream = _raw_stream(call.device_index)
    capturing = torch.cuda.is_current_stream_capturing()
    prepared = 0
    # Inside a capture the weight is prepared in the graph itself (a replay after the weight changed
    # must read the new weight, as torch's own convolution would), unless the cache is kept in graphs.
    if exe.weight is not None and cache is not None and weight is cached_weight:
        prepared = cache.address(weight, exe, stream, capturing) or 0
    _WORKSPACES.launch(exe, x.data_ptr(), weight.data_ptr(), prepared, 0 if bias is None else bias.data_ptr(),
                       out.data_ptr(), stream, capturing, 0 if residual is None else residual.data_ptr(),
                       0 if input_scale is None else input_scale.data_ptr())
    return out


def _in_format(t: torch.Tensor, memory_format: torch.memory_format) -> torch.Tensor:
    """``t`` dense in ``memory_format`` at an address the kernels can read in place (a copy if not)."""
    if t.is_contiguous(memory_format=memory_format) and not t.data_ptr() % OPERAND_ALIGNMENT:
        return t
    return t.clone(memory_format=memory_format)


# --- torch tensors as cupyconv arrays (the backward's and the transposed convolution's bridge) ---------

class _StreamHandle:
    """A raw CUDA stream handle under the CUDA stream protocol (what CuPy's Stream.from_external reads)."""

    __slots__ = ("ptr",)

    def __init__(self, ptr: int):
        self.ptr = ptr

    def __cuda_stream__(self):
        return 0, self.ptr


def _torch_allocator(device_index: int):
    """CuPy's allocator for the bridge: each allocation a uint8 tensor from torch's caching allocator on
    torch's current stream of the device (inside a CUDA-graph capture, from the graph's pool), owned by
    the CuPy memory that wraps it."""
    import cupy

    device = torch.device("cuda", device_index)

    def allocate(nbytes: int):
        buffer = torch.empty(nbytes, dtype=torch.uint8, device=device)
        return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(buffer.data_ptr(), nbytes, buffer, device_index), 0)

    return allocate


@contextlib.contextmanager
def _arrays(device: torch.device):
    """The backend ('cupy' or 'numpy') of cupyconv's array functions for tensors on ``device``. On CUDA,
    CuPy runs, for the duration, on the device, on torch's current stream of it and with its memory
    from torch's caching allocator: what it computes follows torch's stream order, can be captured in
    a CUDA graph, and its temporaries return to torch's cache. The CPU gives NumPy (what the tests use
    to check the bridge's formulas without a GPU)."""
    if device.type != "cuda":
        yield "numpy"
        return
    import cupy

    index = device.index if device.index is not None else torch.cuda.current_device()
    raw = _raw_stream(index)
    stream = cupy.cuda.Stream.from_external(_StreamHandle(raw)) if hasattr(cupy.cuda.Stream, "from_external") \
        else cupy.cuda.ExternalStream(raw, index)
    # torch's current device too: the DLPack exchanges compare streams with torch's current one.
    with torch.cuda.device(index), cupy.cuda.Device(index), stream, cupy.cuda.using_allocator(_torch_allocator(index)):
        yield "cupy"


def _to_array(t: torch.Tensor, memory_format: torch.memory_format, backend: str):
    """A 4-D (or 1-D) tensor as a C-contiguous array of ``backend``, without a copy where ``t`` is
    dense in ``memory_format`` already: the channels_last tensor's array is NHWC (KHWC for a weight),
    the tensor permuted (0, 2, 3, 1). bfloat16 travels as int16 (cupyconv reads the problem's dtype)."""
    t = _in_format(t.detach(), memory_format)
    if memory_format is torch.channels_last:
        t = t.permute(0, 2, 3, 1)
    if backend == "numpy":
        return t.numpy()
    import cupy

    return cupy.from_dlpack(t.view(torch.int16) if t.dtype == torch.bfloat16 else t)


def _from_array(a, channels_last: bool, dtype: torch.dtype, backend: str) -> torch.Tensor:
    """A new array of ``backend`` (4-D, in NHWC/KHWC order where ``channels_last``) as a logical
    (N, C, H, W) tensor of ``dtype``, without a copy: channels_last where the array is NHWC."""
    t = torch.from_numpy(a) if backend == "numpy" else torch.from_dlpack(a)
    if t.dtype != dtype:  # bfloat16 as int16
        t = t.view(dtype)
    return t.permute(0, 3, 1, 2) if channels_last else t


@torch.library.custom_op("cupyconv::conv2d", mutates_args=(), device_types="cuda")
def _conv2d_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: list[int],
               padding: list[int], dilation: list[int], groups: int, residual: torch.Tensor | None = None,
               activation: str = "none") -> torch.Tensor:
    """cupyconv's kernel on torch's current stream of x's device: activation(conv + bias + residual).
    padding is (top, left, bottom, right). What torch.compile calls; eager calls skip the op's
    dispatch (_conv2d). Differentiable without an epilogue only: conv2d() computes the epilogue of
    calls that need gradients with torch's operations."""
    problem = _op_problem(x, weight, bias, stride, padding, dilation, groups, residual, activation)
    return _forward(_Call(problem, x.device, _allow_tf32(x.dtype)), x, weight, bias, None, residual)


@_conv2d_op.register_kernel("cpu")
def _conv2d_op_cpu(x, weight, bias, stride, padding, dilation, groups, residual=None, activation="none"):
    # Makes the op total over devices (and testable in CPU-only CI); conv2d() itself sends CPU
    # tensors to F.conv2d directly.
    top, left, bottom, right = padding
    y = _epilogue(F.conv2d(F.pad(x, (left, right, top, bottom)), weight, bias, stride, 0, dilation, groups),
                  residual, activation)
    return y.contiguous(memory_format=_memory_format(_op_problem(x, weight, bias, stride, padding, dilation, groups)))


@_conv2d_op.register_fake
def _conv2d_op_fake(x, weight, bias, stride, padding, dilation, groups, residual=None, activation="none"):
    problem = _op_problem(x, weight, bias, stride, padding, dilation, groups)
    return torch.empty(problem.out_shape, dtype=x.dtype, device=x.device, memory_format=_memory_format(problem))


def _save_for_backward(ctx, x, weight, stride, padding, dilation, groups) -> None:
    needs_x, needs_weight = ctx.needs_input_grad[:2]
    # Each gradient needs only the other operand; keep just what a needed gradient reads.
    ctx.save_for_backward(x if needs_weight else None, weight if needs_x else None)
    ctx.x_shape, ctx.weight_shape = x.shape, weight.shape
    ctx.conv = (tuple(stride), tuple(padding), tuple(dilation), groups)


def _conv2d_op_setup_context(ctx, inputs, output):
    _save_for_backward(ctx, *inputs[:2], *inputs[3:7])
    ctx.epilogue = inputs[7] is not None or inputs[8] != "none"


def _gradients(ctx, grad_out):
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
    return grad_x, grad_weight, grad_bias


def _conv2d_op_backward(ctx, grad_out):
    """The custom op's autograd formula (what torch.compile traces): torch's gradient functions
    (_gradients) whatever set_backward chose, so that the compiled graph holds only ops it knows;
    eager calls run cupyconv's gradient kernels (_Conv2dFunction)."""
    if ctx.epilogue:
        raise RuntimeError("cupyconv::conv2d has no gradient through its epilogue (activation, residual); "
                           "cupyconv.torch.conv2d computes the epilogue of calls that need gradients with torch's "
                           "operations")
    return *_gradients(ctx, grad_out), None, None, None, None, None, None


torch.library.register_autograd("cupyconv::conv2d", _conv2d_op_backward, setup_context=_conv2d_op_setup_context)


def _kernel_gradients(ctx, grad_out, problem: ConvProblem):
    """Gradients by cupyconv's kernels for each input that needs one, in the problem's layouts. On CUDA,
    each gradient that is one program (grad.weight_gradient_executable; input_gradient_executable
    where the input gradient is one stride phase) is launched like a forward call (_launch_gradients);
    the rest go through cupyconv.grad on CuPy arrays on torch's stream and allocator (_arrays), as do
    CPU tensors on NumPy's. The bias gradient is a sum."""
    x, weight = ctx.saved_tensors
    needs_x, needs_weight, needs_bias = ctx.needs_input_grad[:3]
    x_format = _memory_format(problem)
    weight_format = torch.channels_last if problem.weight_layout == "KHWC" else torch.contiguous_format
    grad_x = grad_weight = grad_bias = None
    if grad_out.is_cuda:
        grad_x, grad_weight = _launch_gradients(problem, grad_out, x if needs_weight else None,
                                                weight if needs_x else None, x_format, weight_format)
    if (needs_x and grad_x is None) or (needs_weight and grad_weight is None):
        with _arrays(grad_out.device) as backend:
            dy = _to_array(grad_out, x_format, backend)
            if needs_x and grad_x is None:
                dx = input_gradient(problem, _to_array(weight, weight_format, backend), dy, backend,
                                    backend == "cupy" and _allow_tf32(grad_out.dtype))
                grad_x = _from_array(dx, problem.layout == "NHWC", grad_out.dtype, backend)
            if needs_weight and grad_weight is None:
                dw = weight_gradient(problem, _to_array(x, x_format, backend), dy, backend,
                                     backend == "cupy" and _allow_tf32(grad_out.dtype))
                grad_weight = _from_array(dw, problem.weight_layout == "KHWC", grad_out.dtype, backend)
    if needs_bias:
        grad_bias = grad_out.sum((0, 2, 3))
    return grad_x, grad_weight, grad_bias


def _launch(exe, device_index: int, **tensors) -> None:
    """A program without weight preparation (the gradients', the transposed convolution's) on torch's
    current stream of the current device ``device_index``, its operands CUDA tensors by name (None:
    absent), its workspace from torch's caching allocator."""
    _WORKSPACES.run(exe, _raw_stream(device_index), torch.cuda.is_current_stream_capturing(),
                    **{name: t.data_ptr() for name, t in tensors.items() if t is not None})


def _launch_gradients(problem: ConvProblem, grad_out, x, weight, x_format, weight_format):
    """(grad_x, grad_weight) of CUDA tensors by the gradients' programs on torch's current stream, the
    outputs and workspaces from torch's caching allocator (as _forward's): grad_x where ``weight`` is
    given and the input gradient is one program, grad_weight where ``x`` is given; None for the rest."""
    index = grad_out.device.index
    if torch.cuda.current_device() != index:
        with torch.cuda.device(index):
            return _launch_gradients(problem, grad_out, x, weight, x_format, weight_format)
    allow_tf32 = _allow_tf32(grad_out.dtype)
    dy = _in_format(grad_out, x_format)
    grad_x = grad_weight = None
    exe = None if weight is None else input_gradient_executable(problem, allow_tf32, index)
    if exe is not None:
        grad_x = torch.empty(problem.x_shape, dtype=dy.dtype, device=dy.device, memory_format=x_format)
        _launch(exe, index, x=dy, weight=_in_format(weight, weight_format), out=grad_x)
    if x is not None:
        grad_weight = torch.empty(problem.weight_shape, dtype=dy.dtype, device=dy.device, memory_format=weight_format)
        _launch(weight_gradient_executable(problem, allow_tf32, index), index, x=_in_format(x, x_format),
                grad_output=dy, out=grad_weight)
    return grad_x, grad_weight


def _kernel_backward(n: int) -> bool:
    """Whether a backward runs cupyconv's gradient kernels: chosen by set_backward, not recording a
    graph of its own (create_graph needs torch's differentiable functions) and not empty."""
    return _BACKWARD == "cupyconv" and not torch.is_grad_enabled() and n > 0


class _Conv2dFunction(torch.autograd.Function):
    """The eager call with autograd: the custom op's formula without the op's Python dispatch, its
    gradients by cupyconv's kernels (_kernel_gradients) unless set_backward chose torch's or the
    backward records a graph (create_graph: torch's differentiable functions, for second derivatives)."""

    @staticmethod
    def forward(ctx, x, weight, bias, call, cache):
        p = call.problem
        _save_for_backward(ctx, x, weight, p.stride, (p.pad_top, p.pad_left, p.pad_bottom, p.pad_right), p.dilation,
                           p.groups)
        ctx.problem = p
        return _forward(call, x, weight, bias, cache)

    @staticmethod
    def backward(ctx, grad_out):
        if _kernel_backward(ctx.problem.n):
            return *_kernel_gradients(ctx, grad_out, ctx.problem), None, None
        return *_gradients(ctx, grad_out), None, None


def _op_conv2d(x, weight, bias, problem: ConvProblem, residual=None):
    """A checked 4-D problem through the custom op (what torch.compile traces); the output in the memory
    format torch's convolution would give (the op computes channels_last tensors in place)."""
    return torch.ops.cupyconv.conv2d(x, weight, bias, list(problem.stride),
                                     [problem.pad_top, problem.pad_left, problem.pad_bottom, problem.pad_right],
                                     list(problem.dilation), problem.groups, residual, problem.activation)


def _checked_conv2d(x, weight, bias, stride, padding, dilation, groups, cache, activation, residual, input_scale=None):
    """Every check, then the call: on CPU torch's conv2d, under torch.compile the custom op (on x times
    the input scale by torch's multiply, which the compiler fuses), 3-D input as one image, else the
    eager path, whose checked signature is kept for the next call."""
    problem = _problem(x, weight, bias, stride, padding, dilation, groups, activation, residual, input_scale)
    if input_scale is not None and (x.device.type != "cuda" or torch.compiler.is_compiling()):
        x, input_scale = x * input_scale, None
    if x.device.type != "cuda":
        return _epilogue(F.conv2d(x, weight, bias, stride, padding, dilation, groups), residual, problem.activation)
    if x.dim() == 3:
        return _conv2d(x.unsqueeze(0), weight, bias, stride, padding, dilation, groups, cache, activation,
                       None if residual is None else residual.unsqueeze(0),
                       None if input_scale is None else input_scale.unsqueeze(0)).squeeze(0)
    if torch.compiler.is_compiling():
        return _op_conv2d(x, weight, bias, problem, residual)
    call = _Call(problem, x.device, _allow_tf32(x.dtype))
    try:
        _CALLS[_signature(x, weight, bias, stride, padding, dilation, groups, activation, residual, input_scale)] = call
    except TypeError:  # unhashable arguments (lists): checked on every call
        pass
    return call


def _signature(x, weight, bias, stride, padding, dilation, groups, activation, residual, input_scale=None) -> tuple:
    """What a call's checks depend on. Raises AttributeError or TypeError for non-tensors and
    unhashable arguments (which then take the full checks)."""
    return (x.shape, x.stride(), x.dtype, x.get_device(), weight.shape, weight.stride(), weight.dtype,
            weight.get_device(),
            None if bias is None else (bias.shape, bias.stride(), bias.dtype, bias.get_device()),
            stride, padding, dilation, groups, x.dtype is torch.float32 and _cudnn_allow_tf32(),
            activation,
            None if residual is None else (residual.shape, residual.stride(), residual.dtype, residual.get_device()),
            None if input_scale is None else (input_scale.shape, input_scale.stride(), input_scale.dtype,
                                              input_scale.get_device()))


def _needs_grad(*tensors) -> bool:
    if not torch.is_grad_enabled():
        return False
    for t in tensors:  # a loop, not any() over a generator: every call's path
        if isinstance(t, torch.Tensor) and t.requires_grad:
            return True
    return False


def _conv2d(x, weight, bias, stride, padding, dilation, groups, cache: WeightCache | None, activation=None,
            residual=None, input_scale=None):
    """conv2d with a module's weight cache (None: prepare the weight on every call), an input scale and
    an epilogue."""
    if input_scale is not None and _needs_grad(x, weight, bias, residual, input_scale):
        # Differentiable: the scale by torch's multiply (after the same checks), the rest as below.
        _problem(x, weight, bias, stride, padding, dilation, groups, activation, residual, input_scale)
        return _conv2d(x * input_scale, weight, bias, stride, padding, dilation, groups, cache, activation, residual)
    if (activation is not None or residual is not None) and _needs_grad(x, weight, bias, residual):
        # The fused kernel keeps no pre-activation for a backward: the convolution alone runs on
        # cupyconv, the epilogue on torch's differentiable operations (after the same checks).
        problem = _problem(x, weight, bias, stride, padding, dilation, groups, activation, residual)
        return _epilogue(_conv2d(x, weight, bias, stride, padding, dilation, groups, cache), residual,
                         problem.activation)
    if torch.compiler.is_compiling():  # traced: the custom op, never the eager path's caches
        return _checked_conv2d(x, weight, bias, stride, padding, dilation, groups, cache, activation, residual,
                               input_scale)
    try:
        call = _CALLS.get(_signature(x, weight, bias, stride, padding, dilation, groups, activation, residual,
                                     input_scale))
    except (AttributeError, TypeError):
        call = None
    if call is None:
        call = _checked_conv2d(x, weight, bias, stride, padding, dilation, groups, cache, activation, residual,
                               input_scale)
        if not isinstance(call, _Call):  # computed already (CPU, compiled or unbatched)
            return call
    if _needs_grad(x, weight, bias):
        return _Conv2dFunction.apply(x, weight, bias, call, cache)
    return _forward(call, x, weight, bias, cache, residual, input_scale)


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *, activation=None, residual=None,
           input_scale=None):
    """2-D convolution (cross-correlation) of torch tensors, as ``torch.nn.functional.conv2d``, with an
    optional fused epilogue, ``activation(conv2d(x, weight) + bias + residual)``, and input scale,
    ``conv2d(x * input_scale, ...)``.

    CUDA tensors run cupyconv's kernel on torch's current stream of x's device, with no copy in
    or out; other devices run ``torch.nn.functional.conv2d``. Differentiable, and traceable by
    ``torch.compile(fullgraph=True)``. The arguments are checked once per call signature (shapes,
    strides, dtypes, devices, hyper-parameters); a signature seen before costs a lookup, the
    allocations and the launches. The weight is prepared (transposed, made channels-last, rounded
    or transformed, as the chosen kernel reads it) on every call here; :class:`Conv2d` keeps it.

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
        activation: None, 'relu', 'relu6', 'silu', 'gelu' (exact, torch's default), 'sigmoid' or
            'tanh', applied to the float32 (float64) accumulators before the one rounding.
        residual: None or a tensor of the output's shape, x's dtype and device, added before the
            activation (any memory format; the output's is read in place).
        input_scale: None or an (N, C, 1, 1) tensor (C, 1, 1 for unbatched x) of x's dtype and
            device: the convolution is of ``x * input_scale``, each image's channels scaled and
            rounded to x's dtype (squeeze-and-excitation's gate). The 1x1 channels-last kernel
            scales as it loads x; other kernels read a scaled copy made first. Where a gradient is
            needed, and under torch.compile, the multiply is torch's.

        Without gradients the epilogue runs inside the convolution's kernel; where a gradient is
        needed it runs as torch's operations after the convolution (the kernel keeps no
        pre-activation for the backward), with the same result within the dtype's rounding.

    Returns:
        (N, K, Ho, Wo) tensor (or (K, Ho, Wo)) of x's dtype on x's device, allocated by torch.
        float32 is TF32 when torch.backends.cudnn.allow_tf32 is true (torch's default), else strict
        IEEE float32; float16 and bfloat16 accumulate in float32.

    Raises:
        TypeError: a non-tensor argument, an unsupported or mismatched dtype, or an activation that
            is not a string.
        ValueError: tensors on different devices, inconsistent shapes, bad stride, padding,
            dilation or groups, a kernel larger than the padded input, an output larger than the
            GPU's memory, an unknown activation, a residual not of the output's shape or an
            input_scale not (N, C, 1, 1).
    """
    return _conv2d(x, weight, bias, stride, padding, dilation, groups, None, activation, residual, input_scale)


class Conv2d(nn.Conv2d):
    """``torch.nn.Conv2d`` computed by cupyconv on CUDA tensors (torch's conv2d elsewhere).

    Same constructor arguments, parameters (``weight``, ``bias``), initialisation and state_dict as
    nn.Conv2d, so the two load each other's checkpoints. padding_mode 'reflect', 'replicate' and
    'circular' pad with torch.nn.functional.pad and then run an unpadded cupyconv convolution, as
    nn.Conv2d does with its own kernel. See :func:`conv2d` for precision and devices.

    The weight's prepared forms are kept in the module (a :class:`WeightCache`, not in the
    state_dict) while the weight's storage and version are unchanged: an optimizer step,
    ``load_state_dict`` or any in-place update under torch's version counter prepares it again on
    the next call. After changes through ``weight.data``, which torch does not count, call
    :func:`clear_weight_caches`.
    """

    def _weight_cache(self) -> WeightCache:
        # Made on first use: convert() switches a module's class without running __init__.
        cache = self.__dict__.get("_cupyconv_weights")
        if cache is None:
            cache = self.__dict__["_cupyconv_weights"] = WeightCache()
        return cache

    def _conv_forward(self, input, weight, bias):
        if self.padding_mode != "zeros":
            return _conv2d(F.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode),
                           weight, bias, self.stride, 0, self.dilation, self.groups, self._weight_cache())
        return _conv2d(input, weight, bias, self.stride, self.padding, self.dilation, self.groups,
                       self._weight_cache())

    def _get_name(self):
        return "cupyconv.Conv2d"


# --- transposed convolution ---------------------------------------------------------------------

def _transpose_problem(x, weight, bias, stride, padding, output_padding, groups, dilation) -> TransposeProblem:
    """Check every argument of a conv_transpose2d call (a 3-D x counts as one image) in torch's
    logical shapes; raises before any launch. The layouts follow the tensors' memory formats as
    conv2d's do (_layouts)."""
    _check_tensors(x, weight, bias)
    if x.dim() not in (3, 4):
        raise ValueError(f"x must be 4-D (N, C_in, H, W) or 3-D (C_in, H, W), got shape {tuple(x.shape)}")
    if weight.dim() != 4:
        raise ValueError(f"weight must be 4-D (C_in, C_out/groups, kh, kw), got shape {tuple(weight.shape)}")
    x_shape = (1, *x.shape) if x.dim() == 3 else tuple(x.shape)
    tp = make_transpose_problem(x_shape, tuple(weight.shape), None if bias is None else tuple(bias.shape),
                                _dtype_name(x.dtype, "x"), stride, padding, output_padding, groups, dilation)
    layout, weight_layout = _layouts(x, weight)
    return dataclasses.replace(tp, layout=layout, weight_layout=weight_layout)


def _transposed(tp: TransposeProblem, x, weight, bias) -> torch.Tensor:
    """The checked transposed convolution ``tp`` of 4-D tensors by cupyconv, on torch's current stream of
    x's device with torch's allocator: conv_transpose's program where it takes ``tp``, else
    conv_transpose.transposed on CuPy arrays (on the CPU, NumPy's path: for tests); a new tensor,
    channels_last where tp's layout is NHWC."""
    x_format = torch.channels_last if tp.layout == "NHWC" else torch.contiguous_format
    weight_format = torch.channels_last if tp.weight_layout == "KHWC" else torch.contiguous_format
    if x.is_cuda:
        from .families.implicit_gemm_conv2d import GEMM_MIN_GROUP_CHANNELS
        from .launch import device_memory

        index = x.device.index
        check_output_size((tp.n, tp.c, tp.h, tp.w), STORAGE_BYTES[tp.dtype], device_memory(index), f"GPU {index}")
        if torch.cuda.current_device() != index:
            with torch.cuda.device(index):
                return _transposed(tp, x, weight, bias)
        exe = transposed_executable(tp, _allow_tf32(x.dtype), index, GEMM_MIN_GROUP_CHANNELS)
        if exe is not None:  # one program, launched like a forward call
            out = torch.empty((tp.n, tp.c, tp.h, tp.w), dtype=x.dtype, device=x.device, memory_format=x_format)
            _launch(exe, index, x=_in_format(x, x_format), weight=_in_format(weight, weight_format),
                    bias=None if bias is None else _in_format(bias, torch.contiguous_format), out=out)
            return out
    with _arrays(x.device) as backend:
        y = transposed(_to_array(x, x_format, backend), _to_array(weight, weight_format, backend),
                       None if bias is None else _to_array(bias, torch.contiguous_format, backend), tp, backend,
                       backend == "cupy" and _allow_tf32(x.dtype))
        return _from_array(y, tp.layout == "NHWC", x.dtype, backend)


def _transposed_gradients(ctx, grad_y):
    """The gradients of y = conv_transpose2d(x, weight) + bias, for each input that needs one.

    The transposed convolution is the input gradient of the conv2d C of weight ``weight`` (C_in as
    its output channels), stride, padding, dilation and groups whose input has y's shape. So
    grad x = C(grad y), and grad weight = C's weight gradient with C's input grad y and C's output
    gradient x. C's output has floor(output_padding / stride) more rows (columns) than x where
    output_padding >= stride (allowed when the dilation is larger): grad x is cropped to x's size, and
    x is read with zero rows (columns) added at the bottom (right) for the weight gradient. By
    cupyconv's kernels (its conv2d; weight_gradient) as set_backward chooses, else, and in a backward
    that records a graph, by torch's differentiable functions."""
    x, weight = ctx.saved_tensors
    tp: TransposeProblem = ctx.tp
    needs_x, needs_weight, needs_bias = ctx.needs_input_grad[:3]
    stride, padding, dilation, groups = tp.stride, (tp.pad_top, tp.pad_left), tp.dilation, tp.groups
    conv = make_problem((tp.n, tp.c, tp.h, tp.w), ctx.weight_shape, None, tp.dtype, stride, padding, dilation, groups)
    extra_h, extra_w = conv.ho - tp.hy, conv.wo - tp.wy
    kernels = _kernel_backward(tp.n)
    grad_x = grad_weight = grad_bias = None
    if needs_x:
        if kernels:
            with torch.no_grad():
                grad_x = _conv2d(grad_y, weight, None, stride, padding, dilation, groups, None)
        else:
            grad_x = F.conv2d(grad_y, weight, None, stride, padding, dilation, groups)
        if extra_h or extra_w:
            grad_x = grad_x[:, :, :tp.hy, :tp.wy]
    if needs_weight:
        x_read = F.pad(x, (0, extra_w, 0, extra_h)) if extra_h or extra_w else x
        if kernels and grad_y.is_cuda:
            problem = dataclasses.replace(conv, layout=tp.layout, weight_layout=tp.weight_layout)
            index = grad_y.device.index
            grad_weight = torch.empty(problem.weight_shape, dtype=grad_y.dtype, device=grad_y.device,
                                      memory_format=torch.channels_last if tp.weight_layout == "KHWC"
                                      else torch.contiguous_format)
            with torch.cuda.device(index):
                _launch(weight_gradient_executable(problem, _allow_tf32(grad_y.dtype), index), index,
                        x=_in_format(grad_y, _memory_format(problem)),
                        grad_output=_in_format(x_read, _memory_format(problem)), out=grad_weight)
        elif kernels:
            problem = dataclasses.replace(conv, layout=tp.layout, weight_layout=tp.weight_layout)
            memory_format = _memory_format(problem)
            with _arrays(grad_y.device) as backend:
                dw = weight_gradient(problem, _to_array(grad_y, memory_format, backend),
                                     _to_array(x_read, memory_format, backend), backend,
                                     backend == "cupy" and _allow_tf32(grad_y.dtype))
                grad_weight = _from_array(dw, tp.weight_layout == "KHWC", grad_y.dtype, backend)
        else:
            grad_weight = torch.nn.grad.conv2d_weight(grad_y, ctx.weight_shape, x_read, stride, padding, dilation,
                                                      groups)
    if needs_bias:
        grad_bias = grad_y.sum((0, 2, 3))
    return grad_x, grad_weight, grad_bias


class _ConvTranspose2dFunction(torch.autograd.Function):
    """conv_transpose2d of CUDA tensors with autograd (_transposed_gradients)."""

    @staticmethod
    def forward(ctx, x, weight, bias, tp):
        needs_x, needs_weight = ctx.needs_input_grad[:2]
        ctx.save_for_backward(x if needs_weight else None, weight if needs_x else None)
        ctx.tp, ctx.weight_shape = tp, tuple(weight.shape)
        return _transposed(tp, x, weight, bias)

    @staticmethod
    def backward(ctx, grad_y):
        return *_transposed_gradients(ctx, grad_y), None


def conv_transpose2d(x, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """2-D transposed convolution of torch tensors, as ``torch.nn.functional.conv_transpose2d`` (the
    gradient of a conv2d with respect to its input, plus a bias).

    CUDA tensors run cupyconv's transposed convolution (cupyconv.conv_transpose: the forward kernels,
    one stride phase at a time, no zero-stuffed input) on torch's current stream of x's device, the
    tensors read and written in place and the temporaries from torch's caching allocator;
    other devices, and calls traced by torch.compile, run ``torch.nn.functional.conv_transpose2d``
    after the same checks. Differentiable: the gradients are a cupyconv conv2d (x) and cupyconv's
    weight gradient (weight), or torch's (see :func:`set_backward`).

    Args:
        x: (N, C_in, H, W) or unbatched (C_in, H, W); float16, bfloat16, float32 or float64; any
            strides. A channels_last x (or weight) gives a channels_last output, as torch's
            convolutions do (float64 never).
        weight: (C_in, C_out // groups, kh, kw), x's dtype and device.
        bias: optional (C_out,).
        stride, dilation: int or (h, w), >= 1. Default 1.
        padding: int or (h, w), >= 0: dilation (k - 1) - padding zeros on each side of the input, as
            torch. Default 0.
        output_padding: int or (h, w), >= 0 and smaller than the stride or the dilation: extra rows
            and columns at the bottom and right of the output. Default 0.
        groups: >= 1, dividing C_in and C_out. Default 1.

    Returns:
        (N, C_out, Ho, Wo) (or (C_out, Ho, Wo)), Ho = (H - 1) sh - 2 ph + dh (kh - 1) +
        output_padding + 1, likewise Wo; x's dtype and device. float32 is TF32 when
        torch.backends.cudnn.allow_tf32 is true (torch's default), else strict IEEE float32.

    Raises:
        TypeError: a non-tensor argument or an unsupported or mismatched dtype.
        ValueError: tensors on different devices, inconsistent shapes, bad stride, padding,
            output_padding, dilation or groups, or an output larger than the GPU's memory.
    """
    tp = _transpose_problem(x, weight, bias, stride, padding, output_padding, groups, dilation)
    if x.device.type != "cuda" or torch.compiler.is_compiling():
        return F.conv_transpose2d(x, weight, bias, stride, padding, output_padding, groups, dilation)
    if x.dim() == 3:
        return conv_transpose2d(x.unsqueeze(0), weight, bias, stride, padding, output_padding, groups,
                                dilation).squeeze(0)
    if _needs_grad(x, weight, bias):
        return _ConvTranspose2dFunction.apply(x, weight, bias, tp)
    return _transposed(tp, x, weight, bias)


class ConvTranspose2d(nn.ConvTranspose2d):
    """``torch.nn.ConvTranspose2d`` computed by cupyconv on CUDA tensors (torch's conv_transpose2d
    elsewhere).

    Same constructor arguments, parameters, initialisation and state_dict as nn.ConvTranspose2d, so
    the two load each other's checkpoints; ``forward(input, output_size=None)`` picks the
    output_padding that gives ``output_size`` as nn.ConvTranspose2d does. See
    :func:`conv_transpose2d` for precision, devices and gradients.
    """

    def forward(self, input, output_size=None):
        if self.padding_mode != "zeros":
            raise ValueError("Only `zeros` padding mode is supported for ConvTranspose2d")
        output_padding = self._output_padding(input, output_size, self.stride, self.padding, self.kernel_size, 2,
                                              self.dilation)
        return conv_transpose2d(input, self.weight, self.bias, self.stride, self.padding, output_padding, self.groups,
                                self.dilation)

    def _get_name(self):
        return "cupyconv.ConvTranspose2d"


# --- 1-D convolution ----------------------------------------------------------------------------

def _conv1d(x, weight, bias, stride, padding, dilation, groups, cache: WeightCache | None):
    """conv1d as a conv2d of height 1 on views (x (N, C, 1, L), weight (K, C/groups, 1, k)) through
    _conv2d, which gives the autograd, the custom op under torch.compile and the memory formats; on
    other devices, torch's conv1d after the same checks."""
    _check_tensors(x, weight, bias)
    if x.dim() not in (2, 3):
        raise ValueError(f"x must be 3-D (N, C, L) or 2-D (C, L), got shape {tuple(x.shape)}")
    if weight.dim() != 3:
        raise ValueError(f"weight must be 3-D (K, C/groups, k), got shape {tuple(weight.shape)}")
    rows = (_single(stride, "stride"), _single(padding, "padding", ("same", "valid")), _single(dilation, "dilation"))
    if x.device.type != "cuda":
        _problem(x.unsqueeze(-2), weight.unsqueeze(-2), bias, *rows, groups)
        return F.conv1d(x, weight, bias, stride, padding, dilation, groups)
    return _conv2d(x.unsqueeze(-2), weight.unsqueeze(-2), bias, rows[0], rows[1], rows[2], groups, cache).squeeze(-2)


def conv1d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """1-D convolution (cross-correlation) of torch tensors, as ``torch.nn.functional.conv1d``.

    A conv2d of height 1 through :func:`conv2d` (views, no copies): CUDA tensors run cupyconv's
    kernels, with conv2d's autograd (cupyconv's gradient kernels, see :func:`set_backward`), streams,
    precision and torch.compile support; other devices run ``torch.nn.functional.conv1d`` after the
    same checks.

    Args:
        x: (N, C, L) or unbatched (C, L); float16, bfloat16, float32 or float64.
        weight: (K, C // groups, k), x's dtype and device.
        bias: optional (K,).
        stride, dilation: int or 1-tuple, >= 1. Default 1.
        padding: int or 1-tuple zeros on both ends, 'valid' or 'same' (stride 1). Default 0.
        groups: >= 1, dividing C and K. Default 1.

    Returns:
        (N, K, Lo) (or (K, Lo)), Lo = (L + 2 p - d (k - 1) - 1) // s + 1; x's dtype and device.

    Raises:
        TypeError, ValueError: as :func:`conv2d`; shape errors name the height-1 view they were read in.
    """
    return _conv1d(x, weight, bias, stride, padding, dilation, groups, None)


class Conv1d(nn.Conv1d):
    """``torch.nn.Conv1d`` computed by cupyconv on CUDA tensors (torch's conv1d elsewhere): a conv2d
    of height 1, see :func:`conv1d`.

    Same constructor arguments, parameters, initialisation and state_dict as nn.Conv1d. padding_mode
    'reflect', 'replicate' and 'circular' pad with torch.nn.functional.pad and then run an unpadded
    convolution, as nn.Conv1d does. The weight's prepared forms are kept as :class:`Conv2d` keeps
    them.
    """

    _weight_cache = Conv2d._weight_cache

    def _conv_forward(self, input, weight, bias):
        if self.padding_mode != "zeros":
            return _conv1d(F.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode), weight, bias,
                           self.stride, 0, self.dilation, self.groups, self._weight_cache())
        return _conv1d(input, weight, bias, self.stride, self.padding, self.dilation, self.groups, self._weight_cache())

    def _get_name(self):
        return "cupyconv.Conv1d"


def clear_weight_caches(model: nn.Module) -> None:
    """Forget every prepared weight of the cupyconv modules in ``model`` and fold fused BatchNorms
    again (needed only after changes through ``.data``, which torch's version counter does not see,
    and, for CUDA graphs of a fused model captured before, after changes other than its
    load_state_dict)."""
    for module in model.modules():
        cache = module.__dict__.get("_cupyconv_weights")
        if cache is not None:
            cache.clear()
        if hasattr(module, "refold"):  # a FusedConv2d: its folded BatchNorm too
            module.refold()


#: The torch modules convert() switches (exactly these classes) and the cupyconv modules they become.
CONVERSIONS = {nn.Conv2d: Conv2d, nn.ConvTranspose2d: ConvTranspose2d, nn.Conv1d: Conv1d}


def _left_alone(module: nn.Module, inverse: bool) -> bool:
    """A convolution convert() would be expected to switch but cannot: a subclass it does not know."""
    ours = tuple(CONVERSIONS.values())
    if inverse:
        return isinstance(module, ours) and type(module) not in ours
    return isinstance(module, tuple(CONVERSIONS)) and type(module) not in CONVERSIONS and not isinstance(module, ours)


def refresh_weight_caches(model: nn.Module) -> None:
    """Remake now, in their buffers, the prepared weights that CUDA graphs of ``model`` read -- a
    ``convert(..., static_weights=True)`` model's, a fused model's folded ones -- from the weights as
    they are: for graphs captured before an in-place change (an optimizer step, a copy) that no call of
    the model outside a capture has seen since. On torch's current stream."""
    _refresh_kept_forms(model, refold=True)


def _refresh_kept_forms(model: nn.Module, refold: bool) -> None:
    """refresh_weight_caches; ``refold=False`` leaves fused modules with a BatchNorm alone (after a
    load_state_dict, which refolds them itself: torch_fusion's post-hook)."""
    for module in model.modules():
        if getattr(module, "batch_norm", None) is not None:  # a FusedConv2d's folded BatchNorm and its forms
            if refold:
                module.refold()
            continue
        cache = module.__dict__.get("_cupyconv_weights")
        weight = getattr(module, "weight", None)
        if cache is not None and cache.kept_in_graphs and weight is not None and weight.is_cuda:
            cache.refresh(weight, _raw_stream(weight.device.index))


def _keep_forms_in_graphs(module: nn.Module) -> None:
    """static_weights: ``module``'s weight cache kept in CUDA graphs (a new one if its own is not)."""
    cache = module.__dict__.get("_cupyconv_weights")
    if cache is None or not cache.kept_in_graphs:
        module.__dict__["_cupyconv_weights"] = WeightCache(kept_in_graphs=True)


def _refresh_after_load(model: nn.Module, incompatible_keys) -> None:
    """load_state_dict's post-hook on a static_weights model: its graphs read the loaded weights (a fused
    model's folded ones are refolded by its own hook)."""
    _refresh_kept_forms(model, refold=False)


def convert(model: nn.Module, inverse: bool = False, fuse: bool = False, static_weights: bool = False) -> nn.Module:
    """Make every plain ``nn.Conv2d``, ``nn.ConvTranspose2d`` and ``nn.Conv1d`` in ``model`` a cupyconv
    :class:`Conv2d`, :class:`ConvTranspose2d` and :class:`Conv1d`, in place; with ``fuse=True``, also
    fuse each conv -> BatchNorm2d -> (+ residual) -> activation chain of an eval-mode model into one
    cupyconv call.

    Each module keeps its identity: its class is switched, so parameters (the same Parameter
    objects), buffers, hooks, device, dtype and training flag are untouched, and optimizers or
    other references to it stay valid. Only modules whose type is exactly one of those three
    classes are switched: a subclass may override forward in ways cupyconv cannot honour, so
    subclasses (LazyConv2d, LazyConvTranspose2d, parametrized or quantized convolutions, user
    classes), and convolutions whose dtype cupyconv does not compute in, are left alone and listed
    in one UserWarning.

    ``fuse=True`` (cupyconv.torch_fusion) traces the converted model with torch.fx and returns a
    new ``torch.fx.GraphModule`` that shares the model's modules, parameters and buffers, so its
    state_dict has the same keys and loads the same checkpoints. Each chain becomes a
    :class:`cupyconv.torch_fusion.FusedConv2d` at the convolution's path: the BatchNorm folded
    into the weight and bias (float64, rounded once; again whenever they or the statistics change),
    the residual add and the activation (ReLU, ReLU6, SiLU, exact GELU, Sigmoid, Tanh, as modules,
    functions or methods) in the kernel's epilogue. A model torch.fx cannot trace is returned
    unfused, and BatchNorms that cannot be folded are left alone, listed in one UserWarning.
    Folding freezes the BatchNorm statistics, so it is refused in training mode.

    Args:
        model: any module; it may itself be an nn.Conv2d.
        inverse: switch cupyconv Conv2d, ConvTranspose2d and Conv1d modules back to plain nn.Conv2d,
            nn.ConvTranspose2d and nn.Conv1d instead; given a fused model, return the original model
            (its modules restored, with whatever the fused model loaded since, as they share their
            tensors).
        fuse: fuse chains as above (the model must be in eval mode).
        static_weights: for inference in CUDA graphs. Each converted module's prepared weight (the
            transposed, channels-last, TF32-rounded or Winograd-transformed form its kernel reads) is
            made before a capture and read by the graph, as a fused module's folded weight is, instead
            of being prepared again inside every replay (H200, TF32 NCHW: ResNet-50 at batch 1 0.891 ->
            0.811 ms a replay; benchmarks/profile/graph_weights.py). A graph then computes with a
            weight changed in place only once its forms are remade: by the model's next call outside
            a capture, by its ``load_state_dict``, or by :func:`refresh_weight_caches`. Leave it off
            to train with CUDA graphs (an optimizer step inside a graph is not seen by the next replay).

    Returns:
        ``model``, converted; with fuse=True the fused GraphModule.

    Raises:
        TypeError: ``model`` is not a module.
        ValueError: fuse=True with the model or one of its BatchNorms in training mode, or with
            inverse=True; static_weights=True with inverse=True.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(static_weights, bool):
        raise TypeError(f"convert: static_weights must be True or False, got {static_weights!r}")
    if fuse and inverse:
        raise ValueError("convert: fuse=True and inverse=True exclude each other (inverse of a fused model "
                         "returns the model it was made from)")
    if static_weights and inverse:
        raise ValueError("convert: static_weights=True and inverse=True exclude each other (inverse returns "
                         "torch's modules, which keep no prepared weights)")
    if fuse:
        from .torch_fusion import check_eval, fuse as fuse_chains

        check_eval(model)  # before the model is changed in place
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            convert(model, static_weights=static_weights)
        fused, skipped = fuse_chains(model)
        if static_weights:  # the chains without a BatchNorm too (those with one keep their folded forms)
            for module in fused.modules():
                if "_cupyconv_weights" in module.__dict__:
                    _keep_forms_in_graphs(module)
            fused.register_load_state_dict_post_hook(_refresh_after_load)
        notes = [str(w.message) for w in caught] + skipped
        if notes:
            warnings.warn("; ".join(notes), UserWarning, stacklevel=2)
        return fused
    if inverse and "_cupyconv_unfused" in model.__dict__:
        model = model.__dict__["_cupyconv_unfused"]
    targets = {ours: theirs for theirs, ours in CONVERSIONS.items()} if inverse else CONVERSIONS
    skipped = []
    for name, module in model.named_modules():
        target = targets.get(type(module))
        if target is not None:
            if not inverse and module.weight.dtype not in DTYPE_NAMES:
                skipped.append(f"{name or '(model)'} (dtype {module.weight.dtype})")
                continue
            module.__class__ = target
            module.__dict__.pop("_cupyconv_weights", None)
        elif _left_alone(module, inverse):
            skipped.append(f"{name or '(model)'} ({type(module).__qualname__})")
        if static_weights and type(module) in CONVERSIONS.values():  # switched now or before
            _keep_forms_in_graphs(module)
    if skipped:
        warnings.warn(f"cupyconv.torch.convert left {len(skipped)} module(s) unchanged: {', '.join(skipped)}",
                      UserWarning, stacklevel=2)
    if static_weights and not getattr(model, "_cupyconv_static_weights", False):
        model.register_load_state_dict_post_hook(_refresh_after_load)
        model.__dict__["_cupyconv_static_weights"] = True
    return model
