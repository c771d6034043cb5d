"""The fused epilogue on the GPU: activation(conv + bias + residual) in every kernel family, both
layouts and every activation, against torch in float64, with NaN-poisoned outputs; split-K and
Winograd (whose last launch finishes the output); the residual as the output itself; the public call.
"""
import dataclasses

import pytest

from cases import Case
from checks import relative_error
from devices import gpu_count

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_count(), reason="needs a CUDA GPU (cupy finds none)")]
torch = pytest.importorskip("torch", reason="the GPU tests compare with torch")
cupy = pytest.importorskip("cupy")
F = torch.nn.functional

import cupyconv  # noqa: E402
from cupyconv import planner  # noqa: E402
from cupyconv.arguments import ACTIVATIONS, make_problem  # noqa: E402
from cupyconv.compiler import compute_capability  # noqa: E402
from cupyconv.families import implicit_gemm_nhwc, simt_gemm_conv2d  # noqa: E402
from cupyconv.launch import conv2d_cupy  # noqa: E402
from test_layouts_gpu import TENSOR_CORE, TORCH_DTYPES, arranged, to_cupy, tolerance  # noqa: E402

TORCH_ACTIVATIONS = {"none": lambda y: y, "relu": F.relu, "relu6": F.relu6, "silu": F.silu, "gelu": F.gelu,
                     "sigmoid": torch.sigmoid, "tanh": torch.tanh}
# One problem per family's usual ground: a GEMM layer, a depthwise layer narrow enough for the column
# kernel, a wider depthwise layer, a strided 3x3 that Winograd takes, a grouped odd-sized one, and a
# 1x1 that the streaming kernel takes in NHWC (K 40: a partial channel tile).
CASES = [
    Case(2, 32, 40, 11, 13, 3, 3, padding=1),
    Case(2, 16, 16, 9, 9, 3, 3, padding=1, groups=16),
    Case(1, 24, 24, 20, 36, 3, 3, padding=1, groups=24),
    Case(2, 24, 48, 12, 12, 3, 3, padding=1),
    Case(3, 6, 16, 9, 10, 3, 2, stride=(2, 1), padding=(1, 0), groups=2),
    Case(2, 32, 40, 9, 11, 1, 1),
    Case(2, 3, 24, 13, 15, 3, 3, stride=2, padding=1),  # an RGB stem (few_channel_nhwc)
    Case(3, 40, 12, 1, 1, 1, 1),  # squeeze-excitation's one-pixel planes (one_pixel_conv2d)
]
LAYOUTS = [("NCHW", "KCHW"), ("NHWC", "KHWC")]


def problem_of(case: Case, dtype: str, layout: str, weight_layout: str, activation: str, residual: bool):
    problem = make_problem((case.n, case.c, case.h, case.w), (case.k, case.c // case.groups, case.kh, case.kw),
                           (case.k,) if case.bias else None, dtype, case.stride, case.padding, case.dilation,
                           case.groups)
    return dataclasses.replace(problem, layout=layout, weight_layout=weight_layout, activation=activation,
                               has_residual=residual)


def tensors(case: Case, problem, dtype: str, seed: int):
    """x, weight, bias and a residual of the output's shape (NCHW tensors), random in float64 first."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    make = lambda *shape: torch.randn(*shape, device="cuda", dtype=torch.float64, generator=g).to(TORCH_DTYPES[dtype])
    return (make(case.n, case.c, case.h, case.w), make(case.k, case.c // case.groups, case.kh, case.kw),
            make(case.k) if case.bias else None, make(*problem.out_shape))


def reference(case: Case, x, weight, bias, residual, activation: str):
    up = lambda t: None if t is None else t.double()
    y = F.conv2d(up(x), up(weight), up(bias), case.stride, case.padding, case.dilation, case.groups)
    return TORCH_ACTIVATIONS[activation](y if residual is None else y + residual.double())


def run(plan, problem, x, weight, bias, residual, in_place: bool = False):
    """``plan`` on the arranged arrays into a NaN-poisoned output (or, ``in_place``, into the residual
    itself); the output as an NCHW view."""
    r = None if residual is None else arranged(residual, problem.layout)
    out = r if in_place else torch.full(problem.out_array_shape, float("nan"), device="cuda", dtype=x.dtype)
    conv2d_cupy(to_cupy(arranged(x, problem.layout)), to_cupy(arranged(weight, problem.weight_layout)), to_cupy(bias),
                problem, to_cupy(out), plan=plan, residual=to_cupy(r))
    torch.cuda.synchronize()
    return out.permute(0, 3, 1, 2) if problem.layout == "NHWC" else out


def family_dtype_layouts():
    """(family, dtype, layouts): the tensor cores' dtypes, the direct kernel's float64, the NHWC-only
    depthwise, pointwise and few-channel kernels in NHWC alone (the last in 16 bits)."""
    for kernel in planner.KERNELS:
        dtypes = ("float16", "bfloat16", "float32") if kernel in TENSOR_CORE else \
            ("float64", "float32", "float16") if kernel == planner.DIRECT_KERNEL else \
            ("float32",) if kernel in (planner.SIMT_KERNEL, planner.WINOGRAD_KERNEL) else \
            ("float16", "bfloat16") if kernel == planner.FEW_CHANNEL_KERNEL else ("float32", "float16")
        layouts = LAYOUTS[1:] if kernel in (planner.DEPTHWISE_NHWC_KERNEL, planner.POINTWISE_KERNEL,
                                            planner.FEW_CHANNEL_KERNEL) else LAYOUTS
        yield from ((kernel, dtype, pair) for dtype in dtypes for pair in layouts)


@pytest.mark.parametrize("residual", [False, True], ids=["no_residual", "residual"])
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("kernel,dtype,layouts", list(family_dtype_layouts()), ids=str)
def test_every_family_layout_and_activation(kernel, dtype, layouts, activation, residual):
    ran = 0
    for index, case in enumerate(CASES):
        problem = problem_of(case, dtype, *layouts, activation, residual)
        try:
            plan = planner.make_plan(problem, kernel=kernel, compute_capability=compute_capability())
        except ValueError:  # the family does not take this problem
            continue
        x, weight, bias, r = tensors(case, problem, dtype, seed=index + 7 * ACTIVATIONS.index(activation))
        r = r if residual else None
        out = run(plan, problem, x, weight, bias, r)
        ref = reference(case, x, weight, bias, r, activation)
        assert not out.isnan().any(), f"{case.id}: an output element was never written"
        assert relative_error(out, ref) < tolerance(dtype, kernel), case.id
        ran += 1
    assert ran, f"{kernel} took none of the cases"


# The channels-last GEMM's NHWC stores: 16-byte vectors where the channels allow (K and K / groups
# multiples of 8 16-bit or 4 float values), 4-channel vectors or single channels elsewhere; and its
# 1x1 stride-1 unpadded ("pointwise") gather, which skips the pixel's (image, oh, ow).
NHWC_STORE_CASES = [
    Case(3, 64, 72, 7, 9, 1, 1),                  # pointwise; 189 pixels (a partial tile), K 72: a partial channel tile
    Case(2, 32, 20, 5, 7, 1, 1),                  # pointwise, K 20: 4-channel vectors in 16 bits
    Case(2, 64, 48, 6, 5, 1, 1, groups=2),        # pointwise, grouped: 24 channels per group
    Case(2, 32, 40, 9, 8, 1, 1, padding=1),       # 1x1 padded: the pixel's gather
    Case(2, 16, 12, 7, 6, 1, 1, stride=2, bias=False),  # 1x1 strided
    Case(1, 64, 136, 9, 9, 3, 3, padding=1),      # 3x3, K 136
    Case(2, 16, 9, 5, 5, 3, 3, padding=1),        # K 9: single channels
    Case(2, 128, 136, 12, 12, 1, 1),              # whole k tiles of 64 16-bit channels (the wgmma tiles'), K 136
]


# plain and relu without a residual: 16-bit outputs staged as 16-bit values (bias added before); relu with
# a residual: the 16-byte stores' residual vectors (the inverted residual's "none" takes them too); silu
# with a residual: the element loads every other activation keeps.
@pytest.mark.parametrize("epilogue", [("none", False), ("relu", False), ("relu", True), ("silu", True)],
                         ids=["plain", "relu", "relu_residual", "silu_residual"])
@pytest.mark.parametrize("dtype,config", [(dtype, config.name) for dtype in ("float16", "bfloat16", "float32")
                                          for config in implicit_gemm_nhwc.NHWC_CONFIGS[dtype]], ids=str)
def test_nhwc_stores_every_tile(dtype, config, epilogue):
    """Every channels-last tile (wgmma ones on compute capability 9.0) on NHWC problems whose output
    channels take each kind of store, NaN-poisoned, against torch in float64."""
    activation, residual = epilogue
    ran = 0
    for index, case in enumerate(NHWC_STORE_CASES):
        problem = problem_of(case, dtype, "NHWC", "KHWC", activation, residual)
        try:
            plan = planner.make_plan(problem, config=config, kernel=planner.NHWC_KERNEL,
                                     compute_capability=compute_capability())
        except ValueError:  # wgmma tiles on another GPU, or not on 4-byte pieces
            continue
        x, weight, bias, r = tensors(case, problem, dtype, seed=index + 11)
        r = r if residual else None
        out = run(plan, problem, x, weight, bias, r)
        assert not out.isnan().any(), f"{case.id}: an output element was never written"
        assert relative_error(out, reference(case, x, weight, bias, r, activation)) < \
            tolerance(dtype, planner.NHWC_KERNEL), case.id
        ran += 1
    assert ran or "wgmma" in config, f"{config} took none of the cases"


@pytest.mark.parametrize("activation", ["none", "relu"])
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_nhwc_residual_at_any_address(dtype, activation):
    """A residual whose address the 16-byte residual vectors cannot read (a view one element in):
    the channels-last GEMM's stores read its elements instead, and the result is right."""
    case = NHWC_STORE_CASES[0]
    problem = problem_of(case, dtype, "NHWC", "KHWC", activation, True)
    plan = planner.make_plan(problem, kernel=planner.NHWC_KERNEL, compute_capability=compute_capability())
    x, weight, bias, r = tensors(case, problem, dtype, seed=9)
    shifted = torch.empty(r.numel() + 1, device="cuda", dtype=r.dtype)[1:].view(problem.out_array_shape)
    shifted.copy_(arranged(r, "NHWC"))
    out = torch.full(problem.out_array_shape, float("nan"), device="cuda", dtype=x.dtype)
    conv2d_cupy(to_cupy(arranged(x, "NHWC")), to_cupy(arranged(weight, "KHWC")), to_cupy(bias), problem,
                to_cupy(out), plan=plan, residual=to_cupy(shifted))
    torch.cuda.synchronize()
    ref = reference(case, x, weight, bias, r, activation)
    assert relative_error(out.permute(0, 3, 1, 2), ref) < tolerance(dtype, planner.NHWC_KERNEL)


@pytest.mark.parametrize("layouts", LAYOUTS, ids="-".join)
@pytest.mark.parametrize("kernel,dtype", [(planner.NHWC_KERNEL, "float16"), (planner.SIMT_KERNEL, "float32"),
                                          (planner.DIRECT_KERNEL, "float64"), (planner.WINOGRAD_KERNEL, "float32"),
                                          (planner.DEPTHWISE_KERNEL, "float32")], ids=str)
def test_residual_may_be_the_output(kernel, dtype, layouts):
    """out=residual: each element read once and then written by the same thread (in-place accumulate)."""
    case = CASES[1] if kernel == planner.DEPTHWISE_KERNEL else CASES[3]
    problem = problem_of(case, dtype, *layouts, "relu", True)
    plan = planner.make_plan(problem, kernel=kernel, compute_capability=compute_capability())
    x, weight, bias, r = tensors(case, problem, dtype, seed=5)
    ref = reference(case, x, weight, bias, r, "relu")
    out = run(plan, problem, x, weight, bias, r.clone(), in_place=True)
    assert relative_error(out, ref) < tolerance(dtype, kernel)


@pytest.mark.parametrize("layouts", LAYOUTS, ids="-".join)
@pytest.mark.parametrize("family,dtype", [(implicit_gemm_nhwc, "float16"), (implicit_gemm_nhwc, "float32"),
                                          (simt_gemm_conv2d, "float32")], ids=str)
def test_split_k_finishes_in_the_reduction(family, dtype, layouts):
    """Split-K's runs write partial sums without the epilogue (the channels-last GEMM's default tile
    and, on sm_90, the producer warpgroup's); the ordered reduction applies it, once: bitwise the same
    output on every run, right against float64."""
    case = Case(1, 256, 64, 7, 7, 3, 3, padding=1)
    problem = problem_of(case, dtype, *layouts, "gelu", True)
    configs = [None]
    if family is implicit_gemm_nhwc and compute_capability() == 90:
        configs.append(next(c.name for c in implicit_gemm_nhwc.NHWC_CONFIGS[dtype] if c.producer_warps))
    kwargs = {"compute_capability": compute_capability()} if family is implicit_gemm_nhwc else {}
    x, weight, bias, r = tensors(case, problem, dtype, seed=6)
    for config in configs:
        plan = dataclasses.replace(family.make_plan(problem, config, splits=5, **kwargs), layout=problem.layout,
                                   weight_layout=problem.weight_layout, activation="gelu", has_residual=True)
        outs = [run(plan, problem, x, weight, bias, r) for _ in range(3)]
        assert all(torch.equal(outs[0], out) for out in outs[1:]), config
        kernel = planner.NHWC_KERNEL if family is implicit_gemm_nhwc else planner.SIMT_KERNEL
        assert relative_error(outs[0], reference(case, x, weight, bias, r, "gelu")) < tolerance(dtype, kernel), config


def test_winograd_passes_offset_the_residual(monkeypatch):
    """Winograd in passes of images: each pass's output transform reads its own images of the residual."""
    from cupyconv.families import winograd_conv2d

    case = Case(5, 24, 32, 20, 22, 3, 3, padding=1)
    problem = problem_of(case, "float32", "NCHW", "KCHW", "sigmoid", True)
    monkeypatch.setattr(winograd_conv2d, "WINOGRAD_MAX_WORKSPACE_BYTES", 1 << 20)
    plan = dataclasses.replace(winograd_conv2d.make_plan(problem), activation="sigmoid", has_residual=True)
    assert plan.winograd_images < case.n, str(plan)
    x, weight, bias, r = tensors(case, problem, "float32", seed=8)
    out = run(plan, problem, x, weight, bias, r)
    assert relative_error(out, reference(case, x, weight, bias, r, "sigmoid")) < 1e-5


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("mode", ["float32", "tf32", "float16", "float64"])
def test_public_call(mode, layout):
    """cupyconv.conv2d(..., activation=, residual=) on CuPy arrays, the planner choosing; unbatched
    and in place too; a misaligned or non-contiguous residual is copied, never read wrongly."""
    dtype = "float32" if mode == "tf32" else mode
    case = Case(2, 16, 24, 10, 9, 3, 3, padding=1)
    problem = problem_of(case, dtype, layout, "KCHW", "silu", True)
    x, weight, bias, r = tensors(case, problem, dtype, seed=9)
    ref = reference(case, x, weight, bias, r, "silu")
    cx, cr = to_cupy(arranged(x, layout)), to_cupy(arranged(r, layout))
    kwargs = dict(padding=1, layout=layout, allow_tf32=mode == "tf32", activation="silu")
    nchw = (lambda a: torch.from_dlpack(a).permute(0, 3, 1, 2)) if layout == "NHWC" else torch.from_dlpack
    kernel = planner.NHWC_KERNEL if mode in ("tf32", "float16") else "strict"
    assert relative_error(nchw(cupyconv.conv2d(cx, to_cupy(weight), to_cupy(bias), residual=cr, **kwargs)), ref) < \
        tolerance(dtype, kernel)
    one = cupyconv.conv2d(cx[1], to_cupy(weight), to_cupy(bias), residual=cr[1], **kwargs)[None]
    assert relative_error(nchw(one), ref[1:]) < tolerance(dtype, kernel)
    buffer = cupy.empty(cr.size + 1, dtype=cr.dtype)
    shifted = buffer[1:].reshape(cr.shape)  # 2 or 4 bytes off 16
    shifted[...] = cr
    assert relative_error(nchw(cupyconv.conv2d(cx, to_cupy(weight), to_cupy(bias), residual=shifted, **kwargs)),
                          ref) < tolerance(dtype, kernel)
    strided = cupy.empty((*cr.shape[:-1], 2 * cr.shape[-1]), dtype=cr.dtype)[..., ::2]
    strided[...] = cr
    assert relative_error(nchw(cupyconv.conv2d(cx, to_cupy(weight), to_cupy(bias), residual=strided, **kwargs)),
                          ref) < tolerance(dtype, kernel)
    out = cr.copy()
    cupyconv.conv2d(cx, to_cupy(weight), to_cupy(bias), residual=out, out=out, **kwargs)
    assert relative_error(nchw(out), ref) < tolerance(dtype, kernel)
    with pytest.raises(ValueError, match="residual shares memory with out"):
        cupyconv.conv2d(cx, to_cupy(weight), to_cupy(bias), residual=out[:1], out=out, **kwargs)
