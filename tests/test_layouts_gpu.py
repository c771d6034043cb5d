"""NHWC arrays and KHWC weights on the GPU, against torch in float64.

Every family forced in turn on NHWC / KHWC problems (the channels-last GEMM reads them in place, the
others through transposes), with NaN-poisoned outputs; the result equals the NCHW one bit for bit
where the same kernel computes both; the public CuPy call; and the torch adapter, whose channels_last
tensors go in and come out channels_last with no copy, mixed formats following torch's choice.
"""
import itertools

import pytest

from cases import GRID, Case
from checks import relative_error
from devices import gpu_count

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_count(), reason="needs a CUDA GPU (cupy finds none)")]
torch = pytest.importorskip("torch", reason="the GPU tests compare with torch")
cupy = pytest.importorskip("cupy")
F = torch.nn.functional

import dataclasses  # noqa: E402

import cupyconv  # noqa: E402
import cupyconv.torch as cct  # noqa: E402
from cupyconv import planner  # noqa: E402
from cupyconv.arguments import make_problem  # noqa: E402
from cupyconv.compiler import compute_capability  # noqa: E402
from cupyconv.executor import executable  # noqa: E402
from cupyconv.families import depthwise_nhwc, implicit_gemm_nhwc  # noqa: E402
from cupyconv.families.implicit_gemm_conv2d import GEMM_CONFIGS  # noqa: E402
from cupyconv.launch import conv2d_cupy  # noqa: E402

LAYOUT_PAIRS = [("NHWC", "KCHW"), ("NCHW", "KHWC"), ("NHWC", "KHWC")]
TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
                "float64": torch.float64}
TENSOR_CORE = (planner.NHWC_KERNEL, planner.GEMM_KERNEL, planner.POINTWISE_KERNEL)
CASES = GRID + [
    Case(2, 32, 64, 17, 19, 3, 3, padding=1),          # wgmma, one 64-channel tile
    Case(3, 64, 130, 9, 9, 3, 3, padding=1),           # two 128-channel tiles, the second partial
    Case(2, 128, 96, 10, 12, 3, 3, padding=2, dilation=2, groups=2),
    Case(2, 16, 24, 6, 8, 1, 1),                       # 1x1: NCHW reads it in place (A^T), NHWC too
    Case(2, 5, 20, 13, 12, 3, 5, padding=(1, 2)),      # 16-bit: 5 -> 6 zero-padded channels
    Case(2, 96, 96, 12, 12, 3, 3, padding=1, groups=96),  # depthwise, vectorisable channels
]


def tolerance(dtype: str, kernel: str) -> float:
    if dtype == "float64":
        return 1e-12
    if dtype == "float32":
        return 2e-3 if kernel in TENSOR_CORE else 1e-5
    return 1e-2


def to_cupy(t):
    """Zero-copy CuPy view of a CUDA tensor (bfloat16 as its int16 bits)."""
    if t is None:
        return None
    return cupy.from_dlpack(t.view(torch.int16) if t.dtype == torch.bfloat16 else t)


def inputs(case: Case, dtype: str, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    make = lambda *shape: torch.randn(*shape, device="cuda", dtype=torch.float64, generator=g).to(TORCH_DTYPES[dtype])
    x, weight = make(case.n, case.c, case.h, case.w), make(case.k, case.c // case.groups, case.kh, case.kw)
    return x, weight, make(case.k) if case.bias else None


def reference(x, weight, bias, case: Case):
    up = lambda t: None if t is None else t.double()
    return F.conv2d(up(x), up(weight), up(bias), case.stride, case.padding, case.dilation, case.groups)


def problem_of(case: Case, dtype: str, layout: str, weight_layout: str):
    problem = make_problem((case.n, case.c, case.h, case.w), (case.k, case.c // case.groups, case.kh, case.kw),
                           (case.k,) if case.bias else None, dtype, case.stride, case.padding, case.dilation,
                           case.groups)
    return dataclasses.replace(problem, layout=layout, weight_layout=weight_layout)


def arranged(t, layout: str):
    """The C-contiguous array of NCHW tensor ``t`` in ``layout`` (NHWC / KHWC: channels last)."""
    return t.permute(0, 2, 3, 1).contiguous() if layout in ("NHWC", "KHWC") else t.contiguous()


def nhwc_copy(t):
    """A new NHWC array of NCHW tensor ``t``: for 1x1 planes ``arranged`` returns ``t`` itself (already
    contiguous), and an output written over it would change ``t``."""
    return arranged(t, "NHWC").clone()


def run(plan, problem, x, weight, bias, residual=None):
    """``plan`` on x, the weight (and an NCHW ``residual``) arranged in the problem's layouts; the output,
    poisoned with NaN first, as an NCHW view."""
    shape = problem.out_array_shape
    out = torch.full(shape, float("nan"), device="cuda", dtype=x.dtype)
    conv2d_cupy(to_cupy(arranged(x, problem.layout)), to_cupy(arranged(weight, problem.weight_layout)),
                to_cupy(bias), problem, to_cupy(out), plan=plan,
                residual=None if residual is None else to_cupy(arranged(residual, problem.layout)))
    torch.cuda.synchronize()
    return out.permute(0, 3, 1, 2) if problem.layout == "NHWC" else out


def family_dtypes():
    for kernel in planner.KERNELS:
        dtypes = ("float16", "bfloat16", "float32") if kernel in TENSOR_CORE else \
            ("float64", "float32", "float16") if kernel == planner.DIRECT_KERNEL else ("float32", "float16", "bfloat16")
        yield from ((kernel, dtype) for dtype in dtypes)


@pytest.mark.parametrize("layouts", LAYOUT_PAIRS, ids="-".join)
@pytest.mark.parametrize("kernel,dtype", list(family_dtypes()), ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_every_family_in_every_layout(case, kernel, dtype, layouts):
    problem = problem_of(case, dtype, *layouts)
    try:
        plan = planner.make_plan(problem, kernel=kernel, compute_capability=compute_capability())
    except ValueError:  # the family does not take this problem (test_programs checks the refusals)
        return
    x, weight, bias = inputs(case, dtype, seed=len(case.id))
    saved = [t.clone() for t in (x, weight, bias) if t is not None]
    out = run(plan, problem, x, weight, bias)
    ref = reference(x, weight, bias, case)
    assert out.shape == ref.shape and not out.isnan().any(), "an output element was never written"
    assert relative_error(out, ref) < tolerance(dtype, kernel)
    for before, after in zip(saved, (t for t in (x, weight, bias) if t is not None)):
        assert torch.equal(before, after), "an input was modified"
    # The same kernel and tiles on NCHW arrays sum in the same order: the same bits.
    nchw = problem_of(case, dtype, "NCHW", "KCHW")
    try:
        nchw_plan = planner.make_plan(nchw, config=plan.config.name if kernel == planner.NHWC_KERNEL else None,
                                      kernel=kernel, compute_capability=compute_capability())
    except ValueError:  # NCHW 1x1 problems read in place, with tiles of their own
        return
    if not nchw_plan.a_from_nchw and nchw_plan.config == plan.config:
        assert torch.equal(run(nchw_plan, nchw, x, weight, bias), out)


#: One-pixel planes and 1x1 kernels, which NCHW-only families read and write in NHWC / KHWC as they are:
#: squeeze-excitation's layer, a 3x3 kernel on one-pixel planes (the weight transposed alone), and a 3x3
#: plane to one pixel (x transposed alone).
ONE_PIXEL_CASES = [Case(3, 24, 20, 1, 1, 1, 1), Case(2, 8, 12, 1, 1, 3, 3, padding=1), Case(2, 8, 12, 3, 3, 3, 3)]


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("layouts", LAYOUT_PAIRS, ids="-".join)
@pytest.mark.parametrize("kernel,dtype", [(planner.SIMT_KERNEL, "float32"), (planner.DIRECT_KERNEL, "float64"),
                                          (planner.DIRECT_KERNEL, "float16")], ids=str)
@pytest.mark.parametrize("case", ONE_PIXEL_CASES, ids=lambda c: c.id)
def test_one_pixel_planes_without_transposes(case, kernel, dtype, layouts, residual):
    """NCHW-only families on NHWC one-pixel planes and KHWC 1x1 kernels (no transposes: layouts.transposed),
    with a residual read in place, against torch in float64, the output poisoned with NaN."""
    problem = problem_of(case, dtype, *layouts)
    if residual:
        problem = dataclasses.replace(problem, activation="relu", has_residual=True)
    plan = planner.make_plan(problem, kernel=kernel, compute_capability=compute_capability())
    x, weight, bias = inputs(case, dtype, seed=len(case.id))
    ref = reference(x, weight, bias, case)
    added = torch.randn(ref.shape, device="cuda", dtype=torch.float64).to(x.dtype) if residual else None
    if residual:
        ref = torch.relu(ref + added.double())
    out = run(plan, problem, x, weight, bias, added)
    assert not out.isnan().any(), "an output element was never written"
    assert relative_error(out, ref) < tolerance(dtype, kernel)


@pytest.mark.parametrize("layouts", LAYOUT_PAIRS, ids="-".join)
@pytest.mark.parametrize("mode", ["float32", "tf32", "float16", "float64"])  # CuPy has no bfloat16 dtype
@pytest.mark.parametrize("case", [CASES[0], CASES[10], *CASES[-6:]], ids=lambda c: c.id)
def test_public_call(case, mode, layouts):
    """cupyconv.conv2d(..., layout=, weight_layout=) as a CuPy user calls it, the planner choosing."""
    dtype = "float32" if mode == "tf32" else mode
    x, weight, bias = inputs(case, dtype, seed=3)
    problem = problem_of(case, dtype, *layouts)
    out = torch.full(problem.out_array_shape, float("nan"), device="cuda", dtype=x.dtype)
    got = cupyconv.conv2d(to_cupy(arranged(x, layouts[0])), to_cupy(arranged(weight, layouts[1])), to_cupy(bias),
                          case.stride, case.padding, case.dilation, case.groups, out=to_cupy(out),
                          allow_tf32=mode == "tf32", layout=layouts[0], weight_layout=layouts[1])
    assert got.data.ptr == out.data_ptr()
    torch.cuda.synchronize()
    out = out.permute(0, 3, 1, 2) if layouts[0] == "NHWC" else out
    kernel = "tensor cores" if mode in ("tf32", "float16", "bfloat16") else ""
    assert not out.isnan().any() and relative_error(out, reference(x, weight, bias, case)) < \
        tolerance(dtype, planner.NHWC_KERNEL if kernel else "")


def test_misaligned_views_are_copied():
    """A C-contiguous NHWC view at an address the 16-byte copies cannot read is copied first."""
    case = Case(2, 64, 64, 9, 9, 3, 3, padding=1)
    x, weight, bias = inputs(case, "float16", seed=5)
    storage = torch.empty(x.numel() + 1, device="cuda", dtype=torch.float16)
    shifted = storage[1:].view(2, 9, 9, 64)
    shifted.copy_(x.permute(0, 2, 3, 1))
    assert shifted.data_ptr() % 16
    out = cupyconv.conv2d(to_cupy(shifted), to_cupy(arranged(weight, "KHWC")), to_cupy(bias), padding=1,
                          layout="NHWC", weight_layout="KHWC")
    got = torch.from_dlpack(out).permute(0, 3, 1, 2)
    assert relative_error(got, reference(x, weight, bias, case)) < 1e-2
    y = cct.conv2d(shifted.permute(0, 3, 1, 2), weight.to(memory_format=torch.channels_last), bias, padding=1)
    assert relative_error(y, reference(x, weight, bias, case)) < 1e-2


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_torch_channels_last_in_place(dtype):
    """channels_last x and weight: a channels_last output, and (16-bit) one GEMM launch, no copies."""
    case = Case(4, 64, 128, 14, 14, 3, 3, padding=1)
    x, weight, bias = inputs(case, dtype, seed=7)
    x_cl, w_cl = x.to(memory_format=torch.channels_last), weight.to(memory_format=torch.channels_last)
    y = cct.conv2d(x_cl, w_cl, bias, padding=1)
    assert y.is_contiguous(memory_format=torch.channels_last) and not y.is_contiguous()
    bound = 2e-3 if dtype == "float32" and torch.backends.cudnn.allow_tf32 else tolerance(dtype, planner.NHWC_KERNEL)
    assert relative_error(y, reference(x, weight, bias, case)) < bound
    problem = cct._problem(x_cl, w_cl, bias, 1, 1, 1, 1)
    assert (problem.layout, problem.weight_layout) == ("NHWC", "KHWC")
    if dtype != "float32":
        exe = executable(problem, False, x.device.index)
        assert exe.plan.kernel == planner.NHWC_KERNEL and len(exe._launches) == 1 and exe.weight is None


@pytest.mark.parametrize("dtype", ["float32", "float64"])  # torch keeps float64 contiguous
@pytest.mark.parametrize("x_cl,w_cl", list(itertools.product((False, True), repeat=2)))
def test_torch_mixed_formats_follow_torch(x_cl, w_cl, dtype, strict_torch_fp32):
    case = Case(2, 16, 32, 10, 11, 3, 3, padding=1)
    x, weight, bias = inputs(case, dtype, seed=11)
    x = x.to(memory_format=torch.channels_last) if x_cl else x
    weight = weight.to(memory_format=torch.channels_last) if w_cl else weight
    y, expected = cct.conv2d(x, weight, bias, padding=1), F.conv2d(x, weight, bias, padding=1)
    assert y.is_contiguous(memory_format=torch.channels_last) == expected.is_contiguous(memory_format=torch.channels_last)
    assert y.is_contiguous() == expected.is_contiguous()
    assert relative_error(y, reference(x, weight, bias, case)) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_converted_channels_last_model(dtype, strict_torch_fp32):
    """A converted channels_last model stays channels_last and gives torch's result; the weight cache
    follows an in-place update of a channels_last weight."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 7, stride=2, padding=3), torch.nn.BatchNorm2d(32),
                                torch.nn.ReLU(), torch.nn.Conv2d(32, 64, 3, padding=1),
                                torch.nn.Conv2d(64, 64, 1, groups=2), torch.nn.Conv2d(64, 64, 3, padding=1, groups=64))
    model = model.cuda().eval().to(dtype=dtype, memory_format=torch.channels_last)
    x = torch.randn(2, 3, 32, 32, device="cuda", dtype=dtype).to(memory_format=torch.channels_last)
    with torch.no_grad():
        expected = model(x)
        converted = cct.convert(model)
        y = converted(x)
        assert y.is_contiguous(memory_format=torch.channels_last)
        bound = 2e-2 if dtype == torch.float16 else 1e-5
        assert relative_error(y, expected) < bound
        converted[3].weight.mul_(-0.5)  # in place: the prepared forms are stale now
        again = converted(x)
        fresh = cct.convert(torch.nn.Sequential(*[m for m in model]))  # same modules, emptied caches
        cct.clear_weight_caches(fresh)
        assert torch.equal(again, fresh(x))


def test_compiled_channels_last_model(strict_torch_fp32):
    """torch.compile(fullgraph=True) of a converted channels_last model: the custom op computes NHWC in
    place too, with a channels_last output, as eager calls do."""
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(32, 32, 3, padding=1, groups=32))
    model = model.cuda().half().eval().to(memory_format=torch.channels_last)
    x = torch.randn(2, 16, 12, 12, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    with torch.no_grad():
        expected = model(x)
        torch._dynamo.reset()
        y = torch.compile(cct.convert(model), fullgraph=True)(x)
    assert y.is_contiguous(memory_format=torch.channels_last)
    assert relative_error(y, expected) < 2e-2


# Depthwise NHWC rows: every kernel width and column stride the row instances are compiled for,
# planes whose rows are not whole runs of 4, asymmetric padding, row dilation and stride, and the
# epilogue; against float64, and bit for bit against the per-pixel way (the same sums in the same order).
ROW_CASES = [Case(2, 24, 24, 11, 13, kw, kw, stride=(sh, sw), padding=(kw // 2, kw // 2 + sw - 1),
                  dilation=(dh, 1), groups=24, bias=bias)
             for kw in (3, 5, 7) for sw in (1, 2) for sh, dh, bias in ((1, 1, True), (2, 2, False))]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("case", ROW_CASES, ids=lambda c: c.id)
def test_depthwise_nhwc_rows(case, dtype):
    problem = problem_of(case, dtype, "NHWC", "KHWC")
    rows = planner.make_plan(problem)
    assert rows.kernel == planner.DEPTHWISE_NHWC_KERNEL and rows.config.pixels > 1
    per_pixel = planner.make_plan(problem, "dw_nhwc_v16", planner.DEPTHWISE_NHWC_KERNEL)
    x, weight, bias = inputs(case, dtype, seed=case.kw * 10 + case.stride[1])
    expected = run(per_pixel, problem, x, weight, bias)
    assert not expected.isnan().any(), "an output element was never written"
    assert relative_error(expected, reference(x, weight, bias, case)) < tolerance(dtype, rows.kernel)
    for pixels in depthwise_nhwc.ROW_PIXELS:
        out = run(planner.make_plan(problem, f"dw_nhwc_v16_row{pixels}", planner.DEPTHWISE_NHWC_KERNEL), problem,
                  x, weight, bias)
        assert torch.equal(out, expected), f"runs of {pixels} pixels"
    # The epilogue on every run's pixels: relu(conv + bias + residual), the residual the output itself.
    fused = dataclasses.replace(problem, activation="relu", has_residual=True)
    residual = torch.randn(expected.shape, device="cuda", dtype=torch.float64).to(expected.dtype)
    wanted = F.relu(reference(x, weight, bias, case) + residual.double())
    for pixels in depthwise_nhwc.ROW_PIXELS:
        y = nhwc_copy(residual)
        plan = planner.make_plan(fused, f"dw_nhwc_v16_row{pixels}", planner.DEPTHWISE_NHWC_KERNEL)
        conv2d_cupy(to_cupy(arranged(x, "NHWC")), to_cupy(arranged(weight, "KHWC")), to_cupy(bias), fused,
                    to_cupy(y), plan=plan, residual=to_cupy(y))
        assert relative_error(y.permute(0, 3, 1, 2), wanted) < tolerance(dtype, rows.kernel), f"runs of {pixels}"


def check_forced_against_per_pixel(case, dtype, config, seed, activation):
    """``config`` forced on ``case`` in NHWC sums as the per-pixel way does, in the same order: bit for bit, within
    tolerance of float64, every output written; and with activation(conv + bias + residual) in the epilogue."""
    problem = problem_of(case, dtype, "NHWC", "KHWC")
    forced = planner.make_plan(problem, config, planner.DEPTHWISE_NHWC_KERNEL)
    per_pixel = planner.make_plan(problem, "dw_nhwc_v16", planner.DEPTHWISE_NHWC_KERNEL)
    x, weight, bias = inputs(case, dtype, seed=seed)
    expected = run(per_pixel, problem, x, weight, bias)
    out = run(forced, problem, x, weight, bias)
    assert not out.isnan().any(), "an output element was never written"
    assert torch.equal(out, expected)
    assert relative_error(out, reference(x, weight, bias, case)) < tolerance(dtype, forced.kernel)
    fused = dataclasses.replace(problem, activation=activation, has_residual=True)
    residual = torch.randn(expected.shape, device="cuda", dtype=torch.float64).to(expected.dtype)
    y = nhwc_copy(residual)
    conv2d_cupy(to_cupy(arranged(x, "NHWC")), to_cupy(arranged(weight, "KHWC")), to_cupy(bias), fused, to_cupy(y),
                plan=planner.make_plan(fused, config, planner.DEPTHWISE_NHWC_KERNEL), residual=to_cupy(y))
    wanted = getattr(F, activation)(reference(x, weight, bias, case) + residual.double())
    assert relative_error(y.permute(0, 3, 1, 2), wanted) < tolerance(dtype, forced.kernel)


# Runs that walk down output rows (depthwise_nhwc.WALK_CONFIGS, forced): square kernels of every compiled
# width, equal strides 1 and 2, planes whose rows and columns are not whole walks and runs, asymmetric padding;
# bit for bit the per-pixel sums, every output written, and the epilogue on every walked row.
WALK_CASES = [Case(2, 24, 24, 11, 13, kw, kw, stride=(s, s), padding=(kw // 2, kw // 2 + s - 1), groups=24, bias=s == 1)
              for kw in (3, 5, 7) for s in (1, 2)]


@pytest.mark.parametrize("config", [c.name for c in depthwise_nhwc.WALK_CONFIGS])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("case", WALK_CASES, ids=lambda c: c.id)
def test_depthwise_nhwc_walks_down_rows(case, dtype, config):
    check_forced_against_per_pixel(case, dtype, config, case.kw * 10 + case.stride[1] + 3, "relu6")


# Walks that read the weight in place (depthwise_nhwc.stages_weight: 16-bit, 8-byte vectors, few blocks), on
# channels past a block's 128 vectors: 520 channels (130 vectors: a block's rows wrap past C in the weight) and
# 1152 (288: whole blocks, as EfficientNet-B0's), and 40 (10 vectors: a block holds every channel); bit for bit
# the per-pixel sums of the prepared weight and the same walk's on the prepared weight (its instance for
# launches of many blocks), within tolerance of float64, every output written, and the epilogue.
STAGED_CASES = [Case(3, c, c, 7, 9, kw, kw, stride=(s, s), padding=(kw // 2, kw // 2 + s - 1), groups=c, bias=s == 1)
                for c in (40, 520, 1152) for kw in (3, 5) for s in (1, 2)]
STAGED_CONFIGS = [c.name for c in depthwise_nhwc.WALK_CONFIGS if c.vec_bytes == depthwise_nhwc.STAGED_VEC_BYTES]


@pytest.mark.parametrize("config", STAGED_CONFIGS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", STAGED_CASES, ids=lambda c: c.id)
def test_depthwise_nhwc_walks_read_the_weight_in_place(case, dtype, config):
    problem = problem_of(case, dtype, "NHWC", "KHWC")
    plan = planner.make_plan(problem, config, planner.DEPTHWISE_NHWC_KERNEL)
    assert plan.config.staged and plan.shared_bytes > 0
    assert planner.program(plan, problem).weight is None, "no weight preparation"
    seed = case.c + case.kw * 10 + case.stride[1]
    check_forced_against_per_pixel(case, dtype, config, seed, "relu")
    prepared = dataclasses.replace(plan, config=dataclasses.replace(plan.config, staged=False), shared_bytes=0)
    assert planner.program(prepared, problem).weight is not None
    x, weight, bias = inputs(case, dtype, seed=seed)
    assert torch.equal(run(prepared, problem, x, weight, bias), run(plan, problem, x, weight, bias))


# Runs of any kernel width (depthwise_nhwc.RUN_CONFIGS, forced here; RUN_CONFIG is the rule for kernels
# wider than one column other than the row instances' widths): conv1d's long kernels (31 taps: runs of 4 taps and a
# remainder of 3), a width of whole runs, widths below a run, rows that are not whole runs, several
# kernel rows with row stride and dilation, and the epilogue.
RUN_CASES = [Case(2, 24, 24, 1, 203, 1, 31, padding=(0, 15), groups=24),
             Case(1, 16, 16, 1, 50, 1, 8, padding=(0, 4), groups=16, bias=False),
             Case(2, 8, 8, 1, 37, 1, 2, groups=8),
             Case(1, 24, 24, 1, 19, 1, 1, groups=24),
             Case(2, 16, 16, 9, 23, 3, 9, stride=(2, 1), padding=(2, 4), dilation=(2, 1), groups=16)]


@pytest.mark.parametrize("config", [c.name for c in depthwise_nhwc.RUN_CONFIGS])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("case", RUN_CASES, ids=lambda c: c.id)
def test_depthwise_nhwc_runs_of_any_width(case, dtype, config):
    check_forced_against_per_pixel(case, dtype, config, case.kw, "relu")


# The NCHW-gather GEMM's NHWC instance, reading and writing NHWC arrays in place: every case its tiles
# take, one input channel (wav2vec 2.0's front end, a grayscale stem), three (an RGB stem), channel tiles
# of 32 to 128 with partial ones, groups, 1x1 planes, and the epilogue with a residual.
NHWC_GATHER_CASES = CASES + [Case(2, 1, 64, 1, 300, 1, 10, stride=(1, 5)),
                             Case(3, 1, 32, 20, 22, 3, 3, padding=1),
                             Case(2, 3, 32, 30, 34, 3, 3, stride=2, padding=1),
                             Case(2, 6, 200, 7, 9, 1, 1, bias=False)]


@pytest.mark.parametrize("tile", range(len(GEMM_CONFIGS["float16"])))
@pytest.mark.parametrize("weight_layout", ["KCHW", "KHWC"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("case", NHWC_GATHER_CASES, ids=lambda c: c.id)
def test_nhwc_in_place(case, dtype, weight_layout, tile):
    """On each tile: within tolerance of float64, every output written, and bit for bit the NCHW
    instance's output on the same tile (the same sums in the same order, read and stored elsewhere); with
    relu(conv + bias + residual) too."""
    problem = problem_of(case, dtype, "NHWC", weight_layout)
    try:
        in_place = planner.make_plan(problem, GEMM_CONFIGS[dtype][tile].name, planner.GEMM_KERNEL)
    except ValueError:  # the GEMM does not take this problem
        return
    assert in_place.name_expression.endswith(",true>")
    nchw = problem_of(case, dtype, "NCHW", "KCHW")
    x, weight, bias = inputs(case, dtype, seed=case.k)
    out = run(in_place, problem, x, weight, bias)
    assert not out.isnan().any(), "an output element was never written"
    assert relative_error(out, reference(x, weight, bias, case)) < tolerance(dtype, planner.GEMM_KERNEL)
    assert torch.equal(out, run(planner.make_plan(nchw, in_place.config.name, planner.GEMM_KERNEL), nchw, x, weight,
                                bias))
    fused = dataclasses.replace(problem, activation="relu", has_residual=True)
    residual = torch.randn(out.shape, device="cuda", dtype=torch.float64).to(out.dtype)
    y = nhwc_copy(residual)
    conv2d_cupy(to_cupy(arranged(x, "NHWC")), to_cupy(arranged(weight, weight_layout)), to_cupy(bias), fused,
                to_cupy(y), plan=planner.make_plan(fused, in_place.config.name, planner.GEMM_KERNEL),
                residual=to_cupy(y))
    wanted = F.relu(reference(x, weight, bias, case) + residual.double())
    assert relative_error(y.permute(0, 3, 1, 2), wanted) < tolerance(dtype, planner.GEMM_KERNEL)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("c,k", [(6, 144), (144, 6), (48, 1152), (32, 8)])
def test_one_pixel_planes_run_in_place_through_the_adapter(c, k, dtype):
    """Squeeze-excitation layers of a channels_last model see contiguous (N, C, 1, 1) tensors: the call
    runs the NHWC problem of the same memory in one launch (planner.as_planned), within tolerance of
    float64 with sigmoid(conv + bias + residual), every output written."""
    case = Case(32, c, k, 1, 1, 1, 1)
    x, weight, bias = inputs(case, dtype, seed=c + k)
    residual = torch.randn(32, k, 1, 1, device="cuda", dtype=torch.float64).to(x.dtype)
    y = cct.conv2d(x, weight, bias, activation="sigmoid", residual=residual)
    wanted = torch.sigmoid(reference(x, weight, bias, case) + residual.double())
    assert not y.isnan().any()
    assert relative_error(y, wanted) < (2e-3 if dtype == "float32" else 1e-2)
    problem = make_problem((32, c, 1, 1), (k, c, 1, 1), (k,), dtype)
    exe = executable(problem, True, x.device.index)
    assert exe.plan.layout == "NHWC" and len(exe._launches) == 1, str(exe.plan)


#: Strided layers of few channels, which the channels-last GEMM runs as stride-1 layers on space-to-depth
#: copies: ResNet's stem on odd planes (4x4 taps of 12 -> 16 channels), AlexNet's (3x3 taps of 48),
#: EfficientNet's (2x2), a patchify layer (one tap), blocks of 1 x 2 pixels of 2 channels (float32 too),
#: and 5 channels at stride (3, 2) (30 -> 32 channels; float32 too).
SPACE_TO_DEPTH_CASES = [
    Case(2, 3, 64, 23, 21, 7, 7, stride=2, padding=3),
    Case(1, 3, 96, 35, 33, 11, 11, stride=4, padding=2),
    Case(2, 3, 32, 17, 16, 3, 3, stride=2, padding=1, bias=False),
    Case(2, 3, 40, 16, 20, 4, 4, stride=4),
    Case(1, 2, 24, 13, 15, 3, 5, stride=(1, 2), padding=(1, 2)),
    Case(3, 5, 136, 11, 12, 5, 3, stride=(3, 2), padding=(2, 0)),
]


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("layouts", [("NCHW", "KCHW"), *LAYOUT_PAIRS], ids="-".join)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("case", SPACE_TO_DEPTH_CASES, ids=lambda c: c.id)
def test_space_to_depth(case, dtype, layouts, residual):
    """The rules' plan of the channels-last GEMM (float32 as TF32) blocks these layers' pixels where their
    channels make no 16-byte pieces: within tolerance of float64, with relu(conv + bias + residual) too,
    every output written, the inputs untouched; and, with space-to-depth forced off, within tolerance too."""
    problem = problem_of(case, dtype, *layouts)
    if residual:
        problem = dataclasses.replace(problem, activation="relu", has_residual=True)
    block = implicit_gemm_nhwc.space_to_depth_block(problem)
    assert (block != (1, 1)) == (dtype != "float32" or case.c in (2, 5))
    x, weight, bias = inputs(case, dtype, seed=case.k + case.c)
    saved = [t.clone() for t in (x, weight, bias) if t is not None]
    wanted = reference(x, weight, bias, case)
    added = torch.randn(wanted.shape, device="cuda", dtype=torch.float64).to(x.dtype) if residual else None
    if residual:
        wanted = F.relu(wanted + added.double())
    for space_to_depth in (None, False):
        plan = planner.make_plan(problem, kernel=planner.NHWC_KERNEL, compute_capability=compute_capability(),
                                 space_to_depth=space_to_depth)
        assert plan.space_to_depth == (block if space_to_depth is None else (1, 1)), str(plan)
        out = run(plan, problem, x, weight, bias, added)
        assert not out.isnan().any(), "an output element was never written"
        assert relative_error(out, wanted) < tolerance(dtype, planner.NHWC_KERNEL), str(plan)
    for before, after in zip(saved, (t for t in (x, weight, bias) if t is not None)):
        assert torch.equal(before, after), "an input was modified"


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("tile", range(len(implicit_gemm_nhwc.NHWC_CONFIGS["float16"])))
@pytest.mark.parametrize("case", [SPACE_TO_DEPTH_CASES[0], SPACE_TO_DEPTH_CASES[5]], ids=lambda c: c.id)
def test_space_to_depth_every_tile(case, tile, dtype, layout):
    """Every channels-last tile that takes the blocked problem (forced), whole and with split-K's runs or
    stream-K where they fit, within tolerance of float64, every output written."""
    problem = problem_of(case, dtype, layout, "KCHW")
    if implicit_gemm_nhwc.space_to_depth_block(problem) == (1, 1):  # float32's 3 channels
        return
    if tile >= len(implicit_gemm_nhwc.NHWC_CONFIGS[dtype]):
        pytest.skip(f"{dtype} has {len(implicit_gemm_nhwc.NHWC_CONFIGS[dtype])} tiles (the ping-pong one is 16-bit)")
    config = implicit_gemm_nhwc.NHWC_CONFIGS[dtype][tile].name
    x, weight, bias = inputs(case, dtype, seed=case.k)
    wanted = reference(x, weight, bias, case)
    for options in ({}, {"splits": 2}, {"stream_k": 3}):
        try:
            plan = planner.make_plan(problem, config, planner.NHWC_KERNEL, compute_capability=compute_capability(),
                                     **options)
        except ValueError:  # a wgmma tile on another GPU, the producer's whole k tiles, stream-K's tiles
            continue
        assert plan.space_to_depth != (1, 1)
        out = run(plan, problem, x, weight, bias)
        assert not out.isnan().any(), f"an output element was never written: {plan}"
        assert relative_error(out, wanted) < tolerance(dtype, planner.NHWC_KERNEL), str(plan)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_space_to_depth_output_layout_on_the_rules_tile(layout):
    """A layer whose space-to-depth copies make 64 channels (4 at stride 4; unfused): its GEMM's output is
    the caller's layout, so an NCHW one never takes the ping-pong tile, which writes NHWC alone (the rules
    once gave it that tile); NHWC does."""
    case = Case(32, 4, 256, 128, 128, 8, 8, stride=4, bias=False)
    problem = problem_of(case, "float16", layout, "KCHW")
    plan = planner.make_plan(problem, compute_capability=compute_capability())
    assert plan.space_to_depth == (4, 4)
    pingpong = plan.config.wgmma == implicit_gemm_nhwc.WGMMA_PINGPONG
    assert pingpong == (layout == "NHWC" and compute_capability() == 90), str(plan)
    x, weight, bias = inputs(case, "float16", seed=11)
    out = run(plan, problem, x, weight, bias)
    assert not out.isnan().any(), f"an output element was never written: {plan}"
    assert relative_error(out, reference(x, weight, bias, case)) < tolerance("float16", planner.NHWC_KERNEL), str(plan)


#: Layers whose windows an im2col map cannot walk (strides past 8, corners more than 128 pixels outside the
#: plane), which the TMA-fed tiles' rules took before they asked implicit_gemm_nhwc.im2col_map_fits.
PAST_THE_IM2COL_MAP = [
    Case(8, 64, 64, 200, 200, 3, 3, stride=9),
    Case(2, 64, 128, 16, 16, 3, 3, padding=130),
    Case(8, 128, 128, 200, 60, 3, 3, stride=(10, 1), padding=1),
    Case(1, 256, 256, 300, 300, 3, 3, stride=9, padding=1),
    Case(4, 64, 256, 40, 40, 1, 1, padding=130),
]


@pytest.mark.parametrize("layouts", [("NHWC", "KHWC"), ("NCHW", "KCHW")], ids="-".join)
@pytest.mark.parametrize("mode", ["float16", "bfloat16", "tf32"])
@pytest.mark.parametrize("case", PAST_THE_IM2COL_MAP, ids=lambda c: c.id)
def test_windows_past_the_im2col_map(case, mode, layouts):
    """The rules' plan of such a layer runs (no tile whose im2col map the driver refuses) and is right."""
    dtype = "float32" if mode == "tf32" else mode
    problem = problem_of(case, dtype, *layouts)
    plan = planner.make_plan(problem, allow_tf32=mode == "tf32", compute_capability=compute_capability())
    x, weight, bias = inputs(case, dtype, seed=case.k + case.h)
    out = run(plan, problem, x, weight, bias)
    assert not out.isnan().any(), "an output element was never written"
    assert relative_error(out, reference(x, weight, bias, case)) < tolerance(dtype, planner.NHWC_KERNEL)


#: (N, C, P, Cp): the channels-last copy's shapes: few channels (nchw_to_nhwc_narrow), whole and partial 64 x 64
#: tiles of pairs (16 bits, P and Cp even), odd P or odd Cp (the element-wise tile), zero channels past C.
COPY_SHAPES = [(2, 3, 50, 4), (2, 3, 49, 8), (3, 64, 3136, 64), (2, 130, 196, 136), (2, 129, 50, 130),
               (1, 96, 49, 96), (2, 72, 30, 75), (3, 33, 2, 34), (1, 512, 4, 512)]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("n,c,positions,padded", COPY_SHAPES, ids=str)
def test_channels_last_copy(n, c, positions, padded, dtype):
    """implicit_gemm_nhwc.channels_last_copy's launch (whichever kernel it takes) writes [n][positions][padded]
    from [n][c][positions]: every value in place, bit for bit, and zeros past c, over a NaN-poisoned output."""
    from cupyconv.executor import program_executable
    from cupyconv.launch import run_program
    from cupyconv.program import OUT, X, CallProgram, Pointer

    launch = implicit_gemm_nhwc.channels_last_copy(dtype, n, c, positions, padded, False, Pointer(X), Pointer(OUT))
    problem = make_problem((n, c, 1, positions), (c, c, 1, 1), None, dtype)  # the operands' names only
    exe = program_executable(lambda plan, p: CallProgram((launch,)), None, problem, cupy.cuda.Device().id)
    storage = cupy.int16 if dtype == "bfloat16" else dtype  # raw 16-bit patterns: bit for bit is the point
    x = cupy.random.default_rng(3).integers(-30000, 30000, (n, c, positions)).astype(storage) \
        if cupy.dtype(storage).itemsize == 2 else cupy.random.default_rng(3).standard_normal((n, c, positions), dtype)
    y = cupy.full((n, positions, padded), cupy.nan if storage != cupy.int16 else -1, dtype=storage)
    run_program(exe, x=x, out=y)
    cupy.cuda.get_current_stream().synchronize()
    assert bool((y[..., :c] == x.transpose(0, 2, 1)).all())
    assert bool((y[..., c:] == 0).all())
