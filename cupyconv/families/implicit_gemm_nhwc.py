"""The channels-last implicit GEMM on tensor cores (kernels/implicit_gemm_nhwc.cu; mma.sync, and wgmma
on the H100) and the copies it reads (kernels/nchw_to_nhwc.cu): the input as [N][H][W][Cp] in the
workspace, the weight as [K][kh][kw][Cgp] prepared once; 1x1 stride-1 unpadded problems, and 1-D ones
whose taps shift whole pieces of pixels, read both in place. The default tensor-core family.

It computes the NHWC layout natively: an NHWC input is read in place (copied only to add zero
channels or, in float32 with more than one tap on a wgmma tile but the producer's, to round to TF32;
the kernel rounds the others, in registers or shared memory), the output is written NHWC, and a KHWC
weight is the form it reads (in place where it needs no zero channels and, in float32, no rounding).
Strided layers whose few channels make no 16-byte pieces (RGB stems) run as stride-1 layers on
space-to-depth copies of x and the weight (kernels/space_to_depth.cu; space_to_depth_block), in either
layout."""
from __future__ import annotations

import dataclasses
import math

from ..arguments import ConvProblem
from ..planner import LaunchPlan
from ..program import (BIAS, FLAG_COUNT, FLAGS, OUT, PREPARED, WEIGHT, WORKSPACE, X, CallProgram, Im2colMap, Launch,
                       PixelStripMap, Pointer, Table, TensorMap, WeightPreparation, align)
from .common import (BLOCK_RESERVED_SHARED_BYTES, CTYPES, H100_SMS, INDEX_TYPES, MAX_GRID_Y, REDUCE_KERNEL, SPLIT_K_MAX,
                     SM_SHARED_BYTES, STORAGE_BYTES, check_splits, conv_launch, epilogue_args, forced_config,
                     gemm_grid, grid_refusal, index_type, partial_bytes, reduce_specialisation, split_k_reduce,
                     split_k_runs)
from . import pointwise_nhwc
from .implicit_gemm_conv2d import GEMM_DTYPES, GEMM_MIN_GROUP_CHANNELS, GemmConfig, describe_tiles, dtype_refusal

KERNEL = "implicit_gemm_nhwc"
#: The layouts it reads and writes in place (layouts.py transposes for the families without these).
LAYOUTS = ("NCHW", "NHWC")
WEIGHT_LAYOUTS = ("KCHW", "KHWC")
CHANNELS_LAST_TILED = "nchw_to_nhwc_tiled"
CHANNELS_LAST_NARROW = "nchw_to_nhwc_narrow"
CHANNELS_LAST_PAIRS = "nchw_to_nhwc_pairs"
PAD_CHANNELS = "pad_channels"
#: Up to this many channels the copy runs one thread per position (nchw_to_nhwc_narrow).
NARROW_CHANNELS = 8
#: Zero channels may add at most a third to the reduction (AlexNet's 3 -> 4); more, and a smaller
#: piece (or the NCHW gather) does less work.
MAX_PADDING_RATIO = 4 / 3
SPACE_TO_DEPTH = "space_to_depth"
#: Strided layers whose input channels make no 16-byte pieces (RGB stems) run as stride-1 layers on a
#: space-to-depth copy (kernels/space_to_depth.cu) where a block of stride pixels makes at most this
#: many channels: ResNet-50's 7x7 stride-2 stem becomes a 4x4 layer of 12 -> 16 channels, AlexNet's 11x11
#: stride 4 a 3x3 layer of 48, a patchify layer (kernel = stride) a 1x1 one.
SPACE_TO_DEPTH_MAX_CHANNELS = 64

#: Tiles per dtype: 128 pixels by 64, 96 or 128 output channels, and 64 by 64, each with k rows of 64 bytes
#: (four stages) and of 128 bytes (three; half the barriers per multiply-add). Chosen by _choose_config
#: from timings of these and of other tiles on the H100 (benchmarks/NOTES_igemm.md); the 64-pixel ones for
#: small grids of NCHW 1x1 layers (SMALL_POINTWISE_MAX_TILES). The 32-channel
#: tile (four warps) is the stride-phase launch's for outputs of at most 32 channels (phases_plan), and
#: the tuner's to try on such outputs; the fixed rules of one convolution do not choose it.
NHWC_CONFIGS = {
    dtype: tuple(GemmConfig(f"nhwc_m{bm}n{bn}k{bk}", bm, bn, bk, warps_m, warps_n, stages)
                 for bm, bn, warps_m, warps_n in ((128, 64, 2, 2), (128, 96, 4, 2), (128, 128, 2, 4), (128, 32, 4, 1),
                                                  (64, 64, 2, 2))
                 for bk, stages in ((short_k, 4), (2 * short_k, 3)))
    for dtype, short_k in (("float32", 16), ("float16", 32))
}
#: The 128-channel tile pays off (it gathers the input half as often) only with this many blocks.
WIDE_TILE_BLOCKS = 1024
#: NCHW 1x1 layers read in place whose 64 x 64 mma.sync tiles make at most this many (a third of the SMs,
#: before split-K; timed up to 39, larger grids keep the 128-pixel tiles untimed) take them rather than
#: the 128-pixel ones: half the rows of padding on 7^2 planes and twice the tiles to share the reduction. H200,
#: batch 1, TF32: MobileNetV2's and EfficientNet-B0's 1x1 layers on 7^2-28^2 8-20 % faster (160 -> 960 on 7^2
#: 9.9 -> 8.0 us, 192 -> 64 on 14^2 9.7 -> 8.2, 960 -> 160 on 7^2 12.0 -> 10.5); fp16 where no wgmma tile takes them 5-16 % (192 -> 64 7.9 -> 6.7, 576 -> 96 9.9 -> 8.9),
#: one 2 % slower (672 -> 112 9.9 -> 10.1; benchmarks/NOTES.md).
SMALL_POINTWISE_MAX_TILES = H100_SMS // 3
#: Hopper (sm_90a) wgmma tiles, k rows of 128 bytes, 128-byte swizzled: two warpgroups of 64
#: pixels x 128 channels (3 stages), or warpgroups of 64 channels x 128 pixels, two (256 pixels) or
#: one (128), with 4 stages. The tuner's alone (no fixed rule takes them): the 128 x 128 tile with 5
#: stages (one block per SM; H100: TF32 layers of long reductions 1.07-1.31x, fp16 ones 0.90-0.99x;
#: deeper 128 x 64 tiles, 6 and 8 stages, were slower everywhere: benchmarks/NOTES.md) and with a
#: producer warpgroup (below). Chosen by _choose_config from H100 timings of these and of others
#: (64 pixels x 64 or 96 channels; 256 pixels x 64 or 128 channels; 3 stages) in benchmarks/NOTES_igemm.md.
WGMMA_ARCH = "sm_90a"
WGMMA_COMPUTE_CAPABILITY = 90
#: The 128-channel tile is the faster from half a wave of blocks (H100: r50_l3_3x3_256 fp16, 98
#: blocks, 0.037 ms, the 64-channel tiles 0.041-0.043), not with 52 (r50_l4_3x3_512: 0.063 vs 0.046).
WGMMA_WIDE_TILE_BLOCKS = 64
#: The producer tiles' block times in 128-pixel blocks' (H100, fp16 and TF32 channels_last, many waves
#: of each: vgg_conv3_2 ran 12 waves of 128 pixels in 0.246 ms, 8 of 192 in 0.216, 6 of 256 in 0.204).
#: Each runs one block an SM, so _choose_config takes the tile of the fewest waves times this (on
#: ties the narrower): r50_l2_3x3_128, r50_down_3x3s2, vgg_conv5_2 and dilated_3x3_d2 192 pixels
#: (1.1-1.4x over 128), vgg_conv3_2 and the large suite's 3x3 rows 256 (1.2x), r50_l3_3x3_256 (one wave
#: of 98 blocks) 128. benchmarks/NOTES.md, "A producer tile of 256 pixels" and "... of 192 pixels".
PRODUCER_BLOCK_COST = {128: 1.0, 192: 1.32, 256: 1.65}
#: 1x1 layers take the producer tiles from this many k tiles on (H100, channels_last, 192 pixels against
#: the 3-stage 128 x 128 tile: r50_l2_1x1_512to128 fp16, 8 k tiles, 0.0160 -> 0.0131 ms, TF32 16 k
#: tiles 1.07x, r50_l3_1x1_256to1024 TF32 8 k tiles 1.04x; fp16's 4 k tiles 0.98x, mbv2_pw_1x1_96to576
#: TF32's 3 0.80x: a block of few k tiles is its epilogue, which the producer does not overlap).
PRODUCER_MIN_ONE_TAP_K_TILES = 8
#: The taller producer tiles only where a wave of their blocks reads at most this many bytes of x (the
#: rows of pixels' channels that every tap reads again): the H100's 50 MB L2 holds them. large_3x3_512_28sq in TF32
#: (192 pixels: 52 MB a wave; 256: 69 MB; 128: 35 MB) ran 0.76x and 0.71x on them, in fp16 (35 MB on
#: 256 pixels) 1.22x faster.
TALL_PRODUCER_MAX_WAVE_BYTES = 40 << 20
#: A pair's block time over the same tile alone's (H200, channels_last, where a wave's x fits in L2:
#: the pairs of 128-256 pixels ran 1.02-1.08x longer on ResNet-50's, VGG-16's and the large suite's
#: 3x3 layers). A pair's wave reads half the pixels (its two blocks share them), so the taller tiles fit
#: in pairs where alone they would not: large_3x3_512_28sq TF32 0.884 ms on 128 pixels alone, 0.774 on
#: 192 in pairs (benchmarks/NOTES.md, "Producer tiles in pairs").
PAIR_BLOCK_COST = 1.08
#: Below WGMMA_WIDE_TILE_BLOCKS, the producer's tile with split-K where its reduction is at least
#: PRODUCER_SPLIT_MIN_K_TILES long, each run at least PRODUCER_SPLIT_MIN_RUN k tiles, and the runs
#: make PRODUCER_SPLIT_MIN_BLOCKS blocks (three quarters of the H100's SMs). H100, CUDA-graph timings
#: (benchmarks/NOTES.md, "Split-K on the producer warpgroup's tile"): r50_l4_3x3_512 fp16 batch 32
#: 0.0262 -> 0.0240 ms, batch 8 0.0123 -> 0.0115, TF32 batch 8 0.0205 -> 0.0174; short reductions
#: (18 k tiles: r50_l2_3x3_128 at batch 8, 0.0092 -> 0.0137), short runs (vgg_conv5_2 fp16 at batch 1,
#: 16 runs of 5: 0.0095 -> 0.0100; dilated_3x3_d2 TF32 at batch 1, 8 runs of 9: 0.0150 -> 0.0164) and
#: batch 1's 64 blocks of r50_l4 lose to the 64-channel tile.
PRODUCER_SPLIT_MIN_K_TILES = 36
PRODUCER_SPLIT_MIN_RUN = 9
PRODUCER_SPLIT_MIN_BLOCKS = 99
WGMMA_PIXEL_ROWS, WGMMA_CHANNEL_ROWS, WGMMA_PIXEL_ROWS_PRODUCER = 1, 2, 3
#: The pixel-row tiles with a producer warpgroup (kernels/implicit_gemm_nhwc.cu PRODUCER): one thread
#: copies both tiles of each of PRODUCER_STAGES stages by TMA (the input in im2col mode, the weight as
#: a matrix; cupyconv/tensor_map.py) and the warpgroups that multiply (two to four) wait on mbarriers,
#: not at a __syncthreads per k tile. One block per SM (384-640 threads, 97-193 KB); one convolution per
#: launch, whole or split-K's runs (no stream-K or stride phases), of one group whose channels fill
#: whole k tiles. _choose_config takes them instead of the 3-stage 128 x 128 tile (H100, layers suite
#: channels_last: 1.05-1.20x on ResNet-50's and VGG-16's 3x3 layers and the dilated one, in fp16 and
#: TF32 on 128 pixels; the taller tiles 1.1-1.4x more; benchmarks/NOTES.md).
PRODUCER_STAGES = 4
#: Reductions of fewer k rows of 128 bytes than this take the mma.sync tiles with k rows of 64 bytes:
#: with one k tile a block loads, multiplies and stores with nothing to overlap, and a wgmma block
#: (up to 164 KB of shared memory) is alone on its SM, where three mma.sync blocks of two k tiles
#: overlap each other (H100, 1x1 of 64 -> 64 fp16 channels_last on 256^2 planes: 0.187 ms wgmma,
#: 0.139 ms 128 x 64 mma.sync with k rows of 64 bytes; benchmarks/NOTES.md).
MIN_DEEP_K_TILES = 2
#: Layers of at most this many pixels (one mma.sync tile) and at most 64 output channels per group (one
#: wgmma channel tile) keep the mma.sync tiles: wgmma's 256 x 64 tile is mostly padding there (H100,
#: channels_last, EfficientNet-B0's squeeze-excitation reductions at batch 32, 32 pixels: 240 -> 10,
#: 480 -> 20, 672 -> 28 channels 0.0106-0.0126 ms fp16 and 0.0158-0.0254 TF32 on wgmma's tile,
#: 0.0080-0.0100 and 0.0115-0.0130 on mma.sync's 32-channel one; 1152 -> 48 TF32 0.0166 against 0.0130
#: on the 64-channel one, fp16 even; benchmarks/NOTES.md, "Runs along rows").
WGMMA_MIN_NARROW_PIXELS = 129
for _dtype, _item in (("float32", 4), ("float16", 2)):
    NHWC_CONFIGS[_dtype] += (
        GemmConfig("nhwc_wgmma_m128n128", 128, 128, 128 // _item, 8, 1, 3, wgmma=WGMMA_PIXEL_ROWS),
        GemmConfig("nhwc_wgmma_producer_m128n128", 128, 128, 128 // _item, 8, 1, PRODUCER_STAGES,
                   wgmma=WGMMA_PIXEL_ROWS_PRODUCER, producer_warps=4),
        *(GemmConfig(f"nhwc_wgmma_ch_m{bm}n64", bm, 64, 128 // _item, bm // 32, 1, 4, wgmma=WGMMA_CHANNEL_ROWS)
          for bm in (256, 128)),
        GemmConfig("nhwc_wgmma_m128n128s5", 128, 128, 128 // _item, 8, 1, 5, wgmma=WGMMA_PIXEL_ROWS))
#: The producer tile of 256 pixels, four warpgroups multiplying (640 threads, 193 KB): half the tiles,
#: and the weight tile read once for twice the pixels. Its float32 input is a copy rounded to TF32:
#: rounded in registers (ROUND_A) it spills at the 96 registers 640 threads leave (_float32_rounding).
TALL_PRODUCER_CONFIG = "nhwc_wgmma_producer_m256n128"
#: The producer tile of 256 pixels x 64 channels: for layers of at most 64 output channels whose float32
#: NHWC input the channel-row tile would read from a rounded copy; it reads x in place and rounds it in
#: registers (H100, TF32 channels_last: r50_l1_3x3_64 0.0825 -> 0.0597 ms, vgg_conv1_2 1.096 -> 0.729;
#: in 16 bits, read in place by both, the channel-row tile is as fast or faster: large_7x7_64_224sq
#: 0.367 against 0.415; benchmarks/NOTES.md). Up to NARROW_PRODUCER_MAX_K_TILES: on longer reductions
#: the copy is a smaller share (large_7x7_64_224sq TF32, 98 k tiles: 0.776 ms on the copy, 0.824 in place).
NARROW_PRODUCER_CONFIG = "nhwc_wgmma_producer_m256n64"
NARROW_PRODUCER_MAX_K_TILES = 36
for _dtype, _item in (("float32", 4), ("float16", 2)):
    NHWC_CONFIGS[_dtype] += tuple(GemmConfig(f"nhwc_wgmma_producer_m{bm}n128", bm, 128, 128 // _item, bm // 16, 1,
                                             PRODUCER_STAGES, wgmma=WGMMA_PIXEL_ROWS_PRODUCER, producer_warps=4)
                                  for bm in (256, 192)) + \
        (GemmConfig(NARROW_PRODUCER_CONFIG, 256, 64, 128 // _item, 16, 1, PRODUCER_STAGES,
                    wgmma=WGMMA_PIXEL_ROWS_PRODUCER, producer_warps=4),)
#: The producer tiles of 128 channels in pairs (PAIR_KERNEL): two blocks on consecutive channel tiles of
#: one pixel tile, each copying half of the input tile by TMA into both, so that each reads 2/3 (256
#: pixels) to 3/4 (128) of the L2 bytes a k tile reads alone. For layers of an even number of channel
#: tiles and 32-bit indices.
for _dtype in ("float32", "float16"):
    NHWC_CONFIGS[_dtype] += tuple(dataclasses.replace(c, name=f"{c.name}_pair", cluster=2) for c in NHWC_CONFIGS[_dtype]
                                  if c.producer_warps and c.bn == 128)
#: Pixel-row tiles of one warpgroup, 64 pixels x 64 (6 stages) or 128 channels (4 stages): for layers whose
#: larger tiles make less than a wave of blocks, where more blocks of shorter work (and split-K's runs
#: over fewer tiles) finish sooner. _choose_wgmma_config takes the 64 x 64 one for layers where the
#: other wgmma tiles make fewer than SMALL_TILE_MAX_BLOCKS blocks (split-K's runs counted) and it
#: makes at most SMALL_TILE_MAX_BLOCKS tiles and no fewer blocks. H200, fp16 channels_last, CUDA graphs
#: of the rules' plans (benchmarks/NOTES.md, "One warpgroup's 64 x 64 tile for layers of less than a
#: wave"): every ResNet-50 layer it takes at batch 1 ran 1.05-1.74x faster (3x3 of 64 on 56^2 9.2 ->
#: 5.3 us, 256 -> 1024 on 14^2 4.0 -> 3.2, 3x3 of 512 on 7^2 7.5 -> 7.0); at batch 8, where it made
#: fewer blocks than the split plans of the 3x3 layers it would replace, those ran 0.87-0.93x (3x3 of
#: 256 on 14^2 12.5 -> 13.5), so it does not take them (1024 -> 256 on 14^2 would have run 8.2 -> 6.9).
#: Whole models at batch 1, CUDA graph: ResNet-50 fp16 channels_last 0.931 -> 0.877 ms, fp16 NCHW 1.043 ->
#: 0.994, TF32 NCHW 0.899 -> 0.868; MobileNetV2 and EfficientNet-B0 within 1.5 %. Not in place of a
#: producer tile's plan: VGG-16's 3x3 of 512 on 14^2 at batch 1 in TF32 ran 12.1 us on the producer tile
#: split 16 ways, 14.8 on the 64 x 64 tile split 4 ways.
#: 16-bit 1x1 channels-last layers take it with fewer blocks too (SMALL_TILE_FEWER_BLOCKS): ResNet-50's 1024 ->
#: 256 on 14^2 at batch 8, 100 tiles against 52 in 2 runs, 8.0 -> 6.8 us (torch 4.7); MobileNetV2's 960 -> 160 and
#: -> 320 on 7^2 at batch 32 10.7 -> 10.0 and 12.1 -> 10.1 (events; torch 7.2, 7.9) (benchmarks/NOTES.md, "Small
#: tiles at batch 8").
SMALL_TILE_CONFIG = "nhwc_wgmma_m64n64"
SMALL_TILE_MAX_BLOCKS = H100_SMS
#: The 64 x 128 tile: the rules take it (_small_wide_tile), ahead of the ping-pong tile, for 16-bit channels-last
#: layers of output channels a multiple of 128, reductions of at most SMALL_WIDE_MAX_K_TILES k tiles and
#: SMALL_WIDE_MIN_TILES to H100_SMS of its tiles (one wave, nearly full). H200, fp16 channels_last, CUDA graphs,
#: ResNet-50 at batch 8 (98-112 tiles, 8-18 k tiles), the rules' plans before: 3x3 of 128 on 28^2 9.6 -> 9.1 us,
#: its s2 on 56^2 9.8 -> 9.0, 1024 -> 512 on 14^2 8.1 -> 7.9, 512 -> 2048 on 7^2 5.8 -> 5.3 (ping-pong before), 1024
#: -> 2048 s2 on 14^2 9.3 -> 8.7; at batch 32 (100 tiles) it was not among the fastest three on the 3x3 of 512
#: on 7^2 (72 k tiles) nor on 2048 -> 512 (32).
SMALL_WIDE_CONFIG = "nhwc_wgmma_m64n128"
SMALL_WIDE_MAX_K_TILES = 18
SMALL_WIDE_MIN_TILES = 92
for _dtype, _item in (("float32", 4), ("float16", 2)):
    NHWC_CONFIGS[_dtype] += (
        GemmConfig(SMALL_TILE_CONFIG, 64, 64, 128 // _item, 4, 1, 6, wgmma=WGMMA_PIXEL_ROWS),
        GemmConfig(SMALL_WIDE_CONFIG, 64, 128, 128 // _item, 4, 1, 4, wgmma=WGMMA_PIXEL_ROWS))
#: The ping-pong tile (PINGPONG_KERNEL, kernels/implicit_gemm_nhwc.cu): persistent blocks, at most one per
#: SM, of a producer warpgroup copying by TMA into one ring of PINGPONG_STAGES stages and two consumer
#: warpgroups each taking every other tile of the block, a whole 128 x 128 one: one multiplies while the
#: other runs its epilogue. 16-bit and TF32 NHWC layers of one group, input and output channels multiples of 8,
#: 32-bit indices, no split-K. x and w are read in place: x as the matrix [N H W][C] for 1x1, stride-1,
#: unpadded layers (TMA fills the last k tile's columns past C with zeros), elsewhere by the im2col map in
#: whole k tiles of 128 bytes of channels of one tap (C a multiple of 64 16-bit or 32 float32 values). In TF32
#: x is rounded in the consumers' registers, A multiplied from there (or, on the 128 x 128 tiles, read from a
#: rounded copy: PINGPONG_TF32_COPY_CHANNELS), and the weight is the prepared weight, rounded once. The rules take
#: them for TF32 layers where they take them for 16-bit ones (PINGPONG_TF32_SHORT_K_TILES says where not). H200,
#: TF32 channels_last, GPU time against the rules' plans before (benchmarks/NOTES.md, "The ping-pong tile in
#: TF32"), us: ResNet-50 at batch 32, 256 -> 1024 on 14^2 25.5 -> 22.2 (torch 19.4), 2048 -> 512 on 7^2 31.5 ->
#: 28.1 in clusters, 512 -> 2048 29.8 -> 26.5, 128 -> 512 on 28^2 35.5 -> 29.8, 3x3 of 256 on 14^2 42.2 -> 40.2,
#: of 512 on 7^2 51.7 -> 47.6 in clusters, of 64 on 56^2 (64 channels wide) 53.0 -> 50.2.
WGMMA_PINGPONG = 4
PINGPONG_CONFIG = "nhwc_wgmma_pingpong_m128n128"
PINGPONG_DTYPES = ("float32", "float16", "bfloat16")
#: In TF32 (float32) the ping-pong tile leaves (pingpong_pays) layers of more than one tap that a producer tile
#: taller than 128 pixels would take (dilated_3x3_d2: 101 us on the 192-pixel one, 105 on it; its MMAs, A from
#: registers, run 1.2x longer than from shared memory and its epilogue is a smaller share of a TF32 tile's time), and
#: the planner leaves the pointwise kernel the 1x1 layers it takes (r50_l1_1x1_64: 20.8 us there, 22.3 on it), and it
#: leaves reductions of PINGPONG_TF32_SHORT_K_TILES k tiles or fewer (mbv2_pw_1x1_96to576, 3: 14.1 us on the 3-stage
#: 128 x 128 tile, 16.0 on it in the layers suite).
PINGPONG_TF32_SHORT_K_TILES = 3
#: TF32's split-K on the ping-pong tile (pingpong_split_runs) takes reductions from PINGPONG_TF32_SPLIT_MIN_K_TILES k
#: tiles of 32 channels (16-bit ones from PINGPONG_SPLIT_MIN_K_TILES of 64): H200, TF32 channels_last, four input sets
#: in turn, ResNet-50's 1024 -> 256 on 14^2 at batch 8 (26 tiles, 32 k tiles) 22.3 us on the 128 x 64 channel-row tile
#: in 2 runs, 18.5 on it in 4; torch 10.9 (benchmarks/NOTES.md, "TF32 1x1 layers"). The 64-pixel tiles that take such
#: 16-bit layers in split-K's runs were slower on it in TF32 (PINGPONG_TF32_64_PIXEL_* below).
PINGPONG_TF32_SPLIT_MIN_K_TILES = 32
#: Its runs in TF32 may be as short as PINGPONG_TF32_SPLIT_MIN_RUN k tiles of 32 channels (16 bits:
#: PINGPONG_SPLIT_MIN_RUN of 64): 1024 -> 256 on 14^2 at batch 8 in 5 runs of 7 against 4 runs, three calls (H200, four
#: input sets in turn): 17.0 against 19.0 and 16.7 against 18.5 among the tuner's candidates, 17.7 against 18.1 alone
#: (results/tf32_64_pixel_candidates_h200.txt, results/tf32_split_min_run_ab_98dd758_h200.txt).
PINGPONG_TF32_SPLIT_MIN_RUN = 7
#: In TF32 the 64-channel ping-pong tile takes from the pointwise kernel (pingpong_tf32_narrow_pays) the unfused 1x1
#: layers of more than PINGPONG_TF32_NARROW_CHANNELS[0] output or more than PINGPONG_TF32_NARROW_CHANNELS[1] input
#: channels and PINGPONG_TF32_NARROW_MIN_WAVES waves of 128-pixel tiles or more. H200, TF32 channels_last, four input
#: sets in turn (x from DRAM, as the layers suite reads it), batch 32 (784 pixel tiles): r50_l1_1x1_256 (64 -> 256 on
#: 56^2) 52.7 -> 48.1 us, mbv2_pw_1x1_144to24 33.1 -> 29.2; the pointwise kernel keeps 64 -> 64 (21.0 us there, 23.6
#: on it) and the same layers at batch 8 (196 pixel tiles: 17.8 against 20.0, 13.7 against 15.9; benchmarks/NOTES.md,
#: "TF32 1x1 layers").
PINGPONG_TF32_NARROW_CHANNELS = (64, 128)
PINGPONG_TF32_NARROW_MIN_WAVES = 4
#: The TF32 ping-pong tiles of this many channels read layers of more than one tap and PINGPONG_TF32_COPY_MIN_TILES
#: tiles or more from a copy of x rounded to TF32 (pad_channels) and multiply A from shared memory; where x is read
#: in place they round it in registers and multiply it from there, 1.2x slower on 3x3 layers. A copy is a pass over
#: x, which 128 output channels x 9 taps make a small share of the layer: H200, TF32 channels_last, ResNet-50 at
#: batch 32, the 3x3 of 256 on 14^2 (98 tiles) 40.1 -> 38.4 us, of 512 on 7^2 (52) 47.4 -> 45.3; at batch 8 (26 and
#: 16 tiles, split-K's runs) 21.0 -> 22.2 and 26.4 -> 27.4, so those read x in place. The 64-channel tile
#: (r50_l1_3x3_64: a 26 MB x) reads it in place.
PINGPONG_TF32_COPY_CHANNELS = 128
PINGPONG_TF32_COPY_MIN_TILES = 48
#: Where the ping-pong rules would take such a copy, the 192-pixel producer tile, which rounds x in its registers,
#: runs the layer instead (tf32_copy_avoided) in split-K's runs (_splits) where its tiles make SPLIT_K_MAX_BLOCKS or
#: fewer. H200, TF32 channels_last, four input sets in turn (benchmarks/NOTES.md, "TF32's 64-pixel ping-pong
#: tiles"), ResNet-50 at batch 32, us: the 3x3 of 256 on 28^2 s2 (a 25.7 MB x) 64.9 -> 41.0 in 2 runs, of 512 on
#: 14^2 s2 60.2 -> 51.3 in 3, the 3x3 of 256 on 14^2 42.3 -> 39.5 in 2; the 3x3 of 512 on 7^2 49.2 -> 49.7 in 3
#: (again, the rules' plans before and after: 62.8 -> 42.5, 58.3 -> 50.7, 41.6 -> 39.9, 48.7 -> 49.5;
#: results/tf32_copy_avoided_ab_3020599_h200.txt).
TF32_COPY_AVOIDING_CONFIG = "nhwc_wgmma_producer_m192n128"
PINGPONG_KERNEL = "implicit_gemm_nhwc_pingpong"
PINGPONG_STAGES = 4
#: The fixed rules take it (pingpong_pays) for layers of at least PINGPONG_MIN_OUT_CHANNELS output and
#: PINGPONG_MIN_IN_CHANNELS input channels that make PINGPONG_MIN_TILES tiles or more, reductions shorter
#: than PINGPONG_SHORT_K_TILES k tiles only with a wave of tiles (H100_SMS), and in place of a producer
#: tile only where its cost, PINGPONG_WAVE_COST a wave of tiles plus PINGPONG_FIRST_EPILOGUE_COST, is below
#: the producer's (PRODUCER_BLOCK_COST's units: a 128-pixel producer block's time). H200, fp16 channels_last,
#: CUDA graphs, each layer's rules' plan against the ping-pong tile (benchmarks/NOTES.md, "The ping-pong tile
#: for 1x1 channels-last layers"): ResNet-50's 256 -> 1024 on 14^2 at batch 32 11.9 -> 8.2 us (torch 8.9),
#: 512 -> 256 on 28^2 16.6 -> 12.1 (12.8), 128 -> 512 15.0 -> 11.0 (10.7), at batch 8 512 -> 2048 on 7^2 (64
#: tiles) 6.9 -> 5.6, 256 -> 128 on 56^2 7.9 -> 6.3; conformer's 512 -> 1024 on 16 x 1000 pixels 39.5 -> 29.9
#: (35.6). Slower: narrow outputs (K 64: 256 -> 64 on 56^2 at batch 8 6.1 -> 7.6), narrow inputs (24 ->
#: 144: 17.5 -> 26.4), fewer tiles than SMs where the rules split the reduction (2048 -> 512 on 7^2 at batch
#: 8, 52 tiles: 7.7 -> 12.2), two short k tiles on half a wave (96 -> 576 on 14^2 at batch 8: 3.5 -> 3.9), and
#: two waves of tiles where a 192-pixel producer tile makes one (1024 -> 512 on 14^2 at batch 32: 12.6 -> 13.6).
#: Only for calls without a residual (_fused; in TF32 without bias or activation too): the epilogue of a fused call
#: can outlast the other consumer's MMAs. A bias or activation alone no longer keeps a 16-bit call off it: H200,
#: fp16 channels_last, with a bias, GPU time behind a spin, the rules' plan before against the ping-pong tile
#: (benchmarks/results/candidates_fused_h200.txt), us: vgg_conv1_2 426.7 -> 283.2 (torch 521.2), vgg_conv3_2 186.9
#: -> 168.8, ResNet-50's 3x3 of 64 on 56^2 31.2 -> 24.2, 256 -> 1024 1x1 on 14^2 18.8 -> 12.9; its 3x3 of 256 on
#: 14^2 18.8 -> 19.2. In TF32 vgg_conv3_2 ran 359.8 on the producer tile, 398.3 on the ping-pong tile, so TF32 keeps
#: fused calls off it. Before (H200, convert(fuse=True), bias,
#: ReLU and residual adds in the convolutions), fp16 channels_last, batch 32, CUDA graph: 1.310 ms on the
#: producer tiles, 1.361 with the ping-pong tile on its reductions (bias and ReLU; the bias read in the
#: epilogue), 1.364 on its expansions too (the residual read by the stores as vectors), 1.645 (the residual
#: read as elements from the fragments). With the bias read into shared memory while the tile multiplies
#: (benchmarks/results/pingpong_bias_in_shared_unverified.diff) 1.333: not kept, its GPU tests unfinished.
#: The same rule on layers with taps and strides (x by im2col; NOTES.md, "The ping-pong tile on layers with
#: taps and strides"), batch 32: 256 -> 512 1x1 s2 on 56^2 23.7 -> 16.4 us (torch 20.7), 3x3 of 256 on 14^2
#: 20.4 -> 17.1 (17.1) and s2 on 28^2 20.3 -> 17.1, 512 -> 1024 1x1 s2 on 28^2 16.5 -> 14.5 (18.1); it leaves
#: the 3x3 of 128 on 28^2 (196 tiles, 18.3 against the 192-pixel producer tile's 15.3) and of 512 (52 tiles,
#: 30 against split-K's 23-24). Against the 256-pixel producer tile, which shares each weight tile between
#: twice the pixels, reductions of PINGPONG_LONG_K_TILES or more stay there where it makes one wave: 1024 ->
#: 2048 1x1 s2 on 14^2 at batch 32 (16 k tiles; 112 tiles there, 208 here) 15.8 us there, 17.6 on the
#: ping-pong tile; 512 -> 2048 on 7^2 (8 k tiles, the same tiles) 10.4 there, 8.6 on it.
#: Split-K on it (its work items the (run, tile) pairs, the runs' sums added by split_k_reduce with the epilogue):
#: the rules take it (pingpong_split_runs) for layers it can run of fewer than PINGPONG_MIN_TILES tiles and
#: reductions of PINGPONG_SPLIT_MIN_K_TILES k tiles or more, fused or not, in as many runs as keep one work item a
#: block on one wave (H100_SMS // tiles), each of at most ceil(k tiles / runs) >= PINGPONG_SPLIT_MIN_RUN, where
#: the items make PINGPONG_SPLIT_MIN_WAVE of a wave or more. H200, fp16 channels_last, CUDA graphs, against the
#: rules' plan before (benchmarks/NOTES.md, "Split-K on the ping-pong tile"): ResNet-50's 3x3 of 512 on 7^2 at
#: batch 32 (52 tiles, 72 k tiles) 24.6 -> 21.3 us in 2 runs (torch 16.7), its s2 on 14^2 25.0 -> 21.6; at batch
#: 8 the 3x3 of 256 on 14^2 (26 tiles, 36 k tiles) 12.3 -> 10.8 in 5 runs (torch 9.0), the 3x3 of 512 on 7^2
#: (16 tiles) 11.5 -> 10.7 in 8. Two items a block ran slower than one (26 tiles in 6 runs 13.8, in 5 10.8);
#: 1x1 reductions of 16-32 k tiles lost to the rules' tiles (1024 -> 256 on 14^2 at batch 8: 8.5 against 8.0;
#: 2048 -> 512 on 7^2 8.3 against 7.9).
PINGPONG_SPLIT_MIN_K_TILES = 36
PINGPONG_SPLIT_MIN_RUN = 8
PINGPONG_SPLIT_MIN_WAVE = 0.75
PINGPONG_MIN_OUT_CHANNELS = 128
PINGPONG_MIN_IN_CHANNELS = 64
PINGPONG_MIN_TILES = 64
PINGPONG_SHORT_K_TILES = 3
PINGPONG_WAVE_COST = 0.6
PINGPONG_FIRST_EPILOGUE_COST = 0.3
PINGPONG_LONG_K_TILES = 16
#: The ping-pong tile's split-K in clusters (PINGPONG_CLUSTER_KERNEL): a cluster of S blocks (plan.splits, one of
#: PINGPONG_CLUSTER_SPLITS) takes one tile, block r its run r; each block stores its sums of block q's rows into
#: block q's shared memory (distributed shared memory), and block q adds the runs in order and finishes its BM / S
#: rows: no workspace, no reduction launch. Distributed shared memory is slow for this: a block's 64 KB of sums
#: took ~2 us to store (H200), about what split_k_reduce's launch costs, so the rules take it
#: (pingpong_cluster_runs) only in clusters of 2 for fewer than PINGPONG_MIN_TILES tiles whose two runs make
#: PINGPONG_SPLIT_MIN_WAVE of a wave or more, each of PINGPONG_CLUSTER_MIN_RUN k tiles or more. H200, fp16
#: channels_last, CUDA graphs (benchmarks/NOTES.md, "Split-K in clusters"): ResNet-50's 3x3 of 512 on 7^2 at
#: batch 32 (52 tiles, 72 k tiles) 21.7 us in 2 runs of split-K -> 20.1 (torch 16.7), 2048 -> 512 on 7^2 (52
#: tiles, 32 k tiles) 13.2 on the 64-channel tile -> 11.9 (7.4); with 26 tiles at batch 8 clusters of 4 lost to
#: split-K's 5 runs (3x3 of 256 on 14^2: 11.5 against 10.8) and to the 64 x 64 tile (1024 -> 256: 9.5 against 6.8).
PINGPONG_CLUSTER_CONFIG = "nhwc_wgmma_pingpong_m128n128_cluster"
PINGPONG_CLUSTER_KERNEL = "implicit_gemm_nhwc_pingpong_cluster"
PINGPONG_CLUSTER_SPLITS = (2, 4, 8)
PINGPONG_CLUSTER_MIN_RUN = 16
#: The ping-pong tile 64 channels wide (the same kernel, BN 64): its stages are 24 KB, not 32, so the ring holds
#: PINGPONG_NARROW_STAGES of them, 112 KB of x in flight a block where the 128-channel tile's 4 hold 64 KB,
#: and a layer makes twice the tiles. The fixed rules take it (pingpong_narrow_pays; the planner asks before the
#: pointwise kernel's rule) for the calls pingpong_pays takes (_fused), of PINGPONG_MIN_IN_CHANNELS input channels or
#: more:
#: - of 64 output channels, a wave of tiles or more, and more than one k tile or PINGPONG_NARROW_SHORT_WAVES waves
#:   of tiles (one k tile a tile leaves its epilogue the whole of its time); in TF32, layers of more than one tap from
#:   PINGPONG_TF32_NARROW_MIN_WAVES waves (the 3x3 of 64 on 56^2 at batch 8, 196 tiles: 24.3 us on it, 21.9 on the
#:   256 x 64 producer tile the rules take instead; at batch 32, 784 tiles, 51.0 against 53.2; H200, four input sets
#:   in turn, results/tf32_64_pixel_candidates_h200.txt);
#: - of fewer than PINGPONG_MIN_TILES tiles of 128 x 128 but PINGPONG_NARROW_MIN_WAVE to one wave of its own, over
#:   PINGPONG_NARROW_K_TILES k tiles (longer reductions spread further by split-K's runs). From 4 k tiles since
#:   session #28 (H200, fp16 channels_last, CUDA graphs, results/pingpong_partial_tiles_candidates_h200.txt): at
#:   batch 32 MobileNetV2's 384 -> 96 on 14^2 (98 tiles, 6 k tiles) 7.0 -> 4.7 us on it (torch 3.7) and
#:   EfficientNet-B0's 240 -> 80 (4 k tiles) 4.7 -> 4.0 (3.4), both from the pointwise kernel.
#: H200, fp16 channels_last, CUDA graphs, each against the rules' plan before (benchmarks/NOTES.md, "The
#: ping-pong tile 64 channels wide"): ResNet-50 at batch 32, 3x3 of 64 on 56^2 26.1 -> 19.8 us (torch 24.9), 256
#: -> 64 on 56^2 22.1 -> 18.9 (18.3), 64 -> 64 1x1 7.8 -> 6.9 (6.5), 2048 -> 512 on 7^2 (104 of its tiles, 32 k
#: tiles) 12.4 -> 10.9 (7.4); at batch 8 the 3x3 of 128 on 28^2 and its s2 on 56^2 (98 tiles) 9.1 -> 7.6 and
#: 7.7 (9.4, 8.2), 1024 -> 512 on 14^2 7.9 -> 6.9 (5.2), 512 -> 128 on 28^2 5.3 -> 4.9 (4.1), 256 -> 64 5.9 ->
#: 5.5 (5.2), 3x3 of 64 9.8 -> 8.4 (10.3). Slower: 64 -> 64 1x1 at batch 8 (196 tiles of one k tile) 3.5 -> 3.8;
#: two waves of its tiles where the 128-channel tile makes one (512 -> 256 on 28^2 at batch 8 5.8 -> 7.1) and
#: every layer of 64 tiles of 128 x 128 or more at batch 32 (0.7-0.8x); 1024 -> 2048 1x1 s2 on 14^2 at batch 8
#: (64 of those tiles, 128 of its own) 8.5 -> 9.2; the 3x3 of 512 on 7^2 at batch 32 (72 k tiles) 18.8 in 2
#: runs of split-K -> 21.6.
PINGPONG_NARROW_CONFIG = "nhwc_wgmma_pingpong_m128n64"
PINGPONG_NARROW_STAGES = 7
PINGPONG_NARROW_SHORT_WAVES = 4
PINGPONG_NARROW_K_TILES = (4, 32)
#: The same range of TF32's k tiles of 32 channels: H200, TF32 channels_last, plan timings (candidates.py, one input
#: set), ResNet-50's 3x3 of 128 on 28^2 at batch 8 (49 tiles of 128 x 128, 36 k tiles) 26.6 us on the 128 x 64
#: channel-row tile, 23.5 on it (benchmarks/NOTES.md, "TF32 at batch 8"; since b2c0c46 the 64-pixel tile takes that
#: layer, and the range MobileNetV2's 384 -> 96 on 14^2 at batch 32).
PINGPONG_TF32_NARROW_K_TILES = (16, 36)
PINGPONG_NARROW_MIN_WAVE = 0.7
#: Two taps a k tile (the kernel's TAPS 2) on these ping-pong tiles, for 16-bit layers of PAIRED_TAP_CHANNELS
#: channels read by im2col copies: a pixel's 64 bytes are half a k tile's 128-byte row, so one tap a k tile
#: multiplied zeros in half of every k tile (the 5x9 seed, wide_5x9's 32 -> 64).
PAIRED_TAP_CONFIGS = (PINGPONG_CONFIG, PINGPONG_NARROW_CONFIG)
PAIRED_TAP_CHANNELS = 32
#: The fixed rules take them (paired_taps_config) for such layers of more than PAIRED_TAP_MAX_OUT_CHANNELS output
#: channels, at most PAIRED_TAP_MAX_K_TILES k tiles (7x7 kernels) and PAIRED_TAP_MIN_TILES tiles or more, fused
#: as pingpong_pays allows (_fused): the 128 x 64 tile for at most 64 output channels, else the 128 x 128 one.
#: H200, fp16 channels_last, GPU time behind a spin, us, since the odd last tap's k tile repeats it in both halves
#: (before, its early break from the instruction loop made ptxas serialize the tile's wgmma; 323c84b,
#: benchmarks/results/candidates_paired_unserialized_h200.txt, candidates_k32_paired_h200.txt): 3x3 32 -> 64 s2 on
#: 112^2 at batch 32 24.6 -> 20.5 (torch channels_last 21.7), 32 -> 128 on 56^2 28.7 -> 22.9 (24.1), 32 -> 256 on
#: 56^2 39.7 (36.7; the one-tap 128 x 128 tile 54.7), 5x5 32 -> 128 on 56^2 44.1 against the rules' one-tap tile's
#: 56.2 (40.8), 7x7 32 -> 128 on 112^2 at batch 8 77.6 against 99.2 (98.6). Layers of 32 -> 33-64 channels go to the
#: pixel strips first (pixel_strips_config); of 32 or fewer to the 128 x 32 mma.sync tile (narrow_out_config).
PAIRED_TAP_MAX_K_TILES = 25
PAIRED_TAP_MAX_OUT_CHANNELS = 32
PAIRED_TAP_MIN_TILES = 4 * H100_SMS
#: 16-bit layers of PAIRED_TAP_CHANNELS -> at most PAIRED_TAP_MAX_OUT_CHANNELS channels with taps run on the 128 x 32
#: mma.sync tile of 64-byte k rows (narrow_out_taps_config), a tap's pixel a k row: the wgmma tiles are 64 channels
#: wide, half of it zeros. H200, fp16 channels_last, GPU time behind a spin, against the rules' plan before
#: (benchmarks/results/candidates_k32_paired_h200.txt), us: 3x3 32 -> 32 on 112^2 at batch 32 75.5 (the paired
#: 128 x 64 tile) -> 60.6 (torch channels_last 42.1), at batch 8 22.1 -> 20.7 (17.2). Wider inputs stay on the
#: wgmma tiles: 64 -> 32 on 56^2 29.5 (the 128 x 32 tiles 28.9 and 31.0 with 64- and 128-byte rows), 128 -> 32 on 28^2
#: 17.5 (20.4 on this tile).
NARROW_OUT_TAPS_CONFIG = "nhwc_m128n32k32"


def _pingpong_tile(name: str, bm: int, bn: int, stages: int, item: int = 2) -> GemmConfig:
    """A ping-pong tile of ``bm`` pixels and ``bn`` channels: k tiles of 128-byte rows of ``item``-byte values,
    ``stages`` of them in the ring, a producer warpgroup copying by TMA."""
    return GemmConfig(name, bm, bn, 128 // item, 8, 1, stages, wgmma=WGMMA_PINGPONG, producer_warps=4)


for _dtype, _item in (("float32", 4), ("float16", 2)):
    NHWC_CONFIGS[_dtype] += (_pingpong_tile(PINGPONG_CONFIG, 128, 128, PINGPONG_STAGES, _item),
                             _pingpong_tile(PINGPONG_CLUSTER_CONFIG, 128, 128, PINGPONG_STAGES, _item),
                             _pingpong_tile(PINGPONG_NARROW_CONFIG, 128, 64, PINGPONG_NARROW_STAGES, _item))
#: The ping-pong tile 64 pixels tall (the same kernel, BM 64): layers of few 128 x 128 tiles spread over twice the
#: blocks, each copying 24 KB a k tile, not 32 (a k tile took ~0.23 us, against the 128 x 128 tile's ~0.29; H200).
#: Its stages are 24 KB, 7 of them. No residual instance: a 64-row half's float sums need twice a consumer's staging
#: of 64 rows (split-K's reduction adds it). The fixed rules take it (pingpong_64_pixel_runs; the planner asks after
#: pingpong_small_pays, before any other tile's rule) for calls _fused allows, of whole tiles of 128 output channels
#: where the 128 x 128 tile makes fewer than PINGPONG_MIN_TILES tiles and the reduction has
#: PINGPONG_64_PIXEL_MIN_K_TILES k tiles or more: in as many runs of split-K as keep one work item a block on one wave,
#: each of at least PINGPONG_64_PIXEL_MIN_RUN k tiles, where the work items make PINGPONG_64_PIXEL_MIN_WAVE of a wave or
#: more, and whole only for reductions of PINGPONG_64_PIXEL_WHOLE_K_TILES k tiles or fewer. H200, fp16 channels_last,
#: CUDA graphs, ResNet-50's layers against the rules' plan before (benchmarks/NOTES.md, "The ping-pong tile 64 pixels
#: tall"; results/pingpong_64_pixel_sweep_h200.txt), us: batch 8, 1024 -> 256 on 14^2 (50 tiles, 16 k tiles) 6.8 ->
#: 6.3 (torch 4.7), the 3x3 of 256 on 14^2 (36 k tiles) 10.4 -> 9.9 in 2 runs (9.0), 2048 -> 512 on 7^2 (28 tiles)
#: 7.9 -> 7.1 in 3 (6.5), the 3x3 of 512 on 7^2 10.3 -> 9.8 in 4, 1024 -> 512 7.1 -> 6.7, the 3x3 of 128 on 28^2 7.7
#: -> 7.2, 512 -> 128 4.9 -> 4.7; batch 32, 2048 -> 512 (100 tiles) 11.0 -> 10.1 (7.4); batch 1, 256 -> 128 on 56^2
#: (49 tiles, 4 k tiles) 4.2 -> 3.6. Slower: where the 128 x 128 tile makes 64 tiles or more (1024 -> 256 at batch 32
#: 8.2 -> 10.3, 256 -> 1024 at batch 8 4.7 -> 5.0), long reductions whole (the 3x3 of 512 on 7^2 at batch 32, 72 k
#: tiles: 19.1 against the clusters' 18.6), short runs (1024 -> 256 at batch 8 in 2 runs of 8: 7.3), few work items
#: (1024 -> 256 at batch 1, 8 tiles: 6.1 against 4.8), and 2 k tiles (128 -> 512 on 28^2 at batch 1: 3.2 against
#: 2.8). Outputs of 64 channels (half a tile) won at batch 1 (256 -> 64 on 56^2 4.2 -> 3.7) but other widths,
#: MobileNetV2's and EfficientNet's, were not timed on it.
PINGPONG_64_PIXEL_CONFIG = "nhwc_wgmma_pingpong_m64n128"
PINGPONG_64_PIXEL_MIN_K_TILES = 4
PINGPONG_64_PIXEL_MIN_RUN = 10
PINGPONG_64_PIXEL_MIN_WAVE = 0.35
PINGPONG_64_PIXEL_WHOLE_K_TILES = 32
#: float32 (TF32) has the 64-pixel tiles too, in fewer stages (a consumer stages a 64-row half's float sums, twice
#: the 16-bit tile's staging), x always read in place and rounded in the consumers' registers. The fixed rules take
#: the 64 x 128 one in TF32 (_tf32_64_pixel_runs) whole for layers of fewer than PINGPONG_MIN_TILES tiles of 128 x
#: 128 where its own make PINGPONG_TF32_64_PIXEL_MIN_WAVE of a wave or more over at most
#: PINGPONG_TF32_64_PIXEL_WHOLE_K_TILES k tiles; for fewer of its tiles, layers of more than one tap in
#: PINGPONG_TF32_64_PIXEL_MIN_RUNS or more runs of split-K; and 1x1 layers of more 128 x 128 tiles in place of the
#: 128 x 128 ping-pong tile (pingpong_pays) where PINGPONG_TF32_64_PIXEL_WAVE_COST times its waves of tiles are
#: fewer than that tile's (a fuller last wave). H200, TF32 channels_last, four input sets in turn (x from DRAM), each
#: against the rules' plan before (benchmarks/NOTES.md, "TF32's 64-pixel ping-pong tiles"), us: ResNet-50 at batch
#: 8, 128 -> 512 on 28^2 (196 tiles of 128 x 128, 392 of its own) 16.9 -> 13.6 (torch 12.9), 512 -> 2048 on 7^2 (64;
#: 112) 19.7 -> 17.1 and 1024 -> 2048 s2 29.3 -> 25.6, 1024 -> 512 on 14^2 (100 of its tiles) 22.3 -> 20.5, 512 ->
#: 128 on 28^2 15.2 -> 14.2, the 3x3 of 128 on 28^2 (98, 36 k tiles) 23.4 -> 20.9 and its s2 twin on 56^2 23.5 ->
#: 20.8 (28.8 from a rounded copy of x); MobileNetV2's 320 -> 1280 on 7^2 14.7 -> 12.6; at batch 1 the 3x3 of 256
#: on 14^2 in 7 runs 16.3 -> 15.2, its s2 twin 16.8 -> 15.2, the 3x3 of 512 on 7^2 in 15 runs 23.4 -> 21.2, its s2
#: twin 23.6 -> 21.3. Left out, slower or at most 5 % faster: other 3x3 layers at batch 8 (the 3x3 of 256 on 14^2
#: in 2 runs 22.3 -> 25.2 and its s2 twin 22.6 -> 29.7 from a rounded copy, in place neither among the best five;
#: the 3x3 of 512 on 7^2 in 4 runs 28.0 -> 29.0), 1x1 layers at batch 1 (128 -> 512 on 28^2, 52 tiles: 8.6 -> 9.2;
#: three others 0.98x), split-K on 1x1 layers at batch 8 (1024 -> 256 on 14^2 in 2 runs 17.9 -> 17.2, 2048 -> 512
#: on 7^2 in 4 20.9 -> 20.5), and two waves of its tiles against one (256 -> 1024 on 14^2 at batch 8, 1024 -> 256
#: at batch 32; results/tf32_64_pixel_candidates_h200.txt). The 64 x 64 tile is tuning's alone in TF32 (one row
#: timed: 256 -> 64 on 56^2 at batch 8, 16.5 against the rules' 17.3).
PINGPONG_TF32_64_PIXEL_STAGES = 6
PINGPONG_TF32_64_PIXEL_MIN_WAVE = 0.5
PINGPONG_TF32_64_PIXEL_WHOLE_K_TILES = 36
PINGPONG_TF32_64_PIXEL_WAVE_COST = 0.6
PINGPONG_TF32_64_PIXEL_MIN_RUNS = 7
NHWC_CONFIGS["float16"] += (_pingpong_tile(PINGPONG_64_PIXEL_CONFIG, 64, 128, PINGPONG_NARROW_STAGES),)
NHWC_CONFIGS["float32"] += (_pingpong_tile(PINGPONG_64_PIXEL_CONFIG, 64, 128, PINGPONG_TF32_64_PIXEL_STAGES, 4),)
#: The ping-pong tile 64 x 64 (the same kernel): its k tiles copy 16 KB, two thirds of the 64-pixel tile's 24, and a
#: block's copies bound these tiles at ~115 GB/s an SM (H200: the 64-pixel tile's k tiles took ~0.23 us, the 128 x
#: 128 tile's ~0.29), so a layer of few 128 x 128 tiles spreads over twice the 64-pixel tile's blocks with a third
#: less to copy each. PINGPONG_SMALL_STAGES of them hold as much in flight as the 64-pixel tile's 7. The fixed
#: rules take it whole (pingpong_small_pays; asked before the 64-pixel tile's rule) for calls _fused allows where its
#: tiles make at most one wave (H100_SMS) and the reduction has
#: PINGPONG_SMALL_MIN_K_TILES k tiles or more: up to PINGPONG_SMALL_SHORT_K_TILES on PINGPONG_SMALL_MIN_TILES tiles
#: or more, up to PINGPONG_SMALL_LONG_K_TILES on PINGPONG_SMALL_MIN_WAVE of a wave or more. H200, fp16 channels_last,
#: CUDA graphs, ResNet-50's layers against the rules' plans before (benchmarks/NOTES.md, "The ping-pong tile 64
#: x 64"; results/pingpong_small_sweep_h200.txt), us: batch 8, 1024 -> 256 on 14^2 (100 tiles, 16 k tiles) 6.5
#: -> 5.7 (torch 4.9), the 3x3 of 256 on 14^2 (36 k tiles) 10.1 -> 9.6 (9.2) and its s2 on 28^2 10.2 -> 9.6; batch
#: 1, the 3x3 of 64 on 56^2 (49 tiles, 9 k tiles) 5.2 -> 4.3, 256 -> 64 on 56^2 4.5 -> 3.3, 512 -> 1024 1x1 s2
#: 5.0 -> 4.3, 512 -> 2048 on 7^2 (32 tiles) 4.4 -> 4.0, 512 -> 128 on 28^2 (26 tiles) 4.4 -> 4.0. Slower: more
#: than a wave of tiles (every batch-32 layer, 0.5-0.9x; batch 8 1024 -> 512, 200 tiles, 6.8 -> 8.7), long
#: reductions on few tiles (2048 -> 512 on 7^2 at batch 8, 56 tiles of 32 k tiles: 8.3 against 7.4 in split-K's
#: runs; 1024 -> 256 at batch 1, 16 tiles: 5.4 against 5.0), 2 k tiles (128 -> 512 on 28^2 at batch 1: 3.1
#: against 2.9); 256 -> 1024 on 14^2 at batch 1 (64 tiles, 4 k tiles) 3.2 -> 3.4 is taken. From 21 tiles on
#: (results/pointwise_small_rule_candidates_h200.txt, batch 8): MobileNetV2's 384 -> 64 on 14^2 (25 tiles, 6 k
#: tiles) 4.3 -> 3.7 (torch 3.1), EfficientNet-B0's 672 -> 192 on 7^2 (21 tiles, 11 k tiles) 5.5 -> 4.6 (3.6).
#: Outputs of any multiple of 8 channels since session #28 (the last tile's unused channels are multiplied and not
#: stored), but on fewer than PINGPONG_SMALL_FEW_TILES tiles only up to PINGPONG_SMALL_FEW_TILES_K_TILES k tiles
#: (results/pingpong_partial_tiles_candidates_h200.txt, against the rules' plan before, us): batch 8, MobileNetV2's
#: 384 -> 96 on 14^2 4.9 -> 3.6 (torch 3.1), 576 -> 96 4.8 -> 4.2 (3.4), 576 -> 160 on 7^2 (21 tiles) 4.7 -> 4.1
#: (3.3); EfficientNet-B0's 240 -> 80 on 14^2 4.2 -> 3.2 (2.9), 480 -> 80 5.0 -> 4.1 (3.4), 480 -> 112 5.0 -> 4.0
#: (3.4), 672 -> 112 5.7 -> 4.5 (3.7); batch 32, 576 -> 160 on 7^2 (75 tiles) 4.8 -> 4.2 (3.5), 960 -> 160 6.8 ->
#: 5.2 (4.1). Slower: 960 -> 160 on 7^2 at batch 8 (21 tiles, 15 k tiles) 5.1 against 4.8 in split-K's 5 runs of
#: the one-warpgroup 64 x 64 tile.
PINGPONG_SMALL_CONFIG = "nhwc_wgmma_pingpong_m64n64"
PINGPONG_SMALL_STAGES = 12
PINGPONG_SMALL_MIN_K_TILES = 4
PINGPONG_SMALL_SHORT_K_TILES = 16
PINGPONG_SMALL_MIN_TILES = 21
PINGPONG_SMALL_LONG_K_TILES = 36
PINGPONG_SMALL_MIN_WAVE = 0.75
PINGPONG_SMALL_FEW_TILES = 32
PINGPONG_SMALL_FEW_TILES_K_TILES = 12
PINGPONG_TF32_SMALL_STAGES = 11
NHWC_CONFIGS["float16"] += (_pingpong_tile(PINGPONG_SMALL_CONFIG, 64, 64, PINGPONG_SMALL_STAGES),)
NHWC_CONFIGS["float32"] += (_pingpong_tile(PINGPONG_SMALL_CONFIG, 64, 64, PINGPONG_TF32_SMALL_STAGES, 4),)
#: The ping-pong tiles that run whole or split by split_k_reduce (the cluster config aside).
PINGPONG_WHOLE_CONFIGS = (PINGPONG_CONFIG, PINGPONG_NARROW_CONFIG, PINGPONG_64_PIXEL_CONFIG, PINGPONG_SMALL_CONFIG)
#: Pixel strips (PIXEL_STRIPS_KERNEL, the kernel's PIXEL_STRIPS): 16-bit layers of PIXEL_STRIPS_CHANNELS channels
#: (pixels of 64 or 128 bytes, the kernel's STRIP_BYTES), stride 1 and no dilation along w, on the 128 x 64 ping-pong
#: tile, a k tile a kernel row. Each 64-pixel half of a tile is one output row's segment, and a k tile copies its strip
#: of 64 + kw - 1 input pixels once (a 4-D tiled map, zeros outside x), from which tap s's A rows are read s rows on,
#: beside the row's kw taps of the weight. The im2col copies of two taps a k tile read every pixel kw times from L2 in
#: 64-byte rows; in 64 channels (128-byte rows, the same FLOPs: results/candidates_c64_5x9_h200.txt) the 128 x 64 tile
#: ran the 5x9 seed's FLOPs in 776 us against the paired tile's 1530 on 32 channels, both ~60 G im2col rows a second
#: (H200). Stages hold a kernel row's weight, kw C / 64 k rows of 64 channels: PIXEL_STRIPS_STAGES of them fit to kw 11
#: in 32 channels, 5 in 64; the 2-stage PIXEL_STRIPS_WIDE_CONFIG's to 9 in 64 (_pixel_strips_refusal asks
#: _shared_bytes). The fixed rules take it first (pixel_strips_config), fused or not, for layers it runs of
#: PIXEL_STRIPS_RULE_TAPS' input channels and taps along w, PIXEL_STRIPS_OUT_CHANNELS output channels, and output rows
#: of which the 64-pixel segments use PIXEL_STRIPS_MIN_ROW_USE or more, on the first of PIXEL_STRIPS_CONFIGS that runs
#: them. H200, GPU time behind a spin (results/candidates_pixel_strips*_h200.txt), us, against the rules' plan before
#: (torch channels_last): the 5x9 seed 988.0 -> 663.6 in fp16 (874.5), 974.8 -> 655.9 in bf16 (902.4); fp16, 3x3 32 ->
#: 64 on 112^2 at batch 32 72.2 -> 56.9 (47.1), with a bias 86.2 -> 57.3, at batch 1 10.6 -> 8.3 (9.2), on 224^2 at
#: batch 8 73.2 -> 56.6 (47.8), on 56^2 at batch 8 10.3 -> 9.4 (11.4); 5x5 on 56^2 at batch 32 37.1 -> 31.7 (34.0), 7x7
#: on 112^2 at batch 8 56.5 -> 48.1 (54.2), 1x9 on 256^2 at batch 8 92.4 -> 51.1 (62.2). Slower: rows of 28 pixels
#: (segments 44 % used: over 11.9 against 10.9), 128 output channels (two channel tiles: 29.2 against the paired 128 x
#: 128 tile's 28.3), 32 (half a tile: 75.1 against the 128 x 32 mma.sync tile's 60.5). In 64 channels (fp16, against the
#: 128 x 64 ping-pong tile's one tap a k tile; results/candidates_pixel_strips_c64_templated_h200.txt): 5x5 64 -> 64 on
#: 56^2 at batch 32 52.1 -> 43.5 (55.1), the 5x9 seed's shape in 64 channels 1530.2 -> 1355.9 on the 2-stage tile
#: (1833.3); level on 3x3 (vgg_conv1_2 278.1 against 280.3, r50_l1_3x3_64 23.5 against 22.9), slower on 7x7 on the
#: 2-stage tile (large_7x7_64_224sq 335.8 against 372.7), so those stay on the ping-pong tile.
PIXEL_STRIPS_KERNEL = "implicit_gemm_nhwc_pingpong_strips"
PIXEL_STRIPS_CONFIG = "nhwc_wgmma_strips_m128n64"
PIXEL_STRIPS_WIDE_CONFIG = "nhwc_wgmma_strips_m128n64s2"
PIXEL_STRIPS_CONFIGS = (PIXEL_STRIPS_CONFIG, PIXEL_STRIPS_WIDE_CONFIG)
#: The input channels each strips tile runs (and has instances for): the 2-stage tile serves wide kernel rows of 64.
PIXEL_STRIPS_CHANNELS = {PIXEL_STRIPS_CONFIG: (32, 64), PIXEL_STRIPS_WIDE_CONFIG: (64,)}
#: Input channels -> kernel widths the fixed rules take the strips for (pixel_strips_config).
PIXEL_STRIPS_RULE_TAPS = {32: range(3, 12), 64: (4, 5, 8, 9)}
PIXEL_STRIPS_STAGES, PIXEL_STRIPS_WIDE_STAGES = 3, 2
PIXEL_STRIPS_OUT_CHANNELS = range(33, 65)
PIXEL_STRIPS_MIN_ROW_USE = 0.75
#: taps_per_k_tile of its plans: a k tile is a whole kernel row.
PIXEL_STRIPS = 0
NHWC_CONFIGS["float16"] += (_pingpong_tile(PIXEL_STRIPS_CONFIG, 128, 64, PIXEL_STRIPS_STAGES),
                             _pingpong_tile(PIXEL_STRIPS_WIDE_CONFIG, 128, 64, PIXEL_STRIPS_WIDE_STAGES))
NHWC_CONFIGS["bfloat16"] = NHWC_CONFIGS["float16"]
PIXEL_ROWS_CONFIG = "nhwc_wgmma_m128n128"
#: 1x1 NCHW layers read in place (NCHW_A) on wgmma's 3-stage pixel-row tile: each warp's A fragments
#: loaded into registers from the k-major A^T tile (TF32 wgmma cannot read a transposed operand from
#: shared memory), the weight tile from swizzled rows. The rule gives it layers of at least
#: NCHW_A_WGMMA_MIN_CHANNELS output channels per group and NCHW_A_WGMMA_MIN_K_TILES k rows of 128 bytes
#: that make NCHW_A_WGMMA_MIN_BLOCKS blocks (tiles of 128 x 128 times split-K's runs), all three by the
#: element's bytes. 16 bits: ResNet-50's 1x1 layers at batch 8 and 32 (98-245 blocks) ran 1.01-1.37x
#: faster there than on mma.sync's NCHW_A tile (H200); with 8-49 blocks (batch 1, and 512 -> 128 at
#: batch 8; mma.sync's 64-channel tile makes twice as many) 0.92-0.97x (benchmarks/NOTES.md, "1x1 NCHW
#: layers on wgmma: measured"). TF32, A rounded in its fragments and the weight in shared memory
#: (H200 at d0969cd; NOTES, "TF32 NCHW_A on wgmma: A rounded in its fragments again"): 1.04-1.45x on
#: those of at least 256 output channels, 3 whole k rows (96 channels: MobileNetV2's 96 -> 576 at batch
#: 32, 1.26x) and 98 blocks at batch 8 and 32 but one (512 -> 2048 on 7^2 at batch 8, 0.96x); 0.88-1.13x on
#: those of 128 output channels, 0.98x on 64 -> 256, 0.85-1.02x at batch 1, whose split plans make up to
#: 80 blocks (a TF32 k tile holds half the channels: twice the runs), and 0.84-1.03x on MobileNetV2's and
#: EfficientNet-B0's layers at batch 8 (13-65 blocks). In TF32 the input channels fill whole k rows:
#: EfficientNet-B0's 112 -> 672 on 14^2 (3.5 rows) ran 0.87x at batch 32, 80 -> 480 (2.5) 0.95x, where the
#: layers of 160-320 whole rows' channels ran 1.12-1.18x.
NCHW_A_WGMMA_MIN_CHANNELS = {2: 128, 4: 256}
NCHW_A_WGMMA_MIN_K_TILES = {2: MIN_DEEP_K_TILES, 4: 3}
NCHW_A_WGMMA_MIN_BLOCKS = {2: 64, 4: 96}
NCHW_A_WGMMA_WHOLE_K_ROWS = {2: False, 4: True}
#: LaunchPlan.a_from_nchw, the kernel's NCHW_A: the NCHW input read in place as A^T, rows that are
#: channels (1x1) or rows (c, s) shifted by their tap (1-D), each its own instance (the 1-D rows'
#: decomposition cost 1x1 TF32 layers an SM's fourth block: ResNet-50 TF32 b32, CUDA graph, 5.04 ->
#: 5.42 ms on an H200 while it was shared).
NCHW_A_POINTWISE, NCHW_A_ROW_TAPS = 1, 2
#: 1-D layers are read in place up to this many output channels per group: there the copy to
#: channels-last is most of the work (H200, WaveNet's 64 channels 1.3-1.6x faster in place, a TCN
#: layer's 64 1.05-1.16x), while from 128 on the producer tile on the copy is faster than any tile
#: reading in place (0.6-0.9x; benchmarks/NOTES.md, "1-D convolutions read in place").
NCHW_A_ROW_TAPS_MAX_CHANNELS = 64
CONFIG_NAMES = frozenset(c.name for configs in NHWC_CONFIGS.values() for c in configs)
CONFIG_NAMES_BY_DTYPE = {dtype: frozenset(c.name for c in configs) for dtype, configs in NHWC_CONFIGS.items()}
#: Outputs of at most this many channels per group (an RGB layer widened to 8, a decoder's last
#: layers) take the 32-channel tile with k rows of 64 bytes on the phase launch: the 64-wide ones
#: compute 2-8 times the columns they store. The tuner tries the 32-channel tiles on such outputs alone.
NARROW_TILE_CHANNELS = 32
#: Their stages: 16 bits' 4-stage tile (k rows of 64 bytes); float32's 3-stage one, k rows of 128 bytes
#: (H200, TF32 decoder_3x3s2_op1_64to32: 0.184 ms against 0.220 on 64-byte rows).
NARROW_TILE_STAGES = {"float32": 3, "float16": 4, "bfloat16": 4}
NARROW_CONFIG_NAMES = frozenset(c.name for configs in NHWC_CONFIGS.values() for c in configs
                                if c.bn == NARROW_TILE_CHANNELS)
NHWC_VECS = (16, 8, 4)
#: Split-K (common.split_k_runs): a grid of at most SPLIT_K_MAX_BLOCKS tiles (half the H100's 132
#: SMs) with a reduction of at least SPLIT_K_MIN_REDUCTION k tiles splits it into as many runs as keep
#: the blocks within SPLIT_K_TARGET_BLOCKS (one per SM: more, and a second wave costs more than the
#: runs save), of at least SPLIT_K_MIN_TILES k tiles each. Chosen from H100 timings of every run count
#: on the batch 1 and 8 layers of the layers suite in fp16 and TF32 (benchmarks/NOTES.md; e.g.
#: ResNet-50's 3x3 of 512 at batch 1, 8 tiles of 72 k tiles: 0.025 ms whole, 0.007 in 16 runs; a
#: TF32 1x1 of 96 channels in 2 runs 0.0067 ms against 0.0049 whole).
SPLIT_K_MAX_BLOCKS = 66
SPLIT_K_TARGET_BLOCKS = H100_SMS
SPLIT_K_MIN_REDUCTION = 12
SPLIT_K_MIN_TILES = 3
#: Stream-K (kernels/stream_k.cuh; wgmma tiles, 32-bit indices): where whole tiles spread unevenly over
#: the SMs -- more than SPLIT_K_MAX_BLOCKS tiles, at most STREAM_K_MAX_WAVES waves of them, the last
#: wave leaving the SMs less than STREAM_K_MAX_BALANCE busy on average -- STREAM_K_SMS x (blocks
#: resident per SM) persistent blocks share the tiles' k tiles equally, where each block's share is
#: worth at least STREAM_K_MIN_WORK k tiles of a 128 x 128 tile per wave of whole tiles: a block pays
#: a pipeline fill per tile it touches and 64 KB of float32 sums out or in per tile it shares, which
#: shorter shares do not earn back. H100, stream-K against whole tiles (benchmarks/NOTES.md,
#: benchmarks/profile/stream_k.py): fp16 ResNet-50 3x3 layers at batch 32, 13-14 such k tiles a
#: block, 0.84-0.94x; TF32 r50_l3_3x3_256 (98 tiles, 27) 1.10x, r50_l2_3x3_128 (196 tiles, 27) 0.98x;
#: vgg_conv5_2 (196 tiles, 53 fp16, 107 TF32) 1.09-1.12x.
STREAM_K_SMS = H100_SMS
STREAM_K_MAX_WAVES = 4
STREAM_K_MAX_BALANCE = 0.85
STREAM_K_MIN_WORK = 24
STREAM_K_KERNEL = "implicit_gemm_nhwc_stream_k"
#: The producer warpgroup's tile launches this entry: its weight tiles come by TMA (a TensorMap argument).
TMA_KERNEL = "implicit_gemm_nhwc_tma"
#: ... and in pairs (GemmConfig.cluster 2), this one, launched in clusters of two blocks along y.
PAIR_KERNEL = "implicit_gemm_nhwc_tma_pair"
#: TMA_KERNEL copies a 1x1 layer's x as the matrix [N H W][C] by a 2-D map, not in im2col mode, on tiles of
#: up to this many pixels. H200, fp16 channels_last, ResNet-50's 1x1 layers at batch 32, two rounds against
#: the im2col copies in one call (benchmarks/NOTES.md): 128 pixels 1.00-1.07x (1024 -> 256 13.6 -> 13.0 us,
#: 2048 -> 512 20.1 -> 18.7), 192 0.99-1.09x; 256 0.97-1.03x.
MATRIX_MAP_MAX_PIXELS = 192


def strip_pixels(kw: int) -> int:
    """Pixels of a strip feeding 64 output pixels ``kw`` taps: 64 + kw - 1, in whole 8-row swizzle patterns."""
    return math.ceil((63 + kw) / 8) * 8


def strip_pixel_bytes(channels: int, dtype: str) -> int:
    """A strip pixel's bytes (the kernel's STRIP_BYTES): its ``channels`` of ``dtype``."""
    return channels * STORAGE_BYTES[dtype]


def _strip_stage_bytes(cfg: GemmConfig, kw: int, pixel_bytes: int) -> int:
    """A stage of the pixel strips' tile: bm / 64 strips of strip_pixels(kw) pixels of ``pixel_bytes``, and a kernel
    row's weight, ceil(kw pixel_bytes / 128) k rows of 128 bytes a channel."""
    return cfg.bm // 64 * strip_pixels(kw) * pixel_bytes + math.ceil(kw * pixel_bytes / 128) * cfg.bn * 128


def _shared_bytes(cfg: GemmConfig, dtype: str, a_from_nchw: bool, strip: tuple[int, int] = (1, 64)) -> int:
    """STAGES x (A + B): B [bn][bk + pad], rows of bk elements + 16 bytes; A the same with bm rows,
    or (a_from_nchw) [bk][bm + 8]. wgmma: rows of 128 bytes, unpadded, and 1 KB to align the tiles. ``strip``: the
    pixel strips' kernel width and pixel bytes."""
    item = 4 if dtype == "float32" else 2
    if cfg.wgmma == WGMMA_PINGPONG:  # the ring, each consumer's staging of bm rows of 16-bit values (float32's of 64
        # rows of floats), the mbarriers, 1 KB to align (and the clusters' `ready` mbarrier)
        staging_rows_bytes = 64 * 4 if dtype == "float32" else cfg.bm * 2
        stage = _strip_stage_bytes(cfg, *strip) if cfg.name in PIXEL_STRIPS_CONFIGS else (cfg.bm + cfg.bn) * 128
        return cfg.stages * stage + 2 * staging_rows_bytes * (cfg.bn + 8) + 16 * cfg.stages + 8 + 1024
    a_stage = cfg.bk * (cfg.bm + 8) * item if a_from_nchw else cfg.bm * (cfg.bk * item + (0 if cfg.wgmma else 16))
    if cfg.wgmma:  # and the producer's full and empty mbarriers, 8 bytes each per stage
        return cfg.stages * (a_stage + cfg.bn * 128) + 1024 + (16 * cfg.stages if cfg.producer_warps else 0)
    return cfg.stages * (a_stage + cfg.bn * (cfg.bk * item + 16))


def _is_matrix(p: ConvProblem) -> bool:
    """Whether x is the GEMM's A as it lies (pixels x channels, or their transpose in NCHW): 1x1, stride-1,
    unpadded layers."""
    return (p.kh, p.kw, p.stride, p.pad_top, p.pad_left, p.pad_bottom, p.pad_right) == (1, 1, (1, 1), 0, 0, 0, 0)


def _nchw_a_vec(problem: ConvProblem) -> int:
    """Bytes per A piece where the NCHW input can be read in place (0 where it cannot), the KCHW weight
    too, in 16-byte rows of kh kw C / groups: 1x1, stride-1, unpadded problems, whose pieces of pixels
    never straddle two images; and 1-D ones (height 1, taps along the row, stride 1 along it, at most
    NCHW_A_ROW_TAPS_MAX_CHANNELS output channels per group), whose pieces never straddle two rows and
    whose taps shift them by whole pieces (padding and dilation), so that each lies wholly inside x's
    row or wholly in its padding."""
    item = 4 if problem.dtype == "float32" else 2
    if problem.layout != "NCHW" or (problem.kh * problem.kw * problem.c // problem.groups * item) % 16:
        return 0
    if _is_matrix(problem):
        rows = (problem.h * problem.w * item,)
    elif problem.h == problem.kh == problem.ho == 1 and problem.stride[1] == 1 and problem.weight_layout == "KCHW" \
            and problem.k // problem.groups <= NCHW_A_ROW_TAPS_MAX_CHANNELS:
        rows = (problem.w * item, problem.wo * item, problem.pad_left * item) + \
            ((problem.dilation[1] * item,) if problem.kw > 1 else ())
    else:
        return 0
    return next((vec for vec in NHWC_VECS if all(row % vec == 0 for row in rows)), 0)


def _nchw_a_mode(problem: ConvProblem) -> int:
    """The kernel's NCHW_A for ``problem``: 0 (x gathered from channels-last), NCHW_A_POINTWISE (1x1 read
    in place) or NCHW_A_ROW_TAPS (1-D read in place)."""
    if not _nchw_a_vec(problem):
        return 0
    return NCHW_A_POINTWISE if problem.kh * problem.kw == 1 else NCHW_A_ROW_TAPS


def pads_channels(problem: ConvProblem) -> bool:
    """Whether the kernel would read ``problem``'s input through a copy with zero channels added (3-channel
    RGB inputs: 4)."""
    return _pieces(problem)[0][1] > problem.c


def _pieces(problem: ConvProblem) -> tuple[tuple[int, int], str]:
    """((bytes per cp.async piece, channels of the copies), "") or ((0, 0), why the problem cannot run).

    Problems that _nchw_a_vec reads in place: its piece, and the input's channels (no copies). Else the
    widest piece whose channel count divides the channels per group; with one group the copies may
    add zero channels to make it divide (at most MAX_PADDING_RATIO more)."""
    item = 4 if problem.dtype == "float32" else 2
    cg = problem.c // problem.groups
    for vec in (_nchw_a_vec(problem),) if _nchw_a_vec(problem) else NHWC_VECS:
        per_piece = vec // item
        padded = math.ceil(cg / per_piece) * per_piece
        if padded == cg or (problem.groups == 1 and padded <= MAX_PADDING_RATIO * cg):
            pieces = vec, padded * problem.groups
            break
    else:
        return (0, 0), f"{cg} channels per group is odd, with {problem.groups} groups (no 4-byte pieces)"
    if problem.n > MAX_GRID_Y or problem.k > MAX_GRID_Y:
        return (0, 0), f"batch {problem.n} or {problem.k} output channels past the copies' grid limit {MAX_GRID_Y}"
    return pieces, ""


def space_to_depth_block(problem: ConvProblem) -> tuple[int, int]:
    """The (rows, columns) of input pixels a space-to-depth copy makes one pixel each for ``problem``, or (1, 1)
    for none: its stride, for ungrouped, undilated strided layers whose channels make no 16-byte pieces and
    whose kernel covers a stride (no input pixel skipped), where a block makes at most
    SPACE_TO_DEPTH_MAX_CHANNELS channels (padded to whole 16-byte pieces)."""
    block = problem.stride
    if block == (1, 1) or problem.groups != 1 or problem.dilation != (1, 1) or problem.kh < block[0] or \
            problem.kw < block[1] or _nchw_a_vec(problem) or _pieces(problem)[0][0] == 16 or \
            _space_to_depth_channels(problem, block) > SPACE_TO_DEPTH_MAX_CHANNELS:
        return (1, 1)
    return block


def _space_to_depth_channels(problem: ConvProblem, block: tuple[int, int]) -> int:
    """Channels of a space-to-depth pixel: a block's pixels' channels, padded to whole 16-byte pieces."""
    per_piece = 16 // STORAGE_BYTES[problem.dtype]
    return math.ceil(block[0] * block[1] * problem.c / per_piece) * per_piece


def space_to_depth_problem(problem: ConvProblem, block: tuple[int, int]) -> ConvProblem:
    """The stride-1, unpadded problem the GEMM runs on the space-to-depth copies of ``problem``'s x and weight
    (kernels/space_to_depth.cu): ceil(kh / rows) x ceil(kw / columns) taps of _space_to_depth_channels, on
    planes of the output's size plus those taps less one, NHWC and KHWC (the copies' forms); the same output."""
    kh, kw = -(-problem.kh // block[0]), -(-problem.kw // block[1])
    return dataclasses.replace(problem, c=_space_to_depth_channels(problem, block), h=problem.ho + kh - 1,
                               w=problem.wo + kw - 1, kh=kh, kw=kw, stride=(1, 1), pad_top=0, pad_left=0,
                               pad_bottom=0, pad_right=0, layout="NHWC", weight_layout="KHWC")


def _space_to_depth_specialisation(dtype: str, source_nhwc: bool) -> str:
    flags = ",".join(str(flag).lower() for flag in (dtype == "float32", source_nhwc))
    return f"cupyconv::{SPACE_TO_DEPTH}<{CTYPES[dtype]},{flags}>"


def space_to_depth_copy(dtype: str, source_nhwc: bool, source_shape: tuple[int, int, int, int],
                        copy_shape: tuple[int, int, int], block: tuple[int, int], pads: tuple[int, int],
                        source: Pointer, copy: Pointer) -> Launch:
    """The launch (kernels/space_to_depth.cu) copying ``source`` of logical shape (N, C, H, W) (in NHWC memory
    where ``source_nhwc``) to [N][Hs][Ws][Cs] at ``copy`` (``copy_shape``: Hs, Ws, Cs), blocks of ``block``
    pixels from (-pad_top, -pad_left) on each one pixel; float32 rounded to TF32."""
    n, c, h, w = source_shape
    vectors = n * math.prod(copy_shape) // (16 // STORAGE_BYTES[dtype])
    return Launch(SPACE_TO_DEPTH, _space_to_depth_specialisation(dtype, source_nhwc),
                  (math.ceil(vectors / 256), 1, 1), (256, 1, 1), 0,
                  (source, copy, n, c, h, w, *copy_shape, *block, *pads))


def refusal(problem: ConvProblem) -> str:
    """Why the channels-last GEMM cannot run ``problem`` ("" when it can): a dtype without tensor-core
    instructions here, no piece fits, or the grid of the tile it would choose is past CUDA's limits."""
    why_not = dtype_refusal(problem) or _pieces(problem)[1]
    return why_not or grid_refusal(gemm_grid(problem, _choose_config(problem)[0]))


def _wgmma_refusal(problem: ConvProblem, compute_capability: int, cfg: GemmConfig | None = None) -> str:
    """Why the wgmma tiles (``cfg``: that one; None: any) cannot run ``problem`` ("" when they can): they
    need the H100's sm_90a and k rows of 128 bytes gathered in 16-byte pieces from channels-last copies
    -- or, for 1x1 NCHW inputs read in place, the 3-stage pixel-row tile (1-D ones run on mma.sync)."""
    if compute_capability != WGMMA_COMPUTE_CAPABILITY:
        return f"wgmma needs compute capability {WGMMA_COMPUTE_CAPABILITY} (sm_90a), got {compute_capability or 'none'}"
    if _nchw_a_mode(problem) == NCHW_A_ROW_TAPS:
        return "a 1-D NCHW input read in place runs on mma.sync's tiles alone (its taps' rows spill wgmma's registers)"
    if _nchw_a_vec(problem):
        if cfg is not None and cfg.name != PIXEL_ROWS_CONFIG:
            return (f"an NCHW input read in place runs on wgmma's {PIXEL_ROWS_CONFIG} tile alone (A in "
                    f"registers, no lag between k tiles), not on {cfg.name}")
        return ""
    if _pieces(problem)[0][0] != 16:
        return "wgmma needs 16-byte pieces from channels-last copies (this problem has narrower ones or none)"
    return ""


def config_named(dtype: str, name: str) -> GemmConfig:
    """The tile of NHWC_CONFIGS[dtype] called ``name``."""
    return next(c for c in NHWC_CONFIGS[dtype] if c.name == name)


def taps_per_k_tile(problem: ConvProblem, cfg: GemmConfig) -> int:
    """Taps a k tile of the ping-pong tile ``cfg`` holds for ``problem``: 2 on PAIRED_TAP_CONFIGS for 16-bit layers
    of one group and PAIRED_TAP_CHANNELS channels read by im2col copies (not 1x1 matrices), PIXEL_STRIPS (a kernel
    row) on PIXEL_STRIPS_CONFIGS, else 1."""
    if cfg.name in PIXEL_STRIPS_CONFIGS:
        return PIXEL_STRIPS
    paired = cfg.name in PAIRED_TAP_CONFIGS and STORAGE_BYTES[problem.dtype] == 2 and problem.groups == 1 and \
        problem.c == PAIRED_TAP_CHANNELS and not _is_matrix(problem)
    return 2 if paired else 1


def pixel_strips_config(problem: ConvProblem, compute_capability: int) -> GemmConfig | None:
    """The pixel strips' tile where the fixed rules take it for ``problem`` (PIXEL_STRIPS_* above), or None."""
    if compute_capability != WGMMA_COMPUTE_CAPABILITY or problem.layout != "NHWC" or \
            problem.dtype not in ("float16", "bfloat16") or \
            problem.kw not in PIXEL_STRIPS_RULE_TAPS.get(problem.c, ()) or \
            problem.k not in PIXEL_STRIPS_OUT_CHANNELS or \
            problem.wo / (64 * math.ceil(problem.wo / 64)) < PIXEL_STRIPS_MIN_ROW_USE:
        return None
    (_, channels_padded), why_not = _pieces(problem)
    if why_not:
        return None
    index = _index(problem, config_named(problem.dtype, PIXEL_STRIPS_CONFIG), channels_padded)
    return next((cfg for cfg in (config_named(problem.dtype, name) for name in PIXEL_STRIPS_CONFIGS)
                 if not _pingpong_refusal(problem, cfg, channels_padded, index, None, None)), None)


def paired_taps_config(problem: ConvProblem, compute_capability: int) -> GemmConfig | None:
    """The ping-pong tile of two taps a k tile that the fixed rules take for ``problem`` (PAIRED_TAP_* above), or
    None."""
    if compute_capability != WGMMA_COMPUTE_CAPABILITY or _fused(problem) or problem.layout != "NHWC":
        return None
    cfg = config_named(problem.dtype, PINGPONG_NARROW_CONFIG if problem.k <= 64 else PINGPONG_CONFIG)
    (_, channels_padded), why_not = _pieces(problem)
    if why_not or taps_per_k_tile(problem, cfg) == 1 or problem.k <= PAIRED_TAP_MAX_OUT_CHANNELS or \
            _pingpong_refusal(problem, cfg, channels_padded, _index(problem, cfg, channels_padded), None, None):
        return None
    if reduction_tiles(problem, cfg, channels_padded) > PAIRED_TAP_MAX_K_TILES or \
            math.prod(gemm_grid(problem, cfg)) < PAIRED_TAP_MIN_TILES:
        return None
    return cfg


def narrow_out_taps_config(problem: ConvProblem, compute_capability: int) -> GemmConfig | None:
    """The 128 x 32 mma.sync tile where the fixed rules take it for ``problem`` (NARROW_OUT_TAPS_CONFIG above), or
    None."""
    if compute_capability != WGMMA_COMPUTE_CAPABILITY or problem.layout != "NHWC" or \
            problem.dtype not in ("float16", "bfloat16") or problem.groups != 1 or _is_matrix(problem) or \
            problem.c != PAIRED_TAP_CHANNELS or problem.k > PAIRED_TAP_MAX_OUT_CHANNELS:
        return None
    return config_named(problem.dtype, NARROW_OUT_TAPS_CONFIG)


def _pingpong_refusal(problem: ConvProblem, cfg: GemmConfig, channels_padded: int, index: str, splits,
                      stream_k) -> str:
    """Why the ping-pong tile ``cfg`` cannot run ``problem`` ("" where it can)."""
    p = problem
    if p.dtype not in PINGPONG_DTYPES or p.layout != "NHWC":
        return f"it runs 16-bit and TF32 NHWC layers (got {p.dtype}, {p.layout})"
    if p.groups != 1:
        return f"it runs layers of one group (got {p.groups})"
    if cfg.name in PIXEL_STRIPS_CONFIGS:
        return _pixel_strips_refusal(p, cfg, channels_padded, index, splits, stream_k)
    paired = taps_per_k_tile(p, cfg) > 1
    if not _is_matrix(p) and p.c % cfg.bk and not paired:
        return (f"its im2col copies (layers other than 1x1, stride-1, unpadded ones) take whole k tiles of {cfg.bk} "
                f"channels of one tap, or on {', '.join(PAIRED_TAP_CONFIGS)} two taps of {PAIRED_TAP_CHANNELS} 16-bit "
                f"channels (got {p.c} channels of {p.dtype})")
    if paired and (splits or 1) > 1:
        return f"its k tiles of two taps run without split-K (got splits={splits!r})"
    if channels_padded != p.c or p.k % 8:
        return f"its x is read in place and its output stored in 8-channel vectors (got {p.c} -> {p.k} channels)"
    if index != "int":
        return f"it takes 32-bit indices ({p.x_shape} -> {p.out_shape} needs 64-bit ones)"
    if not im2col_map_fits(p):
        return _im2col_refusal(p)
    if stream_k:
        return f"it shares no tiles between blocks: no stream-K (got stream_k={stream_k})"
    if cfg.bm < 128 and p.has_residual and (splits or 1) == 1:
        return (f"its {cfg.bm}-row tile adds a residual only through split-K's reduction (a 64-row half's float sums "
                f"need twice its staging); got a residual of {p.out_shape} and splits={splits!r}")
    return ""


def _pixel_strips_refusal(p: ConvProblem, cfg: GemmConfig, channels_padded: int, index: str, splits,
                          stream_k) -> str:
    """Why the pixel strips' tile ``cfg`` cannot run ``p``, a layer of one group in NHWC ("" where it can)."""
    if STORAGE_BYTES[p.dtype] != 2 or p.c not in PIXEL_STRIPS_CHANNELS[PIXEL_STRIPS_CONFIG] or channels_padded != p.c \
            or p.k % 8:
        return (f"its strips are pixels of {' or '.join(map(str, PIXEL_STRIPS_CHANNELS[PIXEL_STRIPS_CONFIG]))} 16-bit "
                f"channels read in place, its output 8-channel vectors (got {p.c} -> {p.k} channels of {p.dtype})")
    if p.c not in PIXEL_STRIPS_CHANNELS[cfg.name]:
        rows = " or ".join(map(str, PIXEL_STRIPS_CHANNELS[cfg.name]))
        return f"its {cfg.stages} stages serve wide kernel rows of {rows} channels ({PIXEL_STRIPS_CONFIG} runs {p.c})"
    if p.stride[1] != 1 or p.dilation[1] != 1:
        return (f"its taps are a strip's rows one after another: stride and dilation 1 along w (got stride "
                f"{p.stride}, dilation {p.dilation})")
    shared = _shared_bytes(cfg, p.dtype, False, (p.kw, strip_pixel_bytes(p.c, p.dtype)))
    if shared + BLOCK_RESERVED_SHARED_BYTES > SM_SHARED_BYTES:
        return (f"its {cfg.stages} stages hold a kernel row's {p.kw} taps of {p.c} channels: {shared} bytes of shared "
                f"memory, past an SM's {SM_SHARED_BYTES - BLOCK_RESERVED_SHARED_BYTES}")
    if (splits or 1) > 1 or stream_k:
        return f"it runs whole reductions (got splits={splits!r}, stream_k={stream_k!r})"
    if index != "int":
        return f"it takes 32-bit indices ({p.x_shape} -> {p.out_shape} needs 64-bit ones)"
    return ""


def strip_tiles(problem: ConvProblem, cfg: GemmConfig) -> int:
    """Tiles of the pixel strips' tile ``cfg``: pairs of 64-pixel segments of output rows, by channel tiles."""
    segments = problem.n * problem.ho * math.ceil(problem.wo / 64)
    return math.ceil(segments / (cfg.bm // 64)) * math.ceil(problem.k / cfg.bn)


def _pingpong_shape(problem: ConvProblem, compute_capability: int, config: str = PINGPONG_CONFIG,
                    min_out_channels: int = PINGPONG_MIN_OUT_CHANNELS) -> tuple[tuple[int, int, int], int] | None:
    """The grid and k tiles of the ping-pong tile ``config`` for ``problem`` where its rules may take it (compute
    capability 9.0, 16 bits or TF32 where the dtype has ``config``, ``min_out_channels`` and PINGPONG_MIN_IN_CHANNELS,
    a tile that runs it), else None."""
    if compute_capability != WGMMA_COMPUTE_CAPABILITY or problem.dtype not in PINGPONG_DTYPES or \
            config not in CONFIG_NAMES_BY_DTYPE[problem.dtype] or problem.k < min_out_channels or \
            problem.c < PINGPONG_MIN_IN_CHANNELS:
        return None
    (_, channels_padded), why_not = _pieces(problem)
    cfg = config_named(problem.dtype, config)
    if why_not or _pingpong_refusal(problem, cfg, channels_padded, _index(problem, cfg, channels_padded), None, None):
        return None
    return gemm_grid(problem, cfg), reduction_tiles(problem, cfg, channels_padded)


def pingpong_pays(problem: ConvProblem, compute_capability: int) -> bool:
    """Whether the fixed rules take the ping-pong tile for ``problem`` on a GPU of ``compute_capability``
    (PINGPONG_* above: wide enough, enough tiles, cheaper than the producer tile the rules would take
    instead, no residual: _fused). The planner asks it before the pointwise kernel's rule."""
    shape = None if _fused(problem) else _pingpong_shape(problem, compute_capability)
    if shape is None:
        return False
    tiles, k_tiles = math.prod(shape[0]), shape[1]
    if tiles < PINGPONG_MIN_TILES or (k_tiles < PINGPONG_SHORT_K_TILES and tiles < H100_SMS):
        return False
    if problem.dtype == "float32" and k_tiles <= PINGPONG_TF32_SHORT_K_TILES:
        return False
    if _deep(problem) and problem.k // problem.groups > 64:  # the rules' other wgmma tile for it
        other = _larger_wgmma_config(problem)[0]
        if other.wgmma == WGMMA_PIXEL_ROWS_PRODUCER:
            if problem.dtype == "float32" and problem.kh * problem.kw > 1 and other.bm > 128:
                return False
            producer_tiles = math.prod(gemm_grid(problem, other))
            if other.bm == 256 and k_tiles >= PINGPONG_LONG_K_TILES and producer_tiles <= H100_SMS:
                return False
            return _pingpong_cost(tiles) < math.ceil(producer_tiles / H100_SMS) * \
                PRODUCER_BLOCK_COST[other.bm] * (PAIR_BLOCK_COST if other.cluster > 1 else 1.0)
    return True


def tf32_copy_avoided(problem: ConvProblem, compute_capability: int) -> bool:
    """Whether the fixed rules give a TF32 layer the 128 x 128 ping-pong tiles would read from a rounded copy of x
    (PINGPONG_TF32_COPY_*) to the 192-pixel producer tile instead (TF32_COPY_AVOIDING_CONFIG above)."""
    shape = None if problem.dtype != "float32" or _fused(problem) else _pingpong_shape(problem, compute_capability)
    if shape is None or problem.kh * problem.kw == 1 or math.prod(shape[0]) < PINGPONG_TF32_COPY_MIN_TILES:
        return False
    producer = config_named(problem.dtype, TF32_COPY_AVOIDING_CONFIG)
    taken = pingpong_pays(problem, compute_capability) or pingpong_cluster_runs(problem, compute_capability) > 1 or \
        pingpong_split_runs(problem, compute_capability) > 1
    return taken and math.prod(gemm_grid(problem, producer)) <= SPLIT_K_MAX_BLOCKS


def pingpong_narrow_pays(problem: ConvProblem, compute_capability: int) -> bool:
    """Whether the fixed rules take the 64-channel ping-pong tile (PINGPONG_NARROW_CONFIG) for ``problem``
    (PINGPONG_NARROW_* above). The planner asks it before any other tile's rule."""
    width = config_named("float16", PINGPONG_NARROW_CONFIG).bn
    shape = None if _fused(problem) else _pingpong_shape(problem, compute_capability, PINGPONG_NARROW_CONFIG, width)
    if shape is None:
        return False
    tiles, k_tiles = math.prod(shape[0]), shape[1]
    if problem.k == width:  # in TF32, layers of more taps from PINGPONG_TF32_NARROW_MIN_WAVES waves of tiles
        waves = PINGPONG_TF32_NARROW_MIN_WAVES if problem.dtype == "float32" and problem.kh * problem.kw > 1 else 1
        return tiles >= waves * H100_SMS and (k_tiles > 1 or tiles >= PINGPONG_NARROW_SHORT_WAVES * H100_SMS)
    wide = config_named(problem.dtype, PINGPONG_CONFIG)
    fewest_k_tiles, most_k_tiles = \
        PINGPONG_TF32_NARROW_K_TILES if problem.dtype == "float32" else PINGPONG_NARROW_K_TILES
    return (math.prod(gemm_grid(problem, wide)) < PINGPONG_MIN_TILES and fewest_k_tiles <= k_tiles <= most_k_tiles
            and PINGPONG_NARROW_MIN_WAVE * H100_SMS <= tiles <= H100_SMS)


def pingpong_tf32_narrow_pays(problem: ConvProblem, compute_capability: int) -> bool:
    """Whether the fixed rules take the 64-channel ping-pong tile for a TF32 1x1 layer the pointwise kernel would
    take (PINGPONG_TF32_NARROW_CHANNELS above)."""
    if problem.dtype != "float32" or _fused(problem) or pointwise_nhwc.refusal(problem) or \
            not pointwise_nhwc.pays(problem, compute_capability):
        return False
    most_out, most_in = PINGPONG_TF32_NARROW_CHANNELS
    shape = _pingpong_shape(problem, compute_capability, PINGPONG_NARROW_CONFIG, min_out_channels=1)
    return shape is not None and shape[0][0] >= PINGPONG_TF32_NARROW_MIN_WAVES * H100_SMS and \
        (problem.k > most_out or problem.c > most_in)


def pingpong_small_pays(problem: ConvProblem, compute_capability: int) -> bool:
    """Whether the fixed rules take the 64 x 64 ping-pong tile (PINGPONG_SMALL_CONFIG) whole for ``problem``
    (PINGPONG_SMALL_* above)."""
    width = config_named("float16", PINGPONG_SMALL_CONFIG).bn
    if _fused(problem) or problem.dtype == "float32":  # TF32: tuning's alone
        return False
    shape = _pingpong_shape(problem, compute_capability, PINGPONG_SMALL_CONFIG, width)
    if shape is None:
        return False
    tiles, k_tiles = math.prod(shape[0]), shape[1]
    if not PINGPONG_SMALL_MIN_K_TILES <= k_tiles <= PINGPONG_SMALL_LONG_K_TILES or tiles > H100_SMS:
        return False
    if tiles < PINGPONG_SMALL_FEW_TILES and k_tiles > PINGPONG_SMALL_FEW_TILES_K_TILES:
        return False  # a long reduction on few tiles: split-K's runs on another tile spread it further
    return tiles >= (PINGPONG_SMALL_MIN_TILES if k_tiles <= PINGPONG_SMALL_SHORT_K_TILES
                     else PINGPONG_SMALL_MIN_WAVE * H100_SMS)


def pingpong_64_pixel_runs(problem: ConvProblem, compute_capability: int) -> int:
    """Split-K's runs with which the fixed rules take the 64-pixel ping-pong tile (PINGPONG_64_PIXEL_CONFIG) for
    ``problem`` (PINGPONG_64_PIXEL_* above; 1: whole; 0: the rule does not take it)."""
    width = config_named("float16", PINGPONG_64_PIXEL_CONFIG).bn
    shape = None if _fused(problem) or problem.k % width else _pingpong_shape(problem, compute_capability,
                                                                              PINGPONG_64_PIXEL_CONFIG)
    if shape is None:
        return 0
    grid, k_tiles = shape
    wide_tiles = math.prod(gemm_grid(problem, config_named(problem.dtype, PINGPONG_CONFIG)))
    if problem.dtype == "float32":
        return _tf32_64_pixel_runs(problem, compute_capability, grid, k_tiles, wide_tiles)
    if wide_tiles >= PINGPONG_MIN_TILES or k_tiles < PINGPONG_64_PIXEL_MIN_K_TILES:
        return 0
    runs = _one_wave_runs(problem, grid, k_tiles, PINGPONG_64_PIXEL_MIN_RUN)
    too_long = runs == 1 and k_tiles > PINGPONG_64_PIXEL_WHOLE_K_TILES
    if math.prod(grid) * runs < PINGPONG_64_PIXEL_MIN_WAVE * H100_SMS or too_long:
        return 0
    return runs


def _tf32_64_pixel_runs(problem: ConvProblem, compute_capability: int, grid: tuple[int, int, int], k_tiles: int,
                        wide_tiles: int) -> int:
    """pingpong_64_pixel_runs in TF32 (PINGPONG_TF32_64_PIXEL_* above), given the tile's ``grid`` and ``k_tiles`` and
    the 128 x 128 tile's ``wide_tiles``."""
    tiles = math.prod(grid)
    if wide_tiles >= PINGPONG_MIN_TILES:  # in place of the 128 x 128 tile, where its last wave is fuller
        fuller_waves = PINGPONG_TF32_64_PIXEL_WAVE_COST * math.ceil(tiles / H100_SMS) < math.ceil(wide_tiles / H100_SMS)
        return int(problem.kh * problem.kw == 1 and fuller_waves and pingpong_pays(problem, compute_capability))
    if tiles >= PINGPONG_TF32_64_PIXEL_MIN_WAVE * H100_SMS:
        return int(k_tiles <= PINGPONG_TF32_64_PIXEL_WHOLE_K_TILES)
    runs = _one_wave_runs(problem, grid, k_tiles, PINGPONG_64_PIXEL_MIN_RUN)
    return runs if problem.kh * problem.kw > 1 and runs >= PINGPONG_TF32_64_PIXEL_MIN_RUNS else 0


def _one_wave_runs(problem: ConvProblem, grid: tuple[int, int, int], k_tiles: int, min_run: int) -> int:
    """Split-K's runs that keep one work item a block on one wave of ``grid``'s tiles, each of at least ``min_run``
    k tiles, within split_k_runs' limits (the workspace, 32-bit offsets)."""
    runs = min(H100_SMS // math.prod(grid), SPLIT_K_MAX)
    while runs > 1 and math.ceil(k_tiles / runs) < min_run:
        runs -= 1
    return split_k_runs(problem, grid, k_tiles, runs, 1)


def pingpong_rules_take(problem: ConvProblem, compute_capability: int) -> bool:
    """Whether a ping-pong tile's rule takes ``problem`` whole or in the 64-pixel tile's runs (the planner leaves
    such 1x1 layers to this family rather than to the pointwise kernel; in TF32 where pingpong_tf32_narrow_pays)."""
    if problem.dtype == "float32":
        return pingpong_tf32_narrow_pays(problem, compute_capability)
    return (pingpong_small_pays(problem, compute_capability) or pingpong_64_pixel_runs(problem, compute_capability)
            > 0 or pingpong_narrow_pays(problem, compute_capability) or pingpong_pays(problem, compute_capability))


def pingpong_split_runs(problem: ConvProblem, compute_capability: int) -> int:
    """Split-K's runs the fixed rules give the ping-pong tile for ``problem`` (PINGPONG_SPLIT_* above; 1:
    the rule does not take it)."""
    shape = _pingpong_shape(problem, compute_capability)
    if shape is None:
        return 1
    grid, k_tiles = shape
    tiles = math.prod(grid)
    min_k_tiles, min_run = _split_limits(problem)
    if tiles >= PINGPONG_MIN_TILES or k_tiles < min_k_tiles:
        return 1
    runs = _one_wave_runs(problem, grid, k_tiles, min_run)
    return runs if runs > 1 and tiles * runs >= PINGPONG_SPLIT_MIN_WAVE * H100_SMS else 1


def _split_limits(problem: ConvProblem) -> tuple[int, int]:
    """The ping-pong tile's split-K rule in ``problem``'s dtype, counted in its k tiles: the fewest k tiles of a
    reduction it takes, and of a run."""
    if problem.dtype == "float32":
        return PINGPONG_TF32_SPLIT_MIN_K_TILES, PINGPONG_TF32_SPLIT_MIN_RUN
    return PINGPONG_SPLIT_MIN_K_TILES, PINGPONG_SPLIT_MIN_RUN


def pingpong_cluster_runs(problem: ConvProblem, compute_capability: int) -> int:
    """The runs (cluster blocks) the fixed rules give the ping-pong tile's split-K in clusters for ``problem``
    (PINGPONG_CLUSTER_* above; 1: the rule does not take it)."""
    shape = _pingpong_shape(problem, compute_capability)
    if shape is None:
        return 1
    grid, k_tiles = shape
    tiles, runs = math.prod(grid), PINGPONG_CLUSTER_SPLITS[0]
    fills_a_wave = PINGPONG_SPLIT_MIN_WAVE * H100_SMS <= tiles * runs <= H100_SMS
    return runs if tiles < PINGPONG_MIN_TILES and fills_a_wave and k_tiles >= runs * PINGPONG_CLUSTER_MIN_RUN else 1


def _fused(problem: ConvProblem) -> bool:
    """Whether the ping-pong tiles' rules leave ``problem`` to the other tiles for its epilogue (see
    PINGPONG_MIN_TILES): a residual in any dtype, a bias or an activation in TF32."""
    return problem.has_residual or (problem.dtype == "float32" and (problem.has_bias or problem.activation != "none"))


def _pingpong_cost(tiles: int) -> float:
    """The ping-pong tile's time on ``tiles`` tiles in 128-pixel producer blocks' (PRODUCER_BLOCK_COST)."""
    return PINGPONG_WAVE_COST * math.ceil(tiles / H100_SMS) + PINGPONG_FIRST_EPILOGUE_COST


def _deep(problem: ConvProblem) -> bool:
    """Whether k rows of 128 bytes pay: 16-byte pieces from copies, >= 64 bytes of channels per tap."""
    item = 4 if problem.dtype == "float32" else 2
    return _pieces(problem)[0][0] == 16 and not _nchw_a_vec(problem) and problem.c // problem.groups * item >= 64


def _choose_config(problem: ConvProblem, compute_capability: int = 0, pingpong: bool = True,
                   pingpong_split: bool = True) -> tuple[GemmConfig, str]:
    """On compute capability 9.0, wherever 16-byte pieces are gathered from copies, the reduction spans
    MIN_DEEP_K_TILES k rows of 128 bytes or more, a group has 8 output channels or more and the layer is
    not one tile of few pixels and <= 64 channels (WGMMA_MIN_NARROW_PIXELS), the wgmma tiles (_choose_wgmma_config);
    1x1 NCHW inputs read in place there, with NCHW_A_WGMMA_MIN_CHANNELS output channels per group,
    NCHW_A_WGMMA_MIN_K_TILES k rows (whole ones where NCHW_A_WGMMA_WHOLE_K_ROWS) and NCHW_A_WGMMA_MIN_BLOCKS
    blocks or more (by the dtype's bytes), the 3-stage pixel-row tile; elsewhere the mma.sync ones.

    mma.sync, channels: the 96-channel tile for 65-96 output channels per group (AlexNet), the
    128-channel one for more where it makes WIDE_TILE_BLOCKS blocks or more, else the 64-channel one,
    and the 32-channel one for 32 or fewer; NCHW 1x1 layers read in place, the 64 x 64 tile where its
    tiles make at most SMALL_POINTWISE_MAX_TILES (k rows of 128 bytes from MIN_DEEP_K_TILES of them).
    Depth: k rows of 128 bytes where the gather copies 16-byte pieces of at least 64 bytes of channels per
    tap and the reduction spans MIN_DEEP_K_TILES of them, else of 64 bytes (narrower pieces make a deep tile
    many copies per thread; few channels per tap make it many taps; 1x1 problems read in place have short
    reductions).

    Before all of these, where ``pingpong``, the pixel strips' tile where pixel_strips_config takes it, then the
    ping-pong tile of two taps a k tile paired_taps_config gives; then the 128 x 32 mma.sync tile where
    narrow_out_taps_config takes it; then,
    where ``pingpong`` and pingpong_small_pays, the 64 x 64 ping-pong tile; then the 64-pixel
    ping-pong tile where pingpong_64_pixel_runs takes it (whole where ``pingpong``, in runs of split-K where
    ``pingpong_split``); then, where ``pingpong`` and pingpong_narrow_pays, the 64-channel ping-pong tile; then the
    64 x 128 tile where _small_wide_tile takes it; then, where ``pingpong`` and pingpong_pays, the ping-pong tile;
    where ``pingpong_split`` and pingpong_split_runs, the ping-pong tile with split-K in clusters where
    pingpong_cluster_runs takes it, else with split-K's runs (make_plan asks
    pingpong_split_runs for them)."""
    if pingpong and (strips := pixel_strips_config(problem, compute_capability)):
        return strips, (f"wgmma; {problem.kh}x{problem.kw} of {problem.c} -> {problem.k} channels on output rows of "
                        f"{problem.wo}: the ping-pong tile, a k tile a kernel row read from strips of pixels")
    if pingpong and (paired := paired_taps_config(problem, compute_capability)):
        return paired, (f"wgmma; {problem.kh}x{problem.kw} of {problem.c} -> {problem.k} channels, "
                        f"{math.prod(gemm_grid(problem, paired))} tiles of {paired.bm} x {paired.bn}: the ping-pong "
                        f"tile, two taps a k tile")
    if narrow := narrow_out_taps_config(problem, compute_capability):
        return narrow, (f"{problem.kh}x{problem.kw} of {problem.c} -> {problem.k} channels: one 32-channel tile, a "
                        f"tap's {problem.c} channels a k row of 64 bytes")
    if pingpong and pingpong_small_pays(problem, compute_capability):
        cfg = config_named(problem.dtype, PINGPONG_SMALL_CONFIG)
        return cfg, (f"wgmma; {math.prod(gemm_grid(problem, cfg))} tiles of 64 x 64 (<= {H100_SMS}), "
                     f"{reduction_tiles(problem, cfg, problem.c)} k tiles: the ping-pong tile 64 x 64")
    runs = pingpong_64_pixel_runs(problem, compute_capability)
    if (pingpong and runs == 1) or (pingpong_split and runs > 1):
        cfg = config_named(problem.dtype, PINGPONG_64_PIXEL_CONFIG)
        return cfg, (f"wgmma; {math.prod(gemm_grid(problem, config_named(problem.dtype, PINGPONG_CONFIG)))} tiles of "
                     f"128 x 128 (< {PINGPONG_MIN_TILES}), {math.prod(gemm_grid(problem, cfg))} of 64 x 128, "
                     f"{reduction_tiles(problem, cfg, problem.c)} k tiles: the ping-pong tile 64 pixels tall")
    if pingpong and (pingpong_narrow_pays(problem, compute_capability) or
                     pingpong_tf32_narrow_pays(problem, compute_capability)):
        cfg = config_named(problem.dtype, PINGPONG_NARROW_CONFIG)
        return cfg, (f"wgmma; {problem.c} -> {problem.k} channels, {math.prod(gemm_grid(problem, cfg))} tiles of "
                     f"128 x 64: the ping-pong tile 64 channels wide, {cfg.stages} stages")
    small_wide = _small_wide_tile(problem, compute_capability)
    if small_wide:
        return small_wide, (f"wgmma; {math.prod(gemm_grid(problem, small_wide))} tiles of 64 x 128 (a wave, >= "
                            f"{SMALL_WIDE_MIN_TILES}), {reduction_tiles(problem, small_wide, problem.c)} k tiles (<= "
                            f"{SMALL_WIDE_MAX_K_TILES}): one warpgroup's 64 x 128 tile")
    if pingpong_split and tf32_copy_avoided(problem, compute_capability):
        cfg, wide = (config_named(problem.dtype, name) for name in (TF32_COPY_AVOIDING_CONFIG, PINGPONG_CONFIG))
        return cfg, (f"wgmma; the ping-pong tile's {math.prod(gemm_grid(problem, wide))} tiles of 128 x 128 would "
                     f"read a copy of x rounded to TF32: {math.prod(gemm_grid(problem, cfg))} tiles of 192 pixels x "
                     f"128 channels rounding it in place, split-K's runs filling a wave")
    if pingpong and pingpong_pays(problem, compute_capability):
        cfg = config_named(problem.dtype, PINGPONG_CONFIG)
        return cfg, (f"wgmma; {problem.kh}x{problem.kw} of {problem.c} -> {problem.k} channels, "
                     f"{math.prod(gemm_grid(problem, cfg))} tiles of 128 x 128: the ping-pong tile (one consumer "
                     f"warpgroup's epilogue beside the other's MMAs)")
    if pingpong_split and pingpong_cluster_runs(problem, compute_capability) > 1:
        cfg = config_named(problem.dtype, PINGPONG_CLUSTER_CONFIG)
        return cfg, (f"wgmma; {math.prod(gemm_grid(problem, cfg))} tiles of 128 x 128 (< {PINGPONG_MIN_TILES}), "
                     f"{reduction_tiles(problem, cfg, problem.c)} k tiles (>= {2 * PINGPONG_CLUSTER_MIN_RUN}): the "
                     f"ping-pong tile, two runs of each tile in a cluster of two blocks")
    if pingpong_split and pingpong_split_runs(problem, compute_capability) > 1:
        cfg = config_named(problem.dtype, PINGPONG_CONFIG)
        return cfg, (f"wgmma; {math.prod(gemm_grid(problem, cfg))} tiles of 128 x 128 (< {PINGPONG_MIN_TILES}), "
                     f"{reduction_tiles(problem, cfg, problem.c)} k tiles (>= {_split_limits(problem)[0]}): the "
                     f"ping-pong tile, split-K's runs its work items")
    kg = problem.k // problem.groups
    item = 4 if problem.dtype == "float32" else 2
    deep_k_tiles = math.ceil(problem.kh * problem.kw * _pieces(problem)[0][1] // problem.groups * item / 128)
    few_pixels = problem.n * problem.ho * problem.wo < WGMMA_MIN_NARROW_PIXELS and kg <= 64
    if _nchw_a_vec(problem):
        pixel_rows = config_named(problem.dtype, PIXEL_ROWS_CONFIG)
        min_channels, min_k_tiles = NCHW_A_WGMMA_MIN_CHANNELS[item], NCHW_A_WGMMA_MIN_K_TILES[item]
        min_blocks = NCHW_A_WGMMA_MIN_BLOCKS[item]
        whole_rows = problem.c // problem.groups * item % 128 == 0 or not NCHW_A_WGMMA_WHOLE_K_ROWS[item]
        if kg >= min_channels and deep_k_tiles >= min_k_tiles and whole_rows and \
                not _wgmma_refusal(problem, compute_capability) and (blocks := _blocks(problem, pixel_rows)) >= min_blocks:
            return pixel_rows, (
                f"wgmma; {kg} output channels per group (>= {min_channels}), {blocks} blocks of 128 x 128 "
                f"(>= {min_blocks}, split-K's runs counted), {deep_k_tiles} k rows of 128 bytes "
                f"(>= {min_k_tiles}): the NCHW input's fragments loaded into registers")
    elif not _wgmma_refusal(problem, compute_capability) and deep_k_tiles >= MIN_DEEP_K_TILES and \
            kg >= GEMM_MIN_GROUP_CHANNELS and not few_pixels:
        return _choose_wgmma_config(problem)
    if _nchw_a_mode(problem) == NCHW_A_POINTWISE:
        small = next(c for c in NHWC_CONFIGS[problem.dtype] if c.bm == 64 and not c.wgmma and
                     (c.bk * item == 128) == (deep_k_tiles >= MIN_DEEP_K_TILES))
        if (tiles := math.prod(gemm_grid(problem, small))) <= SMALL_POINTWISE_MAX_TILES:
            return small, (f"1x1, NCHW read in place: {tiles} tiles of 64 x 64 (<= {SMALL_POINTWISE_MAX_TILES}), k "
                           f"rows of {small.bk * item} bytes")
    deep = _deep(problem) and deep_k_tiles >= MIN_DEEP_K_TILES
    candidates = [c for c in NHWC_CONFIGS[problem.dtype]
                  if (c.bk * item == 128) == deep and not c.wgmma and c.bm == 128]
    by_width = {c.bn: c for c in candidates}
    depth = f"k rows of {by_width[64].bk * item} bytes"
    if 64 < kg <= 96:
        return by_width[96], f"{kg} output channels per group fit one 96-channel tile; {depth}"
    if kg > 96:
        blocks = math.prod(gemm_grid(problem, by_width[128]))
        if blocks >= WIDE_TILE_BLOCKS:
            return by_width[128], f"{kg} output channels per group, {blocks} blocks of 128 channels; {depth}"
        return by_width[64], (f"{kg} output channels per group; 128-channel tiles would make {blocks} blocks "
                              f"(< {WIDE_TILE_BLOCKS}), 64-channel ones twice as many; {depth}")
    if kg <= NARROW_TILE_CHANNELS:
        return by_width[NARROW_TILE_CHANNELS], f"{kg} output channels per group: one 32-channel tile; {depth}"
    return by_width[64], f"{kg} output channels per group: one 64-channel tile; {depth}"


def _small_wide_tile(problem: ConvProblem, compute_capability: int) -> GemmConfig | None:
    """SMALL_WIDE_CONFIG where the rules take it for ``problem`` (SMALL_WIDE_* above), else None."""
    if problem.dtype not in ("float16", "bfloat16") or problem.layout != "NHWC" or problem.groups != 1 or \
            problem.k % 128 or _nchw_a_vec(problem):
        return None
    cfg = config_named(problem.dtype, SMALL_WIDE_CONFIG)
    (vec, channels_padded), why_not = _pieces(problem)
    if why_not or vec != 16 or _wgmma_refusal(problem, compute_capability, cfg):
        return None
    k_tiles, tiles = reduction_tiles(problem, cfg, channels_padded), math.prod(gemm_grid(problem, cfg))
    return cfg if k_tiles <= SMALL_WIDE_MAX_K_TILES and SMALL_WIDE_MIN_TILES <= tiles <= H100_SMS else None


def _choose_wgmma_config(problem: ConvProblem) -> tuple[GemmConfig, str]:
    """The wgmma tile (see _choose_config for where): _larger_wgmma_config's, or where that is not a
    producer tile and its blocks (split-K's runs counted) are fewer than SMALL_TILE_MAX_BLOCKS, one
    warpgroup's 64 x 64 tile where it makes at most SMALL_TILE_MAX_BLOCKS tiles and, its own runs
    counted, no fewer blocks (with fewer, the larger tiles' runs are shorter per MMA: slower) -- but for
    16-bit 1x1 channels-last layers, which ran faster on it with fewer blocks too."""
    cfg, why = _larger_wgmma_config(problem)
    if cfg.producer_warps:
        return cfg, why
    small = config_named(problem.dtype, SMALL_TILE_CONFIG)
    blocks, tiles, small_blocks = _blocks(problem, cfg), math.prod(gemm_grid(problem, small)), _blocks(problem, small)
    fewer_pay = problem.kh * problem.kw == 1 and problem.dtype != "float32" and problem.layout == "NHWC"
    if blocks < SMALL_TILE_MAX_BLOCKS and tiles <= SMALL_TILE_MAX_BLOCKS and (small_blocks >= blocks or fewer_pay):
        return small, (f"wgmma; {cfg.name} would make {blocks} blocks (< {SMALL_TILE_MAX_BLOCKS}); one warpgroup's "
                       f"64 pixels x 64 channels make {tiles} tiles (<= {SMALL_TILE_MAX_BLOCKS}), {small_blocks} "
                       f"blocks with split-K's runs")
    return cfg, why


def _larger_wgmma_config(problem: ConvProblem) -> tuple[GemmConfig, str]:
    """The wgmma tile of 128 pixels or more: for up to 64 output channels per group, warpgroups
    of 64 channels x 128 pixels, two per block -- or, for a float32 NHWC input of a short reduction
    that those would read from a rounded copy, the 256 x 64 producer tile, which reads it in place; for
    more, a producer tile of 128 channels where WGMMA_WIDE_TILE_BLOCKS blocks of 128 x 128 or more fill
    the GPU (_fewest_waves), the 3-stage 128 x 128 tile where the producer tiles cannot run, else the
    128 x 128 producer tile with split-K where its reduction and runs are long and fill the SMs
    (PRODUCER_SPLIT_*), else one warpgroup of 64 channels x 128 pixels per block (twice the blocks).

    The producer tiles run layers of one group whose channels fill whole k tiles, of more than one tap
    or (1x1) at least PRODUCER_MIN_ONE_TAP_K_TILES k tiles, and whose windows their im2col map walks
    (im2col_map_fits)."""
    kg = problem.k // problem.groups
    by_pixels = {c.bm: c for c in NHWC_CONFIGS[problem.dtype] if c.wgmma == WGMMA_CHANNEL_ROWS}
    producer = next(c for c in NHWC_CONFIGS[problem.dtype] if c.wgmma == WGMMA_PIXEL_ROWS_PRODUCER and c.cluster == 1)
    channels_padded = _pieces(problem)[0][1]
    k_tiles = reduction_tiles(problem, producer, channels_padded)
    producer_runs = (problem.kh * problem.kw > 1 or k_tiles >= PRODUCER_MIN_ONE_TAP_K_TILES) and \
        problem.groups == 1 and channels_padded % producer.bk == 0 and im2col_map_fits(problem)
    if kg <= 64:
        narrow = config_named(problem.dtype, NARROW_PRODUCER_CONFIG)
        if producer_runs and k_tiles <= NARROW_PRODUCER_MAX_K_TILES and \
                _x_copied(problem, channels_padded, by_pixels[256]) and not _x_copied(problem, channels_padded, narrow):
            return narrow, (f"wgmma; {kg} output channels per group: one 64-channel tile of 256 pixels copied "
                            f"by TMA (a producer warpgroup), x read in place")
        return by_pixels[256], f"wgmma; {kg} output channels per group: one 64-channel tile"
    wide = next(c for c in NHWC_CONFIGS[problem.dtype] if c.wgmma == WGMMA_PIXEL_ROWS)
    blocks = math.prod(gemm_grid(problem, wide))
    if blocks >= WGMMA_WIDE_TILE_BLOCKS:
        if producer_runs and blocks > SPLIT_K_MAX_BLOCKS:
            return _fewest_waves(problem, producer, channels_padded)
        return wide, f"wgmma; {kg} output channels per group, {blocks} blocks of 128 channels"
    if producer_runs and k_tiles >= PRODUCER_SPLIT_MIN_K_TILES:
        grid = gemm_grid(problem, producer)
        splits = _splits(problem, producer, grid, channels_padded, _index(problem, producer, channels_padded))
        if splits * blocks >= PRODUCER_SPLIT_MIN_BLOCKS and math.ceil(k_tiles / splits) >= PRODUCER_SPLIT_MIN_RUN:
            return producer, (f"wgmma; {kg} output channels per group, {blocks} blocks of 128 channels "
                              f"(< {WGMMA_WIDE_TILE_BLOCKS}) copied by TMA (a producer warpgroup), each "
                              f"reduction split")
    return by_pixels[128], (f"wgmma; {kg} output channels per group; 128-channel tiles would make {blocks} "
                            f"blocks (< {WGMMA_WIDE_TILE_BLOCKS}), 64-channel ones twice as many")


def _fewest_waves(problem: ConvProblem, producer: GemmConfig, channels_padded: int) -> tuple[GemmConfig, str]:
    """Of the producer tiles of 128 channels (``producer``: the 128-pixel one), the one of the fewest
    waves of blocks times its block time (PRODUCER_BLOCK_COST; on ties the shorter), the taller ones
    only where a wave of their blocks reads at most TALL_PRODUCER_MAX_WAVE_BYTES of x (its taps read
    it again; 1x1 layers read it once) and where they read x as the 128-pixel tile does (a float32
    input the 256-pixel tile would read from a rounded copy only where that one copies it too). In
    pairs (PAIR_BLOCK_COST; an even number of channel tiles) a wave reads half the pixels: the taller
    tiles run in pairs where alone their wave would overflow L2."""
    item = 4 if problem.dtype == "float32" else 2

    def cost(c: GemmConfig) -> float:
        return math.ceil(math.prod(gemm_grid(problem, c)) / H100_SMS) * PRODUCER_BLOCK_COST[c.bm] * \
            (PAIR_BLOCK_COST if c.cluster > 1 else 1.0)

    def fits(c: GemmConfig) -> bool:
        if c.cluster > 1 and (gemm_grid(problem, c)[1] % c.cluster or _index(problem, c, channels_padded) != "int"):
            return False
        wave_bytes = min(problem.n * problem.h * problem.w, H100_SMS * c.bm // c.cluster) * channels_padded * item
        return (c.bm == producer.bm and c.cluster == 1) or (
            (wave_bytes <= TALL_PRODUCER_MAX_WAVE_BYTES or problem.kh * problem.kw == 1) and
            _x_copied(problem, channels_padded, c) == _x_copied(problem, channels_padded, producer))

    best = min((c for c in NHWC_CONFIGS[problem.dtype]
                if c.wgmma == WGMMA_PIXEL_ROWS_PRODUCER and c.bn == 128 and fits(c)),
               key=lambda c: (cost(c), c.bm, c.cluster))
    return best, (f"wgmma; {problem.k // problem.groups} output channels per group, "
                  f"{math.prod(gemm_grid(problem, best))} blocks of {best.bm} pixels x 128 channels"
                  f"{' in pairs sharing their input tile' if best.cluster > 1 else ''} ({cost(best):.2f} waves of "
                  f"128-pixel blocks' time, the fewest of the producer tiles), copied by TMA (a producer warpgroup)")


def reduction_tiles(problem: ConvProblem, cfg: GemmConfig, channels_padded: int) -> int:
    """k tiles of ``cfg``'s reduction: kh kw taps of the (padded) channels per group, bk at a time (two taps of
    PAIRED_TAP_CHANNELS a k tile: the same count)."""
    return math.ceil(problem.kh * problem.kw * (channels_padded // problem.groups) / cfg.bk)


def _blocks(problem: ConvProblem, cfg: GemmConfig) -> int:
    """Blocks of ``cfg``'s grid for ``problem``, split-K's runs (as _splits would choose them) counted."""
    grid, channels = gemm_grid(problem, cfg), _pieces(problem)[0][1]
    return math.prod(grid) * _splits(problem, cfg, grid, channels, _index(problem, cfg, channels))


def _splits(problem: ConvProblem, cfg: GemmConfig, grid: tuple[int, int, int], channels_padded: int, index: str) -> int:
    """Runs of the reduction for split-K (1: none): up to SPLIT_K_TARGET_BLOCKS blocks for grids of
    at most SPLIT_K_MAX_BLOCKS tiles and reductions of SPLIT_K_MIN_REDUCTION k tiles or more, with
    32-bit indices (the split instances are compiled for those). ``grid``: cfg's gemm_grid."""
    k_tiles = reduction_tiles(problem, cfg, channels_padded)
    if math.prod(grid) > SPLIT_K_MAX_BLOCKS or k_tiles < SPLIT_K_MIN_REDUCTION or index != "int":
        return 1
    return split_k_runs(problem, grid, k_tiles, SPLIT_K_TARGET_BLOCKS // math.prod(grid), SPLIT_K_MIN_TILES)


def _blocks_per_sm(cfg: GemmConfig, dtype: str) -> int:
    """Blocks of a wgmma tile resident per SM: as the kernel's launch bounds ask of the registers
    (nhwc_min_blocks in kernels/implicit_gemm_nhwc.cu, 16-byte pieces, 32-bit indices) and as the
    shared memory holds."""
    item = 4 if dtype == "float32" else 2
    multiplying = 32 * cfg.warps_m * cfg.warps_n
    accumulators, pieces = cfg.bm * cfg.bn // multiplying, cfg.bm * cfg.bk * item // (16 * multiplying)
    by_registers = min(3, max(1, 65536 // (cfg.threads * (accumulators + 48 + 4 * pieces))))
    by_shared = SM_SHARED_BYTES // (_shared_bytes(cfg, dtype, False) + BLOCK_RESERVED_SHARED_BYTES)
    return max(1, min(by_registers, by_shared))


def _stream_k_blocks(problem: ConvProblem, cfg: GemmConfig, grid: tuple[int, int, int], k_tiles: int,
                     forced: bool | int | None) -> tuple[int, str]:
    """Stream-K's persistent blocks for ``cfg``'s ``grid`` of ``k_tiles`` each (0: whole tiles), and
    why; ``forced``: True or False forces it on or off, an int on with that many blocks (at most one
    per unit and FLAG_COUNT; None: the rule, STREAM_K_*)."""
    tiles = math.prod(grid)
    if forced is False or not tiles:  # an empty batch launches nothing
        return 0, ""
    if forced is not True and isinstance(forced, int):
        blocks = min(forced, tiles * k_tiles, FLAG_COUNT)
        return blocks, f"; stream-K forced: {blocks} blocks share the {tiles * k_tiles} tiles x k tiles"
    blocks = min(STREAM_K_SMS * _blocks_per_sm(cfg, problem.dtype), tiles * k_tiles)
    waves = tiles / STREAM_K_SMS
    balance = waves / math.ceil(waves)
    work = tiles * k_tiles * cfg.bm * cfg.bn / (blocks * 128 * 128)  # k tiles of 128 x 128 per block
    if forced is None and not (SPLIT_K_MAX_BLOCKS < tiles <= STREAM_K_MAX_WAVES * STREAM_K_SMS
                               and balance < STREAM_K_MAX_BALANCE and work >= STREAM_K_MIN_WORK * math.ceil(waves)):
        return 0, ""
    how = "forced" if forced else (f"{tiles} tiles keep {STREAM_K_SMS} SMs {balance:.0%} busy; {work:.0f} k tiles "
                                   f"of 128 x 128 a block")
    return blocks, f"; stream-K ({how}): {blocks} blocks share the {tiles * k_tiles} tiles x k tiles"


def make_plan(problem: ConvProblem, config: str | None = None, reason: str = "",
              compute_capability: int = 0, splits: int | None = None,
              stream_k: bool | int | None = None, space_to_depth: bool | None = None, *,
              nhwc_out: bool = True) -> LaunchPlan:
    """The channels-last GEMM launch: grid (pixel tiles, channel tiles, groups x splits), one block
    per tile and run of the reduction -- or, with stream-K, plan.stream_k_blocks persistent blocks
    over that grid's tiles. ``compute_capability``: of the GPU that will run it (90: the wgmma tiles
    may be chosen; 0: any GPU). ``splits`` forces split-K's runs (1: none; None: _splits);
    ``stream_k`` forces stream-K on (True, or an int: that many blocks; then no split-K unless
    ``splits`` says so, an error) or off (None: _stream_k_blocks' rule; wgmma tiles only);
    ``space_to_depth=False`` keeps the problem's own stride where space_to_depth_block would block it
    (None or True: the rule; the tuner tries both); ``nhwc_out=False``: the output is NCHW though ``problem`` is
    NHWC (a space-to-depth copy's problem), which the ping-pong tiles, writing NHWC alone, cannot run."""
    why_not = refusal(problem)
    if why_not:
        raise ValueError(f"kernel {KERNEL!r} cannot run this problem: {why_not}")
    if space_to_depth not in (None, True, False):
        raise ValueError(f"space_to_depth must be None, True or False, got {space_to_depth!r}")
    block = (1, 1) if space_to_depth is False else space_to_depth_block(problem)
    if block != (1, 1):  # the GEMM of the copies' problem; the copies round float32 to TF32
        blocked = space_to_depth_problem(problem, block)
        plan = make_plan(blocked, config, reason, compute_capability, splits, stream_k,
                         nhwc_out=problem.layout == "NHWC")
        return dataclasses.replace(plan, round_a=False, space_to_depth=block, reason=(
            f"{plan.reason}; space-to-depth: {problem.c} channels at stride {block} make no 16-byte pieces, so "
            f"each block of {block[0]} x {block[1]} input pixels is one pixel of {blocked.c} channels, a stride-1 "
            f"{blocked.kh}x{blocked.kw} convolution"))
    vec, channels_padded = _pieces(problem)[0]
    if config is not None:
        cfg = forced_config(NHWC_CONFIGS[problem.dtype], config, f"config for {KERNEL} in {problem.dtype}")
        why = "config forced by the caller"
        why_not = _wgmma_refusal(problem, compute_capability, cfg) if cfg.wgmma else ""
        if cfg.wgmma == WGMMA_PINGPONG and not nhwc_out:
            why_not = "it writes NHWC outputs alone (got an NCHW output of the space-to-depth copies' GEMM)"
        if why_not:
            raise ValueError(f"config {config!r} cannot run this problem: {why_not}")
    else:
        cfg, why = _choose_config(problem, compute_capability,
                                  pingpong=splits in (None, 1) and not stream_k and nhwc_out,
                                  pingpong_split=splits is None and not stream_k and nhwc_out)
        if cfg.producer_warps and stream_k:  # forced onto the tile it runs on
            cfg = config_named(problem.dtype, PIXEL_ROWS_CONFIG)
            why += f"; {cfg.name} instead: stream-K runs on it"
    a_from_nchw = _nchw_a_mode(problem)
    if a_from_nchw:
        shape = "1x1" if problem.kh * problem.kw == 1 else f"1-D, {problem.kw} taps shifting whole pieces"
        why += f"; {shape}: the NCHW input and KCHW weight read in place, {vec}-byte pieces of pixels"
    elif channels_padded != problem.c:
        why += f"; input copied with {channels_padded - problem.c} zero channel(s) for {vec}-byte pieces"
    round_a = problem.layout == "NHWC" and problem.dtype == "float32" and not _x_copied(problem, channels_padded, cfg)
    if round_a:
        why += "; NHWC input read in place, rounded to TF32 by the kernel (ROUND_A)"
    index = _index(problem, cfg, channels_padded)
    grid = gemm_grid(problem, cfg)
    if cfg.wgmma == WGMMA_PINGPONG:
        why_not = _pingpong_refusal(problem, cfg, channels_padded, index, splits, stream_k)
        if why_not:
            raise ValueError(f"config {cfg.name!r} cannot run this problem: {why_not}")
        tiles = strip_tiles(problem, cfg) if cfg.name in PIXEL_STRIPS_CONFIGS else math.prod(grid)
        if cfg.name == PINGPONG_CLUSTER_CONFIG:  # one block a work item, the clusters finishing their tiles
            splits = PINGPONG_CLUSTER_SPLITS[0] if splits is None else splits
            k_tiles = reduction_tiles(problem, cfg, channels_padded)
            if splits not in PINGPONG_CLUSTER_SPLITS or splits > k_tiles:
                raise ValueError(f"config {cfg.name!r} runs clusters of {PINGPONG_CLUSTER_SPLITS} blocks, at most one a "
                                 f"k tile ({k_tiles}); got splits={splits!r}")
            blocks = tiles * splits
            why += (f"; split-K in clusters of {splits} blocks, one a run of a tile, their sums added through "
                    f"distributed shared memory: {blocks} blocks")
        else:
            if splits is None:  # the rules' runs, for the 128 x 128 and 64-pixel tiles
                splits = pingpong_split_runs(problem, compute_capability) if cfg.name == PINGPONG_CONFIG else \
                    max(pingpong_64_pixel_runs(problem, compute_capability), 1) \
                    if cfg.name == PINGPONG_64_PIXEL_CONFIG else 1
                if splits > 1:
                    why += f"; split-K: {splits} runs of the reduction"
            else:
                check_splits(splits, grid, problem)
                why += f"; split-K forced: {splits} runs, each its own work item"
            blocks = min(tiles * splits, H100_SMS)
            why += f"; {tiles * splits} work items on {blocks} persistent blocks, two consumer warpgroups taking turns"
        taps = taps_per_k_tile(problem, cfg)
        if taps > 1:
            why += f"; {taps} taps of {problem.c} channels a k tile"
        strip = (problem.kw, strip_pixel_bytes(channels_padded, problem.dtype))
        if taps == PIXEL_STRIPS:
            why += (f"; a k tile a kernel row, its {problem.kw} taps read from strips of 64 + {problem.kw - 1} pixels "
                    f"of {strip[1]} bytes")
        return LaunchPlan(
            kernel=KERNEL, dtype=problem.dtype, index_type=index, config=cfg, grid=(blocks, 1, 1),
            block=(cfg.threads, 1, 1), shared_bytes=_shared_bytes(cfg, problem.dtype, False, strip),
            reason=f"{reason}; {why}" if reason else why, vec=vec, channels_padded=channels_padded, splits=splits,
            round_a=round_a, arch=WGMMA_ARCH, taps_per_k_tile=taps)
    if splits is None:  # stream-K finishes its tiles itself
        splits = 1 if stream_k else _splits(problem, cfg, grid, channels_padded, index)
        if splits > 1:
            why += (f"; split-K: {math.prod(grid)} tiles (<= {SPLIT_K_MAX_BLOCKS}) each reduce over {splits} runs "
                    f"of the {problem.kh * problem.kw * channels_padded // problem.groups} products")
    else:
        check_splits(splits, grid, problem)
        if splits > 1 and index != "int":
            raise ValueError(f"splits > 1 needs 32-bit indices; this problem {problem.x_shape} -> "
                             f"{problem.out_shape} needs 64-bit ones")
        why += f"; split-K forced: {splits} runs"
    stream_k_blocks = 0
    if not (stream_k is None or isinstance(stream_k, bool) or (isinstance(stream_k, int) and stream_k >= 1)):
        raise ValueError(f"stream_k must be None, True, False or a block count >= 1, got {stream_k!r}")
    if stream_k and (not cfg.wgmma or cfg.producer_warps or splits > 1 or index != "int" or a_from_nchw):
        raise ValueError(f"stream_k needs a wgmma tile, no split-K and 32-bit indices (and no producer "
                         f"warpgroup or NCHW input read in place); got {cfg.name}, {splits} split(s), {index} "
                         f"indices for {problem.x_shape} -> {problem.out_shape}")
    if cfg.producer_warps and (problem.groups > 1 or channels_padded % cfg.bk):
        raise ValueError(f"config {cfg.name!r} cannot run this problem: its producer warpgroup copies whole k tiles "
                         f"of one tap by TMA, one group, channels a multiple of {cfg.bk} (got {problem.groups} "
                         f"group(s), {channels_padded} channels)")
    if cfg.producer_warps and not im2col_map_fits(problem):
        raise ValueError(f"config {cfg.name!r} cannot run this problem: {_im2col_refusal(problem)}")
    if cfg.cluster > 1 and (grid[1] % cfg.cluster or index != "int"):
        raise ValueError(f"config {cfg.name!r} cannot run this problem: its blocks run in clusters of {cfg.cluster} "
                         f"channel tiles, with 32-bit indices (got {grid[1]} channel tiles of {cfg.bn}, {index} "
                         f"indices)")
    if cfg.wgmma and not cfg.producer_warps and splits == 1 and index == "int" and not a_from_nchw:
        stream_k_blocks, stream_k_why = _stream_k_blocks(problem, cfg, grid,
                                                         reduction_tiles(problem, cfg, channels_padded), stream_k)
        why += stream_k_why
    return LaunchPlan(
        kernel=KERNEL, dtype=problem.dtype, index_type=index,
        config=cfg, grid=(grid[0], grid[1], grid[2] * splits), block=(cfg.threads, 1, 1),
        shared_bytes=_shared_bytes(cfg, problem.dtype, a_from_nchw),
        reason=f"{reason}; {why}" if reason else why, vec=vec, channels_padded=channels_padded, a_from_nchw=a_from_nchw,
        round_a=round_a, splits=splits, stream_k_blocks=stream_k_blocks,
        arch=WGMMA_ARCH if cfg.wgmma else "")


def describe(plan: LaunchPlan) -> str:
    """The printed plan: tile, warps (or wgmma warpgroups), launch shape, the copies it reads and why."""
    c = plan.config
    warps = (f"one run of a tile a block, multiplied by one of its 2 warpgroups with wgmma ({plan.arch}; the "
             f"ping-pong tile in clusters of {plan.splits}), a producer warpgroup copying both operands by TMA"
             if c.name == PINGPONG_CLUSTER_CONFIG else
             "persistent blocks of 2 warpgroups each multiplying every other tile with wgmma while the other "
             f"stores its last ({plan.arch}; ping-pong), a producer warpgroup copying both operands by TMA"
             if c.wgmma == WGMMA_PINGPONG else
             f"{c.warps_m // 4} warpgroups of {'64 ch' if c.wgmma == WGMMA_CHANNEL_ROWS else '64 px'} with wgmma "
             f"({plan.arch})" + (", a producer warpgroup copying both operands by TMA" if c.producer_warps else "")
             + (f"; clusters of {c.cluster} channel tiles, each block copying 1/{c.cluster} of the input tile into "
                f"all ({PAIR_KERNEL})" if c.cluster > 1 else "")
             if c.wgmma else f"{c.warps_m}x{c.warps_n} warps")
    made = "copies made first" if plan.layout == "NCHW" else "operands (copied first unless read in place)"
    reads = "" if plan.a_from_nchw else (
        f"  reads channels-last {made}: input [N][H][W][{plan.channels_padded}], weight "
        f"[K][kh][kw][{plan.channels_padded} / groups], in {plan.vec}-byte pieces\n")
    if plan.space_to_depth != (1, 1):
        bh, bw = plan.space_to_depth
        reads = (f"  reads space-to-depth copies made first ({SPACE_TO_DEPTH}): each block of {bh} x {bw} input "
                 f"pixels one pixel of {plan.channels_padded} channels, [N][Ho + kh' - 1][Wo + kw' - 1]"
                 f"[{plan.channels_padded}], the weight [K][kh'][kw'][{plan.channels_padded}] (kh' = ceil(kh / {bh}), "
                 f"kw' = ceil(kw / {bw})), a stride-1 convolution in {plan.vec}-byte pieces\n")
    if plan.splits > 1 and c.name == PINGPONG_CLUSTER_CONFIG:
        reads += (f"  split-K: clusters of {plan.splits} blocks, one a run of a tile, add their float32 sums in run "
                  f"order through distributed shared memory (the same bits on every run)\n")
    elif plan.splits > 1:
        reads += (f"  split-K: {plan.splits} runs of the reduction write float32 partial sums to the workspace, "
                  f"added in order by {REDUCE_KERNEL} (the same bits on every run)\n")
    if plan.stream_k_blocks:
        reads += (f"  stream-K: {plan.stream_k_blocks} persistent blocks ({STREAM_K_KERNEL}) share the grid's "
                  f"tiles x k tiles equally; a tile's owner adds the other blocks' float32 sums in block order "
                  f"(the same bits on every run)\n")
    return describe_tiles(plan, warps, reads)


def _index(problem: ConvProblem, cfg: GemmConfig, channels_padded: int) -> str:
    """The index type of ``cfg``'s GEMM: 64-bit where x, its copy or the output needs it."""
    copy = problem.n * channels_padded * problem.h * problem.w if _x_copied(problem, channels_padded, cfg) else 0
    return index_type(problem, copy)


def _x_copied(problem: ConvProblem, channels_padded: int, cfg: GemmConfig) -> bool:
    """Whether the GEMM reads a copy of x: NCHW inputs but those read in place (_nchw_a_vec); NHWC inputs that
    need zero channels, and float32 ones with more than one tap rounded to TF32 by the copy where
    ``cfg`` would round them in shared memory at every k tile (the kernel rounds float32 inputs it
    reads in place itself: LaunchPlan.round_a, its ROUND_A; mma.sync tiles and the 128-pixel
    producer's in registers, the other wgmma tiles in shared memory), and every float32 input of the
    256-pixel producer tile; on the 128 x 128 ping-pong tiles, float32 inputs of more than one tap
    and PINGPONG_TF32_COPY_MIN_TILES tiles (PINGPONG_TF32_COPY_CHANNELS)."""
    if problem.layout == "NCHW":
        return not _nchw_a_vec(problem)
    rounding = _float32_rounding(cfg)
    many_taps = problem.kh * problem.kw != 1
    pingpong_copy = _pingpong_may_copy(cfg) and math.prod(gemm_grid(problem, cfg)) >= PINGPONG_TF32_COPY_MIN_TILES
    return channels_padded != problem.c or (problem.dtype == "float32" and (
        rounding == "copy" or (rounding == "shared" and many_taps) or (pingpong_copy and many_taps)))


def _pingpong_may_copy(cfg: GemmConfig) -> bool:
    """Whether the ping-pong tile ``cfg`` reads a float32 x of more than one tap from a rounded copy where it makes
    enough tiles (PINGPONG_TF32_COPY_*): the 128 x 128 tiles; the 64-pixel ones always read it in place."""
    return cfg.wgmma == WGMMA_PINGPONG and cfg.bn >= PINGPONG_TF32_COPY_CHANNELS and cfg.bm == 128


def _float32_rounding(cfg: GemmConfig) -> str:
    """Where ``cfg``'s kernel rounds a float32 input it reads in place to TF32 (kernels/implicit_gemm_nhwc.cu
    ROUND_IN_REGISTERS / ROUND_IN_SHARED): "registers" (mma.sync's fragments, the producer tiles' wgmma
    A registers), "shared" (the other wgmma tiles), or "copy" where it cannot (the 256 x 128 producer
    tile: in registers it spills at the 96 registers 640 threads leave), which reads a rounded copy."""
    if not cfg.wgmma:
        return "registers"
    if cfg.producer_warps:
        return "copy" if (cfg.bm, cfg.bn) == (256, 128) else "registers"  # alone or in pairs
    return "shared"


def _weight_channels_last(problem: ConvProblem) -> bool:
    """Whether the weight's memory is [K][kh][kw][C / groups]: KHWC, or a 1x1 weight in either layout
    (the same memory; torch calls a 1x1 weight contiguous, not channels_last)."""
    return problem.weight_layout == "KHWC" or problem.kh * problem.kw == 1


def _weight_copied(problem: ConvProblem, channels_padded: int) -> bool:
    """Whether the GEMM reads a prepared weight: KCHW weights of more than one tap; channels-last ones
    that need zero channels or TF32 rounding (but not those the NCHW_A path reads in place,
    rounding fragments itself)."""
    if _nchw_a_vec(problem):
        return False
    return not _weight_channels_last(problem) or channels_padded != problem.c or problem.dtype == "float32"


def specialisation(dtype: str, index: str, cfg: GemmConfig, vec: int, a_from_nchw: int, nhwc_out: bool,
                   round_a: bool = False, split_k: bool = False) -> str:
    """The C++ template instance of ``cfg`` gathering ``vec``-byte pieces (of the NCHW input where
    ``a_from_nchw``: NCHW_A_POINTWISE or NCHW_A_ROW_TAPS; else of channels-last x), writing an NHWC
    output where ``nhwc_out``, rounding an unrounded float32 input to TF32 in shared memory where
    ``round_a``, and writing split-K's partial sums where ``split_k``."""
    flags = ",".join(str(flag).lower() for flag in (cfg.wgmma, nhwc_out, round_a, split_k))
    return (f"cupyconv::{KERNEL}<{CTYPES[dtype]},{index},{cfg.bm},{cfg.bn},{cfg.bk},"
            f"{cfg.warps_m},{cfg.warps_n},{cfg.stages},{vec},{int(a_from_nchw)},{flags}>")


def stream_k_specialisation(dtype: str, cfg: GemmConfig, nhwc_out: bool, round_a: bool) -> str:
    """The C++ template instance of stream-K with ``cfg``'s wgmma tile, 16-byte pieces, 32-bit indices."""
    flags = ",".join(str(flag).lower() for flag in (nhwc_out, round_a))
    return (f"cupyconv::{STREAM_K_KERNEL}<{CTYPES[dtype]},int,{cfg.bm},{cfg.bn},{cfg.bk},{cfg.warps_m},{cfg.warps_n},"
            f"{cfg.stages},16,{cfg.wgmma},{flags}>")


def tma_specialisation(dtype: str, index: str, cfg: GemmConfig, nhwc_out: bool, round_a: bool = False,
                       split_k: bool = False) -> str:
    """The C++ template instance of the producer warpgroup's tile reading its input and weight by TMA
    (``round_a``: a float32 NHWC input read in place, rounded to TF32 in registers; ``split_k``: writing
    split-K's partial sums)."""
    flags = ",".join(str(flag).lower() for flag in (nhwc_out, round_a, split_k))
    kernel = PAIR_KERNEL if cfg.cluster > 1 else TMA_KERNEL
    return (f"cupyconv::{kernel}<{CTYPES[dtype]},{index},{cfg.bm},{cfg.bn},{cfg.bk},{cfg.warps_m},{cfg.warps_n},"
            f"{cfg.stages},16,{cfg.wgmma},{flags}>")


def pingpong_specialisation(dtype: str, cfg: GemmConfig, residual: bool, split_k: bool = False,
                            round_a: bool = False, taps: int = 1) -> str:
    """The C++ template instance of the ping-pong tile ``cfg``, for calls with a residual or without, or for
    split-K's runs; ``round_a``: a float32 x read in place, rounded to TF32 in the consumers' registers; ``taps``
    a k tile (taps_per_k_tile)."""
    flags = ",".join(str(flag).lower() for flag in (residual, split_k, round_a))
    return f"cupyconv::{PINGPONG_KERNEL}<{CTYPES[dtype]},{cfg.bm},{cfg.bn},{cfg.stages},{taps},{flags}>"


def pixel_strips_specialisation(dtype: str, cfg: GemmConfig, pixel_bytes: int, residual: bool) -> str:
    """The C++ template instance of the pixel strips' tile ``cfg`` for pixels of ``pixel_bytes``."""
    return (f"cupyconv::{PIXEL_STRIPS_KERNEL}<{CTYPES[dtype]},{cfg.bm},{cfg.bn},{cfg.stages},{pixel_bytes},"
            f"{str(residual).lower()}>")


def pingpong_cluster_specialisation(dtype: str, cfg: GemmConfig, splits: int, round_a: bool = False) -> str:
    """The C++ template instance of the ping-pong tile's split-K in clusters of ``splits`` blocks."""
    return (f"cupyconv::{PINGPONG_CLUSTER_KERNEL}<{CTYPES[dtype]},{cfg.bm},{cfg.bn},{cfg.stages},{splits},"
            f"{str(round_a).lower()}>")


def name_expression(plan: LaunchPlan) -> str:
    """The specialisation ``plan`` launches."""
    if plan.config.name == PINGPONG_CLUSTER_CONFIG:
        return pingpong_cluster_specialisation(plan.dtype, plan.config, plan.splits, plan.round_a)
    if plan.config.name in PIXEL_STRIPS_CONFIGS:
        return pixel_strips_specialisation(plan.dtype, plan.config, strip_pixel_bytes(plan.channels_padded, plan.dtype),
                                           plan.has_residual)
    if plan.config.wgmma == WGMMA_PINGPONG:
        return pingpong_specialisation(plan.dtype, plan.config, plan.has_residual and plan.splits == 1,
                                       plan.splits > 1, plan.round_a, plan.taps_per_k_tile)
    if plan.config.producer_warps:
        return tma_specialisation(plan.dtype, plan.index_type, plan.config, plan.layout == "NHWC", plan.round_a,
                                  plan.splits > 1)
    if plan.stream_k_blocks:
        return stream_k_specialisation(plan.dtype, plan.config, plan.layout == "NHWC", plan.round_a)
    return specialisation(plan.dtype, plan.index_type, plan.config, plan.vec, plan.a_from_nchw, plan.layout == "NHWC",
                          plan.round_a, plan.splits > 1)


def _gemm_specialisations(wgmma: bool) -> list[str]:
    """The mma.sync ones (any GPU), or the wgmma ones (sm_90a: 16-byte pieces from channels-last x only);
    split-K's with 32-bit indices alone (_splits)."""
    return [specialisation(dtype, index, cfg, vec, a_from_nchw, nhwc_out, round_a, split_k) for dtype in GEMM_DTYPES
            for index in INDEX_TYPES for cfg in NHWC_CONFIGS[dtype] if bool(cfg.wgmma) == wgmma and not cfg.producer_warps
            for vec in (NHWC_VECS if not wgmma or cfg.name == PIXEL_ROWS_CONFIG else (16,))
            for a_from_nchw, nhwc_out, round_a in _gemm_flags(wgmma, cfg, dtype, vec)
            for split_k in ((False, True) if index == "int" else (False,))] + \
        [tma_specialisation(dtype, index, cfg, nhwc_out, round_a, split_k) for dtype in GEMM_DTYPES
         for index in INDEX_TYPES for cfg in NHWC_CONFIGS[dtype]
         if wgmma and cfg.wgmma == WGMMA_PIXEL_ROWS_PRODUCER and (cfg.cluster == 1 or index == "int")
         for nhwc_out, round_a in ((False, False), (True, False))
         + (((True, True),) if dtype == "float32" and _float32_rounding(cfg) != "copy" else ())
         for split_k in ((False, True) if index == "int" else (False,))] + \
        [pingpong_specialisation(dtype, cfg, residual, split_k, round_a) for dtype in GEMM_DTYPES
         for cfg in NHWC_CONFIGS[dtype] if wgmma and cfg.name in PINGPONG_WHOLE_CONFIGS
         for residual, split_k in ((False, False), (True, False), (False, True)) if cfg.bm == 128 or not residual
         for round_a in _pingpong_round_a(dtype, cfg)] + \
        [pingpong_specialisation(dtype, cfg, residual, taps=2) for dtype in GEMM_DTYPES if STORAGE_BYTES[dtype] == 2
         for cfg in NHWC_CONFIGS[dtype] if wgmma and cfg.name in PAIRED_TAP_CONFIGS for residual in (False, True)] + \
        [pixel_strips_specialisation(dtype, config_named(dtype, name), strip_pixel_bytes(channels, dtype), residual)
         for dtype in GEMM_DTYPES if STORAGE_BYTES[dtype] == 2 and wgmma
         for name, tile_channels in PIXEL_STRIPS_CHANNELS.items() for channels in tile_channels
         for residual in (False, True)] + \
        [pingpong_cluster_specialisation(dtype, cfg, splits, round_a) for dtype in GEMM_DTYPES
         for cfg in NHWC_CONFIGS[dtype] if wgmma and cfg.name == PINGPONG_CLUSTER_CONFIG
         for splits in PINGPONG_CLUSTER_SPLITS for round_a in _pingpong_round_a(dtype, cfg)]


def _pingpong_round_a(dtype: str, cfg: GemmConfig) -> tuple[bool, ...]:
    """The ROUND_A flags of the ping-pong tile ``cfg``'s instances: float32 read in place, and from a rounded copy
    where the tile may read one (_pingpong_may_copy); 16 bits never round."""
    if dtype != "float32":
        return (False,)
    return (False, True) if _pingpong_may_copy(cfg) else (True,)


def _gemm_flags(wgmma: bool, cfg: GemmConfig, dtype: str, vec: int) -> tuple[tuple[int, bool, bool], ...]:
    """(a_from_nchw, nhwc_out, round_a) of ``cfg``'s instances gathering ``vec``-byte pieces: of channels-last
    x (mma.sync: every piece; wgmma: 16 bytes) with an NCHW or NHWC output, a float32 NHWC input read in
    place; and of the NCHW input read in place: 1x1 (every mma.sync tile; on wgmma the 3-stage pixel-row
    tile) and 1-D (mma.sync)."""
    flags = ()
    if not wgmma or vec == 16:
        flags = ((0, False, False), (0, True, False)) + (((0, True, True),) if dtype == "float32" else ())
    if not wgmma or cfg.name == PIXEL_ROWS_CONFIG:
        flags += ((NCHW_A_POINTWISE, False, False),)
    if not wgmma:
        flags += ((NCHW_A_ROW_TAPS, False, False),)
    return flags


def _copy_specialisation(kernel: str, dtype: str, round_tf32: bool) -> str:
    return f"cupyconv::{kernel}<{CTYPES[dtype]},{'true' if round_tf32 and dtype == 'float32' else 'false'}>"


def _pairs_specialisation(dtype: str) -> str:
    return f"cupyconv::{CHANNELS_LAST_PAIRS}<{CTYPES[dtype]}>"


def channels_last_specialisations() -> list[str]:
    """The copies of this family's operands (float32 rounded to TF32), the exact ones of every dtype
    (simt_gemm_conv2d's transposed weight; layouts.py's transposes) and the NHWC operands' padding."""
    roundings = [(dtype, True) for dtype in GEMM_DTYPES] + [("float32", False), ("float64", False)]
    return [_copy_specialisation(kernel, dtype, round_tf32)
            for kernel in (CHANNELS_LAST_TILED, CHANNELS_LAST_NARROW) for dtype, round_tf32 in roundings] + \
        [_pairs_specialisation(dtype) for dtype in GEMM_DTYPES if STORAGE_BYTES[dtype] == 2] + \
        [_copy_specialisation(PAD_CHANNELS, dtype, round_tf32) for dtype, round_tf32 in roundings
         if dtype != "float64"]


def specialisations() -> list[str]:
    """The mma.sync GEMMs (of one convolution and of stride phases), split-K's reductions and the
    channels-last copies (any GPU)."""
    return _gemm_specialisations(wgmma=False) + _phases_specialisations(wgmma=False) + \
        [reduce_specialisation(dtype, "int") for dtype in GEMM_DTYPES if dtype != "float32"] + \
        channels_last_specialisations() + \
        [_space_to_depth_specialisation(dtype, nhwc) for dtype in GEMM_DTYPES for nhwc in (False, True)]


def _stream_k_specialisations() -> list[str]:
    return [stream_k_specialisation(dtype, cfg, nhwc_out, round_a) for dtype in GEMM_DTYPES
            for cfg in NHWC_CONFIGS[dtype] if cfg.wgmma and not cfg.producer_warps
            for nhwc_out, round_a in ((False, False), (True, False)) + (((True, True),) if dtype == "float32" else ())]


def arch_specialisations() -> dict[str, list[str]]:
    """NVRTC target -> the name expressions that compile for it alone (the wgmma tiles, stream-K's too)."""
    return {WGMMA_ARCH: _gemm_specialisations(wgmma=True) + _phases_specialisations(wgmma=True)
            + _stream_k_specialisations() + _stacked_specialisations()}


def channels_last_copy(dtype: str, n: int, c: int, positions: int, channels_padded: int, round_tf32: bool,
                       source: Pointer, copy: Pointer) -> Launch:
    """The launch (kernels/nchw_to_nhwc.cu) copying the C-contiguous [n][c][positions] ``source`` to
    [n][positions][channels_padded] at ``copy``, zero channels past c; float32 rounded to TF32 on the
    way where ``round_tf32`` (the tensor-core GEMM's operands), kept exact otherwise (the FMA GEMM's
    transposed weight)."""
    if channels_padded <= NARROW_CHANNELS:
        kernel, grid, block = CHANNELS_LAST_NARROW, (math.ceil(positions / 256), n, 1), (256, 1, 1)
    elif STORAGE_BYTES[dtype] == 2 and positions % 2 == 0 and channels_padded % 2 == 0:  # whole 4-byte pairs
        return Launch(CHANNELS_LAST_PAIRS, _pairs_specialisation(dtype),
                      (math.ceil(positions / 64), math.ceil(channels_padded / 64), n), (32, 8, 1), 0,
                      (source, copy, c, positions, channels_padded))
    else:
        kernel, grid, block = (CHANNELS_LAST_TILED, (math.ceil(positions / 32), math.ceil(channels_padded / 32), n),
                               (32, 8, 1))
    return Launch(kernel, _copy_specialisation(kernel, dtype, round_tf32), grid, block, 0,
                  (source, copy, c, positions, channels_padded))


def pad_channels(dtype: str, rows: int, c: int, channels_padded: int, source: Pointer, copy: Pointer,
                 round_tf32: bool = True) -> Launch:
    """The launch (kernels/nchw_to_nhwc.cu) copying [rows][c] at ``source`` to [rows][channels_padded]
    at ``copy``, zero channels past c, float32 rounded to TF32 where ``round_tf32`` (the forward GEMM's
    operands; the weight gradient rounds its own)."""
    return Launch(PAD_CHANNELS, _copy_specialisation(PAD_CHANNELS, dtype, round_tf32),
                  (math.ceil(rows * channels_padded / 256), 1, 1), (256, 1, 1), 0, (source, copy, c, rows, channels_padded))


def _weight_preparation(problem: ConvProblem, channels_padded: int) -> WeightPreparation:
    """The weight as [K][kh][kw][Cgp], Cgp = channels_padded / groups (zero channels past C / groups),
    float32 rounded to TF32: transposed from KCHW, or padded and rounded from channels-last memory."""
    p, cg, cgp = problem, problem.c // problem.groups, channels_padded // problem.groups
    if _weight_channels_last(p):
        copy = pad_channels(p.dtype, p.k * p.kh * p.kw, cg, cgp, Pointer(WEIGHT), Pointer(PREPARED))
    else:
        copy = channels_last_copy(p.dtype, p.k, cg, p.kh * p.kw, cgp, True, Pointer(WEIGHT), Pointer(PREPARED))
    return WeightPreparation((KERNEL, p.dtype, p.weight_shape, p.weight_layout, cgp),
                             p.k * p.kh * p.kw * cgp * STORAGE_BYTES[p.dtype], (copy,))


def _space_to_depth_weight(problem: ConvProblem, blocked: ConvProblem, block: tuple[int, int]) -> WeightPreparation:
    """The weight in ``blocked``'s form (space_to_depth_problem): [K][kh'][kw'][Cs], float32 rounded to TF32."""
    p = problem
    copy = space_to_depth_copy(p.dtype, p.weight_layout == "KHWC", (p.k, p.c, p.kh, p.kw),
                               (blocked.kh, blocked.kw, blocked.c), block, (0, 0), Pointer(WEIGHT), Pointer(PREPARED))
    return WeightPreparation((KERNEL, SPACE_TO_DEPTH, p.dtype, p.weight_shape, p.weight_layout, block),
                             p.k * blocked.kh * blocked.kw * blocked.c * STORAGE_BYTES[p.dtype], (copy,))


def program(plan: LaunchPlan, problem: ConvProblem) -> CallProgram:
    """The GEMM on channels-last operands: x and the weight read in place where they are in the form
    it reads, else copied first (x into the workspace, the weight as the prepared weight), or, where
    the plan blocks a strided layer's pixels (plan.space_to_depth), both copied so and the blocked
    stride-1 problem run on them; with split-K, its partial sums in the workspace (after x's copy) and
    their reduction."""
    p = problem
    x, workspace, launches = Pointer(X), 0, []
    if plan.space_to_depth != (1, 1):  # the GEMM runs the blocked problem (in the output's layout) on copies
        p = dataclasses.replace(space_to_depth_problem(problem, plan.space_to_depth), layout=problem.layout)
        x, workspace = Pointer(WORKSPACE), align(p.n * p.h * p.w * p.c * STORAGE_BYTES[p.dtype])
        launches.append(space_to_depth_copy(p.dtype, problem.layout == "NHWC", problem.x_shape, (p.h, p.w, p.c),
                                            plan.space_to_depth, (problem.pad_top, problem.pad_left), Pointer(X), x))
        weight = _space_to_depth_weight(problem, p, plan.space_to_depth)
    else:
        if _x_copied(p, plan.channels_padded, plan.config):
            x, workspace = Pointer(WORKSPACE), align(p.n * p.h * p.w * plan.channels_padded * STORAGE_BYTES[p.dtype])
            if p.layout == "NHWC":
                launches.append(pad_channels(p.dtype, p.n * p.h * p.w, p.c, plan.channels_padded, Pointer(X), x))
            else:
                launches.append(channels_last_copy(p.dtype, p.n, p.c, p.h * p.w, plan.channels_padded, True,
                                                   Pointer(X), x))
        weight = _weight_preparation(p, plan.channels_padded) if _weight_copied(p, plan.channels_padded) else None
    weight_pointer = Pointer(PREPARED) if weight else Pointer(WEIGHT)
    if plan.stream_k_blocks:
        # The blocks' float32 slots in the workspace (after x's copy); the flags are the FLAGS operand.
        partials = Pointer(WORKSPACE, workspace)
        tiles_m, tiles_n, _ = plan.grid
        launch = conv_launch(plan, p, tiles_m, tiles_n, reduction_tiles(p, plan.config, plan.channels_padded), partials,
                             Pointer(FLAGS), x=x, weight=weight_pointer, channels=plan.channels_padded)
        launches.append(dataclasses.replace(launch, kernel=STREAM_K_KERNEL, grid=(plan.stream_k_blocks, 1, 1)))
        slots = 4 * plan.stream_k_blocks * plan.config.bm * plan.config.bn
        return CallProgram(tuple(launches), workspace + slots, weight)
    if plan.splits == 1 or plan.config.name == PINGPONG_CLUSTER_CONFIG:  # the clusters finish their tiles
        launches.append(_with_tensor_maps(plan, p, conv_launch(plan, p, plan.splits, 0, x=x, weight=weight_pointer,
                                                               channels=plan.channels_padded), x, weight_pointer))
        return CallProgram(tuple(launches), workspace, weight)
    partial = Pointer(WORKSPACE, workspace)
    # The bias is the reduction's to add.
    launches += [_with_tensor_maps(plan, p, conv_launch(plan, p, plan.splits, math.prod(p.out_shape), x=x,
                                                        weight=weight_pointer, out=partial,
                                                        channels=plan.channels_padded, partial=True),
                                   x, weight_pointer),
                 split_k_reduce(p.dtype, plan.index_type, p, plan.splits, partial, Pointer(OUT), p.layout == "NHWC")]
    return CallProgram(tuple(launches), workspace + partial_bytes(plan.splits, p), weight)


def _copies_matrix(p: ConvProblem, cfg: GemmConfig) -> bool:
    """Whether the producer tile ``cfg`` copies x by a 2-D map of the matrix [N H W][C], not in im2col
    mode (TMA_KERNEL's x_is_matrix): 1x1, stride-1, unpadded layers on tiles of at most
    MATRIX_MAP_MAX_PIXELS pixels, alone (pairs multicast im2col copies)."""
    return _is_matrix(p) and cfg.cluster == 1 and cfg.bm <= MATRIX_MAP_MAX_PIXELS


#: The im2col map's bounds (cuTensorMapEncodeIm2col, 4-D tensors): window corners within [-IM2COL_LIMIT,
#: IM2COL_LIMIT) of the plane's edges, taps' offsets below IM2COL_LIMIT, strides up to IM2COL_MAX_STRIDE.
IM2COL_LIMIT = 128
IM2COL_MAX_STRIDE = 8


def _im2col_reach(p: ConvProblem) -> tuple[int, int]:
    """The last tap's offset from a window's corner, (h, w)."""
    return (p.kh - 1) * p.dilation[0], (p.kw - 1) * p.dilation[1]


def im2col_map_fits(p: ConvProblem) -> bool:
    """Whether an im2col map (input_im2col_map) can walk ``p``'s windows: IM2COL_LIMIT and IM2COL_MAX_STRIDE."""
    reach_h, reach_w = _im2col_reach(p)
    return max(p.stride) <= IM2COL_MAX_STRIDE and max(reach_h, reach_w) < IM2COL_LIMIT and \
        all(-IM2COL_LIMIT <= bound < IM2COL_LIMIT for bound in (
            -p.pad_top, -p.pad_left, p.pad_bottom - reach_h, p.pad_right - reach_w))


def _im2col_refusal(p: ConvProblem) -> str:
    """Why a tile copying x by TMA cannot run ``p`` where im2col_map_fits says no."""
    return (f"its im2col copies take strides up to {IM2COL_MAX_STRIDE} and windows within {IM2COL_LIMIT} pixels of the "
            f"plane's edges (got stride {p.stride}, padding {(p.pad_top, p.pad_bottom, p.pad_left, p.pad_right)} and "
            f"taps reaching {_im2col_reach(p)} on {p.x_shape})")


def input_im2col_map(p: ConvProblem, x: Pointer, channels: int, channels_per_pixel: int,
                     pixels_per_column: int) -> Im2colMap:
    """The im2col map of ``p``'s NHWC input at ``x`` (``channels`` a pixel): ``pixels_per_column`` window corners
    a copy, the padding's bounds, the convolution's strides, ``channels_per_pixel`` channels of each."""
    reach_h, reach_w = _im2col_reach(p)
    return Im2colMap(x, p.dtype, (p.n, p.h, p.w, channels), (-p.pad_top, -p.pad_left),
                     (p.pad_bottom - reach_h, p.pad_right - reach_w), p.stride, channels_per_pixel, pixels_per_column)


def _with_tensor_maps(plan: LaunchPlan, p: ConvProblem, launch: Launch, x: Pointer, weight: Pointer) -> Launch:
    """``launch`` as the producer warpgroup's tile launches it, where ``plan`` takes that tile: by TMA,
    the weight as K rows of kh kw C columns, x in im2col mode or (_copies_matrix) as the matrix [N H W][C]
    (both maps appended to its arguments, and TMA_KERNEL's x_is_matrix after them)."""
    if not plan.config.producer_warps:
        return launch
    cfg, columns = plan.config, p.kh * p.kw * plan.channels_padded
    weight_map = TensorMap(weight, p.dtype, p.k, columns, columns * STORAGE_BYTES[p.dtype], cfg.bn, cfg.bk)
    # The strips' kernel copies by its strip map alone, 1x1 layers too (a matrix map there stopped it with an
    # illegal instruction).
    strips = cfg.name in PIXEL_STRIPS_CONFIGS
    matrix = not strips and _copies_matrix(p, cfg)
    if strips:
        x_map = PixelStripMap(x, p.dtype, (p.n, p.h, p.w, plan.channels_padded), strip_pixels(p.kw))
    elif matrix:
        x_map = TensorMap(x, p.dtype, p.n * p.h * p.w, plan.channels_padded,
                          plan.channels_padded * STORAGE_BYTES[p.dtype], cfg.bm, cfg.bk)
    else:
        x_map = input_im2col_map(p, x, plan.channels_padded, cfg.bk // plan.taps_per_k_tile, cfg.bm // cfg.cluster)
    if cfg.cluster > 1:
        return dataclasses.replace(launch, kernel=PAIR_KERNEL, args=(*launch.args, weight_map, x_map))
    kernel = PINGPONG_CLUSTER_KERNEL if cfg.name == PINGPONG_CLUSTER_CONFIG else \
        PIXEL_STRIPS_KERNEL if strips else \
        PINGPONG_KERNEL if cfg.wgmma == WGMMA_PINGPONG else TMA_KERNEL
    return dataclasses.replace(launch, kernel=kernel, args=(*launch.args, weight_map, x_map, int(matrix)))


# --- The stride phases of a transposed convolution in one launch (kernels/implicit_gemm_nhwc.cu,
# implicit_gemm_nhwc_phases; cupyconv/conv_transpose.py decides when and builds the phases).

PHASES_KERNEL = "implicit_gemm_nhwc_phases"
#: PhaseTable's capacity in kernels/implicit_gemm_nhwc.cu (a CPU test reads it there).
MAX_PHASES = 16
#: Operands read in place in 16-byte pieces. float32 runs as TF32 alone: y rounded by the kernel (ROUND_A)
#: or by a copy (ROUNDING_COPY_MACS), the phase weights rounded where phase_weights writes them.
PHASES_DTYPES = ("float32", "float16", "bfloat16")
#: Multiply-adds per element of y (every phase's taps x the output channels) past which a float32 NHWC y
#: is rounded to TF32 by a copy (a read and a write of y) rather than by a tile that rounds it in shared
#: memory at every k tile. H200, TF32 transposed suite in channels_last (benchmarks/NOTES.md, "TF32's y
#: rounded by a copy"): that rounding made the 5-stage and 256 x 64 tiles 1.22-1.40x slower; the copy of
#: unet_up_256to128's 205 MB y (512 multiply-adds an element) cost about what it saved.
ROUNDING_COPY_MACS = 512
#: TF32's phase tiles where make_plan's rule chooses one the phase launch has no float32 instance of, by
#: that tile's channels: the producer tiles (TMA-fed: none in any dtype; where y comes rounded, the 3-stage
#: pixel-row tile instead) and the 3-stage pixel-row tile where the kernel rounds y (in its A registers it
#: spills 32 bytes at the 128 registers two blocks an SM leave; phase table reads hold the registers the
#: forward's parameters do not; unrounded, 128 registers and no spills). The 5-stage tile and the 256 x 64
#: channel-row tile round y in shared memory. H200, TF32 transposed suite (benchmarks/NOTES.md, "TF32
#: transposed convolutions"): on its five rows of 128-512 output channels the 5-stage tile took 0.078-0.552
#: ms, mma.sync's best tiles 0.089-0.563 (the spilling 3-stage tile 0.069-0.483); 256 x 64 0.104 ms on 64.
TF32_PHASE_TILES = {128: "nhwc_wgmma_m128n128s5", 64: "nhwc_wgmma_ch_m256n64"}


@dataclasses.dataclass(frozen=True)
class PhaseGemm:
    """One stride phase as the phase launch reads it: its stride-1 ``problem`` (its taps, dilation and
    pixels; its x is the phase's window of y), the padding it reads the whole of y with (``pad_top``,
    ``pad_left``: negative where the window starts inside y), and element offsets of its weight (from
    the weight operand) and of its first output pixel (from the output)."""

    problem: ConvProblem
    pad_top: int
    pad_left: int
    weight_offset: int
    out_offset: int


def phases_plan(problems: tuple[ConvProblem, ...], compute_capability: int = 0,
                config: str | None = None, allow_tf32: bool = False, y_rounded: bool = False) -> LaunchPlan | None:
    """The plan of one launch computing the stride phases ``problems`` (stride-1 NHWC problems of one
    transposed convolution, with their taps), or None where it cannot: more than MAX_PHASES, neither
    16-bit nor float32 under ``allow_tf32``, channels that need copies or pieces narrower than 16 bytes,
    or 64-bit offsets. The tile is the one make_plan picks for the phase of fewest taps at the phases'
    pixels all together (in TF32 by TF32_PHASE_TILES where that has no instance); its grid x counts
    every phase's pixel tiles (phases_tiles); outputs of at most NARROW_TILE_CHANNELS channels per group
    take the 32-channel tile. ``config`` forces a tile (make_plan's). In float32 its ``round_a`` says
    whether the kernel rounds y to TF32; where not, y comes rounded: by a copy where the tile would round
    it in shared memory and the phases make more than ROUNDING_COPY_MACS multiply-adds of each element,
    or by the transpose that ``y_rounded`` says makes it (an NCHW y's)."""
    # The tile is chosen for the phase of fewest taps: one whose reduction is too short for wgmma
    # makes the whole launch take mma.sync (H100, decoder_3x3s2_op1_64to32 fp16: phases of 1, 2, 2
    # and 4 taps of 64 channels, 0.209 ms on wgmma, 0.185 on mma.sync; benchmarks/NOTES.md).
    fewest = min(problems, key=lambda p: p.kh * p.kw)
    if not 1 <= len(problems) <= MAX_PHASES or fewest.layout != "NHWC" or fewest.dtype not in PHASES_DTYPES \
            or (fewest.dtype == "float32" and not allow_tf32) or any(refusal(p) for p in problems):
        return None
    together = dataclasses.replace(fewest, n=fewest.n * len(problems))
    if refusal(together):
        return None
    if config is None and fewest.k // fewest.groups <= NARROW_TILE_CHANNELS:
        config = next(c.name for c in NHWC_CONFIGS[fewest.dtype] if c.bn == NARROW_TILE_CHANNELS
                      and c.stages == NARROW_TILE_STAGES[fewest.dtype])
    plan = make_plan(together, config, compute_capability=compute_capability, stream_k=False)
    macs = sum(p.kh * p.kw for p in problems) * fewest.k
    # float32: y comes rounded (by its transpose, or by a copy where the phases multiply each element often)
    # to the tiles that would round it in shared memory, and to the 3-stage pixel-row tile, whose instance
    # rounding it in its registers spills.
    rounded = fewest.dtype == "float32" and (y_rounded or macs > ROUNDING_COPY_MACS)
    if fewest.dtype == "float32" and (plan.config.producer_warps or plan.config.name == PIXEL_ROWS_CONFIG):
        tile = PIXEL_ROWS_CONFIG if rounded and plan.config.bn == 128 else TF32_PHASE_TILES[plan.config.bn]
        plan = make_plan(together, tile, compute_capability=compute_capability, stream_k=False)
    elif plan.config.producer_warps:  # no phase-launch instances: the same tile fed by all its threads
        plan = make_plan(together, PIXEL_ROWS_CONFIG, compute_capability=compute_capability, stream_k=False)
    if plan.vec != 16 or plan.channels_padded != fewest.c or plan.a_from_nchw or plan.index_type != "int" \
            or index_type(together) != "int":
        return None
    grid = (phases_tiles(problems, plan.config)[-1], plan.grid[1], plan.grid[2])
    rounding = ""
    if fewest.dtype == "float32":
        copied = rounded and not y_rounded and _float32_rounding(plan.config) == "shared"
        rounding = ("; y rounded to TF32 by its transpose" if y_rounded else
                    f"; y rounded to TF32 by a copy ({macs} > {ROUNDING_COPY_MACS} multiply-adds an element)"
                    if copied else "; y rounded to TF32 by the kernel")
        plan = dataclasses.replace(plan, round_a=not (y_rounded or copied))
    return dataclasses.replace(plan, kernel=PHASES_KERNEL, grid=grid,
                               reason=f"{len(problems)} stride phases in one launch; {plan.reason}{rounding}")


def _phase_table(channels: int, strides: tuple[int, int, int, int], interleaved: bool, firsts: tuple[int, ...],
                 phases: tuple[PhaseGemm, ...]) -> Table:
    """kernels/implicit_gemm_nhwc.cu's PhaseTable: ``channels`` stored, the output's element ``strides`` of an
    image, a phase's row and column, and a channel, and each phase's tiles, pixels, taps and offsets."""
    def column(values):
        return (*values, *(0,) * (MAX_PHASES - len(values)))

    return Table((len(phases), channels, *strides, int(interleaved), *firsts, *(0,) * (MAX_PHASES + 1 - len(firsts)),
                  *column([ph.problem.ho for ph in phases]), *column([ph.problem.wo for ph in phases]),
                  *column([ph.problem.kh for ph in phases]), *column([ph.problem.kw for ph in phases]),
                  *column([ph.pad_top for ph in phases]), *column([ph.pad_left for ph in phases]),
                  *column([ph.problem.dilation[0] for ph in phases]),
                  *column([ph.problem.dilation[1] for ph in phases]),
                  *column([ph.weight_offset for ph in phases]), *column([ph.out_offset for ph in phases])))


def phases_tiles(problems, cfg: GemmConfig) -> tuple[int, ...]:
    """The first pixel tile of each phase along the grid's x, and the total: PhaseTable.first_tile."""
    firsts = [0]
    for p in problems:
        firsts.append(firsts[-1] + math.ceil(p.n * p.ho * p.wo / cfg.bm))
    return tuple(firsts)


def phases_specialisation(dtype: str, cfg: GemmConfig, split_k: bool, nhwc_out: bool = True,
                          round_a: bool = False) -> str:
    """The C++ template instance of the phase launch with ``cfg``'s tile, 16-byte pieces, 32-bit
    offsets, writing an NHWC output (or NCHW); ``round_a``: float32's y, read in place, rounded to TF32
    by the kernel (ROUND_A: in the fragments on mma.sync, in shared memory on the wgmma tiles
    TF32_PHASE_TILES names)."""
    return (f"cupyconv::{PHASES_KERNEL}<{CTYPES[dtype]},int,{cfg.bm},{cfg.bn},{cfg.bk},{cfg.warps_m},{cfg.warps_n},"
            f"{cfg.stages},16,{cfg.wgmma},{str(nhwc_out).lower()},{str(round_a).lower()},{str(split_k).lower()}>")


def _phases_specialisations(wgmma: bool) -> list[str]:
    return [phases_specialisation(dtype, cfg, split_k, nhwc_out, round_a) for dtype in PHASES_DTYPES
            for cfg in NHWC_CONFIGS[dtype] if bool(cfg.wgmma) == wgmma and not cfg.producer_warps
            for nhwc_out in (True, False) for split_k in (False, True)
            for round_a in ((True, False) if dtype == "float32" and cfg.name != PIXEL_ROWS_CONFIG else (False,))]


def phases_launch(plan: LaunchPlan, phases: tuple[PhaseGemm, ...], y_size: tuple[int, int],
                  out_shape: tuple[int, int, int, int], stride: tuple[int, int], weight: Pointer,
                  out: Pointer = Pointer(OUT), partial: bool = False, out_layout: str = "NHWC",
                  y: Pointer = Pointer(X)) -> Launch:
    """The launch of ``plan`` (phases_plan) over ``phases``, reading y (at ``y``, NHWC: the phases'
    images and channels, ``y_size`` rows and columns) and the phases' weights (KHWC, at ``weight`` plus each
    weight_offset), writing every phase's pixels of the output ``out_shape`` (its array shape in
    ``out_layout``: (n, h, w, c) or (n, c, h, w); c may be fewer than the phases' output channels, whose
    zero channels are then left out), whose phases are ``stride`` rows and columns apart, at ``out``
    (``partial``: split-K's float32 runs, each the whole output, no bias or epilogue)."""
    first = phases[0].problem
    nhwc_out = out_layout == "NHWC"
    _, h, w, c = out_shape if nhwc_out else (out_shape[0], *out_shape[2:], out_shape[1])
    # Element strides of an image, a phase's row and column, and a channel.
    strides = (h * w * c, stride[0] * w * c, stride[1] * c, 1) if nhwc_out else \
        (c * h * w, stride[0] * w, stride[1], h * w)
    firsts = phases_tiles([ph.problem for ph in phases], plan.config)
    # Phases of as many tiles each take turns along the grid, so that their tiles reading the same rows
    # of y run together: one pass over y from memory rather than one a phase, and the stride-phase
    # columns of an NCHW output's sectors written together.
    interleaved = len({b - a for a, b in zip(firsts, firsts[1:])}) == 1
    table = _phase_table(c, strides, interleaved, firsts, phases)
    splits = plan.splits
    args = (y, weight, Pointer(BIAS), out, int(first.has_bias and not partial),
            *epilogue_args(first, partial=partial), first.n, first.c, *y_size, first.k, first.groups, splits,
            math.prod(out_shape), table)
    return Launch(PHASES_KERNEL, phases_specialisation(plan.dtype, plan.config, splits > 1, nhwc_out, plan.round_a),
                  plan.grid, plan.block, plan.shared_bytes, args, plan.arch)


# --- Transposed convolutions whose kernel is their stride (U-Net's 2x2 up-sampling): every phase one tap,
# a 1x1 convolution of the whole of y, so the phases make one GEMM of y and their weights stacked, which
# the producer warpgroup's tile runs (implicit_gemm_nhwc_tma_stacked; cupyconv/conv_transpose.py builds it).
# H200, same run: TF32 channels_last unet_up_1024to512 0.226 ms stacked, 0.300 on the phase launch
# (benchmarks/NOTES.md, "Stacked phases").

STACKED_KERNEL = "implicit_gemm_nhwc_tma_stacked"


def stacked_specialisation(dtype: str, cfg: GemmConfig, round_a: bool) -> str:
    """The C++ template instance of the stacked phases' GEMM on the producer tile ``cfg`` (``round_a``:
    float32's y read in place, rounded to TF32 by the kernel)."""
    return (f"cupyconv::{STACKED_KERNEL}<{CTYPES[dtype]},int,{cfg.bm},{cfg.bn},{cfg.bk},{cfg.warps_m},{cfg.warps_n},"
            f"{cfg.stages},16,{cfg.wgmma},{str(round_a).lower()}>")


def _stacked_specialisations() -> list[str]:
    return [stacked_specialisation(dtype, cfg, round_a) for dtype in PHASES_DTYPES for cfg in NHWC_CONFIGS[dtype]
            if cfg.wgmma == WGMMA_PIXEL_ROWS_PRODUCER and cfg.cluster == 1
            for round_a in ((True, False) if dtype == "float32" and _float32_rounding(cfg) != "copy" else (False,))]


def stacked_plan(problem: ConvProblem, phases: int, compute_capability: int,
                 config: str | None = None) -> LaunchPlan | None:
    """The plan of the stacked phases' GEMM ``problem`` (the 1x1, NHWC convolution of y to ``phases``
    times C output channels, KHWC weight), or None where make_plan's choice (``config`` forces a tile)
    is not a producer tile of one block a tile and one run, or where a channel tile would straddle two
    phases (C % BN)."""
    if problem.dtype not in PHASES_DTYPES or problem.layout != "NHWC" or refusal(problem) or \
            _wgmma_refusal(problem, compute_capability):
        return None
    # Where make_plan picks the ping-pong or the 3-stage pixel-row tile (short reductions), the producer
    # tile of the same size is slower than the phase launch: H200, fp16 unet_up_256to128 (256 channels of
    # y) 0.276 ms stacked on it against 0.220 (benchmarks/NOTES.md, "Stacked phases").
    plan = make_plan(problem, config, compute_capability=compute_capability, splits=1, stream_k=False)
    cfg = plan.config
    if cfg.wgmma != WGMMA_PIXEL_ROWS_PRODUCER or cfg.cluster != 1 or plan.splits != 1 or plan.stream_k_blocks \
            or plan.index_type != "int" or (problem.k // phases) % cfg.bn or plan.channels_padded != problem.c:
        return None
    return dataclasses.replace(plan, kernel=STACKED_KERNEL, reason=(
        f"{phases} stride phases of one tap each as one GEMM of their weights stacked; {plan.reason}"))


def stacked_launch(plan: LaunchPlan, problem: ConvProblem, launch: Launch, out_shape: tuple[int, int, int, int],
                   stride: tuple[int, int], out_offsets: tuple[int, ...]) -> Launch:
    """``launch``, the producer tile's launch of ``plan``'s stacked GEMM ``problem`` (program's), as
    implicit_gemm_nhwc_tma_stacked: phase p's channel tile writes the NHWC output ``out_shape`` (n, h, w, c)
    at image, row and column strides h w c, stride[0] w c and stride[1] c from out_offsets[p] (its first
    pixel's offset less p c)."""
    _, h, w, c = out_shape
    phase = PhaseGemm(problem, 0, 0, 0, 0)
    table = _phase_table(problem.k, (h * w * c, stride[0] * w * c, stride[1] * c, 1), False, (0,),
                         tuple(dataclasses.replace(phase, out_offset=offset) for offset in out_offsets))
    return dataclasses.replace(launch, kernel=STACKED_KERNEL, args=(*launch.args, table),
                               name_expression=stacked_specialisation(plan.dtype, plan.config, plan.round_a))

