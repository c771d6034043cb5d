"""The Winograd weight gradient (cupyconv.wgrad_winograd, kernels/winograd_conv2d.cu) against
torch.nn.grad.conv2d_weight in float64, on the GPU.

Fresh random inputs, the output poisoned with NaN before every launch, strict float32's 1e-5 bound on the
relative error: F(4x4) and F(2x2), NCHW and NHWC inputs with KCHW and KHWC weights, padding 0, 1, 2,
asymmetric and 'same', planes that are not whole tiles, odd channel counts, every GEMM tile, forced runs,
passes of fewer images than the batch (the workspace cap lowered), the 64-bit index instances, the same
bits over 10 runs, and the route grad.conv2d_weight takes for layers where Winograd pays.
"""
import dataclasses

import pytest

from cases import Case
from checks import relative_error
from test_wgrad_gpu import BITS, CROSS_LAYOUTS, LAYOUTS, problem_of, random_inputs, to_cupy, torch_wgrad

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch", reason="the GPU tests compare with torch")
cupy = pytest.importorskip("cupy")

from cupyconv import grad, wgrad, wgrad_winograd as ww  # noqa: E402
from cupyconv.executor import program_executable  # noqa: E402
from cupyconv.launch import run_program  # noqa: E402

BOUND = 1e-5
CASES = [
    Case(2, 16, 24, 12, 12, 3, 3, padding=1),            # whole 4x4 tiles
    Case(3, 5, 7, 11, 13, 3, 3, padding=1),              # odd channels, partial tiles
    Case(2, 8, 12, 9, 10, 3, 3),                         # no padding: 7x8 outputs
    Case(1, 12, 20, 14, 15, 3, 3, padding=2),            # padding past the window's reach
    Case(2, 6, 10, 10, 9, 3, 3, padding=(0, 2)),         # asymmetric by axis
    Case(2, 9, 17, 8, 11, 3, 3, padding="same"),
    Case(4, 64, 96, 7, 7, 3, 3, padding=1),              # a ResNet-like stage, long GEMMs
    Case(1, 1, 1, 5, 5, 3, 3, padding=1),                # one channel each way
]


def run(problem, x, dy, plan):
    """The plan's program on logical NCHW ``x`` and ``dy``, into a NaN-poisoned weight of the problem's
    layouts; its logical (K, C, 3, 3) view."""
    to_layout = lambda t: (t.permute(0, 2, 3, 1) if problem.layout == "NHWC" else t).contiguous()
    out = torch.full(problem.weight_array_shape, float("nan"), device="cuda", dtype=torch.float32)
    exe = program_executable(ww.program, plan, problem, cupy.cuda.Device().id)
    run_program(exe, x=to_cupy(to_layout(x)), grad_output=to_cupy(to_layout(dy)), out=to_cupy(out))
    cupy.cuda.get_current_stream().synchronize()
    return out, (out.permute(0, 3, 1, 2) if problem.weight_layout == "KHWC" else out)


def check(case, layout, weight_layout, seed, **plan_args):
    problem = problem_of(case, "float32", layout, weight_layout)
    plan = ww.make_plan(problem, **plan_args)
    x, dy = random_inputs(problem, seed)
    _, out = run(problem, x, dy, plan)
    assert not out.isnan().any(), "a weight-gradient element was never written (or is NaN)"
    error = relative_error(out, torch_wgrad(problem, x.double(), dy.double()))
    assert error <= BOUND, f"relative error {error:.3g} ({plan})"
    return plan


@pytest.mark.parametrize("layout,weight_layout", LAYOUTS + CROSS_LAYOUTS)
@pytest.mark.parametrize("tile", ww.WINOGRAD_WGRAD_TILES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_cases(case, tile, layout, weight_layout):
    check(case, layout, weight_layout, seed=len(case.id) + tile, tile=tile)


@pytest.mark.parametrize("layout,weight_layout", LAYOUTS)
@pytest.mark.parametrize("config", [c.name for c in wgrad.WGRAD_CONFIGS])
def test_every_gemm_tile(config, layout, weight_layout):
    check(CASES[6], layout, weight_layout, seed=3, config=config)


@pytest.mark.parametrize("layout,weight_layout", LAYOUTS)
@pytest.mark.parametrize("splits", [1, 3, 8])
def test_forced_runs(splits, layout, weight_layout):
    assert check(CASES[6], layout, weight_layout, seed=splits, splits=splits).passes.runs == splits


@pytest.mark.parametrize("layout,weight_layout", LAYOUTS)
@pytest.mark.parametrize("tile", ww.WINOGRAD_WGRAD_TILES)
def test_passes(tile, layout, weight_layout, monkeypatch):
    """A workspace cap that fits 2 images a pass: 3 passes of 2, 2 and 1 image over a batch of 5, each
    pass's GEMM writing runs of its own (the last pass's plan apart)."""
    case = Case(5, 16, 8, 20, 20, 3, 3, padding=1)
    problem = problem_of(case, "float32", layout, weight_layout)
    cap = 5 * ww._transformed_bytes(problem, tile, 1)  # V and dM take at most half: 2 images
    monkeypatch.setattr(ww, "WINOGRAD_WGRAD_MAX_WORKSPACE_BYTES", cap)
    ww._passes.cache_clear()
    try:
        plan = check(case, layout, weight_layout, seed=tile, tile=tile, splits=2)
    finally:
        ww._passes.cache_clear()
    assert (plan.passes.images, plan.passes.count, plan.passes.runs) == (2, 3, 6)


@pytest.mark.parametrize("layout,weight_layout", LAYOUTS)
def test_64_bit_index_specialisation(layout, weight_layout):
    problem = problem_of(CASES[1], "float32", layout, weight_layout)
    plan = ww.make_plan(problem)
    gemm = dataclasses.replace(plan.passes.gemm, index_type="long long", gemm_expression=wgrad.gemm_specialisation(
        "float32", layout == "NHWC", "long long", plan.passes.gemm.config))
    plan = dataclasses.replace(plan, index_type="long long",
                               passes=dataclasses.replace(plan.passes, gemm=gemm, gemm_last=gemm))
    x, dy = random_inputs(problem, seed=13)
    _, out = run(problem, x, dy, plan)
    assert relative_error(out, torch_wgrad(problem, x.double(), dy.double())) <= BOUND


@pytest.mark.parametrize("layout,weight_layout", LAYOUTS)
def test_same_bits_every_run(layout, weight_layout):
    problem = problem_of(CASES[6], "float32", layout, weight_layout)
    plan = ww.make_plan(problem, splits=5)
    x, dy = random_inputs(problem, seed=21)
    first, _ = run(problem, x, dy, plan)
    for _ in range(9):
        again, _ = run(problem, x, dy, plan)
        assert torch.equal(again.view(BITS["float32"]), first.view(BITS["float32"]))


@pytest.mark.parametrize("layout,weight_layout", LAYOUTS)
def test_the_route_takes_winograd_where_it_pays(layout, weight_layout):
    """grad.conv2d_weight on CuPy arrays runs this path for 3x3 stride-1 layers of enough channels."""
    case = Case(2, 48, 64, 9, 9, 3, 3, padding=1)
    problem = problem_of(case, "float32", layout, weight_layout)
    assert grad.weight_gradient_plan(problem, False)[0] is ww
    assert grad.weight_gradient_plan(dataclasses.replace(problem, c=16, k=16), False)[0] is wgrad
    x, dy = random_inputs(problem, seed=5)
    to_layout = lambda t: to_cupy((t.permute(0, 2, 3, 1) if layout == "NHWC" else t).contiguous())
    out = grad.weight_gradient(problem, to_layout(x), to_layout(dy), "cupy")
    got = torch.from_dlpack(out)
    got = got.permute(0, 3, 1, 2) if weight_layout == "KHWC" else got
    assert relative_error(got, torch_wgrad(problem, x.double(), dy.double())) <= BOUND
