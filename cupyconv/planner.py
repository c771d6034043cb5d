"""The launch plan: which kernel specialisation runs a ConvProblem, with which stages, grid and block.

A plan is plain data, chosen from the problem alone, and printable, so a user can ask why a kernel
was picked (``print(cupyconv.plan(x, weight, ...))``). Compilation lives in compiler.py, the launch in launch.py.
"""
from __future__ import annotations

import dataclasses
import math

from .arguments import ConvProblem

#: Dynamic shared memory a block may use without opting in to more (the same on every GPU since sm_20).
SHARED_MEMORY_BYTES = 48 * 1024
#: CUDA's limit on gridDim.y; images beyond it are looped over inside the kernel.
MAX_GRID_Y = 65535
#: Input channels staged together at most; more only adds synchronisation-free loop trips.
MAX_STAGE_CHANNELS = 16

#: C++ storage type of each dtype in kernels/dtypes.cuh.
CTYPES = {"float16": "cupyconv::half_t", "bfloat16": "cupyconv::bfloat16_t", "float32": "float", "float64": "double"}
ACCUMULATOR_BYTES = {"float16": 4, "bfloat16": 4, "float32": 4, "float64": 8}
INDEX_TYPES = ("int", "long long")


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
TILE_CONFIGS = (
    TileConfig("k32_8x16", bk=32, bh=8, bw=16, rk=4, rp=4),   # many output channels per group
    TileConfig("k16_8x16", bk=16, bh=8, bw=16, rk=2, rp=4),   # 3 to 16 output channels per group
    TileConfig("k1_16x16", bk=1, bh=16, bw=16, rk=1, rp=2),   # depthwise: 1 or 2 output channels per group
    TileConfig("k32_1x1", bk=32, bh=1, bw=1, rk=1, rp=1),     # fallback: any stride and kernel fits
)
_CONFIG_BY_NAME = {c.name: c for c in TILE_CONFIGS}


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    """Everything launch.py needs to run one problem, and why it was chosen."""

    kernel: str
    dtype: str
    index_type: str
    config: TileConfig
    stage_channels: int
    stage_rows: int
    stage_cols: int
    tiles_w: int
    tiles: int
    ktiles: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    reason: str

    @property
    def name_expression(self) -> str:
        return name_expression(self.kernel, self.dtype, self.index_type, self.config)

    def __str__(self) -> str:
        c = self.config
        return (f"{self.kernel} [{c.name}: block {c.bk} ch x {c.bh}x{c.bw} px, thread {c.rk} ch x {c.rp} px, "
                f"{c.threads} threads]\n"
                f"  {self.dtype}, {self.index_type} indices; stage {self.stage_channels} ch x "
                f"{self.stage_rows}x{self.stage_cols} taps, {self.shared_bytes} B shared memory\n"
                f"  grid {self.grid}, block {self.block}\n"
                f"  why: {self.reason}")


def name_expression(kernel: str, dtype: str, index_type: str, cfg: TileConfig) -> str:
    """The C++ template instance, as NVRTC's name_expressions want it."""
    return f"cupyconv::{kernel}<{CTYPES[dtype]},{index_type},{cfg.bk},{cfg.bh},{cfg.bw},{cfg.rk},{cfg.rp}>"


def kernel_specialisations() -> list[str]:
    """Every name expression make_plan can choose: what the compile test builds for each GPU arch."""
    return [name_expression("direct_conv2d", dtype, index, cfg)
            for dtype in CTYPES for index in INDEX_TYPES for cfg in TILE_CONFIGS]


def _stage_bytes(problem: ConvProblem, cfg: TileConfig, channels: int, rows: int, cols: int) -> int:
    (sh, sw), (dh, dw) = problem.stride, problem.dilation
    patch = ((cfg.bh - 1) * sh + (rows - 1) * dh + 1) * ((cfg.bw - 1) * sw + (cols - 1) * dw + 1)
    return channels * (patch + rows * cols * cfg.bk) * ACCUMULATOR_BYTES[problem.dtype]


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
        return _CONFIG_BY_NAME["k1_16x16"], f"{kg} output channel(s) per group (depthwise-like)"
    if kg <= 16:
        return _CONFIG_BY_NAME["k16_8x16"], f"{kg} output channels per group (<= 16)"
    return _CONFIG_BY_NAME["k32_8x16"], f"{kg} output channels per group"


def make_plan(problem: ConvProblem, config: str | None = None) -> LaunchPlan:
    """Choose the kernel specialisation, stage and launch shape for ``problem``.

    Args:
        problem: the convolution.
        config: force a TileConfig by name (tests and benchmarks); None lets the shape decide.
    """
    if config is not None:
        if config not in _CONFIG_BY_NAME:
            raise ValueError(f"config must be one of {sorted(_CONFIG_BY_NAME)}, got {config!r}")
        cfg, reason = _CONFIG_BY_NAME[config], "forced by the caller"
    else:
        cfg, reason = _choose_config(problem)
    stage = _choose_stage(problem, cfg)
    if stage is None:
        cfg = _CONFIG_BY_NAME["k32_1x1"]
        reason += "; no stage of a larger tile fits in shared memory (large stride or dilation)"
        stage = _choose_stage(problem, cfg)
    channels, rows, cols = stage
    largest = max(problem.n * problem.c * problem.h * problem.w, math.prod(problem.out_shape),
                  math.prod(problem.weight_shape))
    index_type = "int" if largest < 2**31 else "long long"
    tiles_w = math.ceil(problem.wo / cfg.bw)
    tiles = math.ceil(problem.ho / cfg.bh) * tiles_w
    ktiles = math.ceil(problem.k // problem.groups / cfg.bk)
    blocks_x = tiles * ktiles * problem.groups
    if blocks_x >= 2**31:
        raise ValueError(f"output {problem.out_shape} needs {blocks_x} thread blocks per image, over CUDA's 2^31 - 1")
    return LaunchPlan(
        kernel="direct_conv2d", dtype=problem.dtype, index_type=index_type, config=cfg,
        stage_channels=channels, stage_rows=rows, stage_cols=cols,
        tiles_w=tiles_w, tiles=tiles, ktiles=ktiles,
        grid=(blocks_x, max(1, min(problem.n, MAX_GRID_Y)), 1), block=(cfg.threads, 1, 1),
        shared_bytes=_stage_bytes(problem, cfg, channels, rows, cols), reason=reason)
