"""The strict-float32 FMA implicit GEMM (kernels/simt_gemm_conv2d.cu) against torch in float64, on the GPU.

Every tile forced in turn over the shared grid plus GEMM edges (reductions and channel counts that are
not multiples of the tiles, weight columns padded to 4, groups, 1x1 with stride, more kernel taps than
a block has threads, runs of pixels that cross images), the 64-bit index specialisation, an output
that is not 16-byte aligned (scalar stores), and both seed shapes at full size through the planner.
Outputs are poisoned with NaN before each launch; strict float32 must land under 1e-5.
"""
import dataclasses
import math

import pytest

from cases import GRID, Case
from checks import relative_error
from test_gpu_core import F, check, cupy, random_inputs, to_cupy, torch

import cupyconv  # noqa: E402
from cupyconv.arguments import make_problem  # noqa: E402
from cupyconv.launch import conv2d_cupy  # noqa: E402
from cupyconv.families.simt_gemm_conv2d import SIMT_CONFIGS  # noqa: E402
from cupyconv.planner import SIMT_KERNEL, make_plan  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("strict_torch_fp32")]

SIMT_GRID = GRID + [
    Case(2, 3, 8, 9, 11, 3, 3, padding=1),                        # Kgemm 27: a partial last k tile
    Case(1, 5, 70, 13, 17, 3, 3, padding=1),                      # K 70: weight columns 72, past a 64 tile
    Case(2, 7, 130, 11, 9, 3, 2, stride=(2, 1), padding=(1, 0)),  # K 130: past one 128-channel tile
    Case(2, 12, 24, 10, 11, 3, 3, padding=1, groups=3),           # grouped, 8 channels per group
    Case(2, 16, 36, 9, 9, 3, 3, groups=2),                        # 18 per group: columns padded to 20
    Case(3, 6, 48, 7, 5, 1, 1, stride=2),                         # 1x1 with stride, tiles across images
    Case(4, 24, 40, 8, 8, 1, 1),                                  # planes of 64 px: float4 stores, 4 images a tile
    Case(1, 136, 72, 9, 12, 1, 1, bias=False),                    # Kgemm 136
    Case(1, 2, 8, 40, 40, 17, 17, padding=8),                     # 289 taps: more than a block's threads
    Case(5, 3, 9, 31, 29, 3, 3, stride=3, padding=(2, 0), dilation=2),  # odd everything
    Case(2, 32, 64, 33, 35, 5, 9),                                # the 5x9 seed's channels, odd planes
    Case(3, 3, 96, 39, 41, 11, 11, stride=4, padding=2),          # AlexNet conv1's geometry
]


def problem_of(case: Case):
    return make_problem((case.n, case.c, case.h, case.w), (case.k, case.c // case.groups, case.kh, case.kw),
                        (case.k,) if case.bias else None, "float32", case.stride, case.padding, case.dilation,
                        case.groups)


@pytest.mark.parametrize("config", [c.name for c in SIMT_CONFIGS])
@pytest.mark.parametrize("case", SIMT_GRID, ids=lambda c: c.id)
def test_every_tile(case, config):
    check(case, "float32", seed=len(case.id) + len(config), kernel=SIMT_KERNEL, config=config)


def run_plan(case: Case, plan, seed: int, out_offset: int = 0):
    """``plan`` on fresh inputs into a NaN-poisoned output that starts ``out_offset`` floats into its
    buffer; returns (output, float64 reference)."""
    x, weight, bias = random_inputs(case, "float32", seed)
    problem = problem_of(case)
    flat = torch.full((math.prod(problem.out_shape) + out_offset,), float("nan"), device="cuda")
    out = flat[out_offset:].view(problem.out_shape)
    conv2d_cupy(to_cupy(x), to_cupy(weight), to_cupy(bias), problem, to_cupy(out), plan=plan)
    torch.cuda.synchronize()
    up = lambda t: None if t is None else t.double()
    return out, F.conv2d(up(x), up(weight), up(bias), case.stride, case.padding, case.dilation, case.groups)


@pytest.mark.parametrize("config", [c.name for c in SIMT_CONFIGS])
@pytest.mark.parametrize("case", [SIMT_GRID[-6], SIMT_GRID[-5], SIMT_GRID[-3], SIMT_GRID[-1]], ids=lambda c: c.id)
def test_64_bit_index_specialisation(case, config):
    plan = dataclasses.replace(make_plan(problem_of(case), kernel=SIMT_KERNEL, config=config), index_type="long long")
    out, ref = run_plan(case, plan, seed=11)
    assert not out.isnan().any()
    assert relative_error(out, ref) < 1e-5


@pytest.mark.parametrize("out_offset", [0, 1, 2])
def test_output_alignment(out_offset):
    """Planes of a multiple of 4 pixels take float4 stores only on a 16-byte aligned output; an output
    1 or 2 floats into its buffer must take the scalar stores and be just as right."""
    case = Case(3, 8, 40, 12, 12, 3, 3, padding=1)
    out, ref = run_plan(case, make_plan(problem_of(case), kernel=SIMT_KERNEL), seed=out_offset, out_offset=out_offset)
    assert not out.isnan().any()
    assert relative_error(out, ref) < 1e-5


SEEDS = {
    "alexnet_conv1": Case(256, 3, 96, 224, 224, 11, 11, stride=4, padding=2),
    "wide_5x9": Case(8, 32, 64, 512, 512, 5, 9, bias=False),
}


@pytest.mark.parametrize("name", SEEDS)
def test_seed_shapes_full_size(name):
    """Both seed shapes at full size on this kernel (the planner's strict-float32 choice for them is
    Winograd; this kernel runs them when forced); every element written, a sample of images against
    float64."""
    case = SEEDS[name]
    x, weight, bias = random_inputs(case, "float32", seed=5)
    x_c, w_c, b_c = to_cupy(x), to_cupy(weight), to_cupy(bias)
    problem = problem_of(case)
    out = torch.full(problem.out_shape, float("nan"), device="cuda")
    conv2d_cupy(x_c, w_c, b_c, problem, to_cupy(out), plan=make_plan(problem, kernel=SIMT_KERNEL))
    cupy.cuda.get_current_stream().synchronize()
    assert not out.isnan().any()
    sample = [0, case.n // 2, case.n - 1]
    up = lambda t: None if t is None else t.double()
    ref = F.conv2d(up(x[sample]), up(weight), up(bias), case.stride, case.padding)
    assert relative_error(out[sample], ref) < 1e-5


# --- split-K -------------------------------------------------------------------------------------

SPLIT_CASES = [c for c in SIMT_GRID if c.n and (c.c // c.groups) * c.kh * c.kw > 16]


@pytest.mark.parametrize("splits", [2, 3, 7])
@pytest.mark.parametrize("case", SPLIT_CASES, ids=lambda c: c.id)
def test_split_k_forced(case, splits):
    """The reduction split into 2, 3 or 7 runs (7 leaves some runs empty on short reductions, which
    must write zeros): every element written, within strict float32's bound."""
    from cupyconv.families import simt_gemm_conv2d

    plan = simt_gemm_conv2d.make_plan(problem_of(case), splits=splits)
    assert plan.splits == splits and plan.grid[2] == case.groups * splits
    out, ref = run_plan(case, plan, seed=splits)
    assert not out.isnan().any()
    assert relative_error(out, ref) < 1e-5


# Batch-1 layers that split: ResNet-50's 1x1 of 1024 channels on 14x14 (8 tiles of 64 k tiles) and
# stride-2 3x3 of 512 (8 tiles of 288), and a 3x3 on Winograd F(2x2) whose batched GEMM (16 tiles of
# 40 k tiles) splits.
SPLIT_LAYERS = {"r50_b1_1x1_1024to256": Case(1, 1024, 256, 14, 14, 1, 1),
                "r50_b1_3x3s2_512": Case(1, 512, 512, 14, 14, 3, 3, stride=2, padding=1),
                "winograd_b1_3x3_640to128": Case(1, 640, 128, 7, 7, 3, 3, padding=1)}


@pytest.mark.parametrize("name", SPLIT_LAYERS)
def test_split_k_is_planned_and_deterministic(name):
    """The planner splits these batch-1 layers, and ten runs on the same inputs give the same bits
    (the partial sums are added in a fixed order, never atomically)."""
    case = SPLIT_LAYERS[name]
    plan = make_plan(problem_of(case))
    assert (plan.gemm or plan).splits > 1, str(plan)
    x, weight, bias = random_inputs(case, "float32", seed=3)
    problem = problem_of(case)
    outs = []
    for _ in range(10):
        out = torch.full(problem.out_shape, float("nan"), device="cuda")
        conv2d_cupy(to_cupy(x), to_cupy(weight), to_cupy(bias), problem, to_cupy(out), plan=plan)
        outs.append(out)
    torch.cuda.synchronize()
    assert all(torch.equal(outs[0], out) for out in outs[1:]), "split-K must be bitwise repeatable"
    up = lambda t: None if t is None else t.double()
    ref = F.conv2d(up(x), up(weight), up(bias), case.stride, case.padding)
    assert not outs[0].isnan().any()
    assert relative_error(outs[0], ref) < 1e-5
