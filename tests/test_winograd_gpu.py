"""Winograd F(2x2, 3x3) and F(4x4, 3x3) for strict float32 (kernels/winograd_conv2d.cu around
simt_gemm_conv2d) against torch in float64, on the GPU: both tile sizes forced on every 3x3 stride-1
shape of interest (odd output sizes that leave partial tiles, every padding including asymmetric
'same', channel counts that are not multiples of the GEMM's tiles or of 4, several images, no bias),
on strided kernels (polyphase channels: AlexNet's 11x11 at stride 4, 5x5, 6x6 and 9x9 ones, strides
that differ by axis, kernels that do not fill their 3 strides) and on kernels past 3 strides (blocks of
3x3 taps: the 5x9 seed's, 5x5, 7x7 at stride 2, 4x10), every GEMM tile forced, the 64-bit index
specialisation, split-K GEMMs whose runs the output transform adds, passes of a few images with a
shorter last one, the layers the planner sends to it, and both seed shapes at full size. Outputs are
poisoned with NaN before each launch; strict float32 must land under 1e-5.
"""
import dataclasses

import pytest

from cases import Case
from checks import relative_error
from test_gpu_core import F, check, cupy, random_inputs, to_cupy, torch
from test_simt_gpu import SEEDS, problem_of, run_plan

import cupyconv  # noqa: E402
from cupyconv.families import winograd_conv2d  # noqa: E402
from cupyconv.families.simt_gemm_conv2d import SIMT_CONFIGS  # noqa: E402
from cupyconv.families.winograd_conv2d import WINOGRAD_TILES  # noqa: E402
from cupyconv.planner import WINOGRAD_KERNEL, make_plan  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("strict_torch_fp32")]

WINOGRAD_CASES = [
    Case(2, 3, 8, 9, 11, 3, 3),                          # no padding: 7 x 9 outputs, partial tiles
    Case(2, 3, 8, 9, 11, 3, 3, padding=1, bias=False),
    Case(1, 5, 70, 13, 17, 3, 3, padding=1),             # K 70: columns padded to 72
    Case(3, 16, 24, 8, 8, 3, 3, padding=2),              # outputs larger than the input
    Case(1, 6, 6, 12, 12, 3, 3, padding=(0, 1)),
    Case(2, 9, 40, 15, 16, 3, 3, padding="same"),
    Case(1, 2, 3, 3, 3, 3, 3),                           # one output pixel
    Case(1, 2, 3, 4, 4, 3, 3),                           # one 2x2 tile
    Case(2, 130, 129, 14, 14, 3, 3, padding=1),          # past one 128-channel GEMM tile each way
    Case(4, 64, 64, 7, 7, 3, 3, padding=1),              # ResNet-50's last stage geometry, small
    Case(3, 3, 96, 39, 41, 11, 11, stride=4, padding=2),  # AlexNet conv1's geometry: 48 phase channels
    Case(2, 5, 70, 17, 19, 5, 5, stride=2, padding=1),   # 5x5 at stride 2: 20 phase channels
    Case(2, 4, 9, 18, 16, 6, 6, stride=2, bias=False),   # 6x6 fills its 3 strides exactly
    Case(1, 3, 12, 26, 29, 9, 7, stride=(3, 3), padding=(0, 4)),  # 9x7 at stride 3: taps short of 9 wide
    Case(2, 6, 10, 21, 23, 5, 9, stride=(2, 3), padding=(2, 1)),  # strides that differ by axis
    Case(1, 2, 5, 11, 11, 11, 11, stride=4),             # one output pixel
    Case(2, 32, 64, 21, 27, 5, 9),                       # the wide seed's 5x9: 2 x 3 blocks, 192 phase channels
    Case(1, 5, 7, 16, 13, 5, 5, padding=2, bias=False),  # 2 x 2 blocks, 11 of 36 taps zero
    Case(2, 3, 6, 23, 21, 7, 7, stride=2, padding=3),    # ResNet's stem geometry: 2 x 2 blocks x 2 x 2 phases
    Case(1, 2, 3, 15, 16, 4, 10, stride=(1, 2), padding=(1, 2)),
]


@pytest.mark.parametrize("tile", WINOGRAD_TILES)
@pytest.mark.parametrize("case", WINOGRAD_CASES, ids=lambda c: c.id)
def test_forced(case, tile):
    out, ref = run_plan(case, winograd_conv2d.make_plan(problem_of(case), tile=tile), seed=len(case.id) + tile)
    assert not out.isnan().any(), "an output element was never written (or is NaN)"
    assert relative_error(out, ref) < 1e-5


@pytest.mark.parametrize("config", [c.name for c in SIMT_CONFIGS])
def test_every_gemm_tile(config):
    check(WINOGRAD_CASES[8], "float32", seed=3, kernel=WINOGRAD_KERNEL, config=config)


@pytest.mark.parametrize("tile", WINOGRAD_TILES)
@pytest.mark.parametrize("case", [WINOGRAD_CASES[0], WINOGRAD_CASES[5], WINOGRAD_CASES[8], WINOGRAD_CASES[10]],
                         ids=lambda c: c.id)
def test_64_bit_index_specialisation(case, tile):
    plan = winograd_conv2d.make_plan(problem_of(case), tile=tile)
    plan = dataclasses.replace(plan, index_type="long long", gemm=dataclasses.replace(plan.gemm, index_type="long long"))
    out, ref = run_plan(case, plan, seed=21)
    assert not out.isnan().any()
    assert relative_error(out, ref) < 1e-5


@pytest.mark.parametrize("index", ["int", "long long"])
@pytest.mark.parametrize("splits", [2, 3])
@pytest.mark.parametrize("tile", WINOGRAD_TILES)
@pytest.mark.parametrize("case", [WINOGRAD_CASES[8], WINOGRAD_CASES[9], WINOGRAD_CASES[10], WINOGRAD_CASES[16]],
                         ids=lambda c: c.id)
def test_split_k_runs_added_by_the_output_transform(case, tile, splits, index):
    """The GEMMs' reductions forced into runs: the output transform adds the runs' partial sums (no
    reduction launch); right, and the same bits on a second run."""
    plan = winograd_conv2d.make_plan(problem_of(case), tile=tile, splits=splits)
    plan = dataclasses.replace(plan, index_type=index, gemm=dataclasses.replace(plan.gemm, index_type=index),
                               gemm_last=dataclasses.replace(plan.gemm_last, index_type=index))
    out, ref = run_plan(case, plan, seed=5 + splits)
    assert not out.isnan().any()
    assert relative_error(out, ref) < 1e-5
    again, _ = run_plan(case, plan, seed=5 + splits)
    assert torch.equal(out, again)


LAYERS = [
    Case(4, 128, 128, 28, 28, 3, 3, padding=1),          # r50_l2_3x3_128 at batch 4
    Case(4, 256, 256, 14, 14, 3, 3, padding=1, bias=False),
    Case(4, 512, 512, 7, 7, 3, 3, padding=1),
    Case(2, 256, 256, 56, 56, 3, 3, padding=1),          # vgg_conv3_2 at batch 2
    Case(2, 64, 64, 224, 224, 3, 3, padding=1),          # vgg_conv1_2 at batch 2
    Case(2, 1024, 128, 14, 14, 3, 3, padding=1),         # F(2x2): more input channels than F(4x4) takes
    Case(2, 3, 96, 224, 224, 11, 11, stride=4, padding=2),  # AlexNet conv1 at batch 2
    Case(2, 64, 128, 56, 56, 5, 5, stride=2, padding=2),
    Case(2, 256, 256, 28, 28, 5, 5, stride=2, padding=2),   # F(2x2): 1024 phase channels
]


@pytest.mark.parametrize("case", LAYERS, ids=lambda c: c.id)
def test_planned_layers(case):
    """The planner sends these to Winograd (through the public conv2d), and the result is right."""
    assert make_plan(problem_of(case)).kernel == WINOGRAD_KERNEL
    check(case, "float32", seed=len(case.id))


def test_passes_of_images(monkeypatch):
    """With the temporaries capped at two images' worth, 5 images run in passes of 2, 2 and 1 (the last
    GEMM planned apart); every pass writes its own images."""
    case = Case(5, 6, 10, 52, 56, 5, 9, padding=(2, 1))
    problem = problem_of(case)
    # 52 x 50 outputs: 13 x 13 tiles an image; 36 phase channels; 10 outputs, 12 weight columns.
    per_image, weight = 4 * 36 * (36 + 10) * 13 * 13, 4 * 36 * 36 * 12
    monkeypatch.setattr(winograd_conv2d, "WINOGRAD_MAX_WORKSPACE_BYTES", weight + 2 * per_image + 1)
    plan = winograd_conv2d.make_plan(problem)
    assert plan.winograd_images == 2 and plan.gemm_last.grid != plan.gemm.grid
    out, ref = run_plan(case, plan, seed=17)
    assert not out.isnan().any()
    assert relative_error(out, ref) < 1e-5


@pytest.mark.parametrize("name", SEEDS)
def test_seed_shapes_full_size(name):
    """Both seed shapes through the public conv2d: Winograd (AlexNet's conv1 on 48 phase channels with
    1 GB of temporaries; the wide 5x9 on 192, in passes of 3, 3 and 2 images); every element written, a
    sample of images against float64."""
    case = SEEDS[name]
    x, weight, bias = random_inputs(case, "float32", seed=9)
    x_c, w_c, b_c = to_cupy(x), to_cupy(weight), to_cupy(bias)
    assert cupyconv.plan(x_c, w_c, b_c, case.stride, case.padding).kernel == WINOGRAD_KERNEL
    problem = problem_of(case)
    out = cupy.full(problem.out_shape, cupy.nan, dtype=cupy.float32)
    cupyconv.conv2d(x_c, w_c, b_c, case.stride, case.padding, out=out)
    out = torch.from_dlpack(out)
    assert not out.isnan().any()
    sample = [0, case.n // 2, case.n - 1]
    ref = F.conv2d(x[sample].double(), weight.double(), None if bias is None else bias.double(), case.stride,
                   case.padding)
    assert relative_error(out[sample], ref) < 1e-5
