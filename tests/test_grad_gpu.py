"""The input gradient, conv_transpose2d and conv1d on the GPU against torch in float64: every dtype
at its tolerance (16-bit and TF32 judged against torch's own error in that precision), both layouts,
the stride phases (several phases, phases no tap reaches, output_padding), with every temporary and
output of the call allocated NaN-poisoned, so an element never written fails."""
import contextlib

import numpy as np
import pytest

import cupyconv
from cases import PHASE_CASES, Case
from checks import relative_error
from cupyconv import conv_transpose
from cupyconv.arguments import make_problem
from cupyconv.compiler import compute_capability
from cupyconv.conv_transpose import make_transpose_problem, transpose_plan, transposed
from cupyconv.wgrad_tensor_cores import K_MAJOR_CONFIGS, TF32_K_MAJOR_CONFIGS, TF32_TMA_CONFIGS, TMA_CONFIGS
from devices import gpu_count

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
F = torch.nn.functional
if gpu_count():
    import cupy

TORCH_DTYPES = {"float64": torch.float64, "float32": torch.float32, "tf32": torch.float32,
                "float16": torch.float16, "bfloat16": torch.bfloat16}
FLOOR = {"float64": 1e-12, "float32": 1e-5, "tf32": 2e-3, "float16": 2e-3, "bfloat16": 1.5e-2}
MODES = list(TORCH_DTYPES)


@contextlib.contextmanager
def nan_poisoned_memory():
    """CuPy allocations inside the block come filled with 0xFF bytes (NaN in every float type)."""
    pool = cupy.get_default_memory_pool()

    def allocate(size):
        memory = pool.malloc(size)
        memory.memset_async(0xFF, size)
        return memory

    with cupy.cuda.using_allocator(allocate):
        yield


def to_cupy(t, nhwc=False):
    if nhwc:
        t = t.permute(0, 2, 3, 1)
    t = t.contiguous()
    return cupy.from_dlpack(t.view(torch.int16) if t.dtype == torch.bfloat16 else t)


def from_cupy(a, dtype, nhwc=False):
    t = torch.from_dlpack(a)
    if dtype == torch.bfloat16:
        t = t.view(torch.bfloat16)
    return t.permute(0, 3, 1, 2) if nhwc else t


def bound(mode, own, ref):
    """Strict modes absolutely; TF32 and 16-bit up to 4x torch's own error in that precision."""
    torch_error = relative_error(own, ref)
    return FLOOR[mode] if mode in ("float64", "float32") else max(FLOOR[mode], 4 * torch_error)


@contextlib.contextmanager
def precision(mode):
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = mode == "tf32"
    yield
    torch.backends.cudnn.allow_tf32 = saved


DGRAD_CASES = [
    Case(2, 8, 16, 9, 11, 3, 3, padding=1),                        # one phase, Winograd in fp32
    Case(2, 16, 32, 14, 15, 3, 3, stride=2, padding=1),            # four phases
    Case(1, 8, 8, 12, 12, 1, 1, stride=2),                         # phases no tap reaches
    Case(2, 6, 12, 17, 19, 4, 2, stride=(2, 3), padding=(0, 1), dilation=(2, 1)),
    Case(1, 8, 16, 10, 9, 4, 2, padding="same"),                   # asymmetric padding
    Case(2, 16, 16, 13, 13, 3, 3, padding=1, groups=16),           # depthwise
    Case(1, 8, 24, 11, 10, 3, 3, stride=2, padding=1, groups=8),   # channel multiplier 3
    Case(2, 16, 24, 9, 9, 3, 3, stride=2, padding=1, groups=2),    # grouped
    Case(1, 4, 16, 23, 37, 5, 5, stride=3, padding=2, dilation=2),
    Case(0, 8, 16, 9, 11, 3, 3, padding=1),                        # empty batch
    Case(4, 64, 64, 28, 28, 3, 3, padding=1),                      # tensor-core sized
    Case(2, 32, 64, 56, 56, 1, 1, stride=2),                       # ResNet's projection shortcut
]


def check_input_gradient(case, mode, nhwc, judged_as=None, plan_check=None):
    """cupyconv.grad.input_gradient of ``case`` in ``mode`` against torch's float64 gradient, NaN-poisoned, at
    the tolerance of ``judged_as`` (default ``mode``); ``plan_check(problem)`` runs first where given."""
    dtype = TORCH_DTYPES[mode]
    gen = torch.Generator(device="cuda").manual_seed(len(case.id))
    x = torch.randn(case.n, case.c, case.h, case.w, device="cuda", dtype=torch.float64, generator=gen)
    w = torch.randn(case.k, case.c // case.groups, case.kh, case.kw, device="cuda", dtype=torch.float64, generator=gen)
    args = (case.stride, case.padding, case.dilation, case.groups)
    xr, wr = x.clone().requires_grad_(), w.clone()
    y = F.conv2d(xr, wr, None, *args)
    dy = torch.randn(y.shape, device="cuda", dtype=torch.float64, generator=gen)
    y.backward(dy)
    ref = xr.grad
    layout = ("NHWC", "KHWC") if nhwc else ("NCHW", "KCHW")
    problem = make_problem(tuple(x.permute(0, 2, 3, 1).shape) if nhwc else tuple(x.shape),
                           tuple(w.permute(0, 2, 3, 1).shape) if nhwc else tuple(w.shape), None,
                           "float32" if mode == "tf32" else mode, *args, *layout)
    if plan_check:
        plan_check(problem)
    with nan_poisoned_memory(), precision(mode):
        out = cupyconv.grad.input_gradient(problem, to_cupy(w.to(dtype), nhwc), to_cupy(dy.to(dtype), nhwc), "cupy",
                                           allow_tf32=mode == "tf32")
        got = from_cupy(out, dtype, nhwc)
        xo = x.to(dtype).requires_grad_()
        F.conv2d(xo, w.to(dtype), None, *args).backward(dy.to(dtype))
    assert got.shape == x.shape and not got.isnan().any()
    assert relative_error(got, ref) <= bound(judged_as or mode, xo.grad, ref)


@pytest.mark.parametrize("nhwc", [False, True], ids=["NCHW", "NHWC"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", DGRAD_CASES, ids=lambda c: c.id)
def test_input_gradient(case, mode, nhwc):
    check_input_gradient(case, mode, nhwc)


def test_public_input_gradient_on_cupy_matches_numpy_path():
    rng = np.random.default_rng(1)
    weight, dy = rng.standard_normal((12, 3, 3, 5)), rng.standard_normal((2, 12, 8, 7))
    ref = cupyconv.grad.conv2d_input((2, 6, 16, 13), weight, dy, stride=2, padding=(1, 2), groups=2)
    with nan_poisoned_memory():
        got = cupyconv.grad.conv2d_input((2, 6, 16, 13), cupy.asarray(weight), cupy.asarray(dy), stride=2,
                                         padding=(1, 2), groups=2)
    assert isinstance(got, cupy.ndarray) and relative_error(cupy.asnumpy(got), ref) < 1e-12


TRANSPOSED = [
    # n, c_in, c_out, h, w, k, stride, padding, output_padding, groups, dilation
    (4, 32, 16, 8, 8, 4, 2, 1, 0, 1, 1),       # DCGAN
    (2, 64, 32, 14, 14, 3, 2, 1, 1, 1, 1),     # decoder, output_padding
    (2, 64, 32, 7, 7, 2, 2, 0, 0, 1, 1),       # U-Net 2x2 up-sampling: four 1x1 phases
    (2, 16, 16, 9, 9, 3, 2, 1, 1, 16, 1),      # depthwise
    (1, 8, 12, 5, 6, 3, 3, 0, 2, 2, 1),        # stride past the kernel, output_padding 2
    (1, 8, 8, 6, 5, 3, 2, 2, 2, 1, 3),         # output_padding past the stride (below the dilation)
    (8, 100, 64, 1, 1, 4, 1, 0, 0, 1, 1),      # DCGAN's first layer: 1x1 input
    (64, 256, 128, 8, 8, 4, 2, 1, 0, 1, 1),    # TF32 on the 3-stage pixel-row phase tile, y rounded first
]


def check_conv_transpose2d(case, mode, nhwc, judged_as=None, plan_check=None):
    """conv_transpose2d of ``case`` (as TRANSPOSED) in ``mode`` against torch in float64, NaN-poisoned, at the
    tolerance of ``judged_as`` (default ``mode``); ``plan_check(tp)`` runs first where given."""
    n, c_in, c_out, h, w_, k, stride, padding, output_padding, groups, dilation = case
    dtype = TORCH_DTYPES[mode]
    gen = torch.Generator(device="cuda").manual_seed(sum(case))
    x = torch.randn(n, c_in, h, w_, device="cuda", dtype=torch.float64, generator=gen)
    w = torch.randn(c_in, c_out // groups, k, k, device="cuda", dtype=torch.float64, generator=gen)
    b = torch.randn(c_out, device="cuda", dtype=torch.float64, generator=gen)
    args = (stride, padding, output_padding, groups, dilation)
    ref = F.conv_transpose2d(x, w, b, *args)
    tp = make_transpose_problem(tuple(x.permute(0, 2, 3, 1).shape) if nhwc else tuple(x.shape),
                                tuple(w.permute(0, 2, 3, 1).shape) if nhwc else tuple(w.shape), (c_out,),
                                "float32" if mode == "tf32" else mode, stride, padding, output_padding, groups,
                                dilation, "NHWC" if nhwc else "NCHW", "KHWC" if nhwc else "KCHW")
    if plan_check:
        plan_check(tp)
    with nan_poisoned_memory(), precision(mode):
        out = transposed(to_cupy(x.to(dtype), nhwc), to_cupy(w.to(dtype), nhwc), to_cupy(b.to(dtype)), tp, "cupy",
                         allow_tf32=mode == "tf32")
        got = from_cupy(out, dtype, nhwc)
        own = F.conv_transpose2d(x.to(dtype), w.to(dtype), b.to(dtype), *args)
    assert got.shape == ref.shape and not got.isnan().any()
    assert relative_error(got, ref) <= bound(judged_as or mode, own, ref)


@pytest.mark.parametrize("nhwc", [False, True], ids=["NCHW", "NHWC"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", TRANSPOSED, ids=str)
def test_conv_transpose2d(case, mode, nhwc):
    check_conv_transpose2d(case, mode, nhwc)


@pytest.mark.parametrize("nhwc", [True, False], ids=["NHWC", "NCHW"])
@pytest.mark.parametrize("mode", ["float16", "bfloat16", "tf32"])
@pytest.mark.parametrize("case", PHASE_CASES, ids=str)
def test_conv_transpose2d_phases_in_one_launch(case, mode, nhwc, monkeypatch):
    """16-bit and TF32 transposed convolutions whose stride phases run in one launch (windows of y read
    through negative padding, phases of different taps, groups, dilation, split-K, phases no tap
    reaches, outputs of 3 channels widened to 8 with transpose_few_channels turned away), NHWC, and
    NCHW (y transposed for the launch, the output written NCHW by it): against torch in float64,
    NaN-poisoned."""
    monkeypatch.setattr(conv_transpose.transpose_few_channels, "refusal", lambda tp: "turned away by the test")
    conv_transpose.transposed_executable.cache_clear()
    y_shape, w_shape, stride, padding, output_padding, groups, dilation = case
    dtype = TORCH_DTYPES[mode]
    gen = torch.Generator(device="cuda").manual_seed(len(str(case)))
    x = torch.randn(y_shape[0], y_shape[3], *y_shape[1:3], device="cuda", dtype=torch.float64, generator=gen)
    w = torch.randn(*w_shape, device="cuda", dtype=torch.float64, generator=gen)
    b = torch.randn(w_shape[1] * groups, device="cuda", dtype=torch.float64, generator=gen)
    args = (stride, padding, output_padding, groups, dilation)
    ref = F.conv_transpose2d(x, w, b, *args)
    tf32 = mode == "tf32"
    tp = make_transpose_problem(y_shape if nhwc else tuple(x.shape), w_shape, tuple(b.shape),
                                "float32" if tf32 else mode, *args, "NHWC" if nhwc else "NCHW", "KCHW")
    assert transpose_plan(tp, tf32, compute_capability(), tp.c).gemm is not None
    with nan_poisoned_memory(), precision(mode):
        out = transposed(to_cupy(x.to(dtype), nhwc), to_cupy(w.to(dtype)), to_cupy(b.to(dtype)), tp, "cupy",
                         allow_tf32=tf32)
        got = from_cupy(out, dtype, nhwc)
        own = F.conv_transpose2d(x.to(dtype), w.to(dtype), b.to(dtype), *args)
    conv_transpose.transposed_executable.cache_clear()  # no program made with the family turned away is kept
    assert got.shape == ref.shape and not got.isnan().any()
    assert relative_error(got, ref) <= bound(mode, own, ref)


@pytest.mark.skipif(gpu_count() == 0 or compute_capability() != 90,
                    reason="the producer warpgroup's tile runs on compute capability 9.0 (sm_90a) alone")
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("mode", ["float16", "bfloat16", "tf32"])
@pytest.mark.parametrize("config", ["nhwc_wgmma_producer_m128n128", "nhwc_wgmma_producer_m192n128",
                                    "nhwc_wgmma_producer_m256n128", "nhwc_wgmma_producer_m256n64"])
@pytest.mark.parametrize("case", [((2, 9, 7, 64), (64, 128, 2, 2)), ((3, 6, 5, 64), (64, 256, 3, 2))], ids=str)
def test_conv_transpose2d_stacked_phases(case, config, mode, bias, monkeypatch):
    """Transposed convolutions whose kernel is their stride, as one GEMM of the phases' weights stacked on
    each producer tile (implicit_gemm_nhwc_tma_stacked; TF32's y rounded by the kernel, or by a copy on the
    256 x 128 tile), NHWC, with and without a bias: against torch in float64, NaN-poisoned."""
    from cupyconv.families import implicit_gemm_nhwc

    stacked_plan = implicit_gemm_nhwc.stacked_plan
    monkeypatch.setattr(implicit_gemm_nhwc, "stacked_plan",
                        lambda problem, count, cc: stacked_plan(problem, count, cc, config))
    conv_transpose.transposed_executable.cache_clear()
    y_shape, w_shape = case
    stride, dtype, tf32 = w_shape[2:], TORCH_DTYPES[mode], mode == "tf32"
    gen = torch.Generator(device="cuda").manual_seed(len(config) + w_shape[1])
    x = torch.randn(y_shape[0], y_shape[3], *y_shape[1:3], device="cuda", dtype=torch.float64, generator=gen)
    w = torch.randn(*w_shape, device="cuda", dtype=torch.float64, generator=gen)
    b = torch.randn(w_shape[1], device="cuda", dtype=torch.float64, generator=gen) if bias else None
    ref = F.conv_transpose2d(x, w, b, stride)
    tp = make_transpose_problem(y_shape, w_shape, (w_shape[1],) if bias else None, "float32" if tf32 else mode,
                                stride, 0, 0, 1, 1, "NHWC", "KCHW")
    plan = transpose_plan(tp, tf32, compute_capability(), tp.c)
    assert plan.stacked is not None and plan.stacked.config.name == config
    with nan_poisoned_memory(), precision(mode):
        out = transposed(to_cupy(x.to(dtype), True), to_cupy(w.to(dtype)), to_cupy(b.to(dtype)) if bias else None,
                         tp, "cupy", allow_tf32=tf32)
        got = from_cupy(out, dtype, True)
        own = F.conv_transpose2d(x.to(dtype), w.to(dtype), b.to(dtype) if bias else None, stride)
    conv_transpose.transposed_executable.cache_clear()  # no program made with the forced tile is kept
    assert got.shape == ref.shape and not got.isnan().any()
    assert relative_error(got, ref) <= bound(mode, own, ref)


@pytest.mark.parametrize("nhwc", [True, False], ids=["NHWC", "NCHW"])
@pytest.mark.parametrize("case", [PHASE_CASES[0], PHASE_CASES[7], ((64, 8, 8, 256), (256, 128, 4, 4), 2, 1, 0, 1, 1)],
                         ids=["one_run", "split_k", "pixel_rows"])
def test_tf32_phases_in_one_launch_round_as_cvt_rna(case, nhwc):
    """The TF32 phase launch rounds y (in registers or shared memory; or a copy or NCHW's transpose
    rounds it first) and phase_weights rounds the phase weights, all as cvt.rna does: operands rounded
    beforehand give the same bits (the tensor cores alone would drop the low bits, truncating). A third
    of the values lie exactly halfway between two TF32 values."""
    y_shape, w_shape, stride, padding, output_padding, groups, dilation = case
    if not nhwc:
        y_shape = (y_shape[0], y_shape[3], *y_shape[1:3])
    tp = make_transpose_problem(y_shape, w_shape, (w_shape[1] * groups,), "float32", stride, padding, output_padding,
                                groups, dilation, "NHWC" if nhwc else "NCHW", "KCHW")
    assert transpose_plan(tp, True, compute_capability(), tp.c).gemm is not None
    rng = cupy.random.default_rng(5)

    def operand(shape):
        a = rng.standard_normal(shape, dtype=cupy.float32)
        ties = (a.view(cupy.uint32) & 0xFFFFE000) | 0x1000
        return cupy.where(rng.random(shape) < 1 / 3, ties.view(cupy.float32), a)

    y, w, b = operand(y_shape), operand(w_shape), operand(w_shape[1] * groups)
    outs = [transposed(ys, ws, b, tp, "cupy", allow_tf32=True)
            for ys, ws in ((y, w), (_rounded_to_tf32(y), _rounded_to_tf32(w)))]
    assert not cupy.isnan(outs[0]).any() and bool((outs[0] == outs[1]).all())


def test_public_conv_transpose2d_and_conv1d_on_cupy():
    rng = np.random.default_rng(2)
    x, weight, bias = rng.standard_normal((2, 6, 5, 7)), rng.standard_normal((6, 4, 3, 3)), rng.standard_normal(8)
    ref = cupyconv.conv_transpose2d(x, weight, bias, stride=2, padding=1, output_padding=1, groups=2)
    with nan_poisoned_memory():
        got = cupyconv.conv_transpose2d(cupy.asarray(x), cupy.asarray(weight), cupy.asarray(bias), stride=2,
                                        padding=1, output_padding=1, groups=2)
    assert relative_error(cupy.asnumpy(got), ref) < 1e-12
    x1, w1 = rng.standard_normal((3, 8, 40)).astype(np.float32), rng.standard_normal((16, 8, 5)).astype(np.float32)
    ref1 = F.conv1d(torch.from_numpy(x1).double(), torch.from_numpy(w1).double(), stride=2, padding=2).numpy()
    got1 = cupyconv.conv1d(cupy.asarray(x1), cupy.asarray(w1), stride=2, padding=2)
    assert got1.shape == ref1.shape and relative_error(cupy.asnumpy(got1), ref1) < 1e-5


@pytest.mark.parametrize("mode", ["float32", "float16"])
@pytest.mark.parametrize("layout", ["NCL", "NLC"])
def test_conv1d_plans_a_row_of_pixels(mode, layout):
    """conv1d runs the 2-D plan of a height-1 image: a GEMM tiles its N x L output pixels (not the
    direct kernel's 2-D tile), and the result matches torch's conv1d."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 64, 1000)).astype(mode)
    w = rng.standard_normal((128, 64, 3)).astype(mode)
    ref = F.conv1d(torch.from_numpy(x).double(), torch.from_numpy(w).double(), padding=1).numpy()
    xl = np.ascontiguousarray(x.transpose(0, 2, 1)) if layout == "NLC" else x
    plan = cupyconv.plan(xl[:, None] if layout == "NLC" else xl[:, :, None], w[:, :, None], padding=(0, 1),
                         layout="NHWC" if layout == "NLC" else "NCHW")
    assert plan.kernel != "direct_conv2d", plan
    got = cupy.asnumpy(cupyconv.conv1d(cupy.asarray(xl), cupy.asarray(w), padding=1, layout=layout))
    got = got.transpose(0, 2, 1) if layout == "NLC" else got
    assert relative_error(got, ref) < (1e-5 if mode == "float32" else 2e-3)


WGRAD_TC_CASES = [
    Case(2, 8, 16, 9, 11, 3, 3, padding=1),
    Case(3, 16, 32, 14, 15, 3, 3, stride=2, padding=1),            # a trailing row no tap reads
    Case(1, 5, 12, 17, 19, 4, 2, stride=(2, 3), padding=(0, 1), dilation=(2, 1)),  # odd C and K: padded copies
    Case(2, 8, 16, 10, 9, 4, 2, padding="same"),
    Case(9, 64, 64, 28, 28, 3, 3, padding=1),
    Case(32, 32, 64, 14, 14, 1, 1),                                 # a long reduction in many runs
    Case(4, 3, 32, 40, 40, 7, 7, stride=2, padding=3),             # ResNet's stem geometry
    Case(2, 12, 3, 13, 7, 3, 3, padding=1),                        # 16-bit x in 8-byte pieces; K = 3
    Case(2, 136, 72, 5, 6, 2, 3, padding=(1, 0)),                  # column tiles across taps, channel tails
]


def _weight_gradient_case(case, mode, nhwc, compute):
    """``compute(problem, x, dy)`` (CuPy arrays in the problem's layout, NaN-poisoned allocations)
    three times against torch's float64 weight gradient: at most 4x torch's own error in that
    precision, and the same bits every run."""
    dtype = TORCH_DTYPES[mode]
    gen = torch.Generator(device="cuda").manual_seed(len(case.id))
    x = torch.randn(case.n, case.c, case.h, case.w, device="cuda", dtype=torch.float64, generator=gen)
    w = torch.randn(case.k, case.c, case.kh, case.kw, device="cuda", dtype=torch.float64, generator=gen)
    args = (case.stride, case.padding, case.dilation)
    y = F.conv2d(x, w.clone().requires_grad_(), None, *args)
    dy = torch.randn(y.shape, device="cuda", dtype=torch.float64, generator=gen)
    wr = w.clone().requires_grad_()
    F.conv2d(x, wr, None, *args).backward(dy)
    layout = ("NHWC", "KHWC") if nhwc else ("NCHW", "KCHW")
    problem = make_problem(tuple(x.permute(0, 2, 3, 1).shape) if nhwc else tuple(x.shape),
                           tuple(w.permute(0, 2, 3, 1).shape) if nhwc else tuple(w.shape), None,
                           "float32" if mode == "tf32" else mode, *args, 1, *layout)
    xc, dyc = to_cupy(x.to(dtype), nhwc), to_cupy(dy.to(dtype), nhwc)
    with nan_poisoned_memory(), precision(mode):
        runs = [compute(problem, xc, dyc) for _ in range(3)]
        wo = w.to(dtype).requires_grad_()
        F.conv2d(x.to(dtype), wo, None, *args).backward(dy.to(dtype))
    got = from_cupy(runs[0], dtype, nhwc)
    assert got.shape == w.shape and not got.isnan().any()
    assert relative_error(got, wr.grad) <= bound(mode, wo.grad, wr.grad)
    assert all(bool((r == runs[0]).all()) for r in runs[1:])  # the same bits on every run


@pytest.mark.parametrize("nhwc", [False, True], ids=["NCHW", "NHWC"])
@pytest.mark.parametrize("mode", ["float16", "bfloat16", "tf32"])
@pytest.mark.parametrize("case", WGRAD_TC_CASES, ids=lambda c: c.id)
def test_weight_gradient_on_tensor_cores(case, mode, nhwc):
    """cupyconv.grad.weight_gradient takes the tensor cores (wgrad_tensor_cores) for 16-bit and TF32
    ungrouped problems."""
    from cupyconv import wgrad_tensor_cores

    def compute(problem, x, dy):
        assert wgrad_tensor_cores.refusal(problem, mode == "tf32") == ""
        return cupyconv.grad.weight_gradient(problem, x, dy, "cupy", allow_tf32=mode == "tf32")

    _weight_gradient_case(case, mode, nhwc, compute)


TILE_CASES = [(case, config, mode) for config in ("tc_m128j128", "tc_m64j128", "tc_m64j64")
              for case in (2, 7, 8) for mode in ("float16", "tf32")] + \
             [(case, config, mode) for config in ("tc_wgmma_m128j128", "tc_wgmma_m64j128", "tc_wgmma_m256j128")
              for case in (2, 8) for mode in ("float16", "bfloat16")]


@pytest.mark.parametrize("nhwc", [False, True], ids=["NCHW", "NHWC"])
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("case,config,mode", TILE_CASES, ids=lambda v: WGRAD_TC_CASES[v].id if isinstance(v, int) else v)
def test_tensor_core_weight_gradient_every_tile(case, config, mode, splits, nhwc):
    """Every tile of wgrad_tensor_cores (mma.sync; wgmma on sm_90a), whole and in forced runs, with
    padded and unpadded channels and column tiles across taps."""
    from cupyconv import wgrad_tensor_cores
    from cupyconv.compiler import compute_capability

    if config.startswith("tc_wgmma") and compute_capability() != wgrad_tensor_cores.WGMMA_COMPUTE_CAPABILITY:
        pytest.skip(f"wgmma needs sm_90a; this GPU is sm_{compute_capability()}")

    def compute(problem, x, dy):
        plan = wgrad_tensor_cores.make_plan(problem, True, config, splits, compute_capability())
        out = cupy.empty(problem.weight_array_shape, dtype=x.dtype)
        return wgrad_tensor_cores.conv2d_weight_cupy(x, dy, problem, out, plan)

    _weight_gradient_case(WGRAD_TC_CASES[case], mode, nhwc, compute)


#: Problems the TMA tiles take (x's channels in whole 64-channel panels, or one tap).
WGRAD_TMA_CASES = [
    Case(9, 64, 64, 28, 28, 3, 3, padding=1),                      # images across l tiles, a partial last one
    Case(3, 128, 72, 13, 11, 3, 3, stride=2, padding=1),           # dy panels past K; column tiles past J
    Case(2, 192, 40, 9, 7, 2, 3, padding=(1, 0), dilation=(2, 1)),  # panels of one tile in two taps
    Case(4, 64, 128, 14, 14, 1, 1, stride=2),                      # a strided 1x1 projection
    Case(2, 64, 21, 10, 10, 3, 3, padding=1),                      # K = 21: dy through a padded copy
    Case(2, 64, 32, 10, 9, 4, 2, padding="same"),                  # asymmetric padding
    Case(1, 128, 64, 4, 4, 3, 3, padding=1),                       # several images in one l tile
    Case(3, 96, 40, 9, 9, 1, 1),                                   # 1x1: a panel past C reads zeros
    Case(4, 128, 64, 7, 9, 1, 1),                                  # 1x1, a partial last l tile
    Case(2, 144, 24, 12, 10, 1, 1, stride=2),                      # 1x1, strided, channels past two panels
]


#: (tile, schedule, mode): one run (the weight written in place where it may be), runs, and stream-K's wave of
#: blocks on the tiles that have a stream-K instance (test_wgrad_tensor_cores_cpu checks the others refuse it), in
#: 16 bits and on TF32's transposing tiles.
TMA_SCHEDULES = [(c.name, schedule, mode) for c in TMA_CONFIGS for schedule in (1, 3, "stream_k")
                 for mode in ("float16", "bfloat16") if c.stream_k or schedule != "stream_k"] + \
                [(c.name, schedule, "tf32") for c in TF32_TMA_CONFIGS for schedule in (1, 3, "stream_k")]


@pytest.mark.parametrize("nhwc", [False, True], ids=["NCHW", "NHWC"])
@pytest.mark.parametrize("config,schedule,mode", TMA_SCHEDULES, ids=str)
@pytest.mark.parametrize("case", WGRAD_TMA_CASES, ids=lambda c: c.id)
def test_tensor_core_weight_gradient_tma_tiles(case, config, mode, schedule, nhwc):
    """The TMA-fed tiles (wgrad_tensor_cores_tma and, in TF32, wgrad_tensor_cores_tma_tf32, sm_90a), whole
    (the weight written in place where the layouts allow), in forced runs and in stream-K (tiles shared by up
    to dozens of blocks, or each block's own), against torch in float64, the same bits every run."""
    from cupyconv import wgrad_tensor_cores
    from cupyconv.compiler import compute_capability

    if compute_capability() != wgrad_tensor_cores.WGMMA_COMPUTE_CAPABILITY:
        pytest.skip(f"TMA and wgmma need sm_90a; this GPU is sm_{compute_capability()}")

    splits, stream_k = (None, True) if schedule == "stream_k" else (schedule, None)

    def compute(problem, x, dy):
        plan = wgrad_tensor_cores.make_plan(problem, True, config, splits, compute_capability(), stream_k)
        whole_pieces = problem.k % (4 if mode == "tf32" else 8) == 0  # dy read in place, no zero channels
        weight_is_the_gemm = nhwc or problem.kh * problem.kw == 1  # [K][kh kw C], or [K][C] in either layout
        assert plan.config.tma and plan.direct == (plan.splits == 1 and weight_is_the_gemm and whole_pieces)
        assert bool(plan.stream_k_blocks) == bool(stream_k)
        out = cupy.empty(problem.weight_array_shape, dtype=x.dtype)
        return wgrad_tensor_cores.conv2d_weight_cupy(x, dy, problem, out, plan)

    _weight_gradient_case(case, mode, nhwc, compute)


#: NCHW stride-1 layers with Wo == W the K-major TF32 tiles take (planes of whole 16-byte rows, even channels, x's
#: panels in one tap).
K_MAJOR_CASES = [
    Case(3, 96, 40, 8, 8, 1, 1),      # two whole l tiles an image; boxes past C and K read the next image's rows
    Case(4, 128, 64, 7, 12, 1, 1),    # 84 pixels: a partial last l tile an image
    Case(2, 130, 72, 6, 6, 1, 1),     # 130 channels: column tiles past C, x's last box two rows of its image
    Case(5, 64, 136, 10, 10, 1, 1),   # two output-channel tiles, the second past K
    Case(1, 256, 256, 4, 4, 1, 1),    # 16 pixels: one partial l tile, one image
    Case(2, 40, 24, 8, 8, 1, 1, padding=(2, 0)),  # rows of zeros above and below: x's boxes shifted up by two rows
    Case(2, 64, 64, 14, 14, 3, 3, padding=1),     # taps: columns wrapping at both edges, two taps a 128-column tile
    Case(3, 32, 40, 12, 8, 3, 3, padding=1),      # rows of 8: an l tile of four rows; a tap a panel
    Case(2, 32, 32, 8, 3, 3, 3, padding=1),       # rows of 3: pixels a thread past two rows' ends
    Case(2, 96, 72, 10, 12, 5, 5, padding=(1, 2)),  # 5x5, Ho 8 < H 10: x's last rows never read
    Case(1, 64, 64, 16, 16, 3, 3, padding="same", dilation=2),
    Case(2, 32, 48, 10, 10, 4, 2, padding="same"),  # even kernel: asymmetric padding
]


@pytest.mark.parametrize("schedule", [1, 3, 7])
@pytest.mark.parametrize("config", [c.name for c in TF32_K_MAJOR_CONFIGS])
@pytest.mark.parametrize("case", K_MAJOR_CASES, ids=lambda c: c.id)
def test_tf32_k_major_tiles(case, config, schedule):
    """wgrad_tensor_cores_tma_tf32 on NCHW arrays in place (LANDING 0: rows rounded, not transposed; a tap's x
    panels shifted, the columns it leaves the row at zeroed), whole (the weight written in place where it is the
    GEMM's), in runs and in more runs than an image has l tiles, against torch in float64, the same bits every
    run."""
    from cupyconv import wgrad_tensor_cores

    if compute_capability() != wgrad_tensor_cores.WGMMA_COMPUTE_CAPABILITY:
        pytest.skip(f"TMA and wgmma need sm_90a; this GPU is sm_{compute_capability()}")

    def compute(problem, x, dy):
        plan = wgrad_tensor_cores.make_plan(problem, True, config, schedule, compute_capability())
        assert (plan.x_copy, plan.dy_copy) == ("", "") and plan.config.k_major
        assert plan.direct == (schedule == 1 and problem.k % 4 == 0 and problem.kh * problem.kw == 1)
        out = cupy.empty(problem.weight_array_shape, dtype=x.dtype)
        return wgrad_tensor_cores.conv2d_weight_cupy(x, dy, problem, out, plan)

    _weight_gradient_case(case, "tf32", False, compute)


#: NCHW 1x1 layers at stride 1 the K-major 16-bit tiles take (planes of whole 16-byte rows, even channels).
K_MAJOR_16_BIT_CASES = [
    Case(3, 96, 40, 8, 8, 1, 1),      # one whole l tile an image; boxes past C and K read the next image's rows
    Case(4, 128, 64, 10, 12, 1, 1),   # 120 pixels: a partial last l tile an image
    Case(2, 130, 72, 6, 4, 1, 1),     # 130 channels: column tiles past C, x's last box two rows of its image
    Case(5, 64, 136, 10, 8, 1, 1),    # two output-channel tiles of 128, the second past K
    Case(1, 256, 256, 4, 4, 1, 1),    # 16 pixels: one partial l tile, one image
    Case(2, 64, 24, 16, 16, 1, 1),    # K = 24: dy's boxes mostly the next image's rows
]

#: (tile, schedule): one run, runs (more than an image has l tiles), and stream-K where the tile has it.
K_MAJOR_16_BIT_SCHEDULES = [(c.name, schedule) for c in K_MAJOR_CONFIGS[2] for schedule in (1, 3, 7, "stream_k")
                            if c.stream_k or schedule != "stream_k"]


@pytest.mark.parametrize("mode", ["float16", "bfloat16"])
@pytest.mark.parametrize("config,schedule", K_MAJOR_16_BIT_SCHEDULES, ids=str)
@pytest.mark.parametrize("case", K_MAJOR_16_BIT_CASES, ids=lambda c: c.id)
def test_16_bit_k_major_tiles(case, config, schedule, mode):
    """wgrad_tensor_cores_tma on NCHW 1x1 arrays in place (K_MAJOR: an image's channel rows land as wgmma's
    untransposed operands), whole (the weight written in place where its channels are the GEMM's), in runs and in
    stream-K, against torch in float64, the same bits every run."""
    from cupyconv import wgrad_tensor_cores

    if compute_capability() != wgrad_tensor_cores.WGMMA_COMPUTE_CAPABILITY:
        pytest.skip(f"TMA and wgmma need sm_90a; this GPU is sm_{compute_capability()}")
    splits, stream_k = (None, True) if schedule == "stream_k" else (schedule, None)

    def compute(problem, x, dy):
        plan = wgrad_tensor_cores.make_plan(problem, True, config, splits, compute_capability(), stream_k)
        assert (plan.x_copy, plan.dy_copy) == ("", "") and plan.config.k_major and not plan.config.tf32
        assert plan.direct == (plan.splits == 1 and plan.channels == problem.c)
        assert bool(plan.stream_k_blocks) == bool(stream_k)
        out = cupy.empty(problem.weight_array_shape, dtype=x.dtype)
        return wgrad_tensor_cores.conv2d_weight_cupy(x, dy, problem, out, plan)

    _weight_gradient_case(case, mode, False, compute)


def _rounded_to_tf32(a):
    """float32 ``a`` rounded to TF32 as cvt.rna does (to nearest, ties away from zero; finite values)."""
    bits = a.view(cupy.uint32)
    return cupy.where(cupy.isfinite(a), (bits + 0x1000) & 0xFFFFE000, bits).view(cupy.float32)


@pytest.mark.parametrize("config", [c.name for c in TF32_TMA_CONFIGS + TF32_K_MAJOR_CONFIGS])
def test_tf32_tma_tiles_round_as_cvt_rna(config):
    """wgrad_tensor_cores_tma_tf32 rounds its operands in two instructions (to_tf32_for_mma), leaving their 13 low
    bits for the tensor cores to drop: operands rounded beforehand as cvt.rna does give the same bits. A third of
    the values lie exactly halfway between two TF32 values. The K-major tiles on an NCHW 1x1 layer."""
    from cupyconv import wgrad_tensor_cores

    if compute_capability() != wgrad_tensor_cores.WGMMA_COMPUTE_CAPABILITY:
        pytest.skip(f"TMA and wgmma need sm_90a; this GPU is sm_{compute_capability()}")
    if config in {c.name for c in TF32_K_MAJOR_CONFIGS}:
        problem = make_problem((2, 64, 16, 16), (64, 64, 1, 1), None, "float32")
    else:
        problem = make_problem((2, 14, 14, 64), (64, 3, 3, 64), None, "float32", 1, 1, 1, 1, "NHWC", "KHWC")
    plan = wgrad_tensor_cores.make_plan(problem, True, config, 1, compute_capability())
    rng = cupy.random.default_rng(7)

    def operand(shape):
        a = rng.standard_normal(shape, dtype=cupy.float32)
        ties = (a.view(cupy.uint32) & 0xFFFFE000) | 0x1000
        return cupy.where(rng.random(shape) < 1 / 3, ties.view(cupy.float32), a)

    x, dy = operand(problem.x_shape), operand(problem.out_shape)
    outs = []
    for xs, dys in ((x, dy), (_rounded_to_tf32(x), _rounded_to_tf32(dy))):
        out = cupy.full(problem.weight_array_shape, cupy.nan, dtype=cupy.float32)
        outs.append(wgrad_tensor_cores.conv2d_weight_cupy(xs, dys, problem, out, plan))
    assert not cupy.isnan(outs[0]).any() and bool((outs[0] == outs[1]).all())


DEPTHWISE_CASES = [
    Case(2, 16, 16, 14, 15, 3, 3, padding=1, groups=16),
    Case(3, 24, 24, 28, 28, 3, 3, stride=2, padding=1, groups=24),
    Case(1, 40, 40, 17, 19, 5, 5, padding=2, groups=40),
    Case(2, 8, 24, 12, 12, 3, 3, padding=1, groups=8),             # channel multiplier 3
    Case(1, 36, 36, 9, 10, 7, 7, padding="same", dilation=(1, 2), groups=36),
    Case(64, 33, 33, 8, 8, 3, 3, padding=1, groups=33),            # many runs; channels past a warp
    Case(2, 144, 144, 9, 10, 3, 3, padding=1, groups=144),         # NHWC: 18 vectors of 8 16-bit channels
    Case(2, 264, 264, 6, 7, 3, 3, stride=2, padding=1, groups=264),  # vectors past one block's 32
    Case(3, 20, 20, 11, 9, 5, 5, padding=2, groups=20),            # 5x5: two channels a thread
    Case(4, 96, 96, 30, 37, 3, 3, padding=1, groups=96),           # NHWC: rows in segments, a step's tail
    Case(2, 48, 48, 17, 23, 3, 3, stride=3, padding=1, groups=48),  # NHWC: a column stride at run time
    Case(2, 40, 40, 19, 21, 5, 5, stride=2, padding=2, groups=40),  # NHWC: 5x5 at stride 2
    Case(1, 4, 4, 9, 300, 3, 3, stride=(2, 1), padding=1, groups=4),  # NCHW: two tiles of output columns
    # NCHW pairs of output columns (even rows, the same walk along both axes), both paddings' parities
    Case(2, 12, 12, 10, 20, 5, 5, padding=2, groups=12),          # even left padding
    Case(2, 8, 8, 16, 16, 7, 7, padding=3, groups=8),             # ConvNeXt's 7x7
    Case(1, 8, 8, 16, 16, 7, 7, stride=2, padding=3, groups=8),
    Case(1, 6, 6, 12, 24, 5, 5, stride=2, padding=2, groups=6),
    Case(2, 8, 8, 14, 14, 3, 3, stride=2, groups=8),              # stride 2, no padding
    Case(2, 8, 8, 12, 12, 3, 3, padding=(2, 1), groups=8),        # the left padding odd, the top even
    Case(1, 4, 4, 5, 1100, 3, 3, padding=1, groups=4),            # three tiles of 256 pairs, the last part-filled
    Case(2, 4, 8, 10, 12, 3, 3, stride=2, padding=1, groups=4),   # channel multiplier 2
]


@pytest.mark.parametrize("nhwc", [False, True], ids=["NCHW", "NHWC"])
@pytest.mark.parametrize("mode", ["float64", "float32", "float16", "bfloat16"])
@pytest.mark.parametrize("case", DEPTHWISE_CASES, ids=lambda c: c.id)
def test_depthwise_weight_gradient(case, mode, nhwc):
    """Depthwise layers take wgrad_depthwise's kernel; against torch in float64, the same bits on
    every run."""
    from cupyconv import wgrad_depthwise

    dtype = TORCH_DTYPES[mode]
    gen = torch.Generator(device="cuda").manual_seed(len(case.id))
    x = torch.randn(case.n, case.c, case.h, case.w, device="cuda", dtype=torch.float64, generator=gen)
    w = torch.randn(case.k, 1, case.kh, case.kw, device="cuda", dtype=torch.float64, generator=gen)
    args = (case.stride, case.padding, case.dilation, case.groups)
    dy = torch.randn(F.conv2d(x, w, None, *args).shape, device="cuda", dtype=torch.float64, generator=gen)
    wr = w.clone().requires_grad_()
    F.conv2d(x, wr, None, *args).backward(dy)
    layout = ("NHWC", "KHWC") if nhwc else ("NCHW", "KCHW")
    problem = make_problem(tuple(x.permute(0, 2, 3, 1).shape) if nhwc else tuple(x.shape),
                           tuple(w.permute(0, 2, 3, 1).shape) if nhwc else tuple(w.shape), None, mode, *args,
                           *layout)
    assert wgrad_depthwise.refusal(problem) == ""
    xc, dyc = to_cupy(x.to(dtype), nhwc), to_cupy(dy.to(dtype), nhwc)
    with nan_poisoned_memory():
        runs = [cupyconv.grad.weight_gradient(problem, xc, dyc, "cupy") for _ in range(3)]
        wo = w.to(dtype).requires_grad_()
        F.conv2d(x.to(dtype), wo, None, *args).backward(dy.to(dtype))
    got = from_cupy(runs[0], dtype, nhwc)
    assert got.shape == w.shape and not got.isnan().any()
    assert relative_error(got, wr.grad) <= bound(mode, wo.grad, wr.grad)
    assert all(bool((r == runs[0]).all()) for r in runs[1:])
