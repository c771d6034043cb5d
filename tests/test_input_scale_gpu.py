"""The input scale on the GPU (conv(x * s), s per image and input channel): every kernel family in both
layouts, the pointwise kernel's tiles (its own scaling in shared memory, tiles across images), the
public CuPy call and the torch adapter, against torch in float64 of x * s rounded to the dtype, with
NaN-poisoned outputs."""
import pytest

from cases import Case
from checks import relative_error
from devices import gpu_count

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_count(), reason="needs a CUDA GPU (cupy finds none)")]
torch = pytest.importorskip("torch", reason="the GPU tests compare with torch")
cupy = pytest.importorskip("cupy")
F = torch.nn.functional

import dataclasses  # noqa: E402

import cupyconv  # noqa: E402
import cupyconv.torch as ct  # noqa: E402
from cupyconv import planner  # noqa: E402
from cupyconv.compiler import compute_capability  # noqa: E402
from cupyconv.families.pointwise_nhwc import POINTWISE_CONFIGS  # noqa: E402
from cupyconv.launch import conv2d_cupy  # noqa: E402
from test_epilogue_gpu import CASES, family_dtype_layouts, problem_of, reference, tensors  # noqa: E402
from test_layouts_gpu import TORCH_DTYPES, arranged, to_cupy, tolerance  # noqa: E402


def gate(case: Case, dtype: str, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.rand(case.n, case.c, device="cuda", dtype=torch.float64, generator=g) * 1.9 + 0.1).to(
        TORCH_DTYPES[dtype])


def run(plan, problem, x, weight, bias, residual, scale):
    r = None if residual is None else arranged(residual, problem.layout)
    out = torch.full(problem.out_array_shape, float("nan"), device="cuda", dtype=x.dtype)
    conv2d_cupy(to_cupy(arranged(x, problem.layout)), to_cupy(arranged(weight, problem.weight_layout)), to_cupy(bias),
                problem, to_cupy(out), plan=plan, residual=to_cupy(r), input_scale=to_cupy(scale))
    torch.cuda.synchronize()
    return out.permute(0, 3, 1, 2) if problem.layout == "NHWC" else out


@pytest.mark.parametrize("kernel,dtype,layouts", list(family_dtype_layouts()), ids=str)
def test_every_family_and_layout(kernel, dtype, layouts):
    """Each family's plan with the scale (its own, or the scaled copy first) and the epilogue."""
    ran = 0
    for index, case in enumerate(CASES):
        problem = dataclasses.replace(problem_of(case, dtype, *layouts, "silu", True), has_input_scale=True)
        try:
            plan = planner.make_plan(problem, kernel=kernel, compute_capability=compute_capability())
        except ValueError:  # the family does not take this problem
            continue
        x, weight, bias, r = tensors(case, problem, dtype, seed=index + 11)
        s = gate(case, dtype, index)
        out = run(plan, problem, x, weight, bias, r, s)
        ref = reference(case, x * s[:, :, None, None], weight, bias, r, "silu")
        assert not out.isnan().any(), f"{case.id}: an output element was never written"
        assert relative_error(out, ref) < tolerance(dtype, kernel), case.id
        assert relative_error(out, reference(case, x, weight, bias, r, "silu")) > 0.05, "the scale was ignored"
        ran += 1
    assert ran, f"{kernel} took none of the cases"


# 1x1 NHWC layers whose pixel tiles span images (7 x 9 and 5 x 3 planes), partial tiles and channels.
POINTWISE_CASES = [Case(3, 64, 72, 7, 9, 1, 1), Case(5, 32, 16, 5, 3, 1, 1), Case(2, 128, 40, 6, 11, 1, 1, bias=False)]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_pointwise_tiles_scale_each_image(dtype):
    ran = 0
    for index, case in enumerate(POINTWISE_CASES):
        problem = dataclasses.replace(problem_of(case, dtype, "NHWC", "KHWC", "none", False), has_input_scale=True)
        for config in POINTWISE_CONFIGS[dtype]:
            try:
                plan = planner.make_plan(problem, config.name, planner.POINTWISE_KERNEL)
            except ValueError:  # too many channels for this tile
                continue
            x, weight, bias, _ = tensors(case, problem, dtype, seed=index)
            s = gate(case, dtype, 100 + index)
            out = run(plan, problem, x, weight, bias, None, s)
            ref = reference(case, x * s[:, :, None, None], weight, bias, None, "none")
            assert not out.isnan().any() and relative_error(out, ref) < tolerance(dtype, planner.POINTWISE_KERNEL), \
                (case.id, config.name)
            ran += 1
    assert ran >= 2 * len(POINTWISE_CASES)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("kh", [1, 3])
def test_public_call(layout, kh):
    """cupyconv.conv2d with input_scale on CuPy arrays: a strided scale (copied first), unbatched x."""
    torch.manual_seed(kh)
    x = torch.randn(4, 64, 10, 12, device="cuda", dtype=torch.float16)
    w = torch.randn(48, 64, kh, kh, device="cuda", dtype=torch.float16) / 8
    s = torch.rand(64, 4, device="cuda", dtype=torch.float16).t()  # (4, 64), not contiguous
    ref = F.conv2d((x * s[:, :, None, None]).double(), w.double(), padding=kh // 2)
    xa = to_cupy(arranged(x, layout))
    out = cupyconv.conv2d(xa, to_cupy(arranged(w, "KHWC")), padding=kh // 2, layout=layout, weight_layout="KHWC",
                          input_scale=to_cupy(s))
    got = torch.from_dlpack(out)
    got = got.permute(0, 3, 1, 2) if layout == "NHWC" else got
    assert relative_error(got, ref) < 1e-2
    one = cupyconv.conv2d(xa[1], to_cupy(arranged(w, "KHWC")), padding=kh // 2, layout=layout, weight_layout="KHWC",
                          input_scale=to_cupy(s[1]))
    cupy.testing.assert_array_equal(one, out[1])


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
def test_torch_adapter_and_graph_replay(channels_last):
    """cupyconv.torch.conv2d(x, w, input_scale=s) on CUDA tensors, eager and replayed in a CUDA graph
    with a new gate copied in."""
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    torch.manual_seed(5)
    x = torch.randn(8, 96, 14, 14, device="cuda", dtype=torch.float16).to(memory_format=fmt)
    w = (torch.randn(24, 96, 1, 1, device="cuda", dtype=torch.float16) / 10).to(memory_format=fmt)
    s = torch.rand(8, 96, 1, 1, device="cuda", dtype=torch.float16)
    expect = lambda: F.conv2d((x * s).double(), w.double())
    with torch.no_grad():
        out = ct.conv2d(x, w, input_scale=s)
        assert out.is_contiguous(memory_format=fmt) and relative_error(out, expect()) < 1e-2
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            replayed = ct.conv2d(x, w, input_scale=s)
        s.copy_(torch.rand_like(s))
        graph.replay()
        torch.cuda.synchronize()
        assert relative_error(replayed, expect()) < 1e-2
