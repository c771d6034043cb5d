"""The FMA implicit GEMM (kernels/simt_gemm_conv2d.cu): strict float32 (IEEE fmaf) where TF32 is not
allowed. It gathers the NCHW input in place and reads a transposed copy of the weight, prepared once."""
from __future__ import annotations

import dataclasses
import math

from ..arguments import ConvProblem
from ..planner import LaunchPlan
from ..program import OUT, PREPARED, WEIGHT, WORKSPACE, X, CallProgram, Launch, Pointer, WeightPreparation
from .common import (INDEX_TYPES, REDUCE_KERNEL, STORAGE_BYTES, check_splits, conv_launch, forced_config, gemm_grid,
                     grid_fits, grid_refusal, index_type, partial_bytes, reduce_specialisation, split_k_reduce,
                     split_k_runs)
from .implicit_gemm_nhwc import channels_last_copy

KERNEL = "simt_gemm_conv2d"


@dataclasses.dataclass(frozen=True)
class SimtConfig:
    """Thread-block tile of the FMA implicit GEMM: bm output pixels x bn output channels, bk of the
    reduction per stage, `stages` cp.async buffers; warp tiles wm x wn, each thread tm x tn outputs (8 or 4
    each way)."""

    name: str
    bm: int
    bn: int
    bk: int
    wm: int
    wn: int
    stages: int
    tm: int = 8
    tn: int = 8

    @property
    def threads(self) -> int:
        return 32 * (self.bm // self.wm) * (self.bn // self.wn)

    def shared_bytes(self, taps: int) -> int:
        """The stages, A [bk][bm] and B [bk][bn] floats each, then the tap table (an int4 per tap)."""
        return 4 * self.stages * self.bk * (self.bm + self.bn) + 16 * taps


#: Tiles chosen by _choose_config from H100 timings of these and other tiles on the bench suites
#: (benchmarks/bench_igemm.py --dtype fp32): k rows of 16 (3 stages) beat 8 (4 stages) by 3-6 % on
#: most layers, except the 64 x 64 tile, the best for 33-64 output channels. Warp tiles of 64 pixels
#: x 32 channels (lanes 8 x 4, each thread 8 x 8 outputs). The first four by output channels.
SIMT_CONFIGS = (
    SimtConfig("simt_m256n32", 256, 32, 8, 64, 32, 4),
    SimtConfig("simt_m64n64", 64, 64, 8, 64, 32, 4),
    SimtConfig("simt_m128n64k16", 128, 64, 16, 64, 32, 3),
    SimtConfig("simt_m128n96k16", 128, 96, 16, 64, 32, 3),
    SimtConfig("simt_m128n128k16", 128, 128, 16, 64, 32, 3),
    SimtConfig("simt_m64n128k16", 64, 128, 16, 64, 32, 3),
    # 4 x 4 outputs a thread, four warps of 32 x 16: for grids of few tiles (batch 1 and 8), where a thread's
    # chain of multiply-adds, not issue, bounds the 8 x 8 tiles (SIMT_SMALL_TILE_MAX_BLOCKS).
    SimtConfig("simt_m32n64t4", 32, 64, 16, 32, 16, 3, tm=4, tn=4),
)
_SIMT_BY_NAME = {c.name: c for c in SIMT_CONFIGS}
_SMALL_TILE = "simt_m32n64t4"
CONFIG_NAMES = frozenset(_SIMT_BY_NAME)
#: SMs of the H100 the tiles were timed on: blocks beyond a multiple of it start another wave.
SIMT_WAVE_BLOCKS = 132
#: The 128-channel tile does a multiply-add in ~10 % less time than the 64-channel one (it gathers
#: the input half as often per output channel).
SIMT_WIDE_TILE_SPEED = 1.1
#: Ungrouped reductions shorter than this (under two k tiles of 16) on more than this many waves of
#: 64 x 128 tiles keep the 96- and 128-pixel tiles, whose blocks each cover more outputs: MobileNetV2's
#: 16 -> 96 on 112^2 at b8 and b32 (25.6 / 94.2 us against 27.3 / 101.3) and 24 -> 144 on 56^2 at b32
#: (58.6 against 68.6; 19.4 against 18.4 at b8, 6 waves).
SIMT_SHORT_REDUCTION = 32
SIMT_SHORT_REDUCTION_WAVES = 8
#: Ungrouped layers whose grid of 32 x 64 tiles of 4 x 4 outputs a thread fits one wave of resident blocks
#: (five an SM: 87-96 registers a thread) take that tile: four times the threads of an 8 x 8 tile's outputs,
#: each with a quarter of the multiply-add chain. H200, graph-timed, MobileNetV2 and EfficientNet-B0 at batch
#: 1 and 8: 35-50 % faster on 1x1 layers of 7^2-28^2 (MobileNetV2 b1 96 -> 576 on 14^2 11.6 -> 5.7 us, 960 ->
#: 160 on 7^2 13.1 -> 7.4), as fast or faster up to 539 tiles (b8 112 -> 672 on 14^2 17.4 -> 14.7), slower
#: from 784 (two waves: b1 16 -> 96 on 112^2 5.6 -> 6.9, b8 144 -> 24 on 56^2 18.3 -> 24.5;
#: benchmarks/NOTES.md).
SIMT_SMALL_TILE_MAX_BLOCKS = 5 * SIMT_WAVE_BLOCKS
#: That tile splits its reduction (split-K) into as many runs as keep its grid within four blocks an SM, at
#: least SPLIT_K_MIN_TILES k tiles a run: H200, MobileNetV2 b32's 960 -> 160 on 7^2 (147 tiles) 48.1 us whole,
#: 35.5 in 2 runs, 31.2 in 4; b1's (6 tiles) 34.6 whole, 7.5 in 15. Over MobileNetV2, EfficientNet-B0 and ResNet-50's
#: layers that take it, within 1 % of the 8 x 8 tiles' rule (_splits' warp count) at batch 1 and 8 and 5 %
#: faster at 32.
SIMT_SMALL_TILE_SPLIT_BLOCKS = 4 * SIMT_WAVE_BLOCKS
#: Kernel taps the tap table holds at most (16 KB of shared memory); larger kernels run direct.
SIMT_MAX_TAPS = 1024
#: Split-K (common.split_k_runs): a grid of at most SPLIT_K_MAX_WARPS_PER_SM warps an SM on average
#: (SIMT_WAVE_BLOCKS SMs) splits its reduction across blocks, into enough runs to make
#: SPLIT_K_TARGET_BLOCKS blocks (two per SM of the H100, which keeps 1 to 3 of them resident) and
#: SPLIT_K_TARGET_WARPS warps, of at least SPLIT_K_MIN_TILES k tiles each. One block of four warps an
#: SM waits on its loads: split 3, ResNet-50 b32's 2048 -> 512 on 7^2 (104 blocks) 236 -> 151 us and
#: MobileNetV2 b8's 144 -> 24 on 56^2 22 -> 19 us; one of eight does not gain (98 blocks of 1024 -> 256
#: on 14^2 128 -> 139 us), nor batch-32 layers of 98-104 tiles of 128 x 128 split into 3 (H100,
#: benchmarks/NOTES.md).
SPLIT_K_TARGET_BLOCKS = 2 * SIMT_WAVE_BLOCKS
SPLIT_K_MAX_WARPS_PER_SM = 4
SPLIT_K_TARGET_WARPS = 8 * SIMT_WAVE_BLOCKS
SPLIT_K_MIN_TILES = 4


def weight_columns(problem: ConvProblem) -> int:
    """Columns of the transposed weight copy: K / groups rounded up to 4 (16-byte pieces)."""
    return math.ceil(problem.k // problem.groups / 4) * 4


def _choose_config(problem: ConvProblem) -> tuple[SimtConfig, str]:
    """Ungrouped layers of at most SIMT_SMALL_TILE_MAX_BLOCKS tiles of 32 x 64 the 4 x 4-output tile. Else
    up to 32 output channels per group the 256 x 32 tile, up to 64 the 64 x 64 one. Ungrouped layers
    of more: the 64 x 128 tile on 1x1 kernels and up to 128 channels (four warps a block and twice the
    blocks of 128 x 128, which a short reduction or a small grid runs faster: ResNet-50 b32's 1x1 layers
    2-12 %, MobileNetV2's and EfficientNet-B0's at b8 8-25 %, H100, benchmarks/NOTES.md), else whichever
    of the 128 x 128, 64 x 128 and 128 x 64 tiles finishes first counting whole waves of
    SIMT_WAVE_BLOCKS blocks (wave quantisation decides the small late layers: ResNet-50's 7x7 and 14x14
    stages fill few waves of 128-channel tiles). Grouped problems (Winograd's batched GEMM among them)
    keep the tiles they were timed with (_channel_fit_config), as do reductions shorter than
    SIMT_SHORT_REDUCTION on more than SIMT_SHORT_REDUCTION_WAVES waves of 64 x 128 tiles."""
    small = _SIMT_BY_NAME[_SMALL_TILE]
    small_blocks = math.prod(gemm_grid(problem, small))
    if problem.groups == 1 and small_blocks <= SIMT_SMALL_TILE_MAX_BLOCKS:
        return small, (f"{small.name}: its {small_blocks} tiles fit one wave of resident blocks (at most "
                       f"{SIMT_SMALL_TILE_MAX_BLOCKS}), 4 x 4 outputs a thread")
    kg = problem.k // problem.groups
    if kg <= 64 or problem.groups > 1:
        return _channel_fit_config(problem)
    tall = _SIMT_BY_NAME["simt_m64n128k16"]
    reduction, tall_blocks = problem.c * problem.kh * problem.kw, math.prod(gemm_grid(problem, tall))
    if reduction < SIMT_SHORT_REDUCTION and tall_blocks > SIMT_SHORT_REDUCTION_WAVES * SIMT_WAVE_BLOCKS:
        cfg, why = _channel_fit_config(problem)
        return cfg, f"{why} (a reduction of {reduction} on {tall_blocks} blocks of {tall.name})"
    if kg <= 128 or problem.kh * problem.kw == 1:
        return tall, f"{tall.name} for {'a 1x1 kernel' if problem.kh * problem.kw == 1 else 'up to 128 channels'}"
    return _fewest_waves(problem, ("simt_m128n128k16", "simt_m64n128k16", "simt_m128n64k16"))


def _channel_fit_config(problem: ConvProblem) -> tuple[SimtConfig, str]:
    """The tiles by output channels per group alone, as first timed (every layer up to 64 channels;
    grouped problems and short reductions on many waves past that): up to 32 the 256 x 32 tile, up to
    64 the 64 x 64 one, up to 96 the 96-channel one, up to 128 the 64 x 128 one (the input gathered once,
    twice the blocks of 128 x 128: r50_down_3x3s2 0.212 ms against 0.245 with 128 x 64). More: 64- or
    128-channel tiles of 128 pixels, whichever finishes first counting whole waves."""
    kg = problem.k // problem.groups
    for limit, name in ((32, "simt_m256n32"), (64, "simt_m64n64"), (96, "simt_m128n96k16"), (128, "simt_m64n128k16")):
        if kg <= limit:
            return _SIMT_BY_NAME[name], f"{kg} output channels per group fit one {name} tile"
    return _fewest_waves(problem, ("simt_m128n128k16", "simt_m128n64k16"))


def _fewest_waves(problem: ConvProblem, names: tuple[str, ...]) -> tuple[SimtConfig, str]:
    """The tile of ``names`` (the first of equals) whose whole waves of SIMT_WAVE_BLOCKS blocks take the
    least time, a 128-channel tile doing a multiply-add SIMT_WIDE_TILE_SPEED times as fast."""
    tiles = [_SIMT_BY_NAME[name] for name in names]

    def cost(cfg: SimtConfig) -> float:
        waves = math.ceil(math.prod(gemm_grid(problem, cfg)) / SIMT_WAVE_BLOCKS)
        return waves * cfg.bm * cfg.bn / (SIMT_WIDE_TILE_SPEED if cfg.bn == 128 else 1.0)

    cfg = min(tiles, key=cost)
    return cfg, (f"{cfg.name} finishes first counting whole waves of {SIMT_WAVE_BLOCKS} blocks ("
                 + ", ".join(f"{math.prod(gemm_grid(problem, t))} of {t.name}" for t in tiles) + ")")


def refusal(problem: ConvProblem) -> str:
    """Why the FMA implicit GEMM cannot run ``problem`` ("" when it can)."""
    if problem.dtype != "float32":
        return f"it computes in float32 only, got {problem.dtype}"
    if problem.kh * problem.kw > SIMT_MAX_TAPS:
        return f"{problem.kh}x{problem.kw} kernel taps past its table of {SIMT_MAX_TAPS}"
    # Tap offsets within a plane are 32-bit.
    if (problem.h + (problem.kh - 1) * problem.dilation[0]) * (problem.w + (problem.kw - 1) * problem.dilation[1]) >= 2**31:
        return f"input planes of {problem.h}x{problem.w} past 32-bit tap offsets"
    return grid_refusal(gemm_grid(problem, _choose_config(problem)[0]))


def _splits(problem: ConvProblem, cfg: SimtConfig, grid: tuple[int, int, int]) -> int:
    """Runs of the reduction for split-K (1: none): for grids of at most SPLIT_K_MAX_WARPS_PER_SM warps
    an SM on average, enough runs to make SPLIT_K_TARGET_BLOCKS blocks and SPLIT_K_TARGET_WARPS warps; for
    tiles of 4 x 4 outputs a thread, as many as keep the grid within SIMT_SMALL_TILE_SPLIT_BLOCKS blocks."""
    blocks, warps = math.prod(grid), cfg.threads // 32
    k_tiles = math.ceil(problem.c // problem.groups * problem.kh * problem.kw / cfg.bk)
    if (cfg.tm, cfg.tn) == (4, 4):
        return split_k_runs(problem, grid, k_tiles, SIMT_SMALL_TILE_SPLIT_BLOCKS // max(1, blocks), SPLIT_K_MIN_TILES)
    if blocks * warps > SPLIT_K_MAX_WARPS_PER_SM * SIMT_WAVE_BLOCKS:
        return 1
    wanted = max(SPLIT_K_TARGET_BLOCKS, math.ceil(SPLIT_K_TARGET_WARPS / warps))
    return split_k_runs(problem, grid, k_tiles, math.ceil(wanted / max(1, blocks)), SPLIT_K_MIN_TILES)


def make_plan(problem: ConvProblem, config: str | None = None, reason: str = "", splits: int | None = None) -> LaunchPlan:
    """The FMA implicit-GEMM launch: grid (pixel tiles, channel tiles, groups x splits), one block per
    tile and run of the reduction. ``splits`` forces split-K's runs (1: none; None: _splits)."""
    if config is not None:
        cfg, why = forced_config(SIMT_CONFIGS, config, f"config for {KERNEL}"), "config forced by the caller"
    else:
        cfg, why = _choose_config(problem)
    grid = gemm_grid(problem, cfg)
    if not grid_fits(grid):
        raise ValueError(f"{KERNEL} grid {grid} exceeds CUDA's limits for output {problem.out_shape} "
                         f"with groups={problem.groups}")
    if splits is None:
        splits = _splits(problem, cfg, grid)
        if splits > 1:
            why += (f"; split-K: {math.prod(grid)} tiles of {cfg.threads // 32} warps (at most "
                    f"{SPLIT_K_MAX_WARPS_PER_SM} warps an SM) each reduce over {splits} runs of the "
                    f"{problem.c // problem.groups * problem.kh * problem.kw} products")
    else:
        check_splits(splits, grid, problem)
        why += f"; split-K forced: {splits} runs"
    grid = (grid[0], grid[1], grid[2] * splits)
    columns = weight_columns(problem)
    weight_copy = problem.groups * (problem.c // problem.groups) * problem.kh * problem.kw * columns
    return LaunchPlan(
        kernel=KERNEL, dtype=problem.dtype, index_type=index_type(problem, weight_copy), config=cfg,
        grid=grid, block=(cfg.threads, 1, 1), shared_bytes=cfg.shared_bytes(problem.kh * problem.kw),
        reason=f"{reason}; {why}" if reason else why, weight_columns=columns, splits=splits)


def describe(plan: LaunchPlan, added_by: str = REDUCE_KERNEL) -> str:
    """The printed plan: tile, launch shape, the weight copy it reads and why (``added_by``: the kernel
    that adds split-K's partial sums)."""
    c = plan.config
    return (f"{plan.kernel} [{c.name}: block {c.bm} px x {c.bn} ch, k {c.bk} per stage, {c.stages} stages, "
            f"warps of {c.wm} px x {c.wn} ch, {c.tm}x{c.tn} outputs per thread, {c.threads} threads]\n"
            f"  float32 (IEEE FMA, no TF32), {plan.index_type} indices; {plan.shared_bytes} B shared memory\n"
            f"  grid {plan.grid} (pixel tiles, channel tiles, groups{' x splits' if plan.splits > 1 else ''}), "
            f"block {plan.block}\n"
            f"  reads the NCHW input in place and a transposed weight copy [groups][Cg kh kw][{plan.weight_columns}]\n"
            + (f"  split-K: {plan.splits} runs of the reduction write partial sums to the workspace, added in "
               f"order by {added_by} (the same bits on every run)\n" if plan.splits > 1 else "") +
            f"  why: {plan.reason}")


def specialisation(index: str, cfg: SimtConfig, split_k: bool = False) -> str:
    """The C++ template instance of ``cfg`` (float32 only), with split-K or without."""
    return (f"cupyconv::{KERNEL}<{index},{cfg.bm},{cfg.bn},{cfg.bk},{cfg.wm},{cfg.wn},{cfg.tm},{cfg.tn},{cfg.stages},"
            f"{'true' if split_k else 'false'}>")


def name_expression(plan: LaunchPlan) -> str:
    """The specialisation ``plan`` launches."""
    return specialisation(plan.index_type, plan.config, plan.splits > 1)


def specialisations() -> list[str]:
    """Every index width and tile, and split-K's reduction."""
    return [specialisation(index, cfg, split_k) for index in INDEX_TYPES for cfg in SIMT_CONFIGS
            for split_k in (False, True)] + \
        [reduce_specialisation("float32", index) for index in INDEX_TYPES]


def gemm_launches(plan: LaunchPlan, problem: ConvProblem, x: Pointer, weight: Pointer, out: Pointer,
                  partial: Pointer) -> tuple[Launch, ...]:
    """The launches of ``plan`` on ``x``, the transposed weight ``weight`` ([groups][Cg kh kw][columns])
    and ``out``: the GEMM, or with split-K the GEMM into ``partial`` (partial_bytes of workspace) and
    the ordered reduction into ``out``."""
    if plan.splits == 1:
        return (gemm_launch(plan, problem, x, weight, out),)
    return (gemm_launch(plan, problem, x, weight, partial),
            split_k_reduce("float32", plan.index_type, problem, plan.splits, partial, out))


def gemm_launch(plan: LaunchPlan, problem: ConvProblem, x: Pointer, weight: Pointer, out: Pointer) -> Launch:
    """The GEMM's own launch into ``out``: the output, or with split-K its ``plan.splits`` runs of float32
    partial sums one after another, without the bias or the epilogue (the launch that adds them in run
    order finishes the output)."""
    if plan.splits == 1:
        return conv_launch(plan, problem, plan.weight_columns, 1, 0, x=x, weight=weight, out=out)
    return conv_launch(plan, problem, plan.weight_columns, plan.splits, math.prod(problem.out_shape), x=x,
                       weight=weight, out=out, partial=True)


def _weight_preparation(problem: ConvProblem, columns: int) -> WeightPreparation:
    """The weight transposed, [groups][Cg kh kw][columns]: zero columns past K / groups, exact float32."""
    p = problem
    rows = p.c // p.groups * p.kh * p.kw
    copy = channels_last_copy(p.dtype, p.groups, p.k // p.groups, rows, columns, False, Pointer(WEIGHT),
                              Pointer(PREPARED))
    return WeightPreparation((KERNEL, p.dtype, p.weight_shape, p.groups, columns),
                             p.groups * rows * columns * STORAGE_BYTES[p.dtype], (copy,))


def program(plan: LaunchPlan, problem: ConvProblem) -> CallProgram:
    """The GEMM on the caller's input and output and the prepared (transposed) weight; with split-K,
    its partial sums in the workspace and their reduction."""
    return CallProgram(gemm_launches(plan, problem, Pointer(X), Pointer(PREPARED), Pointer(OUT), Pointer(WORKSPACE)),
                       partial_bytes(plan.splits, problem), _weight_preparation(problem, plan.weight_columns))
