"""1x1 NCHW layers read in place on wgmma's 3-stage pixel-row tile (families/implicit_gemm_nhwc.py
NCHW_A_WGMMA_MIN_CHANNELS / _MIN_K_TILES / _MIN_BLOCKS; kernels/implicit_gemm_nhwc.cu NCHW_A with
WGMMA_PIXEL_ROWS), planned without a GPU: which layers the rule gives it (deep, wide and with pixels
enough, by dtype), that every plan it can make has a compiled instance, and the refusals."""
import math

import pytest

from cupyconv.arguments import make_problem
from cupyconv.families import implicit_gemm_nhwc
from cupyconv.families.implicit_gemm_nhwc import (NCHW_A_WGMMA_MIN_BLOCKS, NCHW_A_WGMMA_MIN_CHANNELS,
                                                  NCHW_A_WGMMA_MIN_K_TILES, NCHW_A_WGMMA_WHOLE_K_ROWS, NHWC_CONFIGS,
                                                  PIXEL_ROWS_CONFIG, WGMMA_ARCH)
from cupyconv.planner import NHWC_KERNEL, make_plan, program

#: (x NCHW, output channels): ResNet-50's deep 1x1 layers at batch 32, 8 and 1, and the Conformer's
#: pointwise conv1d (512 -> 1024 on 1 x 400) as the conv2d it runs as.
DEEP_1X1 = {
    "r50_l3_1x1_1024to256_b32": ((32, 1024, 14, 14), 256),
    "r50_l4_1x1_2048to512_b32": ((32, 2048, 7, 7), 512),
    "r50_l3_1x1_256to1024_b32": ((32, 256, 14, 14), 1024),
    "r50_l2_1x1_512to128_b8": ((8, 512, 28, 28), 128),
    "r50_l3_1x1_1024to256_b8": ((8, 1024, 14, 14), 256),
    "r50_l4_1x1_2048to512_b1": ((1, 2048, 7, 7), 512),
    "r50_l1_1x1_64to256_b32": ((32, 64, 56, 56), 256),
    "effnet_1x1_112to672_b32": ((32, 112, 14, 14), 672),
    "mbv2_1x1_160to960_b32": ((32, 160, 7, 7), 960),
    "conformer_pw_512to1024": ((8, 512, 1, 400), 1024),
}
SIXTEEN_BITS = ["float16", "bfloat16"]
TENSOR_CORES = [(dtype, False) for dtype in SIXTEEN_BITS] + [("float32", True)]


def plan_for(x, k, dtype, tf32, cc=90, **options):
    return make_plan(make_problem(x, (k, x[1], 1, 1), None, dtype), allow_tf32=tf32, compute_capability=cc, **options)


def _item(dtype) -> int:
    return 4 if dtype == "float32" else 2


def _reads_in_place(x, dtype) -> bool:
    return x[2] * x[3] * _item(dtype) % 4 == 0


@pytest.mark.parametrize("dtype,tf32", TENSOR_CORES)
@pytest.mark.parametrize("layer", DEEP_1X1)
def test_deep_1x1_layers_take_the_pixel_row_tile(layer, dtype, tf32):
    """On compute capability 9.0 each 1x1 layer read in place of NCHW_A_WGMMA_MIN_CHANNELS output channels
    per group and NCHW_A_WGMMA_MIN_K_TILES k rows of 128 bytes (both by dtype: TF32 asks more, and whole
    rows) that makes
    NCHW_A_WGMMA_MIN_BLOCKS blocks or more on it (tiles of 128 x 128 times split-K's runs) takes the 3-stage
    pixel-row tile, with no copies and no prepared weight, never stream-K; its instance is one that
    compiles for sm_90a. Layers whose planes cannot be read in place keep their copies; the others keep
    mma.sync."""
    x, k = DEEP_1X1[layer]
    plan = plan_for(x, k, dtype, tf32)
    assert plan.kernel == NHWC_KERNEL
    if not _reads_in_place(x, dtype):
        assert not plan.a_from_nchw
        return
    assert plan.a_from_nchw, str(plan)
    forced = plan_for(x, k, dtype, tf32, config=PIXEL_ROWS_CONFIG)
    item = _item(dtype)
    if math.ceil(x[0] * x[2] * x[3] / 128) * math.ceil(k / 128) * forced.splits < NCHW_A_WGMMA_MIN_BLOCKS[item] or \
            k < NCHW_A_WGMMA_MIN_CHANNELS[item] or -(-x[1] * item // 128) < NCHW_A_WGMMA_MIN_K_TILES[item] or \
            (NCHW_A_WGMMA_WHOLE_K_ROWS[item] and x[1] * item % 128):
        assert not plan.config.wgmma and plan.arch == "", str(plan)
        return
    assert plan.config.name == PIXEL_ROWS_CONFIG and plan.arch == WGMMA_ARCH, str(plan)
    assert plan.stream_k_blocks == 0 and "fragments loaded into registers" in plan.reason
    cfg = plan.config
    assert plan.shared_bytes == cfg.stages * (cfg.bk * (cfg.bm + 8) * item + cfg.bn * 128) + 1024 == 102400
    assert plan.name_expression in implicit_gemm_nhwc.arch_specialisations()[WGMMA_ARCH]
    problem = make_problem(x, (k, x[1], 1, 1), None, dtype)
    call = program(plan, problem)
    assert call.weight is None and len(call.launches) == (2 if plan.splits > 1 else 1)


@pytest.mark.parametrize("dtype,tf32", TENSOR_CORES)
def test_shallow_narrow_or_small_1x1_layers_keep_mma_sync(dtype, tf32):
    """Fewer than NCHW_A_WGMMA_MIN_CHANNELS output channels, NCHW_A_WGMMA_MIN_K_TILES k rows of 128 bytes or
    NCHW_A_WGMMA_MIN_BLOCKS blocks (the dtype's: ResNet-50's 1024 -> 512 at batch 1 makes 64 in TF32, split-K's
    runs counted), or a GPU other than compute capability 9.0: mma.sync's NCHW_A tiles."""
    item = _item(dtype)
    short = 128 * (NCHW_A_WGMMA_MIN_K_TILES[item] - 1) // item  # input channels a k row of 128 bytes short
    plans = [plan_for((32, 1024, 14, 14), NCHW_A_WGMMA_MIN_CHANNELS[item] - 32, dtype, tf32),
             plan_for((32, short, 28, 28), 256, dtype, tf32),
             plan_for((2, 512, 28, 28), 128, dtype, tf32),  # 13 tiles, no split
             plan_for((1, 1024, 14, 14), 512, dtype, tf32),
             plan_for((32, 1024, 14, 14), 256, dtype, tf32, cc=80)]
    for plan in plans:
        assert plan.a_from_nchw and not plan.config.wgmma, str(plan)


@pytest.mark.parametrize("dtype,tf32", TENSOR_CORES)
def test_other_wgmma_tiles_and_stream_k_refuse(dtype, tf32):
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


def test_every_piece_width_has_an_instance():
    """Forced, in every dtype (TF32 included): planes of 16-, 8- and 4-byte pieces, a partial channel tile,
    split-K or not; each plan's instance exists."""
    shapes = [((2, 256, 14, 14), 256), ((2, 256, 5, 6), 256), ((3, 128, 7, 7), 130), ((1, 512, 7, 7), 256)]
    for dtype, tf32 in TENSOR_CORES:
        for x, k in shapes:
            if not _reads_in_place(x, dtype):
                continue
            for splits in (1, 2):
                plan = plan_for(x, k, dtype, tf32, config=PIXEL_ROWS_CONFIG, kernel=NHWC_KERNEL, splits=splits)
                assert plan.a_from_nchw and plan.splits == splits
                assert plan.name_expression in implicit_gemm_nhwc.arch_specialisations()[WGMMA_ARCH], plan.name_expression
