"""The tiled direct convolution (kernels/direct_conv2d.cu): any dtype, stride, dilation and kernel
size; per block a tile of output channels x pixels, the input patch and the weights staged in shared
memory. The fallback of every other family."""
from __future__ import annotations

import dataclasses
import math

from ..arguments import ConvProblem
from ..planner import LaunchPlan
from ..program import CallProgram
from .common import CTYPES, INDEX_TYPES, MAX_GRID_Y, SHARED_MEMORY_BYTES, conv_launch, forced_config, index_type

KERNEL = "direct_conv2d"
#: Input channels staged together at most; more only adds synchronisation-free loop trips.
MAX_STAGE_CHANNELS = 16
ACCUMULATOR_BYTES = {"float16": 4, "bfloat16": 4, "float32": 4, "float64": 8}


@dataclasses.dataclass(frozen=True)
class TileConfig:
    """Tile of one thread block (bk output channels x bh x bw output pixels) and of one thread (rk x rp)."""

    name: str
    bk: int
    bh: int
    bw: int
    rk: int
    rp: int

    @property
    def threads(self) -> int:
        return (self.bk // self.rk) * (self.bh * self.bw // self.rp)


#: The direct kernel's tile shapes, most specific first. Chosen by _choose_config.
#: A 32-wide tile gives each warp one output row (unit-stride, conflict-free patch reads); an 8 x 4
#: register block gives 32 FMAs per 4 + 2 (vector) shared-memory loads of a kernel tap.
TILE_CONFIGS = (
    TileConfig("k32_8x32", bk=32, bh=8, bw=32, rk=8, rp=4),   # 17+ output channels per group
    TileConfig("k32_8x16", bk=32, bh=8, bw=16, rk=8, rp=4),   # the same for outputs at most 16 wide
    TileConfig("k16_8x32", bk=16, bh=8, bw=32, rk=4, rp=4),   # 3 to 16 output channels per group
    TileConfig("k1_8x32", bk=1, bh=8, bw=32, rk=1, rp=2),     # depthwise: 1 or 2 output channels per group
    TileConfig("k32_1x1", bk=32, bh=1, bw=1, rk=1, rp=1),     # fallback: any stride and kernel fits
)
_CONFIG_BY_NAME = {c.name: c for c in TILE_CONFIGS}
CONFIG_NAMES = frozenset(_CONFIG_BY_NAME)


def _patch(problem: ConvProblem, cfg: TileConfig, rows: int, cols: int) -> tuple[int, int]:
    """(patch rows, row pitch in elements) of one stage of the input patch.

    A row stores its columns permuted by stride phase (kernels/direct_conv2d.cu), sw * ceil(PC / sw)
    of them; the pitch is padded so that the two output rows one warp covers start 16 banks apart.
    """
    (sh, sw), (dh, dw) = problem.stride, problem.dilation
    patch_rows = (cfg.bh - 1) * sh + (rows - 1) * dh + 1
    patch_cols = (cfg.bw - 1) * sw + (cols - 1) * dw + 1
    stored = sw * math.ceil(patch_cols / sw)
    # Padding beyond a quarter of the row would cost more shared memory than the conflicts it saves.
    pitch = next((p for p in range(stored, stored + max(8, stored // 4) + 1) if sh * p % 32 == 16), stored)
    return patch_rows, pitch


def weight_pitch(cfg: TileConfig) -> int:
    """Words between two taps' channel vectors in shared memory (WP in kernels/direct_conv2d.cu)."""
    return cfg.bk + 4 if cfg.bk % 8 == 0 else cfg.bk


def _stage_bytes(problem: ConvProblem, cfg: TileConfig, channels: int, rows: int, cols: int) -> int:
    patch_rows, pitch = _patch(problem, cfg, rows, cols)
    plane = math.ceil(channels * patch_rows * pitch / 4) * 4  # the weights after it stay 16-byte aligned
    return (plane + channels * rows * cols * weight_pitch(cfg)) * ACCUMULATOR_BYTES[problem.dtype]


def _halvings(n: int) -> list[int]:
    sizes = [n]
    while sizes[-1] > 1:
        sizes.append(math.ceil(sizes[-1] / 2))
    return sizes


def _choose_stage(problem: ConvProblem, cfg: TileConfig):
    """The largest stage that fits in shared memory: the whole kernel with as many channels as fit,
    else the whole kernel width with fewer rows, else fewer columns. None when not even one tap fits."""
    cg = problem.c // problem.groups
    shapes = [(rows, problem.kw) for rows in _halvings(problem.kh)] + \
             [(1, cols) for cols in _halvings(problem.kw)[1:]]
    for rows, cols in shapes:
        channels = min(cg, MAX_STAGE_CHANNELS)
        while channels >= 1 and _stage_bytes(problem, cfg, channels, rows, cols) > SHARED_MEMORY_BYTES:
            channels -= 1
        if channels >= 1:
            return channels, rows, cols
    return None


def _choose_config(problem: ConvProblem) -> tuple[TileConfig, str]:
    kg = problem.k // problem.groups
    if kg <= 2:
        return _CONFIG_BY_NAME["k1_8x32"], f"{kg} output channel(s) per group (depthwise-like)"
    if kg <= 16:
        return _CONFIG_BY_NAME["k16_8x32"], f"{kg} output channels per group (<= 16)"
    if problem.wo <= 16:
        return _CONFIG_BY_NAME["k32_8x16"], f"{kg} output channels per group, output {problem.wo} wide (<= 16)"
    return _CONFIG_BY_NAME["k32_8x32"], f"{kg} output channels per group"


def refusal(problem: ConvProblem) -> str:
    """Always "": the direct kernel is the fallback and takes any problem (make_plan raises only where
    the output needs more thread blocks per image than CUDA allows)."""
    return ""


def make_plan(problem: ConvProblem, config: str | None = None, reason: str = "") -> LaunchPlan:
    """The tile (forced by ``config``, else by output channels per group and output width) and the
    largest shared-memory stage of it that fits; grid (tiles x channel tiles x groups, images)."""
    if config is not None:
        cfg, why = forced_config(TILE_CONFIGS, config, "config"), "forced by the caller"
    else:
        cfg, why = _choose_config(problem)
    stage = _choose_stage(problem, cfg)
    if stage is None:
        cfg = _CONFIG_BY_NAME["k32_1x1"]
        why += "; no stage of a larger tile fits in shared memory (large stride or dilation)"
        stage = _choose_stage(problem, cfg)
    channels, rows, cols = stage
    tiles_w = math.ceil(problem.wo / cfg.bw)
    tiles = math.ceil(problem.ho / cfg.bh) * tiles_w
    ktiles = math.ceil(problem.k // problem.groups / cfg.bk)
    blocks_x = tiles * ktiles * problem.groups
    if blocks_x >= 2**31:
        raise ValueError(f"output {problem.out_shape} needs {blocks_x} thread blocks per image, over CUDA's 2^31 - 1")
    return LaunchPlan(
        kernel=KERNEL, dtype=problem.dtype, index_type=index_type(problem), config=cfg,
        stage_channels=channels, stage_rows=rows, stage_cols=cols, pitch=_patch(problem, cfg, rows, cols)[1],
        tiles_w=tiles_w, tiles=tiles, ktiles=ktiles,
        grid=(blocks_x, max(1, min(problem.n, MAX_GRID_Y)), 1), block=(cfg.threads, 1, 1),
        shared_bytes=_stage_bytes(problem, cfg, channels, rows, cols),
        reason=f"{reason}; {why}" if reason else why)


def describe(plan: LaunchPlan) -> str:
    """The printed plan: tile, stage, launch shape and why."""
    c = plan.config
    return (f"{plan.kernel} [{c.name}: block {c.bk} ch x {c.bh}x{c.bw} px, thread {c.rk} ch x {c.rp} px, "
            f"{c.threads} threads]\n"
            f"  {plan.dtype}, {plan.index_type} indices; stage {plan.stage_channels} ch x "
            f"{plan.stage_rows}x{plan.stage_cols} taps, {plan.shared_bytes} B shared memory\n"
            f"  grid {plan.grid}, block {plan.block}\n"
            f"  why: {plan.reason}")


def specialisation(dtype: str, index: str, cfg: TileConfig) -> str:
    """The C++ template instance, as NVRTC's name_expressions want it."""
    return f"cupyconv::{KERNEL}<{CTYPES[dtype]},{index},{cfg.bk},{cfg.bh},{cfg.bw},{cfg.rk},{cfg.rp}>"


def name_expression(plan: LaunchPlan) -> str:
    """The specialisation ``plan`` launches."""
    return specialisation(plan.dtype, plan.index_type, plan.config)


def specialisations() -> list[str]:
    """Every specialisation make_plan can choose: each dtype, index width and tile."""
    return [specialisation(dtype, index, cfg) for dtype in CTYPES for index in INDEX_TYPES for cfg in TILE_CONFIGS]


def program(plan: LaunchPlan, problem: ConvProblem) -> CallProgram:
    """One launch on the caller's operands; the kernel also takes its stage and tiling."""
    return CallProgram((conv_launch(plan, problem, plan.stage_channels, plan.stage_rows, plan.stage_cols, plan.pitch,
                                    plan.tiles_w, plan.tiles, plan.ktiles),))
