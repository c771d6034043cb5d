"""The weight gradient on the tensor cores (float16, bfloat16, and float32 as TF32): the implicit GEMM
of kernels/wgrad_tensor_cores.cu, reading channels-last x and dy in place, and wgrad.py's ordered
reduction of its runs.

    dW[o, (r, s, c)] = sum over l = (n, p, q) of dy[n, p, q, o] x[n, p sh + r dh - pt, q sw + s dw - pl, c]

is a GEMM of K rows, J = kh kw C columns and a reduction over the L = N Ho Wo output pixels. Both
operands are read l-major (a pixel's channels are contiguous in NHWC) and transposed by ldmatrix on
their way to the tensor cores. NCHW inputs (but the K-major TF32 tiles' below), and channel counts that
no whole 16-byte piece of dy (or 4-byte piece of x) divides, are first copied channels-last with zero
channels (nchw_to_nhwc.cu); the zero rows and columns of the result are cut. The reduction runs in
splits fixed by the problem alone, whose float32 partial sums wgrad_reduce adds in order and rounds once
into the weight's layout: the result is bitwise the same on every run. Ungrouped convolutions only; the
rest take wgrad.py's FMA kernel (wgrad_depthwise.py for depthwise layers).

On the H100 (sm_90a), problems whose 128-byte panels of x (64 16-bit channels, 32 float32 ones) lie in one
tap take tiles fed by TMA (dy through a 2-D tensor map, x through an im2col map): wgrad_tensor_cores_tma in
16 bits, whose wgmma reads both operands transposed; in TF32, whose wgmma reads K-major operands only,
wgrad_tensor_cores_tma_tf32, where four warps transpose each landed l tile of x into K-major rows rounded to
TF32 and the warpgroups take dy's fragments into registers. NCHW float32 layers at stride 1 with Wo == W are
K-major already: there the TF32 tile reads x and dy in place (x's box of a tap shifted along the flattened
plane, moved back and masked by eight rounding warps): no copies, no transposes. Where such a plan is one
run and the weight is the GEMM's own [K][kh kw C], the tile writes the weight and no reduction runs.
Where a run's tiles are too few for the SMs, those tiles run stream-K instead: a wave of blocks shares
the tiles x l tiles equally, the holder of a tile's first l tile adding the others' sums in block order
(kernels/stream_k.cuh), again the same bits on every run.

This module holds the family's tile table, its choice and refusal, the plan and the launch.
"""
from __future__ import annotations

import dataclasses
import functools
import math

from . import wgrad
from .arguments import ConvProblem
from .families.common import CTYPES, INDEX_TYPES, MAX_GRID_Y, STORAGE_BYTES, forced_config
from .families.implicit_gemm_nhwc import channels_last_copy, im2col_map_fits, input_im2col_map, pad_channels
from .program import FLAG_COUNT, FLAGS, GRAD_OUTPUT, OUT, WORKSPACE, X, CallProgram, Launch, Pointer, TensorMap, align

KERNEL = "wgrad_tensor_cores"
TMA_KERNEL = "wgrad_tensor_cores_tma"
TF32_TMA_KERNEL = "wgrad_tensor_cores_tma_tf32"
DTYPES = ("float16", "bfloat16", "float32")


@dataclasses.dataclass(frozen=True)
class TileConfig:
    """Thread-block tile: bm output channels x bj (tap, channel) columns, l tiles of bl pixels through
    ``stages`` buffers, warps_m x warps_j warps, multiplying with mma.sync or (``wgmma``, sm_90a, 16-bit
    types) wgmma; ``tma``: wgmma fed by a copying warp's TMA copies (bm / 64 warpgroups multiply), and,
    ``tf32``, ``landing`` > 0, through a ring of that many landing stages whose x four warps transpose;
    ``k_major``: NCHW x and dy read in place (TF32 on stride-1 layers with Wo == W, straight into the stages,
    which eight warps round in place; 16 bits on 1x1 layers, the K-major rows wgmma reads untransposed).
    ``blocks_per_sm``: how many fit an SM (shared memory); ``sm_tflops``: the rate an SM full of them
    reaches on a long reduction (H100 timings), for the choice's timing model; ``stream_k``: a TMA tile
    with a stream-K instance."""

    name: str
    bm: int
    bj: int
    bl: int
    warps_m: int
    warps_j: int
    stages: int
    blocks_per_sm: int
    sm_tflops: float
    wgmma: bool = False
    tma: bool = False
    stream_k: bool = False
    landing: int = 0
    k_major: bool = False
    tf32: bool = False  # a tile of wgrad_tensor_cores_tma_tf32

    @property
    def threads(self) -> int:
        if self.tma:  # the multiplying warpgroups, a copying warp and (TF32) four transposing or eight rounding warps
            return 2 * self.bm + 32 + ((256 if self.k_major else 128) if self.tf32 else 0)
        return 32 * self.warps_m * self.warps_j

    def shared_bytes(self, itemsize: int) -> int:
        """Pipeline buffers: per stage, bl rows of bm + 8 (dy) and bj + 8 (x) elements; wgmma: unpadded
        rows and 1 KB to align the tiles; TMA: and two 8-byte mbarriers a stage (TF32 with landing stages:
        each as much as a stage and two mbarriers, and the stages x's alone, the warpgroups reading dy where
        it landed; TF32's k_major: three mbarriers a stage, and x's tail boxes, 16 bytes a column)."""
        if self.tma:
            stages = self.stages + self.landing
            dy_stages = self.landing if self.landing else self.stages
            return (self.stages * self.bj + dy_stages * self.bm + self.landing * self.bj) * self.bl * itemsize + \
                1024 + 16 * stages + (self.k_major and self.tf32) * self.stages * (8 + 16 * self.bj)
        if self.wgmma:
            return self.stages * self.bl * (self.bm + self.bj) * itemsize + 1024
        return self.stages * self.bl * (self.bm + 8 + self.bj + 8) * itemsize


#: mma.sync tiles per storage size: k tiles (bl) of 64 bytes of each pixel row, four stages, two
#: blocks an SM. Rates from H100 sweeps of the ResNet-50 and VGG layers (benchmarks/NOTES.md): about
#: 1.2-1.3 TFLOP/s an SM in 16-bit types, 0.57 in TF32 (scalar fragment loads).
CONFIGS = {
    itemsize: tuple(TileConfig(f"tc_m{bm}j{bj}", bm, bj, 64 // itemsize, warps_m, warps_j, 4, 2, rate * (
                        1.0 if itemsize == 2 else 0.45))
                    for bm, bj, warps_m, warps_j, rate in ((128, 128, 2, 4, 1.3), (64, 128, 2, 2, 1.2),
                                                           (64, 64, 2, 2, 1.2)))
    for itemsize in (2, 4)
}
#: Hopper (sm_90a) tiles for 16-bit types read in 16-byte pieces: warpgroups of 64 channels x 128
#: columns, l tiles of 64 pixels (128 bytes of each row per panel): 128 x 128 in three stages (two
#: blocks an SM), 64 x 128 (layers of 64 channels) and 256 x 128 (one block an SM, half the loads per
#: multiply-add of 128 x 128) in four. From an H100 sweep of these and of 128 x 64, six-stage tiles of
#: 32 pixels and four-stage 128 x 128 (benchmarks/NOTES.md): none of those was faster by more than
#: the noise on any ResNet-50 or VGG layer. The rates: VGG's 3x3 layers of 64 and 256 channels.
WGMMA_ARCH = "sm_90a"
WGMMA_COMPUTE_CAPABILITY = 90
WGMMA_CONFIGS = tuple(TileConfig(f"tc_wgmma_m{bm}j128", bm, 128, 64, bm // 16, 1, stages, blocks, rate, wgmma=True)
                      for bm, stages, blocks, rate in ((128, 3, 2, 2.5), (64, 4, 2, 1.8), (256, 4, 1, 2.6)))
#: Hopper tiles fed by TMA (wgrad_tensor_cores_tma; _tma_applies): bm / 64 warpgroups of 64 output
#: channels x bj columns, l tiles of 64 pixels, as many stages as blocks_per_sm of them leave room for.
#: Where they apply, the choice is among them alone: on every ungrouped 16-bit layer of bench.LAYERS
#: each was faster than the cp.async wgmma tiles at their best run counts (H200, fp16 channels-last,
#: benchmarks/results/wgrad_tiles_tma_h200.txt). The rates: fitted to that sweep, so that the timing
#: model's choice of tile and runs is within 1.17x of the fastest on each layer (mostly the fastest).
#: Stream-K: all but 128 x 128, whose instance spills under two blocks' launch bounds (its 64 accumulators and
#: a slot's 64 loaded floats a thread in 112 registers); on the sweep that measured it, it never won there.
TMA_CONFIGS = tuple(TileConfig(f"tc_tma_m{bm}j{bj}", bm, bj, 64, bm // 16, 1, stages, blocks, rate, wgmma=True,
                               tma=True, stream_k=(bm, bj) != (128, 128))
                    for bm, bj, stages, blocks, rate in ((128, 128, 3, 2, 2.6), (128, 256, 4, 1, 3.0),
                                                         (64, 128, 4, 2, 2.4), (64, 256, 4, 1, 2.6)))
#: Hopper TF32 tiles fed by TMA (wgrad_tensor_cores_tma_tf32; _tma_applies): bm / 64 warpgroups of 64 output
#: channels x bj columns, l tiles of 32 pixels (128 bytes of float32 a row), `landing` stages landed and `stages`
#: transposed, one block an SM (shared memory). Where they apply, the choice is among them alone: on every TF32 layer of
#: bench.LAYERS they ran 1.1-2.4x faster than the mma.sync tiles' plan (H200, channels-last,
#: benchmarks/results/wgrad_tiles_tma_tf32_h200.txt). The rates: fitted to that sweep (profile/wgrad_fit.py --mode
#: tf32), the model's pick the fastest measured on 14 of 15 layers and within 1.03x on the last. Each has a stream-K
#: instance (the K-major TF32 tiles have none: theirs spilled, the rounders' taps and masks beside a slot's loads).
TF32_TMA_CONFIGS = tuple(TileConfig(f"tc_tma_tf32_m{bm}j{bj}", bm, bj, 32, bm // 16, 1, stages, 1, rate, wgmma=True,
                                    tma=True, stream_k=True, landing=landing, tf32=True)
                         for bm, bj, landing, stages, rate in ((128, 128, 3, 3, 1.4), (64, 128, 4, 4, 1.0),
                                                               (128, 64, 4, 4, 1.0)))
#: Hopper TF32 tiles for NCHW stride-1 layers whose output rows are as wide as the input's (_k_major_applies):
#: there x [N][C][H W] and dy [N][K][Ho Wo] are K-major already (a channel's pixels contiguous), so 2-D TMA copies
#: of dy as [N K][Ho Wo] and of x as [N C][H W], each x panel shifted by its tap, land in wgmma's layout; eight
#: warps round x's in place (moving each row back by its shift's last pixels, zeroing those a tap's column leaves
#: the row at) and the warpgroups take dy's fragments in registers: no channels-last
#: copies and no transposes. The stages the TF32 tiles above split between landing and transposing. Rates:
#: estimates (the transposes' share of shared memory's traffic gone), which a sweep of the layers suite's NCHW
#: 1x1 rows confirmed (H200, benchmarks/results/wgrad_tiles_k_major_tf32_nchw_h200.txt; profile/wgrad_fit.py
#: --mode tf32-nchw): the model's pick within 1.03x of the fastest tile and run count measured on each.
TF32_K_MAJOR_CONFIGS = tuple(TileConfig(f"tc_tma_tf32_nchw_m{bm}j{bj}", bm, bj, 32, bm // 16, 1, stages, 1, rate,
                                        wgmma=True, tma=True, k_major=True, tf32=True)
                             for bm, bj, stages, rate in ((128, 128, 6, 1.8), (64, 128, 8, 1.3), (128, 64, 8, 1.3)))
#: Hopper 16-bit tiles for NCHW 1x1 layers at stride 1 without padding (_k_major_applies): TMA_CONFIGS' tiles with
#: dy read by TMA as [N K][Ho Wo] and x as [N C][H W], an image's channel rows, which land as the K-major rows
#: wgmma reads untransposed (wgrad_tensor_cores_tma, K_MAJOR): no channels-last copies. Rates: TMA_CONFIGS' (the
#: same boxes and multiplies, the operands' majorness swapped; H200, fp16: the 1x1 rows of the layers suite ran as
#: fast as their channels-last twins, benchmarks/results/layers_wgrad_fp16_nchw_923b151_h200.md).
K_MAJOR_CONFIGS = {
    2: tuple(TileConfig(f"tc_tma_nchw_m{c.bm}j{c.bj}", c.bm, c.bj, c.bl, c.warps_m, 1, c.stages, c.blocks_per_sm,
                        c.sm_tflops, wgmma=True, tma=True, stream_k=c.stream_k, k_major=True) for c in TMA_CONFIGS),
    4: TF32_K_MAJOR_CONFIGS,
}
#: How much longer the K-major tiles take an l tile of a layer with taps than their rates (fitted on 1x1 layers)
#: say: the rounders move each of x's rows back by its tap's skew, and a 14^2 or 28^2 plane's last l tile of an
#: image is partly zeros. Measured against the model on the 3x3 rows of the layers suite (H200, 6bb3140:
#: vgg_conv5_2 1.27x, r50_l3_3x3_256 1.33x, vgg_conv3_2 1.20x; benchmarks/results/
#: wgrad_tiles_stream_k_tf32_nchw_h200.txt, layers_wgrad_tf32_nchw_6bb3140_h200.md).
K_MAJOR_TAPS = 1.3
#: The timing model's cost of the reduction's launch, which a TMA tile's one run writing the weight
#: itself saves (`direct`).
REDUCE_LAUNCH_US = 2.0
#: The timing model's bytes a second at which one stream-K block writes its float32 sums to its slot, or
#: reads another block's (one block's loads from L2).
STREAM_K_BLOCK_BANDWIDTH = 100e9
#: What stream-K's modelled time is multiplied by before the choice weighs it, by element size. On an H200
#: sweep of the ResNet-50 and VGG layers (benchmarks/results/wgrad_tiles_stream_k_h200.txt) it ran 1.1-2x slower
#: against the runs than modelled: its fix-up (slots stored and fenced, flags awaited, slots read) sits on each
#: owner's critical path (benchmarks/NOTES.md, ncu). In 16 bits 1.4 keeps it where it won there, a half-idle
#: wave over a long reduction (vgg_conv5_2: 72 tiles of 128 x 256, 98 l tiles; 1.3x faster than its runs), and
#: nowhere else on that sweep; 1.35 also took ResNet-50's last 3x3 (6 % slower), 1.45 nothing. TF32's slower
#: l tiles bear the same fix-up better: on the 128 x 128 tile the model put stream-K's wave 1.36x, 1.71x and 1.25x
#: ahead of the best runs on vgg_conv5_2, r50_l4_3x3_512 and r50_l3_3x3_256, measured 1.15x, 1.39x and 1.0x (H200,
#: benchmarks/results/wgrad_tiles_stream_k_tf32_h200.txt): 1.25 takes all three (the last a tie), and vgg_conv5_2
#: on NCHW arrays, where stream-K on the copies ran 0.204 ms against 0.226 in runs and 0.255 on the K-major tile.
STREAM_K_MARGIN = {2: 1.4, 4: 1.25}
#: The bytes a second (read and written) at which the channels-last copies of NCHW x and dy move, for the timing
#: model: the transposing TF32 tiles ran vgg_conv5_2 and r50_l3_3x3_256 0.024 and 0.011 ms slower on NCHW arrays
#: than on channels-last ones, 51 and 26 MB moved (H200, 6bb3140; benchmarks/results/
#: wgrad_tiles_stream_k_tf32_h200.txt and wgrad_tiles_stream_k_tf32_nchw_h200.txt).
COPY_BANDWIDTH = 2.2e12
CONFIG_NAMES = frozenset(c.name for configs in (*CONFIGS.values(), WGMMA_CONFIGS, TMA_CONFIGS, TF32_TMA_CONFIGS,
                                                *K_MAJOR_CONFIGS.values()) for c in configs)
#: The timing model's machine: the H100's SMs, the bandwidth the partial sums move at, and the k
#: tiles' worth of time a block spends filling and draining its pipeline. A fixed machine, not the
#: device's, so that the runs, and so the result's bits, depend on the problem alone.
MODEL_SMS = 132
MODEL_BANDWIDTH = 2.5e12
FILL_TILES = 2
#: l tiles each run keeps at least (a shorter run spends its time filling the pipeline), and at most
#: this many runs.
MIN_RUN_TILES = 4
MAX_SPLITS = 1024
#: Bytes of an x piece per storage size: 16 where the channels allow, else 8 (16-bit types, their
#: channels padded to a multiple of 4) or 4 (float32, any channels).
X_VECS = {2: (16, 8), 4: (16, 4)}


@dataclasses.dataclass(frozen=True)
class TensorCorePlan:
    """The launches of one weight gradient: copies where needed (``x_copy``, ``dy_copy``: 'transpose' from
    NCHW, 'pad' for zero channels, '' in place), the GEMM ``expression`` on ``grid`` x ``block`` with
    ``shared_bytes`` into a float32 workspace [splits][Kp][kh kw Cp] (``workspace_bytes``), then
    wgrad_reduce into the weight, skipping the zero channels and rows. ``reason`` says why."""

    config: TileConfig
    dtype: str
    layout: str
    weight_layout: str
    index_type: str
    arch: str            # the NVRTC target the GEMM needs ("" for the device's own)
    channels: int        # Cp: x's channels as the kernel reads them
    out_channels: int    # Kp: dy's
    x_vec: int
    x_copy: str
    dy_copy: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    splits: int
    direct: bool         # the GEMM writes the weight itself: no partial sums, no reduction
    stream_k_blocks: int  # > 0: the TMA tile's stream-K, on a grid of that many blocks (splits is 1)
    workspace_bytes: int
    expression: str
    reduce_expression: str
    reason: str

    def __str__(self) -> str:
        c = self.config
        return (f"{KERNEL} [{c.name}: {c.bm} out channels x {c.bj} (tap, channel) columns, l tiles of {c.bl}, "
                f"{c.stages} stages, {c.threads} threads, "
                f"{('wgmma fed by TMA (' if c.tma else 'wgmma (') + self.arch + ')' if c.wgmma else 'mma.sync'}]\n"
                f"  {self.dtype} (float32 accumulators), {self.layout} -> {self.weight_layout}, {self.index_type} "
                f"indices; x as {self.channels} channels in {self.x_vec}-byte pieces "
                f"({self.x_copy or 'in place'}), dy as {self.out_channels} ({self.dy_copy or 'in place'})\n"
                f"  grid {self.grid} ({'stream-K blocks' if self.stream_k_blocks else '(j tiles, o tiles, runs)'}), "
                f"block {self.block}, {self.shared_bytes} B shared; "
                f"workspace {self.workspace_bytes} B{'; the GEMM writes the weight' if self.direct else ''}\n"
                f"  {self.expression}\n" + ("" if self.direct else f"  {self.reduce_expression}\n") +
                f"  why: {self.reason}")


def _channels(problem: ConvProblem) -> tuple[int, int, int]:
    """(Cp, Kp, x piece bytes): dy's channels rounded up to whole 16-byte pieces; x's rounded up to the
    narrower piece of X_VECS, or to 16-byte pieces where that adds no more channels."""
    item = STORAGE_BYTES[problem.dtype]

    def rounded(channels: int, vec: int) -> int:
        return math.ceil(channels * item / vec) * vec // item

    wide, narrow = X_VECS[item]
    vec = wide if rounded(problem.c, wide) == rounded(problem.c, narrow) else narrow
    return rounded(problem.c, vec), rounded(problem.k, 16), vec


def _sizes(problem: ConvProblem) -> tuple[int, int, int]:
    """(Kp, J, L): the GEMM's rows and columns as the kernel computes them, and its reduction."""
    cp, kp, _ = _channels(problem)
    return kp, problem.kh * problem.kw * cp, problem.n * problem.ho * problem.wo


def _tiles(problem: ConvProblem, cfg: TileConfig) -> tuple[int, int]:
    kp, j, _ = _sizes(problem)
    return math.ceil(j / cfg.bj), math.ceil(kp / cfg.bm)


def _wgmma_applies(problem: ConvProblem, compute_capability: int) -> bool:
    """wgmma's tiles run 16-bit types read in 16-byte pieces, on sm_90a."""
    return compute_capability == WGMMA_COMPUTE_CAPABILITY and STORAGE_BYTES[problem.dtype] == 2 and \
        _channels(problem)[2] == 16


def _panel_channels(problem: ConvProblem) -> int:
    """The channels of a TMA tile's 128-byte panel: 64 in 16 bits, 32 in float32."""
    return 128 // STORAGE_BYTES[problem.dtype]


def _tma_applies(problem: ConvProblem, compute_capability: int) -> bool:
    """The TMA tiles run problems on sm_90a read in 16-byte pieces whose x panels (_panel_channels) each lie
    in one tap (Cp a multiple of them, or one tap: the map gives zeros past Cp) and whose windows the im2col
    map can walk (im2col_map_fits), with 32-bit pixel coordinates; and the layers the K-major tiles take
    (_k_major_applies: no pieces, no panels, no im2col map)."""
    return _k_major_applies(problem, compute_capability) or _im2col_tiles_apply(problem, compute_capability)


def _im2col_tiles_apply(problem: ConvProblem, compute_capability: int) -> bool:
    """The TMA tiles reading x through the im2col map (TMA_CONFIGS, TF32_TMA_CONFIGS) run it (_tma_applies)."""
    p = problem
    one_tap_panels = _channels(p)[0] % _panel_channels(p) == 0 or p.kh * p.kw == 1
    return compute_capability == WGMMA_COMPUTE_CAPABILITY and _channels(p)[2] == 16 and one_tap_panels and \
        p.n * p.ho * p.wo < 2**31 and im2col_map_fits(p)


def _k_major_applies(problem: ConvProblem, compute_capability: int) -> bool:
    """The K-major tiles (K_MAJOR_CONFIGS) run NCHW layers at stride 1 on sm_90a whose planes (x's and dy's) are
    whole 16-byte rows (TMA's strides) and whose channels are even (the sums are stored in pairs), with 32-bit row
    and pixel coordinates: in TF32 those whose output rows are as wide as the input's (Wo == W: a tap shifts x's
    plane by a constant) and whose x panels of 32 channels lie in one tap (C a multiple of 32, or a 1x1 kernel);
    in 16 bits 1x1 layers without padding (no shifts: the rounding warps that make them are TF32's)."""
    p = problem
    item = STORAGE_BYTES[p.dtype]
    if compute_capability != WGMMA_COMPUTE_CAPABILITY or p.dtype not in DTYPES or p.layout != "NCHW" or \
            p.stride != (1, 1) or p.h * p.w * item % 16 or p.ho * p.wo * item % 16 or p.c % 2 or \
            p.n * max(p.c, p.k) >= 2**31:
        return False
    if item == 2:
        return p.kh * p.kw == 1 and (p.ho, p.wo) == (p.h, p.w)
    return p.wo == p.w and (p.kh * p.kw == 1 or p.c % 32 == 0) and \
        (p.ho + p.pad_top + (p.kh - 1) * p.dilation[0] + 2) * p.w < 2**31  # a panel's shifted pixels


def _tma_configs(problem: ConvProblem, compute_capability: int) -> tuple[TileConfig, ...]:
    """The TMA tiles the choice weighs: the K-major ones where they apply, and those reading x through the im2col map
    where it does (on NCHW arrays at the price of their copies, _copies_us)."""
    item = STORAGE_BYTES[problem.dtype]
    im2col = TMA_CONFIGS if item == 2 else TF32_TMA_CONFIGS
    return (K_MAJOR_CONFIGS[item] if _k_major_applies(problem, compute_capability) else ()) + \
        (im2col if _im2col_tiles_apply(problem, compute_capability) else ())


def configs(problem: ConvProblem, compute_capability: int) -> tuple[TileConfig, ...]:
    """The tiles that can run ``problem``: mma.sync's, and wgmma's and TMA's where they apply (the K-major ones and,
    where the im2col map can read the channels-last copies, the transposing ones too)."""
    return CONFIGS[STORAGE_BYTES[problem.dtype]] + \
        (WGMMA_CONFIGS if _wgmma_applies(problem, compute_capability) else ()) + \
        _tma_configs(problem, compute_capability)


def _direct(problem: ConvProblem, cfg: TileConfig, splits: int) -> bool:
    """Whether the TMA tile writes the weight itself: one run, and the weight is the GEMM's [K][kh kw C]
    (KHWC, or any layout of a 1x1 kernel; no zero channels in x or dy)."""
    cp, kp, _ = _channels(problem)
    khwc = problem.weight_layout == "KHWC" or problem.kh * problem.kw == 1
    return cfg.tma and splits == 1 and khwc and (cp, kp) == (problem.c, problem.k)


def _l_tiles(problem: ConvProblem, cfg: TileConfig) -> int:
    """The reduction's l tiles: of bl pixels, or (k_major) of bl pixels of one image, its last zero-filled past it."""
    if cfg.k_major:
        return problem.n * math.ceil(problem.ho * problem.wo / cfg.bl)
    return math.ceil(_sizes(problem)[2] / cfg.bl)


def _tile_us(problem: ConvProblem, cfg: TileConfig) -> float:
    """The timing model's µs for one block of ``cfg`` to multiply one l tile, at its share of the SM's rate (the
    K-major tiles' times K_MAJOR_TAPS where their rounders shift x's rows by a tap)."""
    taps = K_MAJOR_TAPS if cfg.k_major and problem.kh * problem.kw > 1 else 1.0
    return taps * 2 * cfg.bm * cfg.bj * cfg.bl / (cfg.sm_tflops * 1e6 / cfg.blocks_per_sm)


def _partial_sums_us(problem: ConvProblem, cfg: TileConfig, splits: int) -> float:
    """The timing model's µs for ``splits`` runs' float32 partial sums, written and read back once each, and the
    reduction's launch; none where the tile writes the weight itself (_direct)."""
    if _direct(problem, cfg, splits):
        return 0.0
    kp, j, _ = _sizes(problem)
    return 2 * splits * kp * j * 4 / MODEL_BANDWIDTH * 1e6 + REDUCE_LAUNCH_US


def _copies_us(problem: ConvProblem, cfg: TileConfig) -> float:
    """The timing model's µs for the channels-last copies of NCHW x and dy, read and written once each at
    COPY_BANDWIDTH; none for the K-major tiles (they read both in place) or channels-last arrays (whose pads of few
    channels every tile needs alike)."""
    if cfg.k_major or problem.layout != "NCHW":
        return 0.0
    p = problem
    moved = 2 * p.n * (p.c * p.h * p.w + p.k * p.ho * p.wo) * STORAGE_BYTES[p.dtype]
    return moved / COPY_BANDWIDTH * 1e6


def _model_us(problem: ConvProblem, cfg: TileConfig, splits: int) -> float:
    """Estimated µs of the GEMM in ``splits`` runs and of its partial sums' round trip: waves of
    blocks (blocks_per_sm on each of MODEL_SMS), each running its l tiles plus FILL_TILES at its share
    of the SM's rate; then _partial_sums_us."""
    j_tiles, o_tiles = _tiles(problem, cfg)
    waves = math.ceil(j_tiles * o_tiles * splits / (cfg.blocks_per_sm * MODEL_SMS))
    tiles_per_run = math.ceil(_l_tiles(problem, cfg) / splits)
    return waves * (tiles_per_run + FILL_TILES) * _tile_us(problem, cfg) + _partial_sums_us(problem, cfg, splits)


def _stream_k_blocks(problem: ConvProblem, cfg: TileConfig) -> int:
    """Stream-K's blocks for the TMA tile ``cfg``: one wave (blocks_per_sm on each of MODEL_SMS), at most
    one a unit (tile x l tile) and FLAG_COUNT."""
    j_tiles, o_tiles = _tiles(problem, cfg)
    units = j_tiles * o_tiles * _l_tiles(problem, cfg)
    return min(cfg.blocks_per_sm * MODEL_SMS, units, FLAG_COUNT)


def _stream_k_wave_us(problem: ConvProblem, cfg: TileConfig) -> float:
    """Estimated µs of the TMA tile ``cfg``'s wave in stream-K: _stream_k_blocks, each running its share of the
    units plus FILL_TILES for each of its (at most two) segments, writing its sums to its slot and reading the
    slots of the blocks that share its tile (STREAM_K_BLOCK_BANDWIDTH)."""
    j_tiles, o_tiles = _tiles(problem, cfg)
    l_tiles = _l_tiles(problem, cfg)
    share = math.ceil(j_tiles * o_tiles * l_tiles / _stream_k_blocks(problem, cfg))
    slot_us = cfg.bm * cfg.bj * 4 / STREAM_K_BLOCK_BANDWIDTH * 1e6
    return (share + 2 * FILL_TILES) * _tile_us(problem, cfg) + (1 + math.ceil(l_tiles / share)) * slot_us


def _stream_k_model_us(problem: ConvProblem, cfg: TileConfig) -> float:
    """Estimated µs of the TMA tile ``cfg`` in stream-K: its wave (_stream_k_wave_us), then one run's
    _partial_sums_us."""
    return _stream_k_wave_us(problem, cfg) + _partial_sums_us(problem, cfg, 1)


def _split_choices(problem: ConvProblem, cfg: TileConfig) -> range:
    """Run counts the choice weighs: each run at least MIN_RUN_TILES l tiles, at most MAX_SPLITS runs,
    the partial sums within wgrad.py's workspace cap (one run always)."""
    kp, j, _ = _sizes(problem)
    by_length = _l_tiles(problem, cfg) // MIN_RUN_TILES
    return range(1, max(1, min(MAX_SPLITS, by_length, wgrad.MAX_WORKSPACE_BYTES // (kp * j * 4))) + 1)


#: A way to run a tile: a run count, or STREAM_K.
STREAM_K = "stream-K"


def _schedule_us(problem: ConvProblem, cfg: TileConfig, schedule: int | str) -> float:
    """The modelled µs the choice weighs for ``cfg`` run in ``schedule`` (stream-K's wave times its STREAM_K_MARGIN,
    not its partial sums' round trip), and its copies (_copies_us)."""
    margin = STREAM_K_MARGIN[STORAGE_BYTES[problem.dtype]]
    gemm = margin * _stream_k_wave_us(problem, cfg) + _partial_sums_us(problem, cfg, 1) \
        if schedule == STREAM_K else _model_us(problem, cfg, schedule)
    return gemm + _copies_us(problem, cfg)


def _schedules(problem: ConvProblem, cfg: TileConfig, stream_k: bool | None) -> list[int | str]:
    """The run counts (_split_choices) and, for tiles with a stream-K instance, STREAM_K, as ``stream_k``
    allows (True: it alone, False: the runs alone, None: both)."""
    runs = [] if stream_k else list(_split_choices(problem, cfg))
    return runs + ([STREAM_K] if cfg.stream_k and stream_k is not False else [])


def _best_schedule(problem: ConvProblem, cfg: TileConfig, stream_k: bool | None) -> int | str:
    """The schedule of least modelled time; the first on ties (the fewer runs, runs before stream-K)."""
    return min(_schedules(problem, cfg, stream_k), key=lambda s: _schedule_us(problem, cfg, s))


def _choose(problem: ConvProblem, compute_capability: int, stream_k: bool | None) -> tuple[TileConfig, int | str, str]:
    """The tile and schedule of least modelled time (_model_us, _stream_k_model_us), among the TMA tiles
    where they apply, else wgmma's where they apply, else mma.sync's; the first on ties (the larger tile,
    the fewer runs)."""
    configs = _tma_configs(problem, compute_capability) if _tma_applies(problem, compute_capability) else \
        WGMMA_CONFIGS if _wgmma_applies(problem, compute_capability) else CONFIGS[STORAGE_BYTES[problem.dtype]]
    configs = [cfg for cfg in configs if _schedules(problem, cfg, stream_k)]  # stream_k=True: its tiles alone
    if not configs:
        raise ValueError(f"stream_k=True needs a tile fed by TMA with a stream-K instance; none can run {problem}")
    best = {cfg: _best_schedule(problem, cfg, stream_k) for cfg in configs}
    cfg = min(configs, key=lambda c: _schedule_us(problem, c, best[c]))
    said = {c: f"{c.name} in {best[c] if best[c] == STREAM_K else f'{best[c]} run(s)'} "
               f"{_schedule_us(problem, c, best[c]):.1f}" for c in configs}
    others = ", ".join(said[c] for c in configs if c is not cfg)
    return cfg, best[cfg], f"{said[cfg]} us has the least modelled time (against {others})"


@functools.lru_cache(maxsize=1024)
def refusal(problem: ConvProblem, allow_tf32: bool) -> str:
    """Why the tensor cores cannot compute ``problem``'s weight gradient ("" when they can). Kept per
    problem: every backward of a layer asks it again."""
    if problem.dtype not in DTYPES or (problem.dtype == "float32" and not allow_tf32):
        return f"{problem.dtype}{' (strict, allow_tf32=False)' if problem.dtype == 'float32' else ''} has no tensor-core path"
    if problem.groups != 1:
        return f"{problem.groups} groups"
    if problem.n == 0:
        return "an empty batch"
    why_not = wgrad.refusal(problem)
    if why_not:
        return why_not
    kp, j, _ = _sizes(problem)
    if kp * j >= 2**31:
        return f"a weight of {kp * j} elements past wgrad_reduce's 32-bit element index"
    if problem.layout == "NCHW" and max(problem.n, math.ceil(problem.k / 32), math.ceil(problem.c / 32)) > MAX_GRID_Y:
        return f"batch {problem.n} past the channels-last copies' grid limit {MAX_GRID_Y}"
    if math.ceil(kp / 64) > MAX_GRID_Y:
        return f"{problem.k} output channels past the grid's y limit"
    return ""


def _copy(problem: ConvProblem, channels: int, padded: int) -> str:
    if problem.layout == "NCHW":
        return "transpose"
    return "pad" if padded != channels else ""


def expression(dtype: str, index: str, cfg: TileConfig, x_vec: int, stream_k: bool = False) -> str:
    """The C++ template instance of the GEMM (the TMA tiles': no index type or piece, TMA addresses, and
    whether it runs stream-K; TF32's: its landing stages too)."""
    if cfg.tf32:
        return (f"cupyconv::{TF32_TMA_KERNEL}<{cfg.bm},{cfg.bj},{cfg.landing},{cfg.stages},"
                f"{'true' if stream_k else 'false'}>")
    if cfg.tma:
        return (f"cupyconv::{TMA_KERNEL}<{CTYPES[dtype]},{cfg.bm},{cfg.bj},{cfg.stages},{cfg.blocks_per_sm},"
                f"{'true' if stream_k else 'false'},{'true' if cfg.k_major else 'false'}>")
    return (f"cupyconv::{KERNEL}<{CTYPES[dtype]},{index},{cfg.bm},{cfg.bj},{cfg.bl},{cfg.warps_m},{cfg.warps_j},"
            f"{cfg.stages},{x_vec},{'true' if cfg.wgmma else 'false'}>")


# typed: splits=True or 2.0 must reach the checks, not the plan cached for 1 or 2.
@functools.lru_cache(maxsize=1024, typed=True)
def make_plan(problem: ConvProblem, allow_tf32: bool = True, config: str | None = None,
              splits: int | None = None, compute_capability: int = 0, stream_k: bool | None = None) -> TensorCorePlan:
    """The launch plan of ``problem``'s weight gradient on the tensor cores.

    Args:
        problem: the forward convolution (cupyconv.arguments.make_problem); its layout says how x and
            grad_output are held, its weight_layout how the gradient is written.
        allow_tf32: whether float32 may run as TF32 (it must: strict float32 is refused).
        config: a name from CONFIGS (or, on sm_90a for 16-byte pieces, WGMMA_CONFIGS) to force the
            tile (tests); None chooses by shape.
        splits: the runs of the reduction to force (tests); None chooses them with the tile (_choose:
            a timing model of waves of blocks and the partial sums' traffic).
        compute_capability: the device's (compiler.compute_capability(); 90 takes wgmma's tiles
            where they apply), 0 for none.
        stream_k: True forces the TMA tiles' stream-K schedule, False forbids it (tests), None lets
            the timing model weigh it against the run counts.

    Raises:
        ValueError: naming why, for a problem the kernel cannot run, an unknown config, or splits out
            of range.
    """
    why_not = refusal(problem, allow_tf32)
    if why_not:
        raise ValueError(f"{KERNEL} cannot run {problem}: {why_not}")
    item = STORAGE_BYTES[problem.dtype]
    cp, kp, x_vec = _channels(problem)
    _, j, length = _sizes(problem)
    if stream_k not in (None, True, False):
        raise ValueError(f"stream_k must be None, True or False, got {stream_k!r}")
    if stream_k and splits is not None:
        raise ValueError(f"stream_k=True runs no fixed runs; got splits={splits!r} as well")
    allowed = False if splits is not None else stream_k
    if config is not None:
        cfg = forced_config(configs(problem, compute_capability), config,
                            f"config for {KERNEL} in {problem.dtype} on compute capability {compute_capability}")
        if stream_k and not cfg.stream_k:
            streamed = ", ".join(c.name for c in configs(problem, compute_capability) if c.stream_k)
            raise ValueError(f"stream_k=True needs a tile fed by TMA with a stream-K instance ({streamed or 'none'} "
                             f"for {problem}), got {cfg.name}")
        schedule = _best_schedule(problem, cfg, allowed)
        why = "config forced by the caller"
    else:
        if stream_k and not _tma_applies(problem, compute_capability):
            raise ValueError(f"stream_k=True needs the tiles fed by TMA, which cannot run {problem} on compute "
                             f"capability {compute_capability}")
        cfg, schedule, why = _choose(problem, compute_capability, allowed)
    j_tiles, o_tiles = _tiles(problem, cfg)
    if cfg.k_major:  # dy read in place: its own channels, the partial sums' rows
        kp = problem.k
    run_bytes = kp * j * 4
    stream_k_blocks = _stream_k_blocks(problem, cfg) if schedule == STREAM_K else 0
    if stream_k_blocks:
        splits = 1
        why += f"; stream-K: {stream_k_blocks} blocks share the tiles x l tiles"
    elif splits is None:
        splits = schedule
    else:
        if isinstance(splits, bool) or not isinstance(splits, int) or not 1 <= splits <= MAX_GRID_Y:
            raise ValueError(f"splits must be an int from 1 to {MAX_GRID_Y} (CUDA's grid z limit), got {splits!r}")
        if splits > 1 and splits * run_bytes > wgrad.MAX_WORKSPACE_BYTES:
            raise ValueError(f"splits={splits} needs a workspace of {splits * run_bytes} B, past the cap of "
                             f"{wgrad.MAX_WORKSPACE_BYTES} B (weight gradient of {kp} x {j} in float32)")
        why += f"; splits forced by the caller: {splits}"
    largest = max(problem.n * problem.h * problem.w * cp, length * kp)
    index = "int" if largest < 2**31 else "long long"
    direct = _direct(problem, cfg, splits)
    grid = (stream_k_blocks, 1, 1) if stream_k_blocks else (j_tiles, o_tiles, splits)
    slots = align(stream_k_blocks * cfg.bm * cfg.bj * 4)
    return TensorCorePlan(
        config=cfg, dtype=problem.dtype, layout=problem.layout, weight_layout=problem.weight_layout,
        index_type=index, arch=WGMMA_ARCH if cfg.wgmma else "", channels=cp, out_channels=kp, x_vec=x_vec,
        x_copy="" if cfg.k_major else _copy(problem, problem.c, cp),
        dy_copy="" if cfg.k_major else _copy(problem, problem.k, kp), grid=grid, block=(cfg.threads, 1, 1),
        shared_bytes=cfg.shared_bytes(item), splits=splits, direct=direct, stream_k_blocks=stream_k_blocks,
        workspace_bytes=slots + (0 if direct else splits * run_bytes),
        expression=expression(problem.dtype, index, cfg, x_vec, bool(stream_k_blocks)),
        reduce_expression=wgrad.reduce_specialisation(problem.dtype), reason=why)


def specialisations() -> list[str]:
    """Every mma.sync GEMM name expression a plan can use (wgrad.py lists the reduction's)."""
    return [expression(dtype, index, cfg, vec) for dtype in DTYPES for index in INDEX_TYPES
            for cfg in CONFIGS[STORAGE_BYTES[dtype]] for vec in X_VECS[STORAGE_BYTES[dtype]]]


def arch_specialisations() -> dict[str, list[str]]:
    """The GEMM name expressions that need an architecture-specific target: wgmma's, for sm_90a."""
    return {WGMMA_ARCH: [expression(dtype, index, cfg, 16) for dtype in ("float16", "bfloat16")
                         for index in INDEX_TYPES for cfg in WGMMA_CONFIGS] +
            [expression(dtype, "", cfg, 16, stream_k) for dtype in ("float16", "bfloat16")
             for cfg in TMA_CONFIGS + K_MAJOR_CONFIGS[2]
             for stream_k in (False, True) if cfg.stream_k or not stream_k] +
            [expression("float32", "", cfg, 16, stream_k) for cfg in TF32_TMA_CONFIGS + K_MAJOR_CONFIGS[4]
             for stream_k in (False, True) if cfg.stream_k or not stream_k]}


def _copy_launch(dtype: str, how: str, n: int, plane: int, channels: int, padded: int, source: Pointer,
          copy: Pointer) -> Launch:
    """The launch copying an operand of ``n`` images of ``plane`` pixels to [n plane][padded] at
    ``copy``, zero channels past ``channels``: from NHWC ('pad') or NCHW ('transpose'), by the kernels
    of nchw_to_nhwc.cu, exact (TF32's rounding is the GEMM's)."""
    if how == "pad":
        return pad_channels(dtype, n * plane, channels, padded, source, copy, round_tf32=False)
    return channels_last_copy(dtype, n, channels, plane, padded, False, source, copy)


def program(plan: TensorCorePlan, problem: ConvProblem) -> CallProgram:
    """The copies x and dy need (into the workspace), the GEMM into the runs' partial sums (after them),
    and wgrad.py's reduction into OUT, which skips the zero channels and rows of the copies; or, where
    the plan is direct, the GEMM into OUT alone."""
    p = problem
    item = STORAGE_BYTES[p.dtype]
    cp, kp = plan.channels, plan.out_channels
    launches, used = [], 0
    operands = []
    for how, source, plane, channels, padded in ((plan.x_copy, X, p.h * p.w, p.c, cp),
                                                 (plan.dy_copy, GRAD_OUTPUT, p.ho * p.wo, p.k, kp)):
        if not how:
            operands.append(Pointer(source))
            continue
        operands.append(Pointer(WORKSPACE, used))
        launches.append(_copy_launch(p.dtype, how, p.n, plane, channels, padded, Pointer(source), operands[-1]))
        used += align(p.n * plane * padded * item)
    if plan.config.tma:
        # Stream-K's slots first, then the runs' partial sums; OUT (any valid pointer) for what the kernel does not
        # touch: the slots without stream-K, the sums where it writes the weight itself.
        slots = Pointer(WORKSPACE, used) if plan.stream_k_blocks else Pointer(OUT)
        used += align(plan.stream_k_blocks * plan.config.bm * plan.config.bj * 4)
        partial = Pointer(OUT) if plan.direct else Pointer(WORKSPACE, used)
        x_operand, dy_operand = operands
        length = p.n * p.ho * p.wo
        width = _panel_channels(p)
        cfg = plan.config
        if cfg.k_major:  # NCHW as [N K][Ho Wo] and [N C][H W]: an image's channels are its rows; x in panels
            dy_map = TensorMap(dy_operand, p.dtype, p.n * p.k, p.ho * p.wo, p.ho * p.wo * item, cfg.bm, cfg.bl)
            x_map = TensorMap(x_operand, p.dtype, p.n * p.c, p.h * p.w, p.h * p.w * item, width, cfg.bl)
            x_tail_map = TensorMap(x_operand, p.dtype, p.n * p.c, p.h * p.w, p.h * p.w * item, width, 16 // item,
                                   False) if cfg.tf32 else x_map  # TF32's: the 4 pixels past a shifted box
            x_rows = p.c
        else:
            dy_map = TensorMap(dy_operand, p.dtype, length, kp, kp * item, cfg.bl, width)
            x_map = input_im2col_map(p, x_operand, cp, width, cfg.bl)
            x_tail_map = x_map  # read by the K-major tiles alone
            x_rows = cp
        args = (partial, Pointer(OUT), int(plan.direct), plan.stream_k_blocks, slots, Pointer(FLAGS), length, x_rows,
                p.kh * p.kw * cp, kp, p.ho, p.wo, p.kw, p.stride[0], p.stride[1], p.pad_top, p.pad_left, p.dilation[0],
                p.dilation[1], dy_map, x_map, *((x_tail_map,) if cfg.tf32 else ()))
        launches.append(Launch(TF32_TMA_KERNEL if cfg.tf32 else TMA_KERNEL, plan.expression, plan.grid,
                               plan.block, plan.shared_bytes, args, plan.arch))
        if plan.direct:
            return CallProgram(tuple(launches), used)
    else:
        partial = Pointer(WORKSPACE, used)
        launches.append(Launch(KERNEL, plan.expression, plan.grid, plan.block, plan.shared_bytes, (
            *operands, partial, p.n, cp, p.h, p.w, kp, p.ho, p.wo, p.kh, p.kw, p.stride[0], p.stride[1], p.pad_top,
            p.pad_left, p.dilation[0], p.dilation[1]), plan.arch))
    taps = p.kh * p.kw
    launches.append(wgrad.reduce_launch(p.dtype, plan.splits, p.k * taps * p.c, p.c, taps, True,
                                        p.weight_layout == "KHWC", partial, Pointer(OUT), cp, kp * taps * cp))
    return CallProgram(tuple(launches), used + plan.splits * kp * p.kh * p.kw * cp * 4)


def conv2d_weight_cupy(x, grad_output, problem: ConvProblem, out, plan: TensorCorePlan | None = None):
    """Write ``problem``'s weight gradient into ``out`` (C-contiguous, ``problem.weight_array_shape``)
    from C-contiguous CuPy ``x`` and ``grad_output`` in ``problem.layout``, on CuPy's current stream
    (float32 runs as TF32; refusal(problem, True) must be ""). ``plan``: from make_plan (None: the
    default)."""
    import cupy

    from .compiler import compute_capability
    from .executor import program_executable
    from .launch import run_program

    p = problem
    if plan is None:
        plan = make_plan(p, True, None, None, compute_capability())
    elif (plan.dtype, plan.layout, plan.weight_layout) != (p.dtype, p.layout, p.weight_layout):
        raise ValueError(f"plan is for {plan.dtype} {plan.layout} -> {plan.weight_layout}, the problem is "
                         f"{p.dtype} {p.layout} -> {p.weight_layout}")
    run_program(program_executable(program, plan, p, cupy.cuda.Device().id), x=x, grad_output=grad_output, out=out)
    return out
