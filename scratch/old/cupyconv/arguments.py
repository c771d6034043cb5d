"""Argument normalisation and validation for conv2d.

Everything a convolution call can get wrong is caught here, before any allocation or launch, and
reported as a ValueError or TypeError that names the argument and the shapes involved. The result
is a :class:`ConvProblem`: plain integers describing the convolution, shared by the NumPy reference,
the kernel planner and the torch adapter.
"""
from __future__ import annotations

import dataclasses
import math
import numbers

import numpy as np

#: Element types cupyconv computes in, by name. float16 and bfloat16 accumulate in float32.
SUPPORTED_DTYPES = ("float16", "bfloat16", "float32", "float64")
#: Memory orders of the input and output: NCHW (torch's default), or NHWC (channels last: torch's
#: channels_last, and what the tensor cores read best).
LAYOUTS = ("NCHW", "NHWC")
#: Memory orders of the weight: (K, C/groups, kh, kw), or (K, kh, kw, C/groups).
WEIGHT_LAYOUTS = ("KCHW", "KHWC")
#: The epilogue's activations, applied to conv + bias + residual before the one rounding to the
#: output's dtype; their index is the kernels' code (kernels/epilogue.cuh). As torch's: relu, relu6
#: (hardtanh 0..6), silu, gelu (exact, erf), sigmoid, tanh.
ACTIVATIONS = ("none", "relu", "relu6", "silu", "gelu", "sigmoid", "tanh")


@dataclasses.dataclass(frozen=True)
class ConvProblem:
    """The shape-level description of one conv2d call. Sizes are named logically (n, c, h, w; k,
    kh, kw); ``layout`` and ``weight_layout`` say how the arrays hold them in memory (C-contiguous
    in that order)."""

    n: int
    c: int
    h: int
    w: int
    k: int
    kh: int
    kw: int
    stride: tuple[int, int]
    dilation: tuple[int, int]
    pad_top: int
    pad_left: int
    pad_bottom: int
    pad_right: int
    groups: int
    dtype: str
    has_bias: bool
    layout: str = "NCHW"
    weight_layout: str = "KCHW"
    # The epilogue: activation(conv + bias + residual); ACTIVATIONS names the activations.
    activation: str = "none"
    has_residual: bool = False
    # The prologue: x multiplied by an (N, C) scale first (cupyconv/input_scale.py).
    has_input_scale: bool = False

    @property
    def ho(self) -> int:
        return (self.h + self.pad_top + self.pad_bottom - self.dilation[0] * (self.kh - 1) - 1) // self.stride[0] + 1

    @property
    def wo(self) -> int:
        return (self.w + self.pad_left + self.pad_right - self.dilation[1] * (self.kw - 1) - 1) // self.stride[1] + 1

    @property
    def out_shape(self) -> tuple[int, int, int, int]:
        return (self.n, self.k, self.ho, self.wo)

    @property
    def x_shape(self) -> tuple[int, int, int, int]:
        return (self.n, self.c, self.h, self.w)

    @property
    def weight_shape(self) -> tuple[int, int, int, int]:
        return (self.k, self.c // self.groups, self.kh, self.kw)

    @property
    def x_array_shape(self) -> tuple[int, int, int, int]:
        """x's shape as its array holds it (in ``layout``)."""
        return (self.n, self.h, self.w, self.c) if self.layout == "NHWC" else self.x_shape

    @property
    def out_array_shape(self) -> tuple[int, int, int, int]:
        """The output's shape as its array holds it (in ``layout``)."""
        return (self.n, self.ho, self.wo, self.k) if self.layout == "NHWC" else self.out_shape

    @property
    def weight_array_shape(self) -> tuple[int, int, int, int]:
        """The weight's shape as its array holds it (in ``weight_layout``)."""
        k, cg, kh, kw = self.weight_shape
        return (k, kh, kw, cg) if self.weight_layout == "KHWC" else self.weight_shape

    @property
    def flops(self) -> int:
        """Multiply-adds counted as two operations, the convention of FLOP/s figures."""
        return 2 * self.n * self.k * self.ho * self.wo * (self.c // self.groups) * self.kh * self.kw


def dtype_name(dtype) -> str:
    """The cupyconv name of a NumPy-style dtype, or TypeError for types conv2d does not compute in.

    The names themselves are accepted too: 'bfloat16' is a NumPy dtype only once ml_dtypes is imported.
    """
    if isinstance(dtype, str) and dtype in SUPPORTED_DTYPES:
        return dtype
    dt = np.dtype(dtype)
    if dt.name in SUPPORTED_DTYPES:
        return dt.name
    raise TypeError(
        f"conv2d computes in {', '.join(SUPPORTED_DTYPES)}; got dtype {dt.name} "
        "(integer, bool and complex arrays must be cast first)")


def _pair(value, name: str, minimum: int) -> tuple[int, int]:
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an int or a pair of ints, got {value!r}")
    if isinstance(value, numbers.Integral):
        pair = (int(value), int(value))
    elif isinstance(value, (tuple, list)) and len(value) == 2 and all(
            isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)) for v in value):
        pair = (int(value[0]), int(value[1]))
    else:
        raise TypeError(f"{name} must be an int or a pair of ints, got {value!r}")
    if min(pair) < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return pair


def _padding(padding, kernel: tuple[int, int], dilation: tuple[int, int],
             stride: tuple[int, int]) -> tuple[int, int, int, int]:
    """(top, left, bottom, right). 'same' puts an odd extra row/column at the bottom/right, as torch."""
    if isinstance(padding, str):
        if padding == "valid":
            return (0, 0, 0, 0)
        if padding == "same":
            if stride != (1, 1):
                raise ValueError(f"padding='same' needs stride 1, got stride={stride}")
            total = [d * (k - 1) for d, k in zip(dilation, kernel)]
            before = [t // 2 for t in total]
            return (before[0], before[1], total[0] - before[0], total[1] - before[1])
        raise ValueError(f"padding must be an int, a pair, 'valid' or 'same'; got {padding!r}")
    ph, pw = _pair(padding, "padding", 0)
    return (ph, pw, ph, pw)


def check_x_dims(x, layout: str, what: str = "x") -> None:
    """ValueError naming the layout unless ``x`` is 4-D (batched) or 3-D (one image)."""
    if x.ndim not in (3, 4):
        raise ValueError(f"{what} must be 4-D ({', '.join(layout)}) or 3-D ({', '.join(layout[1:])}) for "
                         f"layout={layout!r}, got shape {tuple(x.shape)}")


def check_layouts(layout, weight_layout) -> None:
    """ValueError naming the argument unless ``layout`` is one of LAYOUTS and ``weight_layout`` one of
    WEIGHT_LAYOUTS."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if weight_layout not in WEIGHT_LAYOUTS:
        raise ValueError(f"weight_layout must be one of {WEIGHT_LAYOUTS}, got {weight_layout!r}")


def make_problem(x_shape, weight_shape, bias_shape, dtype, stride=1, padding=0, dilation=1,
                 groups=1, layout="NCHW", weight_layout="KCHW", activation=None, residual_shape=None,
                 input_scale_shape=None) -> ConvProblem:
    """Check the shapes and hyper-parameters of a conv2d call and describe it as a ConvProblem.

    Args:
        x_shape: (N, C, H, W), or (N, H, W, C) where ``layout`` is 'NHWC'.
        weight_shape: (K, C // groups, kh, kw), or (K, kh, kw, C // groups) where ``weight_layout``
            is 'KHWC'.
        bias_shape: (K,) or None.
        dtype: the common dtype (a name from SUPPORTED_DTYPES).
        stride, padding, dilation, groups: as torch.nn.functional.conv2d.
        layout, weight_layout: the arrays' memory orders (LAYOUTS, WEIGHT_LAYOUTS).
        activation: None or one of ACTIVATIONS, applied in the epilogue.
        residual_shape: the shape of the array added in the epilogue (the output's, in ``layout``),
            or None.
        input_scale_shape: the shape of the scale x is multiplied by first, (N, C) in either layout, or
            None.
    """
    check_layouts(layout, weight_layout)
    activation = check_activation(activation)
    problem = _problem_in_layouts(x_shape, weight_shape, bias_shape, dtype, stride, padding, dilation, groups, layout,
                                  weight_layout)
    if residual_shape is not None and tuple(residual_shape) != problem.out_array_shape:
        raise ValueError(f"residual must have the output's shape {problem.out_array_shape} (layout {layout!r}), got "
                         f"{tuple(residual_shape)}")
    if input_scale_shape is not None and tuple(input_scale_shape) != (problem.n, problem.c):
        raise ValueError(f"input_scale must have shape (N, C) = {(problem.n, problem.c)} (one factor per image and input "
                         f"channel of x {tuple(x_shape)} in layout {layout!r}), got {tuple(input_scale_shape)}")
    if activation == "none" and residual_shape is None and input_scale_shape is None:
        return problem
    return dataclasses.replace(problem, activation=activation, has_residual=residual_shape is not None,
                               has_input_scale=input_scale_shape is not None)


def check_activation(activation) -> str:
    """The activation's name ('none' for None); TypeError or ValueError naming the choices."""
    if activation is None:
        return "none"
    if not isinstance(activation, str):
        raise TypeError(f"activation must be None or one of {ACTIVATIONS}, got {activation!r}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be None or one of {ACTIVATIONS}, got {activation!r}")
    return activation


def _problem_in_layouts(x_shape, weight_shape, bias_shape, dtype, stride, padding, dilation, groups, layout,
                        weight_layout) -> ConvProblem:
    """make_problem without the epilogue."""
    x_shape, weight_shape = tuple(x_shape), tuple(weight_shape)
    if len(x_shape) != 4:
        raise ValueError(f"x must be 4-D ({', '.join(layout)}) for layout={layout!r}, got shape {x_shape}")
    if len(weight_shape) != 4:
        order = "K, C/groups, kh, kw" if weight_layout == "KCHW" else "K, kh, kw, C/groups"
        raise ValueError(f"weight must be 4-D ({order}) for weight_layout={weight_layout!r}, got shape {weight_shape}")
    if layout == "NCHW" and weight_layout == "KCHW":
        return _make_problem(x_shape, weight_shape, bias_shape, dtype, stride, padding, dilation, groups)
    logical_x = (x_shape[0], x_shape[3], x_shape[1], x_shape[2]) if layout == "NHWC" else x_shape
    logical_weight = (weight_shape[0], weight_shape[3], weight_shape[1], weight_shape[2]) \
        if weight_layout == "KHWC" else weight_shape
    try:
        problem = _make_problem(logical_x, logical_weight, bias_shape, dtype, stride, padding, dilation, groups)
    except ValueError as error:
        raise ValueError(f"{error} [x of shape {x_shape} in layout {layout!r} is (N, C, H, W) = {logical_x}; weight of "
                         f"shape {weight_shape} in weight_layout {weight_layout!r} is (K, C/groups, kh, kw) = "
                         f"{logical_weight}]") from None
    return dataclasses.replace(problem, layout=layout, weight_layout=weight_layout)


def _make_problem(x_shape, weight_shape, bias_shape, dtype, stride, padding, dilation, groups) -> ConvProblem:
    """make_problem of logical shapes, x (N, C, H, W) and weight (K, C // groups, kh, kw)."""
    if isinstance(groups, (bool, np.bool_)) or not isinstance(groups, numbers.Integral):
        raise TypeError(f"groups must be an int, got {groups!r}")
    groups = int(groups)
    n, c, h, w = x_shape
    k, cg, kh, kw = weight_shape
    if groups < 1:
        raise ValueError(f"groups must be >= 1, got {groups}")
    if c < 1 or h < 1 or w < 1:
        raise ValueError(f"x must have C, H and W >= 1, got shape {x_shape}")
    if k < 1 or kh < 1 or kw < 1:
        raise ValueError(f"weight must have K, kh and kw >= 1, got shape {weight_shape}")
    if c % groups:
        raise ValueError(f"groups={groups} must divide the input channels C={c} (x shape {x_shape})")
    if k % groups:
        raise ValueError(f"groups={groups} must divide the output channels K={k} (weight shape {weight_shape})")
    if cg * groups != c:
        raise ValueError(
            f"x has C={c} channels but weight shape {weight_shape} with groups={groups} expects "
            f"C = weight.shape[1] * groups = {cg * groups}")
    if bias_shape is not None and tuple(bias_shape) != (k,):
        raise ValueError(f"bias must have shape ({k},) for weight shape {weight_shape}, got {tuple(bias_shape)}")
    stride = _pair(stride, "stride", 1)
    dilation = _pair(dilation, "dilation", 1)
    top, left, bottom, right = _padding(padding, (kh, kw), dilation, stride)
    problem = ConvProblem(n=n, c=c, h=h, w=w, k=k, kh=kh, kw=kw, stride=stride, dilation=dilation,
                          pad_top=top, pad_left=left, pad_bottom=bottom, pad_right=right,
                          groups=groups, dtype=dtype_name(dtype), has_bias=bias_shape is not None)
    if problem.ho < 1 or problem.wo < 1:
        raise ValueError(
            f"kernel {kh}x{kw} with dilation {dilation} is larger than the padded input "
            f"{h + top + bottom}x{w + left + right} (x shape {x_shape}, padding {padding!r})")
    return problem


def array_backend(array, name: str) -> str:
    """'numpy' or 'cupy' for a NumPy or CuPy array; TypeError for anything else."""
    if isinstance(array, np.ndarray):
        return "numpy"
    if type(array).__module__.split(".")[0] == "cupy" and hasattr(array, "device"):
        return "cupy"
    raise TypeError(f"{name} must be a NumPy or CuPy array, got {type(array).__name__}")


def check_arrays(x, weight, bias, out) -> str:
    """Check that the arrays of one call agree in kind, dtype and device; return the backend name."""
    arrays = {"x": x, "weight": weight}
    if bias is not None:
        arrays["bias"] = bias
    backends = {name: array_backend(a, name) for name, a in arrays.items()}
    if len(set(backends.values())) > 1:
        raise TypeError(f"x, weight and bias must all be NumPy or all CuPy arrays, got {backends}")
    backend = backends["x"]
    for name, a in arrays.items():
        dtype_name(a.dtype)
        if a.dtype != x.dtype:
            raise TypeError(f"{name} has dtype {a.dtype} but x has dtype {x.dtype}; they must match")
    if bias is not None and bias.ndim != 1:
        raise ValueError(f"bias must be 1-D (K,), got shape {tuple(bias.shape)}")
    if backend == "cupy":
        devices = {name: a.device.id for name, a in arrays.items()}
        if len(set(devices.values())) > 1:
            raise ValueError(f"x, weight and bias must be on one GPU, got devices {devices}")
    if out is not None:
        _check_like_x("out", out, x, backend)
        if not out.flags.c_contiguous:
            raise ValueError(f"out must be C-contiguous, got strides {out.strides} for shape {out.shape}")
    return backend


def check_input_scale(input_scale, x, out) -> None:
    """The input scale must be an array of x's kind, dtype and device (its shape is make_problem's to
    check), not overlapping ``out`` (read while the output is written)."""
    _check_like_x("input_scale", input_scale, x, array_backend(x, "x"))
    if out is not None and overlaps(address(out), extent(out), address(input_scale), extent(input_scale)):
        raise ValueError("out shares memory with input_scale; conv2d never modifies its inputs")


def check_residual(residual, x, out) -> None:
    """The residual must be an array of x's kind, dtype and device (its shape is make_problem's to
    check); it may be ``out`` itself, but must not overlap ``out`` otherwise (an element would be
    read after another thread wrote it)."""
    _check_like_x("residual", residual, x, array_backend(x, "x"))
    if out is not None:
        check_residual_overlap(residual, out)


def check_residual_overlap(residual, out) -> None:
    """ValueError where ``residual`` shares memory with ``out`` without being it (checked on every
    call: addresses are not part of a call's signature)."""
    if not same_array(residual, out) and overlaps(address(out), extent(out), address(residual), extent(residual)):
        raise ValueError("residual shares memory with out without being out itself (same memory, shape and strides)")


def _check_like_x(name: str, array, x, backend: str) -> None:
    """``array`` (out, residual or input_scale) must be of x's kind (``backend``), dtype and device."""
    if array_backend(array, name) != backend:
        raise TypeError(f"{name} must be a {backend} array like x, got {type(array).__name__}")
    if array.dtype != x.dtype:
        raise TypeError(f"{name} has dtype {array.dtype} but x has dtype {x.dtype}; they must match")
    if backend == "cupy" and array.device.id != x.device.id:
        raise ValueError(f"{name} is on GPU {array.device.id} but x is on GPU {x.device.id}")


def same_array(a, b) -> bool:
    """Whether ``a`` and ``b`` view the same elements in the same order."""
    return address(a) == address(b) and a.shape == b.shape and a.strides == b.strides


def check_out(out, problem: ConvProblem, shape: tuple[int, ...], x, weight, bias) -> None:
    """out must have the output shape and must not overlap an input (the kernel would read what it writes)."""
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"out must have shape {tuple(shape)} for this convolution, got {tuple(out.shape)}")
    for name, a in (("x", x), ("weight", weight), ("bias", bias)):
        if a is not None and overlaps(address(out), extent(out), address(a), extent(a)):
            raise ValueError(f"out shares memory with {name}; conv2d never modifies its inputs")


def address(a) -> int:
    """The data address of a NumPy or CuPy array."""
    return a.__array_interface__["data"][0] if isinstance(a, np.ndarray) else a.data.ptr


def extent(a) -> tuple[int, int]:
    """Bytes [low, high) that ``a`` spans around its data address, from its shape and strides ((0, 0):
    empty). The same bounds as numpy.may_share_memory's, cheap enough for every call."""
    if a.size == 0:
        return 0, 0
    low = sum(min(0, (n - 1) * s) for n, s in zip(a.shape, a.strides))
    high = sum(max(0, (n - 1) * s) for n, s in zip(a.shape, a.strides)) + a.itemsize
    return low, high


def overlaps(address_a: int, extent_a: tuple[int, int], address_b: int, extent_b: tuple[int, int]) -> bool:
    """Whether two arrays' spans (address + extent) share a byte."""
    return extent_a[0] != extent_a[1] and extent_b[0] != extent_b[1] and \
        address_a + extent_a[0] < address_b + extent_b[1] and address_b + extent_b[0] < address_a + extent_a[1]


def check_output_size(shape: tuple[int, ...], itemsize: int, memory_bytes: int | None, where: str) -> None:
    """ValueError naming the output shape when the output alone would not fit in ``memory_bytes``
    (the device's memory; None: unknown, no check), before anything is allocated: huge paddings
    and strides would otherwise reach the allocator with absurd sizes."""
    nbytes = itemsize * math.prod(shape)
    if memory_bytes is not None and nbytes > memory_bytes:
        raise ValueError(f"the output of shape {tuple(shape)} needs {nbytes:.4g} bytes, more than {where}'s "
                         f"{memory_bytes:.4g} bytes of memory (check padding, stride and dilation)")
