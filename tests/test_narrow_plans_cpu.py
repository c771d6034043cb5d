"""The planner's choice for layers of few output channels, without a GPU: on the tensor cores the
channels-last GEMM's 32-channel tile (not the direct kernel, which an H100 ran 5-10x slower on them),
in strict float32 and float64 the direct kernel (strict float32 on a few pixels: the FMA GEMM's split-K); 32 or fewer output channels on mma.sync tiles take
the 32-channel tile (an RGB stem's, the NCHW-gather GEMM's, planner.NHWC_GATHER_MAX_CHANNELS), as do
layers of one such tile of few pixels on the H100 (benchmarks/NOTES.md, "Few output channels" and "Runs
along rows")."""
import pytest

from cupyconv.arguments import make_problem
from cupyconv.families.implicit_gemm_nhwc import NARROW_TILE_CHANNELS
from cupyconv.planner import (DIRECT_KERNEL, FEW_CHANNEL_KERNEL, GEMM_KERNEL, NHWC_KERNEL, POINTWISE_KERNEL,
                              SIMT_FEW_CHANNELS_MAX_PIXELS, SIMT_KERNEL, make_plan)

#: (x, weight KCHW, stride, padding, layout): EfficientNet-B0's squeeze-excitation reduction on 2 x 2 planes (64
#: pixels; on one-pixel planes one_pixel_conv2d takes it), its stem (3 input channels, 32 output), a 3-channel
#: head on a large plane, and the same in NCHW.
LAYERS = {
    "se_96to4": ((16, 2, 2, 96), (4, 96, 1, 1), 1, 0, "NHWC"),
    "stem_3to32": ((32, 224, 224, 3), (32, 3, 3, 3), 2, 1, "NHWC"),
    "head_64to3": ((8, 256, 256, 64), (3, 64, 3, 3), 1, 1, "NHWC"),
    "head_64to3_nchw": ((8, 64, 256, 256), (3, 64, 3, 3), 1, 1, "NCHW"),
}


@pytest.mark.parametrize("cc", [0, 90])
@pytest.mark.parametrize("dtype,tf32", [("float16", False), ("bfloat16", False), ("float32", True),
                                        ("float32", False), ("float64", False)])
@pytest.mark.parametrize("layer", LAYERS)
def test_few_output_channels_take_the_32_channel_tile_on_the_tensor_cores(layer, dtype, tf32, cc):
    x, w, stride, padding, layout = LAYERS[layer]
    plan = make_plan(make_problem(x, w, None, dtype, stride, padding, layout=layout), allow_tf32=tf32,
                     compute_capability=cc)
    if dtype == "float64" or (dtype == "float32" and not tf32):
        assert plan.kernel != NHWC_KERNEL
        if w[0] < 8:  # strict float32 on few pixels (SIMT_FEW_CHANNELS_MAX_PIXELS): the FMA GEMM's split-K
            pixels = x[0] * (x[1] * x[2] if layout == "NHWC" else x[2] * x[3]) // stride ** 2
            few = dtype == "float32" and pixels <= SIMT_FEW_CHANNELS_MAX_PIXELS
            assert plan.kernel == (SIMT_KERNEL if few else DIRECT_KERNEL), str(plan)
    elif plan.kernel == POINTWISE_KERNEL:  # 1x1 NHWC float32 on the tensor cores: the streaming kernel's
        assert layer == "se_96to4" and dtype == "float32"
    elif layer == "stem_3to32" and dtype != "float32":  # NHWC, 3 channels, 16-bit: the few-channel kernel
        assert plan.kernel == FEW_CHANNEL_KERNEL, str(plan)
    elif layer == "stem_3to32":  # TF32: the NCHW gather's NHWC instance, no padding copy
        assert plan.kernel == GEMM_KERNEL and plan.config.bn == NARROW_TILE_CHANNELS, str(plan)
    else:
        assert plan.kernel == NHWC_KERNEL and plan.config.bn == NARROW_TILE_CHANNELS, str(plan)
        assert not plan.config.wgmma and "one 32-channel tile" in plan.reason


@pytest.mark.parametrize("dtype,tf32", [("float16", False), ("bfloat16", False), ("float32", True)])
@pytest.mark.parametrize("channels,reduced", [(240, 10), (480, 20), (672, 28), (1152, 48)])
def test_one_tile_of_few_pixels_keeps_mma_sync_on_the_h100(channels, reduced, dtype, tf32):
    """EfficientNet-B0's squeeze-excitation reductions on 64 pixels (2 x 2 planes: one_pixel_conv2d takes one-pixel
    ones): mma.sync's 32- or 64-channel tile, not wgmma's 256 x 64 (WGMMA_MIN_NARROW_PIXELS); the same layer on
    more pixels takes wgmma."""
    few = make_plan(make_problem((16, 2, 2, channels), (reduced, channels, 1, 1), None, dtype, layout="NHWC"),
                    allow_tf32=tf32, compute_capability=90)
    assert few.kernel == NHWC_KERNEL and not few.config.wgmma, str(few)
    assert few.config.bn == (NARROW_TILE_CHANNELS if reduced <= NARROW_TILE_CHANNELS else 64), str(few)
    many = make_plan(make_problem((32, 14, 14, channels), (reduced, channels, 3, 3), None, dtype, padding=1,
                                  layout="NHWC"), allow_tf32=tf32, compute_capability=90)
    assert many.kernel == NHWC_KERNEL and many.config.wgmma, str(many)


@pytest.mark.parametrize("dtype,tf32", [("float16", False), ("bfloat16", False), ("float32", True)])
@pytest.mark.parametrize("reduced,channels", [(6, 144), (10, 240), (20, 480), (28, 672)])
def test_expansions_of_one_pixel_tile_take_the_nchw_gather_in_place(reduced, channels, dtype, tf32):
    """EfficientNet-B0's squeeze-excitation expansions on 64 pixels (2 x 2 planes: one_pixel_conv2d takes one-pixel
    ones; a reduction of one k tile): the NCHW-gather GEMM's NHWC instance on its 32-channel tile, a block per 32
    channels (planner.NHWC_GATHER_MAX_PIXELS); on 14 x 14 planes they keep the channels-last kernels."""
    few = make_plan(make_problem((16, 2, 2, reduced), (channels, reduced, 1, 1), None, dtype, layout="NHWC"),
                    allow_tf32=tf32, compute_capability=90)
    assert few.kernel == GEMM_KERNEL and few.config.bn == 32 and few.grid == (1, -(-channels // 32), 1), str(few)
    assert few.name_expression.endswith(",true>")
    many = make_plan(make_problem((32, 14, 14, reduced), (channels, reduced, 1, 1), None, dtype, layout="NHWC"),
                     allow_tf32=tf32, compute_capability=90)
    assert many.kernel in (NHWC_KERNEL, POINTWISE_KERNEL), str(many)
