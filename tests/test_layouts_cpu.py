"""NHWC arrays and KHWC weights on the NumPy path against torch's CPU conv2d in float64; the errors
that name a layout; printed plans that say what is read in place and what is transposed."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import cupyconv
from cases import GRID
from checks import relative_error

TOLERANCE = {np.float64: 1e-12, np.float32: 1e-5}
LAYOUT_PAIRS = [("NHWC", "KCHW"), ("NCHW", "KHWC"), ("NHWC", "KHWC")]


def in_layouts(x, weight, layout, weight_layout):
    """NCHW x and KCHW weight rearranged (C-contiguous) into the given layouts."""
    if layout == "NHWC":
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    if weight_layout == "KHWC":
        weight = np.ascontiguousarray(weight.transpose(0, 2, 3, 1))
    return x, weight


@pytest.mark.parametrize("layouts", LAYOUT_PAIRS, ids="-".join)
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", GRID, ids=lambda c: c.id)
def test_numpy_layouts_match_torch(case, dtype, layouts):
    rng = np.random.default_rng(len(case.id))
    x = rng.standard_normal((case.n, case.c, case.h, case.w)).astype(dtype)
    weight = rng.standard_normal((case.k, case.c // case.groups, case.kh, case.kw)).astype(dtype)
    bias = rng.standard_normal(case.k).astype(dtype) if case.bias else None
    ref = F.conv2d(*(None if a is None else torch.from_numpy(a.astype(np.float64)) for a in (x, weight, bias)),
                   case.stride, case.padding, case.dilation, case.groups).numpy()
    xl, wl = in_layouts(x, weight, *layouts)
    out = np.full(ref.transpose(0, 2, 3, 1).shape if layouts[0] == "NHWC" else ref.shape, np.nan, dtype=dtype)
    got = cupyconv.conv2d(xl, wl, bias, case.stride, case.padding, case.dilation, case.groups, out=out,
                          layout=layouts[0], weight_layout=layouts[1])
    assert got is out and not np.isnan(out).any()
    as_nchw = out.transpose(0, 3, 1, 2) if layouts[0] == "NHWC" else out
    assert relative_error(as_nchw, ref) < TOLERANCE[dtype]


def test_unbatched_nhwc():
    rng = np.random.default_rng(1)
    x, weight = rng.standard_normal((7, 9, 4)), rng.standard_normal((5, 3, 3, 4))
    out = cupyconv.conv2d(x, weight, padding=1, layout="NHWC", weight_layout="KHWC")
    ref = F.conv2d(torch.from_numpy(x).permute(2, 0, 1), torch.from_numpy(weight).permute(0, 3, 1, 2), padding=1)
    assert out.shape == (7, 9, 5)
    assert relative_error(out, ref.permute(1, 2, 0).numpy()) < 1e-12


@pytest.mark.parametrize("argument,value", [("layout", "NWHC"), ("layout", "nchw"), ("weight_layout", "KWHC")])
def test_bad_layout_names_the_argument(argument, value):
    with pytest.raises(ValueError, match=rf"{argument} must be one of"):
        cupyconv.conv2d(np.ones((1, 2, 5, 5)), np.ones((3, 2, 3, 3)), **{argument: value})


def test_shapes_that_do_not_fit_the_layout_name_it():
    x = np.ones((1, 5, 5, 2))  # NHWC with C = 2
    with pytest.raises(ValueError, match=r"layout 'NCHW'.*\(N, C, H, W\) = \(1, 5, 5, 2\)"):
        cupyconv.conv2d(x, np.ones((3, 2, 3, 3)), weight_layout="KHWC")
    with pytest.raises(ValueError, match=r"weight_layout 'KCHW'"):
        cupyconv.conv2d(x, np.ones((3, 5, 3, 3)), layout="NHWC")
    with pytest.raises(ValueError, match=r"x must be 4-D \(N, H, W, C\) or 3-D \(H, W, C\) for layout='NHWC'"):
        cupyconv.conv2d(np.ones((5, 5)), np.ones((3, 2, 3, 3)), layout="NHWC")
    with pytest.raises(ValueError, match=r"must have shape \(1, 3, 3, 4\)"):  # out in the layout's order
        cupyconv.conv2d(x, np.ones((4, 3, 3, 2)), layout="NHWC", weight_layout="KHWC", out=np.empty((1, 4, 3, 3)))


def test_plans_say_what_is_read_in_place():
    x16, w16 = np.empty((8, 56, 56, 64), np.float16), np.empty((64, 3, 3, 64), np.float16)
    printed = str(cupyconv.plan(x16, w16, padding=1, layout="NHWC", weight_layout="KHWC"))
    assert "implicit_gemm_nhwc" in printed
    assert "x and the output in NHWC: read in place" in printed and "the weight in KHWC: read in place" in printed
    x32, w32 = x16.astype(np.float32), w16.astype(np.float32)
    printed = str(cupyconv.plan(x32, w32, padding=1, layout="NHWC", weight_layout="KHWC"))
    assert "winograd" in printed or "simt" in printed
    assert "transposed for the kernel, which computes NCHW only" in printed
    assert "transposed for the kernel, which computes KCHW only" in printed
    assert "NHWC" not in str(cupyconv.plan(x32.transpose(0, 3, 1, 2), w32.transpose(0, 3, 1, 2), padding=1))


def test_transposes_past_the_grid_limit_are_refused_before_a_launch():
    """An NHWC plane of more than 65535 x 32 positions cannot be transposed for an NCHW-only family:
    the program says so with a ValueError (raised when the call is first prepared, before any launch)."""
    import dataclasses

    from cupyconv import planner
    from cupyconv.arguments import make_problem

    problem = dataclasses.replace(make_problem((1, 1, 1500, 1500), (8, 1, 3, 3), None, "float32", padding=1),
                                  layout="NHWC")
    plan = planner.make_plan(problem)
    assert "transposed" in str(plan)
    with pytest.raises(ValueError, match=r"past CUDA's limits.*layout NHWC"):
        planner.program(plan, problem)


def test_short_reductions_take_the_shallow_mma_sync_tiles():
    """A reduction of one 128-byte k row (a 1x1 of 64 fp16 channels) takes mma.sync tiles with k rows
    of 64 bytes on the H100, not wgmma's; two or more keep wgmma (implicit_gemm_nhwc.MIN_DEEP_K_TILES).
    (The channels-last GEMM forced: by default these NHWC 1x1 layers take pointwise_nhwc.)"""
    import dataclasses

    from cupyconv.arguments import make_problem
    from cupyconv.families.implicit_gemm_nhwc import MIN_DEEP_K_TILES
    from cupyconv.planner import make_plan

    for c, dtype, deep_rows in ((64, "float16", 1), (32, "float32", 1), (128, "float16", 2), (64, "float32", 2)):
        problem = dataclasses.replace(make_problem((4, c, 64, 64), (64, c, 1, 1), None, dtype),
                                      layout="NHWC", weight_layout="KHWC")
        cfg = make_plan(problem, kernel="implicit_gemm_nhwc", compute_capability=90).config
        item = 4 if dtype == "float32" else 2
        assert bool(cfg.wgmma) == (deep_rows >= MIN_DEEP_K_TILES), (c, dtype, cfg)
        assert (cfg.bk * item == 128) == (deep_rows >= MIN_DEEP_K_TILES), (c, dtype, cfg)


def test_the_nchw_gather_gemm_reads_and_writes_nhwc_in_place():
    """The NCHW-gather GEMM on an NHWC problem runs its NHWC instance: one launch on the caller's input,
    output and residual, no transposes; a KHWC weight still transposed once into the prepared weight;
    NCHW problems keep the NCHW instance."""
    import dataclasses

    from cupyconv import planner
    from cupyconv.arguments import make_problem
    from cupyconv.program import OUT, PREPARED, RESIDUAL, X, Pointer

    for channels, weight_layout in ((1, "KCHW"), (3, "KHWC")):
        problem = dataclasses.replace(make_problem((2, channels, 9, 300), (64, channels, 3, 10), None, "float16"),
                                      layout="NHWC", weight_layout=weight_layout, activation="relu",
                                      has_residual=True)
        plan = planner.make_plan(problem, kernel=planner.GEMM_KERNEL)
        assert "x and the output in NHWC: read in place by the kernel" in str(plan)
        call = planner.program(plan, problem)
        (gemm,) = call.launches
        assert gemm.kernel == planner.GEMM_KERNEL and gemm.name_expression.endswith(",true>")
        assert {Pointer(X), Pointer(OUT), Pointer(RESIDUAL)} <= set(gemm.args) and call.workspace_bytes == 0
        assert (Pointer(PREPARED) in gemm.args) == (weight_layout == "KHWC")
    nchw = dataclasses.replace(problem, layout="NCHW", weight_layout="KCHW")
    assert planner.make_plan(nchw, kernel=planner.GEMM_KERNEL).name_expression.endswith(",2>")


def test_rgb_stems_take_the_few_channel_kernel_or_the_nchw_gather_in_place():
    """On NHWC arrays a 3-channel stem of <= 48 reduction elements and <= 64 output channels (EfficientNet's,
    MobileNetV2's, VGG's) takes few_channel_nhwc in 16 bits; in TF32 one of <= 32 reduction elements and <= 32
    output channels the NCHW-gather GEMM's NHWC instance, no zero-channel copy (planner.NHWC_GATHER_MAX_*).
    ResNet-50's 7x7 keeps the channels-last GEMM; on NCHW arrays the 3x3 of batch 32 reads x in place (the NCHW
    gather, below)."""
    import dataclasses

    from cupyconv import planner
    from cupyconv.arguments import make_problem

    def plan(channels_out, taps, dtype, layout="NHWC"):
        problem = dataclasses.replace(make_problem((32, 3, 224, 224), (channels_out, 3, taps, taps), None, dtype, 2,
                                                   taps // 2), layout=layout)
        return planner.make_plan(problem, allow_tf32=True, compute_capability=90)

    for dtype in ("float16", "bfloat16"):
        assert plan(32, 3, dtype).kernel == plan(64, 3, dtype).kernel == planner.FEW_CHANNEL_KERNEL
    stem = plan(32, 3, "float32")
    assert stem.kernel == planner.GEMM_KERNEL and "not copied with zero channels" in stem.reason, str(stem)
    assert planner.program(stem, dataclasses.replace(make_problem((32, 3, 224, 224), (32, 3, 3, 3), None, "float32",
                                                                  2, 1), layout="NHWC")).workspace_bytes == 0
    assert plan(64, 3, "float32").kernel == planner.NHWC_KERNEL
    for dtype in ("float16", "bfloat16", "float32"):
        assert plan(64, 7, dtype).kernel == planner.NHWC_KERNEL
        assert plan(32, 3, dtype, "NCHW").kernel == planner.GEMM_KERNEL


def test_nchw_rgb_stems_of_small_batches_are_gathered_in_place():
    """On NCHW arrays a strided stem of 3 input channels takes the NCHW-gather GEMM, one launch reading x in
    place, up to planner.NCHW_STEM_GATHER_MAX_TAPS output pixels x reduction elements (MobileNetV2's 3x3 to
    batch 32, ResNet-50's 7x7 to batch 4) and NCHW_STEM_GATHER_MAX_CHANNELS output channels, in 16 bits and
    TF32; past them, stride-1 and dilated layers, and strict float32 keep their rules."""
    import dataclasses

    from cupyconv import planner
    from cupyconv.arguments import make_problem

    def problem(n, channels_out, taps, dtype, stride=2, dilation=1):
        return make_problem((n, 3, 224, 224), (channels_out, 3, taps, taps), (channels_out,), dtype, stride,
                            taps // 2 * dilation, dilation, activation="relu")

    def plan(*args, tf32=True, **options):
        return planner.make_plan(problem(*args, **options), allow_tf32=tf32, compute_capability=90)

    for dtype in ("float16", "bfloat16", "float32"):
        for n, out, taps in ((1, 32, 3), (32, 32, 3), (1, 64, 7), (4, 64, 7)):
            stem = plan(n, out, taps, dtype)
            pixel_elements = n * 112 * 112 * 3 * taps * taps
            assert pixel_elements <= planner.NCHW_STEM_GATHER_MAX_TAPS
            assert stem.kernel == planner.GEMM_KERNEL and "gathered in place, one launch" in stem.reason, str(stem)
            (launch,) = planner.program(stem, problem(n, out, taps, dtype)).launches
            assert launch.kernel == planner.GEMM_KERNEL
        for n, out, taps in ((64, 32, 3), (8, 64, 7)):  # past the bound
            assert n * 112 * 112 * 3 * taps * taps > planner.NCHW_STEM_GATHER_MAX_TAPS
            assert plan(n, out, taps, dtype).kernel == planner.NHWC_KERNEL
        assert "gathered in place, one launch" not in plan(1, 64, 3, dtype, stride=1).reason
        assert "gathered in place, one launch" not in plan(1, 128, 3, dtype).reason  # wider than timed
        assert "gathered in place, one launch" not in plan(1, 32, 3, dtype, dilation=2).reason
        nhwc = dataclasses.replace(problem(1, 32, 3, dtype), layout="NHWC")
        assert "gathered in place, one launch" not in planner.make_plan(nhwc, allow_tf32=True,
                                                                         compute_capability=90).reason
    assert plan(1, 32, 3, "float32", tf32=False).kernel != planner.GEMM_KERNEL


def test_one_pixel_nchw_planes_are_planned_as_the_nhwc_problem_of_the_same_memory():
    """NCHW problems of 1x1 input and output planes (EfficientNet's squeeze-excitation layers, which torch
    hands over as contiguous tensors) run as NHWC where the rules' family reads NHWC in place: one launch,
    no copy to NHWC first (one_pixel_conv2d's batches in any dtype, the channels-last kernels past them);
    families that compute NCHW alone, and larger planes, keep NCHW."""
    from cupyconv import planner
    from cupyconv.arguments import make_problem

    for n, c, k, dtype, tf32 in ((32, 6, 144, "float16", False), (160, 144, 6, "bfloat16", False),
                                 (160, 48, 1152, "float16", False), (160, 28, 672, "float32", True),
                                 (32, 28, 672, "float32", False)):
        problem = make_problem((n, c, 1, 1), (k, c, 1, 1), (k,), dtype, activation="sigmoid",
                               residual_shape=(n, k, 1, 1))
        planned = planner.as_planned(problem, tf32, 90)
        assert planned.layout == "NHWC" and planned.weight_layout == "KCHW"
        plan = planner.make_plan(planned, allow_tf32=tf32, compute_capability=90)
        assert len(planner.program(plan, planned).launches) == 1, str(plan)
    strict = make_problem((160, 6, 1, 1), (144, 6, 1, 1), None, "float32")
    assert planner.as_planned(strict, False, 90) is strict
    plane = make_problem((32, 6, 2, 1), (144, 6, 1, 1), None, "float16")
    assert planner.as_planned(plane, False, 90) is plane


def test_one_pixel_planes_and_1x1_kernels_are_not_transposed():
    """NHWC planes of one pixel and KHWC 1x1 kernels are the same memory as NCHW and KCHW: a family that
    computes NCHW alone reads and writes them as they are (strict float32 squeeze-excitation layers in a
    channels_last model: one FMA GEMM, no transposes); larger planes and kernels are still transposed."""
    import dataclasses

    from cupyconv import planner
    from cupyconv.arguments import make_problem

    def transposes(x_shape, w_shape, padding=0, residual=False):
        """(whether each launch is a layout's transpose, the weight's transposes) added to the NCHW program."""
        nchw = make_problem(x_shape, w_shape, None, "float32", padding=padding,
                            residual_shape=(x_shape[0], w_shape[0], 1, 1) if residual else None)
        problem = dataclasses.replace(nchw, layout="NHWC", weight_layout="KHWC")
        plan = planner.make_plan(problem)
        assert plan.kernel == planner.SIMT_KERNEL, str(plan)
        program, own = planner.program(plan, problem), planner.program(plan, nchw)
        weight_launches = lambda p: len(p.weight.launches) if p.weight else 0
        kernels = [launch.kernel for launch in own.launches]
        return ([launch.kernel not in kernels for launch in program.launches],
                weight_launches(program) - weight_launches(own))

    launches, weight = transposes((160, 96, 1, 1), (24, 96, 1, 1), residual=True)  # x, residual, output, weight
    assert not any(launches) and weight == 0
    launches, weight = transposes((8, 16, 1, 1), (24, 16, 3, 3), padding=1)  # the 3x3 weight alone
    assert not any(launches) and weight == 1
    launches, weight = transposes((8, 16, 3, 3), (24, 16, 3, 3))  # a 3x3 plane to one pixel: x alone
    assert launches[0] and not any(launches[1:]) and weight == 1
    launches, weight = transposes((8, 16, 5, 5), (24, 16, 1, 1))  # planes of 25 pixels: x and the output
    assert launches[0] and launches[-1] and weight == 0


def test_channels_last_copy_takes_pairs_for_16_bit_types():
    """16-bit copies of even positions and padded channels move pairs in 64 x 64 tiles (nchw_to_nhwc_pairs);
    others keep the element-wise 32 x 32 tile, and few channels the one-thread-a-position kernel."""
    from cupyconv.families import implicit_gemm_nhwc as f
    from cupyconv.program import OUT, X, Pointer

    def launch(dtype, c, positions, padded):
        return f.channels_last_copy(dtype, 2, c, positions, padded, False, Pointer(X), Pointer(OUT))

    for dtype in ("float16", "bfloat16"):
        pairs = launch(dtype, 130, 3136, 136)
        assert (pairs.kernel, pairs.grid, pairs.block) == (f.CHANNELS_LAST_PAIRS, (49, 3, 2), (32, 8, 1))
        assert pairs.name_expression in f.channels_last_specialisations()
        assert pairs.args[2:] == (130, 3136, 136)
        assert launch(dtype, 64, 49, 64).kernel == f.CHANNELS_LAST_TILED  # odd positions
        assert launch(dtype, 72, 30, 75).kernel == f.CHANNELS_LAST_TILED  # odd padded channels
        assert launch(dtype, 3, 50, 4).kernel == f.CHANNELS_LAST_NARROW
    assert launch("float32", 64, 3136, 64).kernel == f.CHANNELS_LAST_TILED
