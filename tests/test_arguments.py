"""Argument normalisation and every bad-input error, on NumPy arrays (no GPU needed)."""
import numpy as np
import pytest

import cupyconv
from cupyconv.arguments import make_problem


def arrays(n=2, c=4, h=9, w=10, k=6, kh=3, kw=3, groups=1, dtype=np.float32, bias=True):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, c, h, w)).astype(dtype)
    weight = rng.standard_normal((k, c // groups, kh, kw)).astype(dtype)
    b = rng.standard_normal(k).astype(dtype) if bias else None
    return x, weight, b


@pytest.mark.parametrize("stride, padding, dilation, expect", [
    (1, 0, 1, ((1, 1), (0, 0, 0, 0), (1, 1))),
    ((2, 3), (1, 2), (2, 1), ((2, 3), (1, 2, 1, 2), (2, 1))),
    (1, "valid", 1, ((1, 1), (0, 0, 0, 0), (1, 1))),
    (1, "same", (2, 3), ((1, 1), (2, 3, 2, 3), (2, 3))),
])
def test_normalisation(stride, padding, dilation, expect):
    p = make_problem((2, 4, 9, 10), (6, 4, 3, 3), (6,), "float32", stride, padding, dilation)
    assert (p.stride, (p.pad_top, p.pad_left, p.pad_bottom, p.pad_right), p.dilation) == expect


def test_same_padding_puts_the_odd_extra_at_bottom_right():
    p = make_problem((1, 1, 8, 8), (1, 1, 4, 2), None, "float32", padding="same")
    assert (p.pad_top, p.pad_left, p.pad_bottom, p.pad_right) == (1, 0, 2, 1)
    assert (p.ho, p.wo) == (8, 8)


def test_output_shape_and_flops():
    p = make_problem((256, 3, 224, 224), (96, 3, 11, 11), (96,), "float32", 4, 2)
    assert p.out_shape == (256, 96, 55, 55)
    assert p.flops == 2 * 256 * 96 * 55 * 55 * 3 * 11 * 11


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(x=np.zeros((4, 9, 10), np.float32)[None, None]), ValueError, ["x must be 4-D", "(1, 1, 4, 9, 10)"]),
    (dict(x=np.zeros((9, 10), np.float32)), ValueError, ["x must be 4-D", "(9, 10)"]),
    (dict(weight=np.ones((6, 4, 3), np.float32)), ValueError, ["weight must be 4-D", "(6, 4, 3)"]),
    (dict(weight=np.ones((6, 3, 3, 3), np.float32)), ValueError, ["C=4", "(6, 3, 3, 3)"]),
    (dict(groups=3), ValueError, ["groups=3", "C=4"]),
    (dict(groups=4, weight=np.ones((6, 1, 3, 3), np.float32)), ValueError, ["groups=4", "K=6"]),
    (dict(groups=0), ValueError, ["groups must be >= 1"]),
    (dict(groups=1.0), TypeError, ["groups must be an int"]),
    (dict(bias=np.ones(5, np.float32)), ValueError, ["bias must have shape (6,)", "(5,)"]),
    (dict(bias=np.ones((6, 1), np.float32)), ValueError, ["bias must be 1-D", "(6, 1)"]),
    (dict(stride=0), ValueError, ["stride must be >= 1"]),
    (dict(stride=(1, -1)), ValueError, ["stride must be >= 1"]),
    (dict(stride=(1, 2, 3)), TypeError, ["stride must be an int or a pair"]),
    (dict(stride=1.5), TypeError, ["stride"]),
    (dict(dilation=0), ValueError, ["dilation must be >= 1"]),
    (dict(padding=-1), ValueError, ["padding must be >= 0"]),
    (dict(padding=(1, -2)), ValueError, ["padding must be >= 0"]),
    (dict(padding="full"), ValueError, ["'full'", "'same'"]),
    (dict(padding="same", stride=2), ValueError, ["'same' needs stride 1"]),
    (dict(weight=np.ones((6, 4, 12, 3), np.float32)), ValueError, ["larger than the padded input", "9x10"]),
    (dict(weight=np.ones((6, 4, 5, 3), np.float32), dilation=3), ValueError, ["larger than the padded input"]),
    (dict(weight=np.ones((6, 4, 3, 3), np.float64)), TypeError, ["weight has dtype float64", "float32"]),
    (dict(bias=np.ones(6, np.float16)), TypeError, ["bias has dtype float16"]),
    (dict(x=np.ones((2, 4, 9, 10), np.int32)), TypeError, ["int32"]),
    (dict(x=np.ones((2, 4, 9, 10), bool)), TypeError, ["bool"]),
    (dict(x=np.ones((2, 4, 9, 10), np.complex64)), TypeError, ["complex64"]),
    (dict(x=[[1.0]]), TypeError, ["x must be a NumPy or CuPy array", "list"]),
    (dict(weight=np.ones((0, 4, 3, 3), np.float32)), ValueError, ["K, kh and kw >= 1"]),
    (dict(x=np.ones((2, 4, 0, 10), np.float32)), ValueError, ["C, H and W >= 1"]),
])
def test_errors_name_the_argument_and_shapes(kwargs, error, words):
    x, weight, bias = arrays()
    call = dict(x=x, weight=weight, bias=bias)
    call.update(kwargs)
    with pytest.raises(error) as info:
        cupyconv.conv2d(**call)
    for word in words:
        assert word in str(info.value)


@pytest.mark.parametrize("out, error, words", [
    (np.empty((2, 6, 7, 9), np.float32), ValueError, ["out must have shape (2, 6, 7, 8)", "(2, 6, 7, 9)"]),
    (np.empty((2, 6, 7, 8), np.float64), TypeError, ["out has dtype float64"]),
    (np.empty((2, 6, 7, 16), np.float32)[..., ::2], ValueError, ["C-contiguous"]),
    ([[0.0]], TypeError, ["out must be a NumPy or CuPy array", "list"]),
])
def test_bad_out(out, error, words):
    x, weight, bias = arrays()
    with pytest.raises(error) as info:
        cupyconv.conv2d(x, weight, bias, out=out)
    for word in words:
        assert word in str(info.value)


def test_out_may_not_alias_an_input():
    x = np.random.default_rng(1).standard_normal((1, 2, 5, 5))
    weight = np.ones((2, 2, 1, 1))
    with pytest.raises(ValueError, match="shares memory with x"):
        cupyconv.conv2d(x, weight, out=x)


def test_out_is_written_and_returned():
    x, weight, bias = arrays()
    out = np.full((2, 6, 7, 8), np.nan, np.float32)
    y = cupyconv.conv2d(x, weight, bias, out=out)
    assert y is out and np.isfinite(out).all()
    np.testing.assert_array_equal(out, cupyconv.conv2d(x, weight, bias))


def test_plan_is_printable_and_explains_the_choice():
    x, weight, bias = arrays(n=256, c=3, h=224, w=224, k=96, kh=11, kw=11)
    text = str(cupyconv.plan(x, weight, bias, stride=4, padding=2))
    assert "winograd_conv2d" in text and "why:" in text and "grid" in text and "strict float32" in text
    assert "48 phase channels (3 channels x 4x4 phases)" in text and "simt_gemm_conv2d" in text  # and its GEMM
    x, weight, bias = arrays(n=1, c=3, h=32, w=32, k=4, kh=3, kw=3)  # 4 output channels: too few for a GEMM
    text = str(cupyconv.plan(x, weight, bias))
    assert "direct_conv2d" in text and "why:" in text and "4 output channel(s)" in text
    x, weight, bias = arrays(n=2, c=192, h=2, w=2, k=4, kh=1, kw=1)  # ... unless there are few pixels too
    text = str(cupyconv.plan(x, weight, bias))
    assert "simt_gemm_conv2d" in text and "4 output channel(s) per group on 8 pixels" in text and "split-K" in text
    x, weight, bias = arrays(n=8, c=192, h=1, w=1, k=4, kh=1, kw=1)  # one-pixel planes: a product per image
    text = str(cupyconv.plan(x, weight, bias))
    assert "one_pixel_conv2d" in text and "8 image(s) of 192 -> 4 channels" in text and "one launch" in text


def test_strict_float32_dispatch():
    """Strict float32 runs on the FMA implicit GEMM where it can, with reasons where it cannot; it
    never runs on the tensor cores unless TF32 is allowed."""
    from cupyconv.arguments import make_problem
    from cupyconv.planner import (DEPTHWISE_COLUMN_KERNEL, DEPTHWISE_KERNEL, DIRECT_KERNEL, NHWC_KERNEL, SIMT_KERNEL,
                                  make_plan)

    def plan(x_shape, w_shape, dtype="float32", allow_tf32=False, **kw):
        return make_plan(make_problem(x_shape, w_shape, None, dtype, kw.get("stride", 1), kw.get("padding", 0),
                                      kw.get("dilation", 1), kw.get("groups", 1)), allow_tf32=allow_tf32)

    assert plan((2, 16, 9, 9), (32, 16, 3, 3)).kernel == SIMT_KERNEL
    assert plan((2, 16, 9, 9), (32, 16, 3, 3), allow_tf32=True).kernel == NHWC_KERNEL
    assert plan((2, 16, 9, 9), (32, 4, 3, 3), groups=4).kernel == SIMT_KERNEL  # 8 output channels per group
    assert plan((2, 16, 9, 9), (16, 1, 3, 3), groups=16).kernel == DEPTHWISE_COLUMN_KERNEL
    assert plan((2, 16, 40, 40), (16, 1, 3, 3), groups=16).kernel == DEPTHWISE_COLUMN_KERNEL  # pairs of columns
    assert plan((2, 16, 41, 41), (16, 1, 3, 3), groups=16).kernel == DEPTHWISE_KERNEL  # odd rows: the tiles
    assert plan((2, 16, 9, 9), (32, 16, 3, 3), dtype="float64").kernel == DIRECT_KERNEL
    wide = plan((1, 2, 40, 1200), (16, 2, 1, 1025))  # more taps than the tap table holds
    assert wide.kernel == DIRECT_KERNEL and "1x1025 kernel taps" in wide.reason
    with pytest.raises(ValueError, match="float32 only"):
        make_plan(make_problem((2, 16, 9, 9), (32, 16, 3, 3), None, "float16"), kernel=SIMT_KERNEL)
    with pytest.raises(ValueError, match="must be one of"):
        make_plan(make_problem((2, 16, 9, 9), (32, 16, 3, 3), None, "float32"), kernel=SIMT_KERNEL,
                  config="nhwc_m128n64k16")


def test_strict_float32_tiles():
    """The channel tile fits the output channels per group; ungrouped layers of more than 64 take the
    64 x 128 tile on 1x1 kernels and up to 128 channels, else the tile of fewest whole waves; grouped
    problems, and short reductions on many waves, keep the 96-channel tile and the 128-pixel tiles; the
    weight copy's columns are padded to a multiple of 4. Grids of one resident wave of 32 x 64 tiles take the
    4 x 4-output tile (test_small_grid_tiles_cpu.py)."""
    from cupyconv.arguments import make_problem
    from cupyconv.planner import make_plan

    def plan(n, c, k, hw, kernel=3, groups=1):  # the FMA GEMM forced: 3x3 layers may take Winograd
        return make_plan(make_problem((n, c, hw, hw), (k, c // groups, kernel, kernel), None, "float32", 1,
                                      kernel // 2, 1, groups), kernel="simt_gemm_conv2d")

    assert plan(8, 32, 24, 128).config.name == "simt_m256n32"
    assert plan(8, 32, 64, 128).config.name == "simt_m64n64"
    assert plan(8, 32, 96, 128).config.name == "simt_m64n128k16"
    assert plan(8, 64, 192, 128, groups=2).config.name == "simt_m128n96k16"
    assert plan(32, 128, 128, 56).config.name == "simt_m64n128k16"
    assert plan(32, 256, 256, 56).config.name == "simt_m128n128k16"   # 1568 blocks, or 3136 of 64 pixels
    assert plan(32, 256, 256, 14).config.name == "simt_m128n128k16"   # 98 blocks: one wave
    assert plan(32, 512, 512, 14).config.name == "simt_m64n128k16"    # 392 blocks: three waves, two of 128 px
    assert plan(32, 512, 1024, 14, groups=2).config.name == "simt_m128n128k16"  # grouped: 128-pixel tiles
    assert plan(32, 1024, 256, 14, kernel=1).config.name == "simt_m64n128k16"
    # A reduction of 24 on 6 waves of 64 x 128 tiles, then on 24 waves: 128-pixel tiles.
    assert plan(8, 24, 144, 56, kernel=1).config.name == "simt_m64n128k16"
    assert plan(32, 24, 144, 56, kernel=1).config.name == "simt_m128n64k16"
    assert plan(8, 16, 96, 112, kernel=1).config.name == "simt_m128n96k16"
    assert "waves" in plan(32, 512, 512, 14).reason
    assert plan(32, 512, 512, 7).config.name == "simt_m32n64t4"  # 392 tiles of 32 x 64: one resident wave
    assert plan(2, 8, 10, 9).weight_columns == 12
    assert plan(2, 12, 18, 9, groups=2).weight_columns == 12


def test_strict_float32_split_k():
    """The FMA GEMM splits the reduction of grids of at most four warps an SM: a small grid, or up to a
    wave of four-warp blocks (more runs for two-warp blocks), not a wave of eight-warp ones; the runs
    keep at least 4 k tiles each. (The 4 x 4-output tile, which the rules take for these small grids, splits by
    its block count: test_small_grid_tiles_cpu.py; here the 8 x 8 tiles are forced.)"""
    from cupyconv.arguments import make_problem
    from cupyconv.planner import make_plan

    def plan(n, c, k, hw, kernel=1, config=None):
        return make_plan(make_problem((n, c, hw, hw), (k, c, kernel, kernel), None, "float32", 1, kernel // 2),
                         config, kernel="simt_gemm_conv2d")

    tall = plan(32, 2048, 512, 7, config="simt_m64n128k16")  # 100 blocks of four warps
    assert (tall.config.name, tall.grid, tall.splits) == ("simt_m64n128k16", (25, 4, 3), 3)
    assert "100 tiles of 4 warps" in tall.reason
    assert plan(8, 240, 40, 28, config="simt_m64n64").splits == 6  # 98 blocks of two warps: 528 blocks
    assert plan(8, 96, 24, 56, config="simt_m256n32").splits == 3  # 98 blocks of four warps, 12 k tiles of 8
    wide = plan(32, 1024, 256, 14, kernel=3)     # 98 blocks of eight warps
    assert (wide.config.name, wide.splits) == ("simt_m128n128k16", 1)
    assert plan(32, 1024, 512, 14).splits == 1  # 392 blocks
    assert plan(8, 32, 24, 7).splits == 1       # 4 k tiles: no run shorter than 4


def test_winograd_dispatch():
    """Strict float32 3x3 stride-1 layers with enough channels take Winograd, F(4x4) up to 512 input
    channels and F(2x2) above; few channels, strides, dilation, groups, TF32, 16-bit types and
    temporaries past the cap do not; forcing it where it cannot run is a clear error."""
    from cupyconv.arguments import make_problem
    from cupyconv.families import winograd_conv2d
    from cupyconv.planner import SIMT_KERNEL, WINOGRAD_KERNEL, make_plan

    def problem(c, k, hw, dtype="float32", stride=1, dilation=1, groups=1, size=3, n=32):
        return make_problem((n, c, hw, hw), (k, c // groups, size, size), None, dtype, stride, 1, dilation, groups)

    def plan(*args, kernel=None, allow_tf32=False, **kw):
        return make_plan(problem(*args, **kw), kernel=kernel, allow_tf32=allow_tf32)

    assert plan(256, 256, 56).kernel == WINOGRAD_KERNEL and plan(256, 256, 56).winograd_tile == 4
    assert plan(64, 64, 224).winograd_tile == 4                  # VGG's first block: 1.85 GB of temporaries
    assert plan(1024, 256, 14).winograd_tile == 2                # F(4x4) rounds more with longer sums
    assert "F(4x4, 3x3)" in str(plan(512, 512, 7))
    assert plan(32, 32, 56).kernel == SIMT_KERNEL                # too few channels to pay for the transforms
    assert plan(128, 128, 28, stride=2).kernel == SIMT_KERNEL    # taps padded 2x2 -> 3x3 per phase: no saving
    assert plan(128, 128, 28, dilation=2).kernel == SIMT_KERNEL
    assert plan(128, 128, 28, groups=2).kernel == SIMT_KERNEL
    assert plan(128, 128, 28, allow_tf32=True).kernel != WINOGRAD_KERNEL
    assert plan(128, 128, 28, dtype="float16").kernel != WINOGRAD_KERNEL
    big = plan(512, 512, 224)                                     # 14.8 GB of temporaries at once: 8 passes of 4 images
    assert big.kernel == WINOGRAD_KERNEL and big.winograd_images == 4 and "8 passes of 4 image(s)" in big.reason
    assert plan(512, 512, 224, n=30).winograd_images == 4            # passes as even as they come: 4 x 7 + 2
    assert plan(512, 512, 224, n=30).gemm_last.grid[0] < big.gemm.grid[0]
    assert plan(512, 512, 2048, n=2).kernel == SIMT_KERNEL          # one image's temporaries past the cap
    assert plan(8, 8, 9, kernel=WINOGRAD_KERNEL).kernel == WINOGRAD_KERNEL  # forced where it does not pay
    assert winograd_conv2d.make_plan(problem(8, 8, 9), tile=2).winograd_tile == 2
    with pytest.raises(ValueError, match="tile must be one of"):
        winograd_conv2d.make_plan(problem(8, 8, 9), tile=3)
    for bad in (dict(dilation=2), dict(dtype="float64"), dict(groups=2)):
        with pytest.raises(ValueError, match="winograd_conv2d.*cannot run"):
            plan(8, 8, 9, kernel=WINOGRAD_KERNEL, **bad)
    with pytest.raises(ValueError, match="winograd_conv2d.*cannot run.*one image"):
        plan(512, 512, 2048, n=2, kernel=WINOGRAD_KERNEL)


def test_strided_and_large_winograd_dispatch():
    """Other kernels run as the stride-1 3x3 problem of their C bh bw sh sw phase channels (blocks of 3
    strides, polyphase components): AlexNet's conv1 (48), the wide 5x9 seed (192, in passes of 3 images),
    5x5 layers, where the phase channels and the multiplies saved pay; kernels that pad their taps too
    far (7x7 at stride 2, 3x3 at stride 2) and too few channels do not; forced, any stride and size run."""
    from cupyconv.arguments import make_problem
    from cupyconv.families.winograd_conv2d import winograd_blocks, winograd_channels, winograd_gemm_problem
    from cupyconv.planner import SIMT_KERNEL, WINOGRAD_KERNEL, make_plan

    def problem(c, k, hw, kh, kw, stride, padding=0, n=32):
        return make_problem((n, c, hw, hw), (k, c, kh, kw), None, "float32", stride, padding)

    alexnet = problem(3, 96, 224, 11, 11, 4, 2, n=256)
    plan = make_plan(alexnet)
    assert plan.kernel == WINOGRAD_KERNEL and plan.winograd_tile == 4 and winograd_channels(alexnet) == 48
    assert (plan.tiles_w, plan.tiles) == (14, 14 * 14)                       # 55 x 55 outputs in 4 x 4 tiles
    assert winograd_gemm_problem(alexnet, 4).c == 36 * 48 and winograd_gemm_problem(alexnet, 4).w == 256 * 196
    assert make_plan(problem(3, 64, 224, 11, 11, 4, 2)).kernel == SIMT_KERNEL  # 64 outputs: too few to pay
    assert make_plan(problem(64, 128, 56, 5, 5, 2, 2)).kernel == WINOGRAD_KERNEL
    assert make_plan(problem(64, 128, 56, 5, 9, (2, 3))).kernel == WINOGRAD_KERNEL  # strides may differ
    assert make_plan(problem(256, 256, 28, 5, 5, 2, 2)).winograd_tile == 2   # 1024 phase channels
    assert make_plan(problem(3, 64, 224, 7, 7, 2, 3)).kernel == SIMT_KERNEL  # 7x7 at stride 2: 4 strides
    assert make_plan(problem(128, 128, 56, 3, 3, 2, 1)).kernel == SIMT_KERNEL  # 3x3 at stride 2: 2 strides
    assert make_plan(problem(8, 8, 56, 5, 5, 2, 2)).kernel == SIMT_KERNEL    # too few channels
    assert make_plan(problem(8, 8, 56, 5, 5, 2, 2), kernel=WINOGRAD_KERNEL).kernel == WINOGRAD_KERNEL
    wide = make_problem((8, 32, 512, 512), (64, 32, 5, 9), None, "float32", 1, 0)
    plan = make_plan(wide)
    assert plan.kernel == WINOGRAD_KERNEL and winograd_blocks(wide) == (2, 3) and winograd_channels(wide) == 192
    assert "192 phase channels (32 channels x 2x3 blocks of 3 strides)" in plan.reason
    assert plan.winograd_images == 3 and "3 passes of 3 image(s)" in plan.reason  # 590 MB of temporaries an image
    assert winograd_gemm_problem(wide, 4, 2).w == 2 * 127 * 126 and plan.gemm_last.grid[0] < plan.gemm.grid[0]
    assert make_plan(problem(64, 64, 56, 5, 5, 1, 2)).kernel == WINOGRAD_KERNEL   # 2 x 2 blocks: 25 taps of 36
    assert make_plan(problem(64, 64, 56, 7, 7, 1, 3)).kernel == SIMT_KERNEL       # 3 x 3 blocks: 49 of 81
    assert make_plan(problem(8, 8, 56, 7, 7, 2, 3), kernel=WINOGRAD_KERNEL).kernel == WINOGRAD_KERNEL


def test_plans_are_cached_and_errors_are_not():
    """The same arguments give the same (immutable) plan object; a bad config raises every time."""
    from cupyconv.arguments import make_problem
    from cupyconv.planner import make_plan

    problem = make_problem((2, 16, 9, 9), (32, 16, 3, 3), None, "float16", 1, 1, 1, 1)
    assert make_plan(problem) is make_plan(problem)
    assert make_plan(problem, allow_tf32=True) == make_plan(problem)
    for _ in range(2):
        with pytest.raises(ValueError, match="must be one of"):
            make_plan(problem, config="no_such_tile")


def test_import_needs_neither_torch_nor_a_gpu():
    import subprocess
    import sys

    code = ("import sys, cupyconv; assert 'torch' not in sys.modules, 'cupyconv imported torch'; "
            "assert 'cupy' not in sys.modules, 'cupyconv imported cupy at import time'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_dtype_names_are_accepted_without_ml_dtypes():
    # bfloat16 is a NumPy dtype only once ml_dtypes is imported; the adapter passes the name.
    assert make_problem((1, 2, 5, 5), (3, 2, 3, 3), None, "bfloat16").dtype == "bfloat16"
    with pytest.raises(TypeError):
        make_problem((1, 2, 5, 5), (3, 2, 3, 3), None, "int8")
