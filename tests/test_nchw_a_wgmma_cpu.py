"""1x1 NCHW layers read in place on wgmma's 3-stage pixel-row tile (families/implicit_gemm_nhwc.py
NCHW_A_WGMMA; kernels/implicit_gemm_nhwc.cu NCHW_A with WGMMA_PIXEL_ROWS), planned without a GPU: which
layers the rule gives it, that every plan it makes has a compiled instance, and the refusals. The switch
is off by default (the tile has not run on a GPU yet): then nothing changes."""
import pytest

from cupyconv.arguments import make_problem
from cupyconv.families import implicit_gemm_nhwc
from cupyconv.families.implicit_gemm_nhwc import (NCHW_A_WGMMA_MIN_CHANNELS, NCHW_A_WGMMA_VARIABLE, NHWC_CONFIGS,
                                                  PIXEL_ROWS_CONFIG, WGMMA_ARCH)
from cupyconv.planner import NHWC_KERNEL, make_plan, program

#: (x NCHW, output channels): ResNet-50's deep 1x1 layers at batch 32 and 1, and the Conformer's pointwise
#: conv1d (512 -> 1024 on 1 x 400) as the conv2d it runs as.
DEEP_1X1 = {
    "r50_l3_1x1_1024to256_b32": ((32, 1024, 14, 14), 256),
    "r50_l4_1x1_2048to512_b32": ((32, 2048, 7, 7), 512),
    "r50_l3_1x1_256to1024_b32": ((32, 256, 14, 14), 1024),
    "r50_l4_1x1_2048to512_b1": ((1, 2048, 7, 7), 512),
    "conformer_pw_512to1024": ((8, 512, 1, 400), 1024),
}
TENSOR_CORES = [("float16", False), ("bfloat16", False), ("float32", True)]


def plan_for(x, k, dtype, tf32, cc=90, **options):
    return make_plan(make_problem(x, (k, x[1], 1, 1), None, dtype), allow_tf32=tf32, compute_capability=cc, **options)


def _reads_in_place(x, dtype) -> bool:
    item = 4 if dtype == "float32" else 2
    return x[2] * x[3] * item % 4 == 0


@pytest.mark.parametrize("dtype,tf32", TENSOR_CORES)
@pytest.mark.parametrize("layer", DEEP_1X1)
def test_off_by_default_nothing_changes(layer, dtype, tf32):
    """Without the switch the deep 1x1 layers keep mma.sync's NCHW_A tiles, and forcing the wgmma tile
    names the switch."""
    assert not implicit_gemm_nhwc.NCHW_A_WGMMA
    x, k = DEEP_1X1[layer]
    plan = plan_for(x, k, dtype, tf32)
    if plan.a_from_nchw:
        assert not plan.config.wgmma and plan.arch == "", str(plan)
        with pytest.raises(ValueError, match=NCHW_A_WGMMA_VARIABLE):
            plan_for(x, k, dtype, tf32, config=PIXEL_ROWS_CONFIG)


@pytest.mark.parametrize("dtype,tf32", TENSOR_CORES)
@pytest.mark.parametrize("layer", DEEP_1X1)
def test_deep_1x1_layers_take_the_pixel_row_tile(layer, dtype, tf32, nchw_a_wgmma):
    """On compute capability 9.0 each deep 1x1 layer read in place takes the 3-stage pixel-row tile, with
    no copies and no prepared weight, split-K where its tiles are few, never stream-K; its instance is
    one that compiles for sm_90a. Layers whose planes cannot be read in place keep their copies."""
    x, k = DEEP_1X1[layer]
    plan = plan_for(x, k, dtype, tf32)
    assert plan.kernel == NHWC_KERNEL
    if not _reads_in_place(x, dtype):
        assert not plan.a_from_nchw
        return
    assert plan.a_from_nchw and plan.config.name == PIXEL_ROWS_CONFIG and plan.arch == WGMMA_ARCH, str(plan)
    assert plan.stream_k_blocks == 0 and "fragments loaded into registers" in plan.reason
    cfg, item = plan.config, 4 if dtype == "float32" else 2
    assert plan.shared_bytes == cfg.stages * (cfg.bk * (cfg.bm + 8) * item + cfg.bn * 128) + 1024 == 102400
    assert plan.name_expression in implicit_gemm_nhwc.arch_specialisations()[WGMMA_ARCH]
    problem = make_problem(x, (k, x[1], 1, 1), None, dtype)
    call = program(plan, problem)
    assert call.weight is None and len(call.launches) == (2 if plan.splits > 1 else 1)
    if x[0] == 1:  # 4 tiles of 128 x 128 over a reduction of 64 k tiles
        assert plan.splits > 1


@pytest.mark.parametrize("dtype,tf32", TENSOR_CORES)
def test_shallow_or_narrow_1x1_layers_keep_mma_sync(dtype, tf32, nchw_a_wgmma):
    """Fewer than NCHW_A_WGMMA_MIN_CHANNELS output channels, one k row of 128 bytes, or a GPU other than
    compute capability 9.0: mma.sync's NCHW_A tiles, as before."""
    narrow = plan_for((32, 1024, 14, 14), NCHW_A_WGMMA_MIN_CHANNELS - 32, dtype, tf32)
    shallow = plan_for((32, 32, 56, 56), 256, dtype, tf32)  # 32 channels: one k row of 128 bytes at most
    other_gpu = plan_for((32, 1024, 14, 14), 256, dtype, tf32, cc=80)
    for plan in (narrow, shallow, other_gpu):
        assert plan.a_from_nchw and not plan.config.wgmma, str(plan)


@pytest.mark.parametrize("dtype,tf32", TENSOR_CORES)
def test_other_wgmma_tiles_and_stream_k_refuse(dtype, tf32, nchw_a_wgmma):
    """The other wgmma tiles (channel rows, 5 stages, producers) and stream-K refuse a 1x1 NCHW input read
    in place with a ValueError that names the tile that runs it."""
    x, k = DEEP_1X1["r50_l3_1x1_1024to256_b32"]
    storage = "float32" if dtype == "float32" else "float16"
    for cfg in NHWC_CONFIGS[storage]:
        if cfg.wgmma and cfg.name != PIXEL_ROWS_CONFIG:
            with pytest.raises(ValueError, match=PIXEL_ROWS_CONFIG):
                plan_for(x, k, dtype, tf32, config=cfg.name)
    with pytest.raises(ValueError, match="stream_k needs"):
        implicit_gemm_nhwc.make_plan(make_problem(x, (k, x[1], 1, 1), None, dtype), PIXEL_ROWS_CONFIG, "", 90,
                                     stream_k=True)


def test_every_piece_width_has_an_instance(nchw_a_wgmma):
    """Planes of 16-, 8- and 4-byte pieces, a partial channel tile, split-K or not: each plan's instance exists."""
    shapes = [((2, 256, 14, 14), 256), ((2, 256, 5, 6), 256), ((3, 128, 7, 7), 130), ((1, 512, 7, 7), 256)]
    for dtype, tf32 in TENSOR_CORES:
        for x, k in shapes:
            if not _reads_in_place(x, dtype):
                continue
            for splits in (1, 2):
                plan = plan_for(x, k, dtype, tf32, config=PIXEL_ROWS_CONFIG, kernel=NHWC_KERNEL, splits=splits)
                assert plan.a_from_nchw and plan.splits == splits
                assert plan.name_expression in implicit_gemm_nhwc.arch_specialisations()[WGMMA_ARCH], plan.name_expression
