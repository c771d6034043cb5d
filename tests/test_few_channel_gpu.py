"""The few-channel kernel (families/few_channel_nhwc.py) on the GPU: 16-bit NHWC layers of 1-4 input channels
against torch in float64 with NaN-poisoned outputs -- partial output tiles, one to three k steps, 8 to 64 output
channels, strides, dilation, uneven padding, both weight layouts, bias, residual and activations -- an infinity
in the input reaching only the outputs whose windows hold it, and the same bits run after run."""
import dataclasses

import pytest

from cases import Case
from checks import relative_error
from devices import gpu_count

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_count(), reason="needs a CUDA GPU (cupy finds none)")]
torch = pytest.importorskip("torch", reason="the GPU tests compare with torch")
cupy = pytest.importorskip("cupy")

from cupyconv import planner  # noqa: E402
from test_epilogue_gpu import problem_of, reference, run, tensors  # noqa: E402

CASES = [
    Case(2, 3, 32, 37, 45, 3, 3, stride=2, padding=1),     # an RGB stem: 19 x 23 outputs, partial tiles both ways
    Case(2, 3, 32, 30, 40, 3, 3, stride=2, padding=1),     # rows of 120 elements: 16-byte copies, shifted 5
    Case(1, 3, 64, 20, 33, 3, 3, padding=1),               # stride 1, K 64: eight 8-channel tiles
    Case(2, 4, 16, 17, 18, 3, 3, stride=(2, 1), padding=(1, 0), dilation=(1, 2)),  # R 36: three k steps
    Case(3, 1, 8, 12, 40, 5, 5, padding=2, bias=False),    # one channel (the rules: depthwise_conv2d), 25 taps, K 8
    Case(2, 2, 24, 9, 11, 4, 4, stride=2, padding=(1, 2)),  # R 32: two whole k steps, none masked
    Case(2, 3, 40, 33, 34, 2, 2, stride=2),                # R 12: one k step, K 40
]
EPILOGUES = [("none", False), ("relu", False), ("relu6", True), ("silu", True)]


@pytest.mark.parametrize("weight_layout", ["KHWC", "KCHW"])
@pytest.mark.parametrize("epilogue", EPILOGUES, ids=[f"{a}-{'residual' if r else 'no_residual'}" for a, r in EPILOGUES])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_few_channel_against_float64(case, dtype, epilogue, weight_layout):
    """Every output written and within 16-bit tolerance; a second run gives the same bits."""
    activation, residual = epilogue
    problem = problem_of(case, dtype, "NHWC", weight_layout, activation, residual)
    plan = planner.make_plan(problem, kernel=planner.FEW_CHANNEL_KERNEL)
    x, weight, bias, r = tensors(case, problem, dtype, seed=case.c * 7 + case.k + len(activation))
    r = r if residual else None
    out = run(plan, problem, x, weight, bias, r)
    assert not out.isnan().any(), f"an output element was never written: {plan}"
    assert relative_error(out, reference(case, x, weight, bias, r, activation)) < 1e-2, str(plan)
    assert torch.equal(out, run(plan, problem, x, weight, bias, r)), "two runs gave different bits"


@pytest.mark.parametrize("case", [CASES[0], CASES[1], CASES[3]], ids=lambda c: c.id)
def test_an_infinity_reaches_only_its_windows(case):
    """The taps past C kh kw (the last k step's padding) are masked, never another tap's value times a zero
    weight: an infinite input gives infinities where torch gives them, finite outputs elsewhere."""
    problem = problem_of(case, "float16", "NHWC", "KHWC", "none", False)
    plan = planner.make_plan(problem, kernel=planner.FEW_CHANNEL_KERNEL)
    x, weight, bias, _ = tensors(case, problem, "float16", seed=3)
    x[0, 0, case.h // 2, case.w // 2] = float("inf")
    out = run(plan, problem, x, weight, bias, None).double()
    ref = reference(case, x, weight, bias, None, "none")
    assert torch.equal(torch.isinf(out), torch.isinf(ref)) and torch.equal(torch.isnan(out), torch.isnan(ref))
    finite = torch.isfinite(ref)
    assert finite.sum() < ref.numel() and relative_error(out[finite], ref[finite]) < 1e-2


@pytest.mark.parametrize("activation", ["none", "silu"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_an_rgb_stem_as_accurate_as_torchs(dtype, activation):
    """EfficientNet's stem at batch 2 (bias and SiLU: BatchNorm and its activation fused): float32 sums rounded
    once, the error against float64 within 1.5x of torch's own in the same dtype (its conv, then SiLU)."""
    case = Case(2, 3, 32, 224, 224, 3, 3, stride=2, padding=1)
    problem = problem_of(case, dtype, "NHWC", "KCHW", activation, False)
    plan = planner.make_plan(problem, kernel=planner.FEW_CHANNEL_KERNEL)
    x, weight, bias, _ = tensors(case, problem, dtype, seed=11)
    ref = reference(case, x, weight, bias, None, activation)
    theirs = torch.nn.functional.conv2d(x, weight, bias, case.stride, case.padding)
    theirs = torch.nn.functional.silu(theirs) if activation == "silu" else theirs
    assert relative_error(run(plan, problem, x, weight, bias, None), ref) <= 1.5 * relative_error(theirs, ref)


@pytest.mark.parametrize("blocks", [1, 3, 7])
def test_persistent_blocks_take_every_tile(blocks):
    """Grids of a few persistent blocks, each taking many tiles in turn (the patch buffers alternate), across
    images: every output written, the same result as the plan's grid."""
    case = CASES[1]
    problem = problem_of(case, "float16", "NHWC", "KHWC", "relu", True)
    plan = planner.make_plan(problem, kernel=planner.FEW_CHANNEL_KERNEL)
    x, weight, bias, r = tensors(case, problem, "float16", seed=blocks)
    wanted = run(plan, problem, x, weight, bias, r)
    out = run(dataclasses.replace(plan, grid=(blocks, 1, 1)), problem, x, weight, bias, r)
    assert torch.equal(out, wanted)
