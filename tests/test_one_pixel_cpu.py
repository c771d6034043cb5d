"""Where the planner takes the one-pixel-plane kernel (one_pixel_conv2d), without a GPU: 1x1 layers on
one-pixel planes of at most MAX_IMAGES images (float32 widening ones MAX_FLOAT32_WIDENING_IMAGES), in every
dtype and mode, layout and GPU; not past those batches, nor on padded, grouped or larger planes and kernels.
Its plan: one launch on the caller's operands, loads of 16-byte pieces where the channels allow, a warp's
images, the grid; and its errors."""
import pytest

from cupyconv import planner
from cupyconv.arguments import ACTIVATIONS, make_problem
from cupyconv.families import one_pixel_conv2d
from cupyconv.families.one_pixel_conv2d import MAX_FLOAT32_WIDENING_IMAGES, MAX_IMAGES, MIN_WARPS
from cupyconv.planner import ONE_PIXEL_KERNEL, make_plan

MODES = [("float16", False), ("bfloat16", False), ("float32", False), ("float32", True), ("float64", False)]


def se_layer(n, c, k, dtype, layout="NCHW", **options):
    x = (n, c, 1, 1) if layout == "NCHW" else (n, 1, 1, c)
    return make_problem(x, (k, c, 1, 1), (k,), dtype, layout=layout, **options)


@pytest.mark.parametrize("cc", [0, 90])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype,tf32", MODES)
@pytest.mark.parametrize("n,c,k", [(1, 1152, 48), (8, 48, 1152), (MAX_IMAGES, 96, 4),
                                   (MAX_FLOAT32_WIDENING_IMAGES, 24, 144), (3, 30, 7)])
def test_squeeze_excitation_layers_take_it(n, c, k, dtype, tf32, layout, cc):
    out = (n, k, 1, 1) if layout == "NCHW" else (n, 1, 1, k)
    problem = se_layer(n, c, k, dtype, layout, activation="silu", residual_shape=out)
    plan = make_plan(planner.as_planned(problem, tf32, cc), allow_tf32=tf32, compute_capability=cc)
    assert plan.kernel == ONE_PIXEL_KERNEL, str(plan)
    assert plan.grid == (-(-k // one_pixel_conv2d.WARPS), -(-n // plan.config.images), 1)
    call = planner.program(plan, problem)
    assert len(call.launches) == 1 and call.workspace_bytes == 0 and call.weight is None
    assert call.launches[0].epilogue == (ACTIVATIONS.index("silu"), 1)


@pytest.mark.parametrize("dtype,tf32", MODES)
def test_other_layers_do_not(dtype, tf32):
    others = [se_layer(MAX_IMAGES + 1, 96, 24, dtype),                                     # past MAX_IMAGES
              se_layer(MAX_IMAGES + 1, 24, 96, dtype),
              make_problem((1, 96, 1, 1), (24, 96, 1, 1), None, dtype, padding=1),         # padded: a 3x3 output
              make_problem((1, 96, 1, 1), (24, 48, 1, 1), None, dtype, groups=2),          # grouped
              make_problem((1, 96, 2, 1), (24, 96, 1, 1), None, dtype),                    # a two-pixel plane
              make_problem((1, 96, 3, 3), (24, 96, 3, 3), None, dtype)]                    # a 3x3 kernel to one pixel
    for problem in others:
        assert make_plan(problem, allow_tf32=tf32, compute_capability=90).kernel != ONE_PIXEL_KERNEL
    assert "padding" in one_pixel_conv2d.refusal(others[2])
    assert "one group, not 2" in one_pixel_conv2d.refusal(others[3])
    assert "2x1 input" in one_pixel_conv2d.refusal(others[4])
    with pytest.raises(ValueError, match="cannot run this problem.*3x3 kernel"):
        make_plan(others[5], kernel=ONE_PIXEL_KERNEL)
    widening = se_layer(MAX_FLOAT32_WIDENING_IMAGES + 1, 24, 96, dtype)  # the FMA GEMM's 4 x 4 tile is faster
    assert (make_plan(widening, allow_tf32=tf32).kernel == ONE_PIXEL_KERNEL) == (dtype != "float32")


@pytest.mark.parametrize("dtype,whole,single", [("float16", 8, 12), ("bfloat16", 40, 4), ("float32", 4, 6),
                                                ("float64", 2, 3)])
def test_loads_are_16_byte_pieces_where_the_channels_allow(dtype, whole, single):
    item = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}[dtype]
    plan = make_plan(se_layer(2, whole, 8, dtype))
    assert plan.vec == 16 and plan.name_expression.endswith(f",1,{16 // item}>") and "16-byte pieces" in str(plan)
    plan = make_plan(se_layer(2, single, 8, dtype))
    assert plan.vec == item and plan.name_expression.endswith(",1,1>") and "single elements" in str(plan)
    assert {plan.name_expression for plan in (make_plan(se_layer(2, whole, 8, dtype)), plan)} <= \
        set(one_pixel_conv2d.specialisations())


@pytest.mark.parametrize("n,k,images", [(1, 1152, 1), (2, 1152, 2), (3, 1152, 4), (5, 1152, 8), (32, 1152, 8),
                                         (32, 48, 1), (64, 48, 2), (128, 48, 4), (128, 4, 1)])
def test_a_warp_takes_the_most_images_that_leave_enough_warps(n, k, images):
    """Up to the batch's next power of two, while K x ceil(N / images) makes MIN_WARPS warps; else one."""
    plan = make_plan(se_layer(n, 64, k, "float16"))
    assert plan.config.images == images and plan.grid[1] == -(-n // images)
    assert k * plan.grid[1] >= MIN_WARPS or images == 1


def test_forced_configs():
    plan = make_plan(se_layer(64, 64, 16, "float16"), config="one_pixel_n2")
    assert plan.kernel == ONE_PIXEL_KERNEL and plan.config.images == 2 and plan.grid == (4, 32, 1)
    with pytest.raises(ValueError, match="config for one_pixel_conv2d must be one of"):
        make_plan(se_layer(2, 64, 16, "float16"), config="one_pixel_n3", kernel=ONE_PIXEL_KERNEL)
