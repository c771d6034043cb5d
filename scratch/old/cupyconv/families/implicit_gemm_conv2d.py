"""The NCHW-gather implicit GEMM on tensor cores (kernels/implicit_gemm_conv2d.cu), float32
accumulators: float16 and bfloat16, and float32 as TF32 where the caller allows it; the fallback of
the channels-last GEMM (implicit_gemm_nhwc) where no channels-last piece fits."""
from __future__ import annotations

import dataclasses
import math

from ..arguments import ConvProblem
from ..planner import LaunchPlan
from ..program import CallProgram
from .common import CTYPES, INDEX_TYPES, conv_launch, forced_config, gemm_grid, grid_fits, grid_refusal, index_type

KERNEL = "implicit_gemm_conv2d"
#: NCHW arrays, or NHWC ones gathered and stored in place by the kernel's NHWC instance (no transposes
#: around it, no channel padding); the weight KCHW (layouts.py transposes a KHWC one into the prepared weight).
LAYOUTS = ("NCHW", "NHWC")
#: Below this many output channels per group the 8-wide instruction tile is mostly padding (depthwise
#: convolutions, say): the direct kernel is used.
GEMM_MIN_GROUP_CHANNELS = 8
GEMM_DTYPES = ("float32", "float16", "bfloat16")


@dataclasses.dataclass(frozen=True)
class GemmConfig:
    """Thread-block tile of the implicit GEMM: bm output pixels x bn output channels, bk of the
    reduction (C/groups * kh * kw) per pipeline stage, warps_m x warps_n warps, `stages` buffers."""

    name: str
    bm: int
    bn: int
    bk: int
    warps_m: int
    warps_n: int
    stages: int
    # implicit_gemm_nhwc on Hopper (sm_90a only): warpgroups multiply with wgmma, each on 64 pixels x
    # bn channels (WGMMA_PIXEL_ROWS; WGMMA_PIXEL_ROWS_PRODUCER with a producer warpgroup) or on 64
    # channels x 128 pixels (WGMMA_CHANNEL_ROWS); 0: mma.sync.
    wgmma: int = 0
    # Warps that only issue the copies (implicit_gemm_nhwc's producer warpgroup), beside those that multiply.
    producer_warps: int = 0
    # Blocks of a cluster (implicit_gemm_nhwc's producer tiles in pairs): consecutive channel tiles of one
    # pixel tile, each copying 1 / cluster of the input tile into all of them.
    cluster: int = 1

    @property
    def threads(self) -> int:
        return 32 * (self.warps_m * self.warps_n + self.producer_warps)

    def shared_bytes(self, dtype: str) -> int:
        """The kernel's pipeline buffers (the epilogue reuses them): A [bk][bm + 8], B [bn][bk + pad]."""
        item = 4 if dtype == "float32" else 2
        b_stride = self.bk + (4 if item == 4 else 8)
        return self.stages * (self.bk * (self.bm + 8) + self.bn * b_stride) * item


#: Tiles per dtype, by output channels per group (narrowest first). TF32 takes k8 instructions and
#: 4-byte elements, so half the bk of the 16-bit types for the same shared memory; the 16-bit types
#: stage through registers, where a second buffer already overlaps loads with the MMAs.
GEMM_CONFIGS = {
    "float32": (GemmConfig("m128n32k16", 128, 32, 16, 4, 1, 3),
                GemmConfig("m128n64k16", 128, 64, 16, 4, 2, 3),
                GemmConfig("m128n128k16", 128, 128, 16, 2, 4, 2)),
    "float16": (GemmConfig("m128n32k32", 128, 32, 32, 4, 1, 2),
                GemmConfig("m128n64k32", 128, 64, 32, 4, 2, 2),
                GemmConfig("m128n128k32", 128, 128, 32, 2, 4, 2)),
}
GEMM_CONFIGS["bfloat16"] = GEMM_CONFIGS["float16"]
CONFIG_NAMES = frozenset(c.name for configs in GEMM_CONFIGS.values() for c in configs)


def _choose_config(problem: ConvProblem) -> tuple[GemmConfig, str]:
    """The narrowest channel tile that holds every output channel of a group, else the widest (each
    channel tile gathers the input again, so fewer, wider tiles beat exact fits) -- but the narrowest
    where the pixels fit one tile, and the 64-channel one where the reduction fits one k tile.

    A block of one k tile gathers, multiplies and stores with nothing of its own to overlap, so the
    warps of other blocks on its SM hide that latency; the 128-channel tile's 200-220 registers a thread
    leave one block of 8 warps an SM, the 64-channel one's ~125 two (H100, ncu). Measured (H100, NHWC
    in place / NCHW, benchmarks/NOTES.md "Short reductions"): wav2vec 2.0's 1 -> 512 k10 s5 fp16 0.042 /
    0.036 ms on 64 channels against 0.054 / 0.039 on 128, TF32 0.040 / 0.035 against 0.050 / 0.037;
    EfficientNet-B0's squeeze-excitation expansions (32 pixels, 6 -> 144 .. 28 -> 672) 0.0065-0.0073
    on 32 channels against 0.0085-0.0093 on 128."""
    kg = problem.k // problem.groups
    configs = GEMM_CONFIGS[problem.dtype]
    pixels = problem.n * problem.ho * problem.wo
    if kg > configs[0].bn and pixels <= configs[0].bm:
        return configs[0], f"{pixels} pixels, one tile: a block per {configs[0].bn} of {kg} channels"
    for cfg in configs:
        if kg <= cfg.bn:
            return cfg, f"{kg} output channels per group fit one {cfg.bn}-channel tile"
    if problem.c // problem.groups * problem.kh * problem.kw <= configs[0].bk:
        return configs[1], (f"{kg} output channels per group, a reduction of one k tile: "
                            f"{math.ceil(kg / configs[1].bn)} tiles of {configs[1].bn} channels, two blocks an SM")
    return configs[-1], f"{kg} output channels per group: {math.ceil(kg / configs[-1].bn)} channel tiles"


def dtype_refusal(problem: ConvProblem) -> str:
    """Why the tensor-core GEMMs cannot compute in ``problem.dtype`` ("" when they can)."""
    return "" if problem.dtype in GEMM_DTYPES else f"it computes in {GEMM_DTYPES}, got dtype {problem.dtype}"


def refusal(problem: ConvProblem) -> str:
    """Why the NCHW-gather GEMM cannot run ``problem`` ("" when it can): a dtype without tensor-core
    instructions here, or the grid of the tile it would choose past CUDA's limits."""
    return dtype_refusal(problem) or grid_refusal(gemm_grid(problem, _choose_config(problem)[0]))


def make_plan(problem: ConvProblem, config: str | None = None, reason: str = "") -> LaunchPlan:
    """The implicit-GEMM launch: grid (pixel tiles, channel tiles, groups), one block per tile; the
    kernel's NHWC instance for an NHWC problem (name_expression, by the plan's layout)."""
    if config is not None:
        cfg = forced_config(GEMM_CONFIGS[problem.dtype], config, f"config for {KERNEL} in {problem.dtype}")
        why = "config forced by the caller"
    else:
        cfg, why = _choose_config(problem)
    if not grid_fits(gemm_grid(problem, cfg)):
        raise ValueError(f"{KERNEL} grid {gemm_grid(problem, cfg)} exceeds CUDA's limits for "
                         f"output {problem.out_shape} with groups={problem.groups}")
    return LaunchPlan(
        kernel=KERNEL, dtype=problem.dtype, index_type=index_type(problem), config=cfg,
        grid=gemm_grid(problem, cfg), block=(cfg.threads, 1, 1), shared_bytes=cfg.shared_bytes(problem.dtype),
        reason=f"{reason}; {why}" if reason else why)


def describe_tiles(plan: LaunchPlan, warps: str, reads: str = "") -> str:
    """The printed plan of a tensor-core GEMM: its tile, ``warps`` (how the block's warps multiply),
    its launch shape, ``reads`` (a line on operands copied first, or "") and why."""
    c = plan.config
    precision = "TF32" if plan.dtype == "float32" else plan.dtype
    return (f"{plan.kernel} [{c.name}: block {c.bm} px x {c.bn} ch, k {c.bk} per stage, {c.stages} stages, "
            f"{warps}, {c.threads} threads]\n"
            f"  {plan.dtype} ({precision} on tensor cores, float32 accumulators), {plan.index_type} indices; "
            f"{plan.shared_bytes} B shared memory\n"
            f"  grid {plan.grid} (pixel tiles, channel tiles, groups{' x splits' if plan.splits > 1 else ''}), "
            f"block {plan.block}\n"
            + reads + f"  why: {plan.reason}")


def describe(plan: LaunchPlan) -> str:
    """The printed plan: tile, warps, launch shape and why."""
    return describe_tiles(plan, f"{plan.config.warps_m}x{plan.config.warps_n} warps")


def specialisation(dtype: str, index: str, cfg: GemmConfig, nhwc: bool = False) -> str:
    """The C++ template instance of ``cfg`` (NHWC, defaulted false, named where true)."""
    return (f"cupyconv::{KERNEL}<{CTYPES[dtype]},{index},{cfg.bm},{cfg.bn},{cfg.bk},"
            f"{cfg.warps_m},{cfg.warps_n},{cfg.stages}{',true' if nhwc else ''}>")


def name_expression(plan: LaunchPlan) -> str:
    """The specialisation ``plan`` launches: the NHWC instance for NHWC arrays."""
    return specialisation(plan.dtype, plan.index_type, plan.config, plan.layout == "NHWC")


def specialisations() -> list[str]:
    """Every tensor-core dtype, index width and tile, on NCHW arrays or NHWC ones in place."""
    return [specialisation(dtype, index, cfg, nhwc) for dtype in GEMM_DTYPES for index in INDEX_TYPES
            for cfg in GEMM_CONFIGS[dtype] for nhwc in (False, True)]


def program(plan: LaunchPlan, problem: ConvProblem) -> CallProgram:
    """One launch on the caller's operands, the NCHW input gathered in place."""
    return CallProgram((conv_launch(plan, problem),))
