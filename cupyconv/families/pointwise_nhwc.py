"""1x1 convolutions of channels-last tensors of few input channels (kernels/pointwise_nhwc.cu): a
GEMM whose whole reduction fits one shared-memory stage, streamed over the pixels by persistent
blocks that keep their channels of the weight for the whole launch and load the next pixel tiles
while they multiply and store this one. Float16, bfloat16, and float32 as TF32.

Such layers (ResNet-50's 64 -> 256 and 64 -> 64, MobileNetV2's projections) are memory-bound: their
time is reading x and writing y. The channels-last GEMM (implicit_gemm_nhwc) runs them as one or two
k tiles a block, loading, multiplying and storing in turn (H100: 52-56 % of copy bandwidth in fp16;
benchmarks/NOTES.md, "A streaming kernel for 1x1 layers of few channels")."""
from __future__ import annotations

import dataclasses
import math

from ..arguments import ConvProblem
from ..planner import LaunchPlan
from ..program import BIAS, INPUT_SCALE, OUT, WEIGHT, X, CallProgram, Launch, Pointer
from .common import (BLOCK_RESERVED_SHARED_BYTES, CTYPES, H100_SMS, INDEX_TYPES, SM_SHARED_BYTES, STORAGE_BYTES,
                     epilogue_args, forced_config, grid_refusal, index_type)

KERNEL = "pointwise_nhwc"
#: NHWC arrays alone (an NCHW 1x1 layer takes implicit_gemm_nhwc, which reads it in place); a 1x1
#: weight is the same memory in either weight layout.
LAYOUTS = ("NHWC",)
WEIGHT_LAYOUTS = ("KCHW", "KHWC")
DTYPES = ("float16", "bfloat16", "float32")
#: The input scale (cupyconv/input_scale.py) is applied to each pixel tile in shared memory.
APPLIES_INPUT_SCALE = True


@dataclasses.dataclass(frozen=True)
class PointwiseConfig:
    """A block of ``warps_m`` x ``warps_n`` warps computing ``bm`` pixels x ``bn`` output channels of
    input channels of at most ``channel_bytes`` bytes, with ``stages`` pixel tiles in shared memory
    and ``min_blocks`` blocks per SM asked of the register allocator."""

    name: str
    bm: int
    bn: int
    channel_bytes: int
    stages: int
    warps_m: int
    warps_n: int
    min_blocks: int

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n

    def shared_bytes(self, dtype: str) -> int:
        """The weight's rows [bn] and ``stages`` pixel tiles [bm], each of channel_bytes + 16 bytes, and
        the staged output [bm][bn elements + 16 bytes] (the kernel's layout)."""
        row = self.channel_bytes + 16
        return (self.bn + self.stages * self.bm) * row + self.bm * (self.bn * STORAGE_BYTES[dtype] + 16)


#: Tiles per dtype, by the input channels' bytes they hold and then by output channels: _config takes,
#: of the tiles that hold C, the narrowest at least K wide (else the widest), of those the one of the
#: fewest channel bytes.
#: Each is the fastest of those timed on the suites' 1x1 rows on the H100 (benchmarks/profile/pointwise.py,
#: calls on three input sets in turn so that x comes from DRAM; benchmarks/results/pointwise_tiles_sweep_3024172.txt
#: and ..._large_5109301.txt): r50_l1_1x1_64 fp16 12.4 us on 64 x 64 with three blocks per SM against
#: 13.9 on 64 x 128; large_1x1_32to128_512sq fp16 131 us on 64 x 128 (weight fragments in registers at two
#: blocks per SM) against 149 on 64 x 64; mbv2_pw_1x1_144to24 on the 32-channel tiles, fp16 15.8 us
#: against 17.1 on 128 x 64, TF32 29.0 against 37.6 on 64 x 64 (a 64-channel tile multiplies 2-3 times
#: the columns it stores, which these long reductions feel). The widest (up to 512 16-bit or 256 float32
#: channels: MobileNetV2's 384 -> 64 and, in TF32, 144 -> 24) fills an SM's shared memory with one block.
#: Outputs of 16-32 channels take a 32-channel tile even where it holds more input channels than a wider
#: tile (H100, benchmarks/profile/pointwise.py, NOTES.md "Narrow projections"): MobileNetV2's and
#: EfficientNet-B0's 32 -> 16 on 112^2 17.8 us fp16 on 128-byte rows of 32 channels against 20.7 on
#: 64, TF32 30.6 against 34.3; 96 -> 24 on 56^2 13.0 us fp16 on 512-byte rows of 32 against 17.0 on
#: 256-byte rows of 128 channels.
#: The 16-bit tiles of 96 and 144 channels hold MobileNetV2's and EfficientNet-B0's 16 -> 96 and 24 -> 144 in one
#: channel tile, each pixel tile staged and multiplied once: at batch 32 28.0 us against 31.9 on 128 channels and
#: 12.0 against 17.1 on three tiles of 64 and 16.1 on two of 96 (H200, fp16 channels_last, CUDA graphs of 20 calls,
#: benchmarks/results/pointwise_96_144_channel_tiles_h200.txt). Wider is not always better: a 192-channel tile (two
#: blocks an SM) ran 32 -> 192 on 28^2 5.9 us against 5.6 on 96 (pointwise_192_channel_tile_trial_h200.txt).
#: Outputs past every tile that holds C take, of the tiles of the widest one's rows and at least BALANCED_MIN_WIDTH
#: channels wide, the one that leaves the fewest of its last channel tile unused (ties: the wider), not the widest:
#: before the 96- and 144-channel tiles, MobileNetV2's 24 -> 144 on 56^2 ran its two channel tiles of 128, the
#: second 16 wide, at 17.4 us at batch 32 against 16.6 on three of 64, 6.1 against 5.8 at batch 8; 32 -> 192 on 28^2
#: 6.2 against 5.6 and 3.4 against 3.3 (pointwise_rules_candidates_h200.txt); now it takes two of 96, as fast as
#: three of 64.
BALANCED_MIN_WIDTH = 64
#: A tile whose pixel tiles times channel tiles make fewer blocks than the H100's SMs leaves SMs idle, and each
#: block's share is the layer's whole time. A tile of more than SHORT_TILE_PIXELS pixels gives way to the widest
#: tile of the same rows SHORT_TILE_PIXELS tall: MobileNetV2's 192 -> 64 on 14^2 on the 128 x 64 tile (13 blocks at
#: batch 8, 49 at batch 32) 3.7 and 4.1 us against 2.8 and 3.8 on the 64 x 32 one (same file; torch 2.8 and 3.1).
#: One of rows of at most NARROW_MAX_CHANNEL_BYTES gives way to the narrowest of its rows: at batch 1
#: (pointwise_b1_candidates_h200.txt) 64 -> 384 on 14^2 2.9 us on the 128-channel tile (12 blocks) against 2.3 on
#: the 32-channel one (48), 32 -> 192 on 28^2 2.7 on 96 channels against 2.2, 40 -> 240 2.9 against 2.4, 24 -> 144 on
#: 56^2 2.9 on 144 (49 blocks) against 2.6, ResNet-50's 64 -> 256 3.2 on 128 against 3.1 (torch 2.5, 2.7, 2.7, 3.0,
#: 3.0); within 0.1 us of the fastest tile on all eight layers timed. There x is a small part of the bytes; on wider
#: rows a narrower tile reads it again for every channel tile (not timed: those keep their tile).
SHORT_TILE_PIXELS = 64
NARROW_MAX_CHANNEL_BYTES = 128
POINTWISE_CONFIGS = {
    "float16": (PointwiseConfig("pw_c128_m64n32", 64, 32, 128, 3, 4, 2, 3),
                PointwiseConfig("pw_c128_m64n64", 64, 64, 128, 3, 4, 2, 3),
                PointwiseConfig("pw_c128_m64n96", 64, 96, 128, 3, 4, 2, 3),
                PointwiseConfig("pw_c128_m64n128", 64, 128, 128, 3, 2, 4, 2),
                PointwiseConfig("pw_c128_m64n144", 64, 144, 128, 3, 2, 3, 3),
                PointwiseConfig("pw_c256_m64n128", 64, 128, 256, 3, 2, 4, 2),
                PointwiseConfig("pw_c512_m64n32", 64, 32, 512, 2, 4, 2, 2),
                PointwiseConfig("pw_c512_m128n64", 128, 64, 512, 2, 4, 2, 1),
                PointwiseConfig("pw_c1024_m64n32", 64, 32, 1024, 2, 4, 2, 1),
                PointwiseConfig("pw_c1024_m64n64", 64, 64, 1024, 2, 2, 4, 1)),
    "float32": (PointwiseConfig("pw_c128_m64n32", 64, 32, 128, 3, 4, 2, 3),
                PointwiseConfig("pw_c256_m64n64", 64, 64, 256, 3, 2, 4, 2),
                PointwiseConfig("pw_c512_m64n32", 64, 32, 512, 2, 4, 2, 2),
                PointwiseConfig("pw_c512_m64n64", 64, 64, 512, 2, 2, 4, 1),
                PointwiseConfig("pw_c1024_m64n32", 64, 32, 1024, 2, 4, 2, 1),
                PointwiseConfig("pw_c1024_m64n64", 64, 64, 1024, 2, 2, 4, 1)),
}
POINTWISE_CONFIGS["bfloat16"] = POINTWISE_CONFIGS["float16"]
CONFIG_NAMES = frozenset(c.name for configs in POINTWISE_CONFIGS.values() for c in configs)
#: The persistent grid: the H100's SMs (common.H100_SMS) x the tile's blocks per SM, shared by the
#: channel tiles. On a GPU of fewer SMs the blocks run in more than one wave, each still a whole stream.
#: The planner takes this kernel for a layer it can run up to this many multiply-adds x 2 per byte of x
#: and y (a pixel's 2 C K over its (C + K) elements): past it the mma.sync tiles' rate, not the copies,
#: binds, and the channels-last GEMM's wgmma tiles are faster. H100, layers suite channels_last: 16-bit
#: rows of 20-82 FLOP/B 1.05-1.4x faster than on the GEMM, r50_l3_1x1_256to1024 (205) 0.67x; TF32 rows of
#: 16-26 1.16-1.38x, mbv2_pw_1x1_96to576 (41) 0.89x.
MAX_FLOP_PER_BYTE = {"float16": 96, "bfloat16": 96, "float32": 32}
#: ... and in float32 to inputs of more than this many channels: large_1x1_32to128_512sq in TF32 ran 268-288
#: us on these tiles against 238 on the GEMM's mma.sync tile (94 % of copy bandwidth), while 64-channel
#: inputs gain 1.09-1.38x (same sweeps) -- unless the output fits one 32-channel tile: 32 -> 16 on 112^2
#: 30.6 us on pw_c128_m64n32 against 42.6 on the GEMM.
MIN_FLOAT32_CHANNELS = 33
#: ... and, on sm_90 (WGMMA_COMPUTE_CAPABILITY), to layers of more than WGMMA_MIN_CHANNEL_BYTES of
#: input channels (the 512-byte tiles' 1 to 2 blocks an SM) and at least WGMMA_MIN_OUT_CHANNELS outputs on
#: at least WGMMA_MIN_PIXELS pixels: the channels-last GEMM's wgmma tiles run them faster. H200, fp16
#: channels_last, each plan against the others in one process (benchmarks/results/pointwise_gemm_h200.txt):
#: ResNet-50's 256 -> 64 on 56^2 9.4 us at batch 8 (25088 pixels) against 12.7 on pw_c512_m128n64, 25.0
#: against 29.1 at batch 32; 256 -> 128 12.6 against 16.3 and 30.3 against 42.7; at 6272 pixels even
#: (EfficientNet-B0's 240 -> 80 on 14^2 at batch 32 7.6 against 7.8, MobileNetV2's 192 -> 64 6.9 against
#: 7.3), at 1568 the pointwise tiles as fast or faster (240 -> 80 7.3 against >= 7.3). TF32 alike: 256 -> 64
#: on 56^2 at batch 32 43 us on wgmma's 128 x 64 channel-row tile against 76 on pw_c1024_m64n64
#: (benchmarks/results/dstride_tf32_ab_h200.txt, candidates_tf32_256to64_h200.txt).
#: In 16 bits from 4096 pixels and 40 outputs since session #30 (H200, fp16 channels_last, CUDA graphs of 20 calls,
#: results/pointwise_rules_candidates_h200.txt, pointwise_rules_ab_h200.txt), us, wgmma's one-warpgroup 64 x 64 tile
#: against the pointwise tiles' rules: batch 8, EfficientNet-B0's 144 -> 40 and 240 -> 40 on 28^2 (6272 pixels)
#: 3.0 and 3.3 against 3.3 and 4.2 (torch 3.0, 3.1); batch 32, MobileNetV2's 192 -> 64 on 14^2 3.1 against 3.8
#: (3.1), and 144 -> 40 and 240 -> 40 on 28^2 on the 256 x 64 channel-row tile 5.2 and 6.1 against 5.5 and 7.3 on
#: pw_c512_m128n64 (4.7, 5.0; results/pointwise_wgmma_b32_candidates_h200.txt); at 1568 pixels even (192 -> 64 at
#: batch 8 2.9 against 2.8). Outputs of up to 32 channels stay (144 -> 24 on 56^2 at batch 8: 4.8 on pw_c512_m64n32,
#: the GEMM's tiles 5.0 and slower).
WGMMA_COMPUTE_CAPABILITY = 90
WGMMA_MIN_CHANNEL_BYTES = 257
WGMMA_MIN_OUT_CHANNELS = {"float16": 40, "bfloat16": 40, "float32": 64}
WGMMA_MIN_PIXELS = {"float16": 4096, "bfloat16": 4096, "float32": 16384}


def refusal(problem: ConvProblem) -> str:
    """Why this kernel cannot run ``problem`` ("" when it can): not NHWC, not 16-bit or float32, not
    a 1x1 stride-1 unpadded convolution of one group, input channels past its widest tile or output
    channels not whole 16-byte vectors."""
    p = problem
    if p.layout != "NHWC":
        return f"it computes NHWC arrays only (layout {p.layout})"
    if p.dtype not in DTYPES:
        return f"it runs {DTYPES} on the tensor cores, not {p.dtype}"
    if (p.kh, p.kw, p.stride, p.pad_top, p.pad_left, p.pad_bottom, p.pad_right, p.groups) != \
            (1, 1, (1, 1), 0, 0, 0, 0, 1):
        return (f"it runs 1x1, stride-1, unpadded convolutions of one group; got {p.kh}x{p.kw}, stride {p.stride}, "
                f"padding {(p.pad_top, p.pad_bottom, p.pad_left, p.pad_right)}, {p.groups} groups")
    item, widest = STORAGE_BYTES[p.dtype], POINTWISE_CONFIGS[p.dtype][-1].channel_bytes
    if p.c * item % 16 or p.c * item > widest:
        return (f"{p.c} input channels of {p.dtype} are not whole 16-byte pieces of at most {widest} bytes "
                f"(its widest tile)")
    if p.k * item % 16:
        return f"{p.k} output channels of {p.dtype} are not whole 16-byte vectors"
    return grid_refusal(_grid(p, _config(p)[0]))


def flop_per_byte(problem: ConvProblem) -> float:
    """2 C K multiply-adds per pixel over its (C + K) elements of x and y."""
    return 2 * problem.c * problem.k / ((problem.c + problem.k) * STORAGE_BYTES[problem.dtype])


def pays(problem: ConvProblem, compute_capability: int = 0) -> bool:
    """Whether the planner takes it for ``problem`` (one it can run) on a GPU of ``compute_capability``
    (0: any): memory-bound enough (MAX_FLOP_PER_BYTE), not a float32 input of few channels to more than
    one narrow tile's (MIN_FLOAT32_CHANNELS), and not a wide, large layer that wgmma runs faster
    (WGMMA_MIN_*)."""
    p = problem
    wgmma_faster = compute_capability == WGMMA_COMPUTE_CAPABILITY and \
        p.c * STORAGE_BYTES[p.dtype] >= WGMMA_MIN_CHANNEL_BYTES and p.k >= WGMMA_MIN_OUT_CHANNELS[p.dtype] and \
        p.n * p.h * p.w >= WGMMA_MIN_PIXELS[p.dtype]
    return flop_per_byte(p) <= MAX_FLOP_PER_BYTE[p.dtype] and not wgmma_faster and \
        not (p.dtype == "float32" and p.c < MIN_FLOAT32_CHANNELS and
             p.k > min(c.bn for c in POINTWISE_CONFIGS[p.dtype]))


def _config(problem: ConvProblem) -> tuple[PointwiseConfig, str]:
    """Of the tiles that hold the input channels, the narrowest at least K channels wide (of those, the one of the
    fewest channel bytes), else the one of the widest tile's rows that wastes fewest channels (BALANCED_MIN_WIDTH);
    a tile that makes less than a wave of blocks gives way to a short one (SHORT_TILE_PIXELS) or, on narrow rows, the
    narrowest (NARROW_MAX_CHANNEL_BYTES). With why."""
    item = STORAGE_BYTES[problem.dtype]
    holding = [c for c in POINTWISE_CONFIGS[problem.dtype] if problem.c * item <= c.channel_bytes]
    wide_enough = [c.bn for c in holding if c.bn >= problem.k]
    if wide_enough:
        cfg = next(c for c in holding if c.bn == min(wide_enough))
        why = f"{problem.k} output channels on its {cfg.bn}-channel tile"
    else:
        widest = next(c for c in holding if c.bn == max(t.bn for t in holding))
        rows = [c for c in holding if c.channel_bytes == widest.channel_bytes and
                c.bn >= min(BALANCED_MIN_WIDTH, widest.bn)]
        cfg = min(rows, key=lambda c: (-problem.k % c.bn, -c.bn))
        why = (f"{problem.k} output channels on {math.ceil(problem.k / cfg.bn)} {cfg.bn}-channel tiles "
               f"({-problem.k % cfg.bn} unused in the last)")
    def blocks(c: PointwiseConfig) -> int:
        return math.ceil(problem.n * problem.h * problem.w / c.bm) * math.ceil(problem.k / c.bn)

    short = [c for c in holding if c.channel_bytes == cfg.channel_bytes and c.bm == SHORT_TILE_PIXELS]
    if blocks(cfg) < H100_SMS and short:
        few = cfg
        if cfg.bm > SHORT_TILE_PIXELS:
            cfg = max(short, key=lambda c: c.bn)
        elif cfg.channel_bytes <= NARROW_MAX_CHANNEL_BYTES:
            cfg = min(short, key=lambda c: c.bn)
        if cfg != few:
            why += (f"; its {blocks(few)} blocks of {few.bm} x {few.bn} (< {H100_SMS} SMs): the {cfg.bm} x {cfg.bn} "
                    f"tile, {blocks(cfg)} blocks")
    return cfg, why


def blocks_per_sm(cfg: PointwiseConfig, dtype: str, index: str = "int") -> int:
    """Blocks resident per SM: the launch bounds' ask (at most two with 64-bit indices: the kernel's
    pointwise_min_blocks), as far as shared memory holds them."""
    asked = min(cfg.min_blocks, 2) if index == "long long" else cfg.min_blocks
    by_shared = SM_SHARED_BYTES // (cfg.shared_bytes(dtype) + BLOCK_RESERVED_SHARED_BYTES)
    return max(1, min(asked, by_shared))


def _grid(problem: ConvProblem, cfg: PointwiseConfig, index: str = "int") -> tuple[int, int, int]:
    """(persistent blocks per channel tile, channel tiles, 1): as many blocks as are resident on H100_SMS
    SMs, shared by the channel tiles, each taking an equal number of pixel tiles (within one)."""
    tiles_m = math.ceil(problem.n * problem.h * problem.w / cfg.bm)
    tiles_n = math.ceil(problem.k / cfg.bn)
    resident = max(1, H100_SMS * blocks_per_sm(cfg, problem.dtype, index) // tiles_n)
    per_block = math.ceil(tiles_m / resident) if tiles_m else 1
    return (max(1, math.ceil(tiles_m / per_block)) if tiles_m else 1, tiles_n, 1)


def make_plan(problem: ConvProblem, config: str | None = None, reason: str = "") -> LaunchPlan:
    """_config's tile (or ``config``), on a persistent grid (_grid)."""
    why_not = refusal(problem)
    if why_not:
        raise ValueError(f"kernel {KERNEL!r} cannot run this problem: {why_not}")
    item = STORAGE_BYTES[problem.dtype]
    if config is not None:
        cfg = forced_config(POINTWISE_CONFIGS[problem.dtype], config, f"config for {KERNEL} in {problem.dtype}")
        if problem.c * item > cfg.channel_bytes:
            raise ValueError(f"config {config!r} holds {cfg.channel_bytes} bytes of input channels; this problem has "
                             f"{problem.c} channels of {problem.dtype} ({problem.c * item} bytes)")
        why = "config forced by the caller"
    else:
        cfg, tile_why = _config(problem)
        why = f"1x1 of {problem.c} channels ({problem.c * item} bytes): the whole reduction in one stage, {tile_why}"
    index = index_type(problem)
    grid = _grid(problem, cfg, index)
    tiles_m = math.ceil(problem.n * problem.h * problem.w / cfg.bm)
    why += f"; {grid[0] * grid[1]} persistent blocks over {tiles_m} pixel tiles x {grid[1]} channel tiles"
    return LaunchPlan(kernel=KERNEL, dtype=problem.dtype, index_type=index, config=cfg, grid=grid,
                      block=(cfg.threads, 1, 1), shared_bytes=cfg.shared_bytes(problem.dtype),
                      reason=f"{reason}; {why}" if reason else why)


def describe(plan: LaunchPlan) -> str:
    """The printed plan: tile, warps, launch shape and why."""
    c = plan.config
    rounding = "; float32 rounded to TF32 in its fragments" if plan.dtype == "float32" else ""
    return (f"{plan.kernel} [{c.name}: {c.bm} pixels x {c.bn} channels, input channels of up to {c.channel_bytes} "
            f"bytes in one stage, {c.stages} stages, {c.warps_m}x{c.warps_n} warps, mma.sync]\n"
            f"  {plan.dtype}, {plan.index_type} indices; x, the weight and the output read and written in place"
            f"{rounding}\n"
            f"  grid {plan.grid}, block {plan.block}, {plan.shared_bytes} bytes of shared memory\n"
            f"  why: {plan.reason}")


def specialisation(dtype: str, index: str, cfg: PointwiseConfig) -> str:
    """The C++ template instance of ``cfg`` for ``dtype`` and ``index``."""
    return (f"cupyconv::{KERNEL}<{CTYPES[dtype]},{index},{cfg.bm},{cfg.bn},{cfg.channel_bytes},{cfg.stages},"
            f"{cfg.warps_m},{cfg.warps_n},{cfg.min_blocks}>")


def name_expression(plan: LaunchPlan) -> str:
    return specialisation(plan.dtype, plan.index_type, plan.config)


def specialisations() -> list[str]:
    """Every tile of every dtype, with 32- and 64-bit indices."""
    return [specialisation(dtype, index, cfg) for dtype in DTYPES for index in INDEX_TYPES
            for cfg in POINTWISE_CONFIGS[dtype]]


def program(plan: LaunchPlan, problem: ConvProblem) -> CallProgram:
    """One launch on the caller's x, weight and output."""
    p = problem
    args = (Pointer(X), Pointer(WEIGHT), Pointer(BIAS), Pointer(OUT), int(p.has_bias), *epilogue_args(p),
            Pointer(INPUT_SCALE), int(p.has_input_scale), p.n, p.c, p.h, p.w, p.k)
    return CallProgram((Launch(KERNEL, plan.name_expression, plan.grid, plan.block, plan.shared_bytes, args),))
