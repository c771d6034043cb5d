"""The streaming 1x1 kernel (pointwise_nhwc) against torch in float64, on the GPU: every tile of every
dtype, forced, on channel counts that fill and that do not fill its widest instruction, pixel counts
that leave a partial last tile and blocks with one, several or no pixel tiles, output channels past
one channel tile; the fused epilogue; float32 rounded to TF32 as the other kernels round it; and the
planner's choice. Outputs are poisoned with NaN before each launch."""
import dataclasses

import pytest

from cases import Case
from checks import relative_error
from devices import gpu_count

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(gpu_count() == 0, reason="needs a CUDA GPU (cupy finds none)")]
torch = pytest.importorskip("torch", reason="the GPU tests compare with torch")
cupy = pytest.importorskip("cupy")
F = torch.nn.functional

from cupyconv.arguments import make_problem  # noqa: E402
from cupyconv.compiler import compute_capability  # noqa: E402
from cupyconv.families.pointwise_nhwc import POINTWISE_CONFIGS  # noqa: E402
from cupyconv.launch import conv2d_cupy  # noqa: E402
from cupyconv.planner import POINTWISE_KERNEL, make_plan  # noqa: E402
from test_igemm_gpu import DTYPES, TOLERANCE, tf32  # noqa: E402  (the tensor-core tests' dtypes, tolerances, rounding)


CASES = [
    Case(2, 64, 256, 28, 28, 1, 1),           # ResNet-50's 64 -> 256 at batch 2: two channel tiles
    Case(3, 24, 40, 5, 6, 1, 1),              # 90 pixels: one partial pixel tile; 24 channels, half an instruction
    Case(1, 8, 8, 3, 5, 1, 1),                # one piece of channels; most blocks get no pixel tile
    Case(4, 144, 24, 19, 17, 1, 1),           # MobileNetV2's 144 -> 24: 9 instructions of k, K < one tile
    Case(2, 96, 200, 23, 29, 1, 1, bias=False),  # K 200: a partial channel tile
    Case(5, 32, 136, 50, 41, 1, 1),           # many pixel tiles a block
    Case(2, 320, 64, 9, 7, 1, 1),             # 640 bytes of 16-bit channels: the widest tile; float32 refused
    Case(2, 24, 144, 21, 19, 1, 1),           # MobileNetV2's 24 -> 144: one 144-channel tile, 1.5 of 96
]


def _fits(case: Case, dtype: str, cfg) -> bool:
    return case.c * (4 if dtype == "float32" else 2) <= cfg.channel_bytes


def _problem(case: Case, dtype: str, activation=None, residual=False):
    return make_problem((case.n, case.h, case.w, case.c), (case.k, case.c, 1, 1), (case.k,) if case.bias else None,
                        dtype, 1, 0, 1, 1, layout="NHWC", activation=activation,
                        residual_shape=(case.n, case.h, case.w, case.k) if residual else None)


def _run(case: Case, name: str, config=None, seed=0, activation=None, residual=None, in_place=False):
    """The kernel, forced, on fresh random NHWC inputs; returns (output NCHW view, x, weight, bias). With
    ``in_place`` the output starts as a copy of ``residual`` and is passed as the residual."""
    dtype, torch_dtype = DTYPES[name]
    g = torch.Generator(device="cuda").manual_seed(seed)
    make = lambda *shape: torch.randn(*shape, device="cuda", dtype=torch.float64, generator=g).to(torch_dtype)
    x, weight, bias = make(case.n, case.c, case.h, case.w), make(case.k, case.c, 1, 1), make(case.k)
    bias = bias if case.bias else None
    problem = _problem(case, dtype, activation, residual is not None)
    plan = make_plan(problem, config=config, kernel=POINTWISE_KERNEL, compute_capability=compute_capability())
    assert plan.kernel == POINTWISE_KERNEL
    out = torch.full((case.n, case.h, case.w, case.k), float("nan"), device="cuda", dtype=torch_dtype)
    as_cupy = lambda t: None if t is None else cupy.asarray(t.contiguous())
    if in_place:
        out.copy_(residual)
    out_array = as_cupy(out)
    conv2d_cupy(as_cupy(x.permute(0, 2, 3, 1)), as_cupy(weight), as_cupy(bias), problem, out_array, plan=plan,
                allow_tf32=True, residual=out_array if in_place else as_cupy(residual))
    torch.cuda.synchronize()
    return out.permute(0, 3, 1, 2), x, weight, bias


def _reference(x, weight, bias):
    return F.conv2d(x.double(), weight.double(), None if bias is None else bias.double())


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("name", DTYPES)
@pytest.mark.parametrize("config_index", range(max(len(configs) for configs in POINTWISE_CONFIGS.values())))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_every_tile(case, config_index, name, residual):
    """Every tile, on outputs narrower and wider than it; with a residual (copied into the staged
    output's rows while the tile multiplies) and an activation, or plain."""
    dtype = DTYPES[name][0]
    if config_index >= len(POINTWISE_CONFIGS[dtype]):
        return
    cfg = POINTWISE_CONFIGS[dtype][config_index]
    if not _fits(case, dtype, POINTWISE_CONFIGS[dtype][-1]):  # past the widest tile: refused outright
        with pytest.raises(ValueError, match="cannot run this problem.*16-byte pieces of at most"):
            make_plan(_problem(case, dtype), config=cfg.name, kernel=POINTWISE_KERNEL)
        return
    if not _fits(case, dtype, cfg):
        with pytest.raises(ValueError, match="holds"):
            make_plan(_problem(case, dtype), config=cfg.name, kernel=POINTWISE_KERNEL)
        return
    if not residual:
        out, x, weight, bias = _run(case, name, cfg.name, seed=config_index)
        assert not out.isnan().any()
        assert relative_error(out, _reference(x, weight, bias)) < TOLERANCE[name]
        return
    g = torch.Generator(device="cuda").manual_seed(100 + config_index)
    added = torch.randn(case.n, case.h, case.w, case.k, device="cuda", generator=g).to(DTYPES[name][1])
    out, x, weight, bias = _run(case, name, cfg.name, seed=config_index, activation="silu", residual=added)
    assert not out.isnan().any()
    ref = F.silu(_reference(x, weight, bias) + added.double().permute(0, 3, 1, 2))
    assert relative_error(out, ref) < TOLERANCE[name]


@pytest.mark.parametrize("config_index", range(len(POINTWISE_CONFIGS["float16"])))
@pytest.mark.parametrize("case", [CASES[0], CASES[5]], ids=lambda c: c.id)
def test_residual_in_place(case, config_index):
    """The output is the residual (in-place accumulate): each tile's residual is copied before any of
    the tile's outputs is stored, by the block that stores them."""
    cfg = POINTWISE_CONFIGS["float16"][config_index]
    if not _fits(case, "float16", cfg):
        return
    g = torch.Generator(device="cuda").manual_seed(11)
    added = torch.randn(case.n, case.h, case.w, case.k, device="cuda", generator=g).half()
    out, x, weight, bias = _run(case, "float16", cfg.name, seed=3, activation="relu", residual=added, in_place=True)
    ref = F.relu(_reference(x, weight, bias) + added.double().permute(0, 3, 1, 2))
    assert relative_error(out, ref) < TOLERANCE["float16"]


@pytest.mark.parametrize("case", CASES[:2], ids=lambda c: c.id)
def test_float32_rounded_to_tf32(case):
    """Both operands are rounded in their fragments: the result is the float64 convolution of the
    TF32-rounded operands to float32 accumulation's error, where an unrounded one is off by ~1e-4."""
    out, x, weight, bias = _run(case, "tf32", seed=5)
    assert relative_error(out, _reference(tf32(x), tf32(weight), bias)) < 1e-5


@pytest.mark.parametrize("name", ["float16", "tf32"])
@pytest.mark.parametrize("activation", ["relu", "silu"])
def test_epilogue_with_residual(activation, name):
    """bias + residual + activation in the epilogue, the residual read at the output's own offsets."""
    case = Case(4, 48, 40, 19, 17, 1, 1)
    dtype, torch_dtype = DTYPES[name]
    g = torch.Generator(device="cuda").manual_seed(7)
    residual = torch.randn(case.n, case.h, case.w, case.k, device="cuda", generator=g).to(torch_dtype)
    out, x, weight, bias = _run(case, name, activation=activation, residual=residual)
    act = {"relu": F.relu, "silu": F.silu}[activation]
    ref = act(_reference(x, weight, bias) + residual.double().permute(0, 3, 1, 2))
    assert relative_error(out, ref) < TOLERANCE[name]


@pytest.mark.parametrize("config", [None, "pw_c128_m64n144"])
def test_64_bit_indices(config):
    """The long long instance computes the same as the int one (the planner's tile and one of 6 warps)."""
    case = CASES[1]
    problem = _problem(case, "float16")
    plan = dataclasses.replace(make_plan(problem, config=config, kernel=POINTWISE_KERNEL), index_type="long long")
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(case.n, case.h, case.w, case.c, device="cuda", generator=g).half()
    weight = torch.randn(case.k, case.c, 1, 1, device="cuda", generator=g).half()
    bias = torch.randn(case.k, device="cuda", generator=g).half()
    out = torch.full((case.n, case.h, case.w, case.k), float("nan"), device="cuda", dtype=torch.float16)
    conv2d_cupy(cupy.asarray(x), cupy.asarray(weight), cupy.asarray(bias), problem, cupy.asarray(out), plan=plan)
    torch.cuda.synchronize()
    ref = F.conv2d(x.permute(0, 3, 1, 2).double(), weight.double(), bias.double())
    assert relative_error(out.permute(0, 3, 1, 2), ref) < 1e-2


def test_planner_chooses_it_for_channels_last_1x1():
    """A 16-bit NHWC 1x1 layer of few channels takes it by default; NCHW, strided and compute-bound ones
    (ResNet-50's 256 -> 1024) do not."""
    case = CASES[0]
    assert make_plan(_problem(case, "float16"), compute_capability=compute_capability()).kernel == POINTWISE_KERNEL
    wide = make_problem((2, 14, 14, 256), (1024, 256, 1, 1), None, "float16", 1, 0, 1, 1, layout="NHWC")
    assert make_plan(wide, compute_capability=compute_capability()).kernel != POINTWISE_KERNEL
    nchw = make_problem((2, 64, 28, 28), (256, 64, 1, 1), None, "float16", 1, 0, 1, 1)
    assert make_plan(nchw, compute_capability=compute_capability()).kernel != POINTWISE_KERNEL
    strided = make_problem((2, 28, 28, 64), (256, 64, 1, 1), None, "float16", 2, 0, 1, 1, layout="NHWC")
    assert make_plan(strided, compute_capability=compute_capability()).kernel != POINTWISE_KERNEL
