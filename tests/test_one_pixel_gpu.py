"""The one-pixel-plane kernel (one_pixel_conv2d: squeeze-excitation's 1x1 layers) against torch in float64,
on the GPU: every config of every dtype, forced, on channel counts of whole 16-byte pieces and not, output
channels that leave a block's last warps idle, batches that leave a warp's last images empty and that take
more than one block row; NCHW and NHWC; the fused epilogue, in place too; bitwise repeatability; and the
public API's choice of it. Outputs are poisoned with NaN before each launch."""
import pytest

from checks import relative_error
from devices import gpu_count

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(gpu_count() == 0, reason="needs a CUDA GPU (cupy finds none)")]
torch = pytest.importorskip("torch", reason="the GPU tests compare with torch")
cupy = pytest.importorskip("cupy")
F = torch.nn.functional

import cupyconv  # noqa: E402
from cupyconv.arguments import make_problem  # noqa: E402
from cupyconv.families.one_pixel_conv2d import CONFIGS  # noqa: E402
from cupyconv.launch import conv2d_cupy  # noqa: E402
from cupyconv.planner import ONE_PIXEL_KERNEL, make_plan  # noqa: E402

#: name -> (cupyconv dtype, torch dtype, tolerance against float64). Strict float32 and float64 accumulate
#: in their own type over at most a few thousand products.
DTYPES = {"float32": ("float32", torch.float32, 1e-6), "float64": ("float64", torch.float64, 1e-13),
          "float16": ("float16", torch.float16, 1e-2), "bfloat16": ("bfloat16", torch.bfloat16, 1e-2)}
#: (N, C, K, bias): 1152 -> 48 and 48 -> 1152 (EfficientNet-B0's squeeze-excitation pair), C not whole
#: 16-byte pieces (single-element loads) and K not whole blocks, batches past a warp's images and odd ones.
SHAPES = [(1, 1152, 48, True), (3, 48, 1152, True), (5, 30, 7, True), (11, 96, 4, False), (20, 1001, 130, True),
          (2, 8, 1, True)]


def _inputs(n, c, k, bias, torch_dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    make = lambda *shape: torch.randn(*shape, device="cuda", dtype=torch.float64, generator=g).to(torch_dtype)
    return make(n, c, 1, 1), make(k, c, 1, 1), make(k) if bias else None


def _run(x, weight, bias, dtype, layout="NCHW", config=None, activation=None, residual=None, out=None):
    """The kernel, forced (``config``: a config name, else the family's choice), writing ``out`` (default: a
    NaN-filled output)."""
    n, c = x.shape[:2]
    k = weight.shape[0]
    x_shape = (n, c, 1, 1) if layout == "NCHW" else (n, 1, 1, c)
    out_shape = (n, k, 1, 1) if layout == "NCHW" else (n, 1, 1, k)
    problem = make_problem(x_shape, tuple(weight.shape), None if bias is None else tuple(bias.shape), dtype,
                           1, 0, 1, 1, layout=layout, activation=activation,
                           residual_shape=out_shape if residual is not None else None)
    plan = make_plan(problem, config=config, kernel=ONE_PIXEL_KERNEL)
    assert plan.kernel == ONE_PIXEL_KERNEL
    if out is None:
        out = torch.full(out_shape, float("nan"), device="cuda", dtype=x.dtype)
    as_cupy = lambda t: None if t is None else cupy.asarray(t.contiguous())
    out_array = cupy.asarray(out)
    conv2d_cupy(as_cupy(x.reshape(x_shape)), as_cupy(weight), as_cupy(bias), problem, out_array, plan=plan,
                residual=None if residual is None else (out_array if residual is out else as_cupy(residual)))
    torch.cuda.synchronize()
    return out.reshape(n, k, 1, 1)


def _reference(x, weight, bias):
    return F.conv2d(x.double(), weight.double(), None if bias is None else bias.double())


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("name", DTYPES)
@pytest.mark.parametrize("config", [c.name for c in CONFIGS])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "n{}c{}k{}{}".format(*s[:3], "_b" if s[3] else ""))
def test_every_config(shape, config, name, layout):
    dtype, torch_dtype, tolerance = DTYPES[name]
    x, weight, bias = _inputs(*shape, torch_dtype, seed=len(config) + shape[0])
    out = _run(x, weight, bias, dtype, layout, config)
    assert not out.isnan().any()
    assert relative_error(out, _reference(x, weight, bias)) < tolerance


@pytest.mark.parametrize("name", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("activation", ["silu", "sigmoid", "relu"])
def test_epilogue_with_residual(activation, name):
    """bias + residual + activation, the residual read at the output's own offsets."""
    dtype, torch_dtype, tolerance = DTYPES[name]
    x, weight, bias = _inputs(6, 240, 10, True, torch_dtype, seed=4)
    residual = torch.randn(6, 10, 1, 1, device="cuda", dtype=torch.float64).to(torch_dtype)
    out = _run(x, weight, bias, dtype, activation=activation, residual=residual)
    act = {"relu": F.relu, "silu": F.silu, "sigmoid": torch.sigmoid}[activation]
    assert relative_error(out, act(_reference(x, weight, bias) + residual.double())) < tolerance


def test_residual_in_place():
    """The output is the residual: each output element reads its own residual before storing."""
    x, weight, bias = _inputs(9, 672, 28, True, torch.float32, seed=8)
    added = torch.randn(9, 28, 1, 1, device="cuda")
    out = added.clone()
    _run(x, weight, bias, "float32", activation="relu", residual=out, out=out)
    assert relative_error(out, F.relu(_reference(x, weight, bias) + added.double())) < 1e-6


@pytest.mark.parametrize("name", ["float32", "float16"])
def test_bitwise_repeatable(name):
    """The lanes' sums in a fixed order: the same bits on every run."""
    dtype, torch_dtype, _ = DTYPES[name]
    x, weight, bias = _inputs(8, 1152, 48, True, torch_dtype, seed=2)
    first = _run(x, weight, bias, dtype)
    for _ in range(9):
        assert torch.equal(_run(x, weight, bias, dtype), first)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("allow_tf32", [False, True])
def test_public_api_takes_it(allow_tf32, layout):
    """cupyconv.conv2d runs squeeze-excitation's layers on it, float32 in TF32 mode as exactly as strict."""
    x, weight, bias = _inputs(4, 1152, 48, True, torch.float32, seed=6)
    x_array = cupy.asarray(x if layout == "NCHW" else x.permute(0, 2, 3, 1).contiguous())
    assert cupyconv.plan(x_array, cupy.asarray(weight), cupy.asarray(bias), allow_tf32=allow_tf32,
                         layout=layout).kernel == ONE_PIXEL_KERNEL
    out = cupyconv.conv2d(x_array, cupy.asarray(weight), cupy.asarray(bias), allow_tf32=allow_tf32, layout=layout)
    out = torch.as_tensor(out, device="cuda").reshape(4, 48, 1, 1)
    assert relative_error(out, _reference(x, weight, bias)) < 1e-6
