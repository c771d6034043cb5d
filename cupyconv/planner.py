"""The launch plan: which kernel specialisation runs a ConvProblem, with which stages, grid and block.

A plan is plain data, chosen from the problem alone, and printable, so a user can ask why a kernel
was picked (``print(cupyconv.plan(x, weight, ...))``). Compilation lives in compiler.py, the launch in launch.py.
"""
from __future__ import annotations

import dataclasses
import functools
import math

from .arguments import ConvProblem

#: Dynamic shared memory a block may use without opting in to more (the same on every GPU since sm_20).
SHARED_MEMORY_BYTES = 48 * 1024
#: CUDA's limit on gridDim.y; images beyond it are looped over inside the kernel.
MAX_GRID_Y = 65535
#: CUDA's limit on threads per block.
MAX_BLOCK_THREADS = 1024
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


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    """Everything launch.py needs to run one problem, and why it was chosen."""

    kernel: str
    dtype: str
    index_type: str
    config: "TileConfig | GemmConfig | SimtConfig | DepthwiseConfig"
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    reason: str
    # direct_conv2d only (kernel arguments after the problem's): its stage and tiling; depthwise_conv2d
    # takes tiles_w, channels_per_block, vec, pitch and patch_buffers.
    stage_channels: int = 0
    stage_rows: int = 0
    stage_cols: int = 0
    pitch: int = 0
    tiles_w: int = 0
    tiles: int = 0
    ktiles: int = 0
    # implicit_gemm_nhwc only: bytes per cp.async piece, and the channels of the channels-last copies
    # (C, or C rounded up with zero channels so that a piece never straddles two taps).
    vec: int = 0
    channels_padded: int = 0
    # ... or, for 1x1 stride-1 unpadded problems, no copies: A read from the NCHW input, vec bytes of
    # consecutive pixels per piece.
    a_from_nchw: bool = False
    # depthwise_conv2d only: output channels each block computes (block z lanes side by side, each
    # channels_per_block / lanes one after another), and input patches each lane keeps in shared
    # memory (a ring of 1 to 4: the next patch_buffers - 1 channels' copies overlap this one's
    # arithmetic). Its vec is bytes per copy piece, its pitch the patch's row pitch in elements.
    channels_per_block: int = 0
    patch_buffers: int = 0
    # simt_gemm_conv2d only: columns of the transposed weight copy [groups][Cg kh kw][weight_columns]
    # it reads (K / groups rounded up to 4 with zero columns, for 16-byte pieces).
    weight_columns: int = 0
    # winograd_conv2d only: the batched GEMM between its transforms (a simt_gemm_conv2d plan), and its
    # output tiles of winograd_tile x winograd_tile pixels: tiles_w per row, tiles per image (above).
    gemm: "LaunchPlan | None" = None
    winograd_tile: int = 0
    # ... which runs in passes of winograd_images images (all, unless the temporaries would pass
    # WINOGRAD_MAX_WORKSPACE_BYTES), the last pass's GEMM planned as gemm_last.
    winograd_images: int = 0
    gemm_last: "LaunchPlan | None" = None
    # The NVRTC target the specialisation needs where it is not the device's own ("sm_90a": wgmma).
    arch: str = ""

    @property
    def name_expression(self) -> str:
        if self.kernel == NHWC_KERNEL:
            return nhwc_name_expression(self.dtype, self.index_type, self.config, self.vec, self.a_from_nchw)
        if self.kernel == DEPTHWISE_KERNEL:
            return depthwise_name_expression(self.dtype, self.index_type, self.config)
        if self.kernel == DEPTHWISE_COLUMN_KERNEL:
            return column_name_expression(self.dtype, self.index_type, self.config)
        if self.kernel == SIMT_KERNEL:
            return simt_name_expression(self.index_type, self.config)
        return name_expression(self.kernel, self.dtype, self.index_type, self.config)

    def __str__(self) -> str:
        if isinstance(self.config, GemmConfig):  # implicit-GEMM plans (see the section below)
            return _describe_gemm_plan(self)
        if self.kernel == WINOGRAD_KERNEL:
            return _describe_winograd_plan(self)
        if isinstance(self.config, SimtConfig):
            return _describe_simt_plan(self)
        if isinstance(self.config, ColumnConfig):
            return _describe_column_plan(self)
        if isinstance(self.config, DepthwiseConfig):
            c = self.config
            taps = f"{c.taps[0]}x{c.taps[1]} taps at row stride {c.taps[2]} unrolled" if c.taps[0] else "run-time taps"
            return (f"{self.kernel} [{c.name}: {c.th}x{c.tw} px of one channel per lane, {c.rpt} rows per thread, "
                    f"{self.block[2]} lane(s) x {c.threads} threads; {taps}]\n"
                    f"  {self.dtype}, {self.index_type} indices; a ring of {self.patch_buffers} input patch(es) per "
                    f"lane, rows of {self.pitch} elements copied in {self.vec}-byte pieces, {self.shared_bytes} B "
                    f"shared memory\n"
                    f"  grid {self.grid} (tiles, channel blocks, images), block {self.block}, "
                    f"{self.channels_per_block} channels per block\n"
                    f"  why: {self.reason}")
        c = self.config
        return (f"{self.kernel} [{c.name}: block {c.bk} ch x {c.bh}x{c.bw} px, thread {c.rk} ch x {c.rp} px, "
                f"{c.threads} threads]\n"
                f"  {self.dtype}, {self.index_type} indices; stage {self.stage_channels} ch x "
                f"{self.stage_rows}x{self.stage_cols} taps, {self.shared_bytes} B shared memory\n"
                f"  grid {self.grid}, block {self.block}\n"
                f"  why: {self.reason}")


def name_expression(kernel: str, dtype: str, index_type: str, cfg: TileConfig) -> str:
    """The C++ template instance, as NVRTC's name_expressions want it."""
    if isinstance(cfg, GemmConfig):
        return gemm_name_expression(dtype, index_type, cfg)
    return f"cupyconv::{kernel}<{CTYPES[dtype]},{index_type},{cfg.bk},{cfg.bh},{cfg.bw},{cfg.rk},{cfg.rp}>"


def kernel_specialisations() -> list[str]:
    """Every name expression make_plan can choose for any GPU: what the compile test builds for each
    arch (arch_specialisations() has those of one arch alone)."""
    return [name_expression("direct_conv2d", dtype, index, cfg)
            for dtype in CTYPES for index in INDEX_TYPES for cfg in TILE_CONFIGS] + gemm_specialisations() + \
        nhwc_specialisations(wgmma=False) + channels_last_specialisations() + depthwise_specialisations() + \
        column_specialisations() + simt_specialisations() + winograd_specialisations()


def arch_specialisations() -> dict[str, list[str]]:
    """NVRTC target -> the name expressions that compile for it alone."""
    return {WGMMA_ARCH: nhwc_specialisations(wgmma=True)}


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


def _forced_config(configs, name: str, what: str):
    """The config called ``name`` among ``configs``; ValueError naming ``what`` and the choices if none is."""
    for cfg in configs:
        if cfg.name == name:
            return cfg
    raise ValueError(f"{what} must be one of {sorted(c.name for c in configs)}, got {name!r}")


def _index_type(problem: ConvProblem, copy: int = 0) -> str:
    """32-bit indices while every tensor (and a copy of ``copy`` elements the kernel reads, if any)
    has fewer than 2^31 elements, else 64-bit."""
    largest = max(math.prod(problem.x_shape), math.prod(problem.out_shape), math.prod(problem.weight_shape), copy)
    return "int" if largest < 2**31 else "long long"


def _choose_config(problem: ConvProblem) -> tuple[TileConfig, str]:
    kg = problem.k // problem.groups
    if kg <= 2:
        return _CONFIG_BY_NAME["k1_8x32"], f"{kg} output channel(s) per group (depthwise-like)"
    if kg <= 16:
        return _CONFIG_BY_NAME["k16_8x32"], f"{kg} output channels per group (<= 16)"
    if problem.wo <= 16:
        return _CONFIG_BY_NAME["k32_8x16"], f"{kg} output channels per group, output {problem.wo} wide (<= 16)"
    return _CONFIG_BY_NAME["k32_8x32"], f"{kg} output channels per group"


@functools.lru_cache(maxsize=4096)
def make_plan(problem: ConvProblem, config: str | None = None, kernel: str | None = None,
              allow_tf32: bool = False, compute_capability: int = 0) -> LaunchPlan:
    """Choose the kernel specialisation, stage and launch shape for ``problem``.

    Plans are immutable and depend on the arguments alone, so each is made once and cached (a model
    calls the same few shapes over and over; planning costs ~20 us of Python).

    Args:
        problem: the convolution.
        config: force a TileConfig (direct) or GemmConfig (implicit GEMM) by name (tests and
            benchmarks); None lets the shape decide.
        kernel: force the family (one of KERNELS; on 'implicit_gemm_nhwc' or 'implicit_gemm_conv2d'
            float32 runs as TF32); None chooses by dtype, ``allow_tf32`` and shape (see choose_kernel).
        allow_tf32: let float32 run on the tensor cores in TF32 (10-bit mantissa products).
        compute_capability: of the GPU that will run the plan (90 for sm_90), where kernels for one
            architecture alone may be chosen (wgmma on the H100); 0, any GPU.
    """
    family, family_reason = choose_kernel(problem, kernel, allow_tf32, config)
    if family == WINOGRAD_KERNEL:
        return make_winograd_plan(problem, config, family_reason)
    if family == SIMT_KERNEL:
        return make_simt_plan(problem, config, family_reason)
    if family == DEPTHWISE_KERNEL:
        return make_depthwise_plan(problem, config, family_reason)
    if family == DEPTHWISE_COLUMN_KERNEL:
        return make_column_plan(problem, config, family_reason)
    if family == NHWC_KERNEL:
        return make_nhwc_plan(problem, config, family_reason, compute_capability)
    if family == GEMM_KERNEL:
        return make_gemm_plan(problem, config, family_reason)
    if config is not None:
        cfg, reason = _forced_config(TILE_CONFIGS, config, "config"), "forced by the caller"
    else:
        cfg, reason = _choose_config(problem)
    stage = _choose_stage(problem, cfg)
    if stage is None:
        cfg = _CONFIG_BY_NAME["k32_1x1"]
        reason += "; no stage of a larger tile fits in shared memory (large stride or dilation)"
        stage = _choose_stage(problem, cfg)
    channels, rows, cols = stage
    tiles_w = math.ceil(problem.wo / cfg.bw)
    tiles = math.ceil(problem.ho / cfg.bh) * tiles_w
    ktiles = math.ceil(problem.k // problem.groups / cfg.bk)
    blocks_x = tiles * ktiles * problem.groups
    if blocks_x >= 2**31:
        raise ValueError(f"output {problem.out_shape} needs {blocks_x} thread blocks per image, over CUDA's 2^31 - 1")
    return LaunchPlan(
        kernel="direct_conv2d", dtype=problem.dtype, index_type=_index_type(problem), config=cfg,
        stage_channels=channels, stage_rows=rows, stage_cols=cols, pitch=_patch(problem, cfg, rows, cols)[1],
        tiles_w=tiles_w, tiles=tiles, ktiles=ktiles,
        grid=(blocks_x, max(1, min(problem.n, MAX_GRID_Y)), 1), block=(cfg.threads, 1, 1),
        shared_bytes=_stage_bytes(problem, cfg, channels, rows, cols), reason=f"{family_reason}; {reason}")


# ---------------------------------------------------------------------------------------------------
# Implicit-GEMM family (kernels/implicit_gemm_conv2d.cu): tensor cores, float32 accumulators.
# float16 and bfloat16 use it by default; float32 only as TF32, when the caller allows it; float64 never.

GEMM_KERNEL = "implicit_gemm_conv2d"
NHWC_KERNEL = "implicit_gemm_nhwc"
DIRECT_KERNEL = "direct_conv2d"
DEPTHWISE_KERNEL = "depthwise_conv2d"
DEPTHWISE_COLUMN_KERNEL = "depthwise_column_conv2d"
SIMT_KERNEL = "simt_gemm_conv2d"
WINOGRAD_KERNEL = "winograd_conv2d"
KERNELS = (DIRECT_KERNEL, DEPTHWISE_KERNEL, DEPTHWISE_COLUMN_KERNEL, SIMT_KERNEL, WINOGRAD_KERNEL, GEMM_KERNEL,
           NHWC_KERNEL)
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
    # bn channels (WGMMA_PIXEL_ROWS) or on 64 channels x 128 pixels (WGMMA_CHANNEL_ROWS); 0: mma.sync.
    wgmma: int = 0

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n

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


def gemm_name_expression(dtype: str, index_type: str, cfg: GemmConfig) -> str:
    return (f"cupyconv::{GEMM_KERNEL}<{CTYPES[dtype]},{index_type},{cfg.bm},{cfg.bn},{cfg.bk},"
            f"{cfg.warps_m},{cfg.warps_n},{cfg.stages}>")


def gemm_specialisations() -> list[str]:
    return [gemm_name_expression(dtype, index, cfg)
            for dtype in GEMM_DTYPES for index in INDEX_TYPES for cfg in GEMM_CONFIGS[dtype]]


def _gemm_grid(problem: ConvProblem, cfg: GemmConfig) -> tuple[int, int, int]:
    m = problem.n * problem.ho * problem.wo
    return (math.ceil(m / cfg.bm), math.ceil(problem.k // problem.groups / cfg.bn), problem.groups)


def _gemm_fits_grid(problem: ConvProblem, cfg: GemmConfig) -> bool:
    mx, ny, gz = _gemm_grid(problem, cfg)
    return mx < 2**31 and ny <= MAX_GRID_Y and gz <= MAX_GRID_Y


def choose_kernel(problem: ConvProblem, kernel: str | None = None, allow_tf32: bool = False,
                  config: str | None = None) -> tuple[str, str]:
    """The kernel family for ``problem`` and why: forced by ``kernel`` (or by a config name of one
    family), else a tensor-core GEMM for float16/bfloat16, and for float32 when ``allow_tf32``: the
    channels-last one (implicit_gemm_nhwc) wherever its copies can be made, else the NCHW gather;
    strict float32 takes Winograd (winograd_conv2d) for undilated, ungrouped layers where its phase
    channels and the multiplies they save pay (3x3 stride 1, AlexNet's 11x11 stride 4, the 5x9), else
    the FMA implicit GEMM (simt_gemm_conv2d) where it can run; depthwise layers
    the depthwise kernel; the rest, and float64, the direct kernel."""
    if kernel is None and config is not None:
        kernel = next((family for family, names in _CONFIG_NAMES.items() if config in names), DIRECT_KERNEL)
    if kernel is not None:
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
        if kernel in (GEMM_KERNEL, NHWC_KERNEL) and problem.dtype not in GEMM_DTYPES:
            raise ValueError(f"kernel {kernel!r} computes in {GEMM_DTYPES}, got dtype {problem.dtype}")
        refusal = {SIMT_KERNEL: _simt_refusal, WINOGRAD_KERNEL: _winograd_refusal,
                   DEPTHWISE_KERNEL: _depthwise_refusal, DEPTHWISE_COLUMN_KERNEL: _column_refusal,
                   NHWC_KERNEL: _nhwc_refusal}.get(kernel)
        why_not = refusal(problem) if refusal else ""
        if why_not:
            raise ValueError(f"kernel {kernel!r} cannot run this problem: {why_not}")
        return kernel, "forced by the caller"
    kg = problem.k // problem.groups
    if not _column_refusal(problem) and problem.wo <= COLUMN_MAX_WIDTH:
        return DEPTHWISE_COLUMN_KERNEL, (f"one input channel per group, output {problem.ho}x{problem.wo} (at most "
                                         f"{COLUMN_MAX_WIDTH} wide): a thread per output column, no shared memory")
    if not _depthwise_refusal(problem):
        return DEPTHWISE_KERNEL, "one input channel per group: memory-bound, a patch per output tile"
    if problem.dtype == "float64":
        return DIRECT_KERNEL, "float64 has no tensor-core path"
    if kg < GEMM_MIN_GROUP_CHANNELS:
        return DIRECT_KERNEL, f"{kg} output channel(s) per group: a GEMM tile would be mostly padding"
    if problem.dtype == "float32" and not allow_tf32:
        if not _winograd_refusal(problem) and _winograd_pays(problem):
            return WINOGRAD_KERNEL, (f"strict float32 (allow_tf32=False), {problem.kh}x{problem.kw} stride "
                                     f"{problem.stride} with {problem.c} -> {problem.k} channels: Winograd, "
                                     f"fewer multiplies")
        why_not = _simt_refusal(problem)
        if not why_not:
            return SIMT_KERNEL, f"strict float32 (allow_tf32=False) on the FMA units, {kg} output channels per group"
        return DIRECT_KERNEL, f"strict float32 (allow_tf32=False); no FMA implicit GEMM: {why_not}"
    precision = "TF32 (allow_tf32=True)" if problem.dtype == "float32" else problem.dtype
    why_not = _nhwc_refusal(problem)
    if not why_not:
        return NHWC_KERNEL, f"tensor cores in {precision}, {kg} output channels per group"
    if not _gemm_fits_grid(problem, _choose_gemm_config(problem)[0]):
        return DIRECT_KERNEL, "implicit-GEMM grid exceeds CUDA's limits (groups or channel tiles > 65535)"
    return GEMM_KERNEL, f"tensor cores in {precision}, {kg} output channels per group; NCHW gather: {why_not}"


def _choose_gemm_config(problem: ConvProblem) -> tuple[GemmConfig, str]:
    """The narrowest channel tile that holds every output channel of a group, else the widest (each
    channel tile gathers the input again, so fewer, wider tiles beat exact fits)."""
    kg = problem.k // problem.groups
    configs = GEMM_CONFIGS[problem.dtype]
    return _narrowest_that_holds(kg, configs)


def _narrowest_that_holds(kg: int, configs) -> tuple[GemmConfig, str]:
    for cfg in configs:
        if kg <= cfg.bn:
            return cfg, f"{kg} output channels per group fit one {cfg.bn}-channel tile"
    return configs[-1], f"{kg} output channels per group: {math.ceil(kg / configs[-1].bn)} channel tiles"


def make_gemm_plan(problem: ConvProblem, config: str | None = None, reason: str = "") -> LaunchPlan:
    """The implicit-GEMM launch: grid (pixel tiles, channel tiles, groups), one block per tile."""
    if config is not None:
        cfg = _forced_config(GEMM_CONFIGS[problem.dtype], config, f"config for {GEMM_KERNEL} in {problem.dtype}")
        why = "config forced by the caller"
    else:
        cfg, why = _choose_gemm_config(problem)
    if not _gemm_fits_grid(problem, cfg):
        raise ValueError(f"{GEMM_KERNEL} grid {_gemm_grid(problem, cfg)} exceeds CUDA's limits for "
                         f"output {problem.out_shape} with groups={problem.groups}")
    return LaunchPlan(
        kernel=GEMM_KERNEL, dtype=problem.dtype, index_type=_index_type(problem), config=cfg,
        grid=_gemm_grid(problem, cfg), block=(cfg.threads, 1, 1), shared_bytes=cfg.shared_bytes(problem.dtype),
        reason=f"{reason}; {why}" if reason else why)


def _describe_gemm_plan(plan: LaunchPlan) -> str:
    c = plan.config
    precision = "TF32" if plan.dtype == "float32" else plan.dtype
    warps = (f"{c.threads // 128} warpgroups of {'64 px' if c.wgmma == WGMMA_PIXEL_ROWS else '64 ch'} with wgmma "
             f"({plan.arch})" if c.wgmma else f"{c.warps_m}x{c.warps_n} warps")
    return (f"{plan.kernel} [{c.name}: block {c.bm} px x {c.bn} ch, k {c.bk} per stage, {c.stages} stages, "
            f"{warps}, {c.threads} threads]\n"
            f"  {plan.dtype} ({precision} on tensor cores, float32 accumulators), {plan.index_type} indices; "
            f"{plan.shared_bytes} B shared memory\n"
            f"  grid {plan.grid} (pixel tiles, channel tiles, groups), block {plan.block}\n"
            + (f"  reads channels-last copies made first: input [N][H][W][{plan.channels_padded}], weight "
               f"[K][kh][kw][{plan.channels_padded} / groups], in {plan.vec}-byte pieces\n"
               if plan.kernel == NHWC_KERNEL and not plan.a_from_nchw else "")
            + f"  why: {plan.reason}")


# ---------------------------------------------------------------------------------------------------
# Channels-last implicit GEMM (kernels/implicit_gemm_nhwc.cu) and the copies it reads
# (kernels/nchw_to_nhwc.cu): the input as [N][H][W][Cp], the weight as [K][kh][kw][Cgp].

CHANNELS_LAST_TILED = "nchw_to_nhwc_tiled"
CHANNELS_LAST_NARROW = "nchw_to_nhwc_narrow"
#: Up to this many channels the copy runs one thread per position (nchw_to_nhwc_narrow).
NARROW_CHANNELS = 8
#: Zero channels may add at most a third to the reduction (AlexNet's 3 -> 4); more, and a smaller
#: piece (or the NCHW gather) does less work.
MAX_PADDING_RATIO = 4 / 3

#: Tiles per dtype: 128 pixels by 64, 96 or 128 output channels, each with k rows of 64 bytes (four
#: stages) and of 128 bytes (three; half the barriers per multiply-add). Chosen by _choose_nhwc_config
#: from timings of these and of other tiles on the H100 (benchmarks/NOTES_igemm.md).
NHWC_CONFIGS = {
    dtype: tuple(GemmConfig(f"nhwc_m128n{bn}k{bk}", 128, bn, bk, warps_m, warps_n, stages)
                 for bn, warps_m, warps_n in ((64, 2, 2), (96, 4, 2), (128, 2, 4))
                 for bk, stages in ((short_k, 4), (2 * short_k, 3)))
    for dtype, short_k in (("float32", 16), ("float16", 32))
}
#: The 128-channel tile pays off (it gathers the input half as often) only with this many blocks.
WIDE_TILE_BLOCKS = 1024
#: Hopper (sm_90a) wgmma tiles, k rows of 128 bytes, 128-byte swizzled: two warpgroups of 64
#: pixels x 128 channels (3 stages), or warpgroups of 64 channels x 128 pixels, two (256 pixels) or
#: one (128), with 4 stages. Chosen by _choose_nhwc_config from H100 timings of these and of others
#: (64 pixels x 64 or 96 channels; 256 pixels x 64 or 128 channels; 3 stages) in benchmarks/NOTES_igemm.md.
WGMMA_ARCH = "sm_90a"
WGMMA_COMPUTE_CAPABILITY = 90
#: The 128-channel tile is the faster from half a wave of blocks (H100: r50_l3_3x3_256 fp16, 98
#: blocks, 0.037 ms, the 64-channel tiles 0.041-0.043), not with 52 (r50_l4_3x3_512: 0.063 vs 0.046).
WGMMA_WIDE_TILE_BLOCKS = 64
WGMMA_PIXEL_ROWS, WGMMA_CHANNEL_ROWS = 1, 2
for _dtype, _item in (("float32", 4), ("float16", 2)):
    NHWC_CONFIGS[_dtype] += (
        GemmConfig("nhwc_wgmma_m128n128", 128, 128, 128 // _item, 8, 1, 3, wgmma=WGMMA_PIXEL_ROWS),
        *(GemmConfig(f"nhwc_wgmma_ch_m{bm}n64", bm, 64, 128 // _item, bm // 32, 1, 4, wgmma=WGMMA_CHANNEL_ROWS)
          for bm in (256, 128)))
NHWC_CONFIGS["bfloat16"] = NHWC_CONFIGS["float16"]
NHWC_VECS = (16, 8, 4)


def _nhwc_shared_bytes(cfg: GemmConfig, dtype: str, a_from_nchw: bool) -> int:
    """STAGES x (A + B): B [bn][bk + pad], rows of bk elements + 16 bytes; A the same with bm rows,
    or (a_from_nchw) [bk][bm + 8]. wgmma: rows of 128 bytes, unpadded, and 1 KB to align the tiles."""
    item = 4 if dtype == "float32" else 2
    if cfg.wgmma:
        return cfg.stages * (cfg.bm + cfg.bn) * 128 + 1024
    a_stage = cfg.bk * (cfg.bm + 8) * item if a_from_nchw else cfg.bm * (cfg.bk * item + 16)
    return cfg.stages * (a_stage + cfg.bn * (cfg.bk * item + 16))


def _nchw_a_vec(problem: ConvProblem) -> int:
    """Bytes per A piece where a 1x1 problem can be read in place (0 where it cannot): stride 1, no
    padding, 16-byte weight rows, and pieces of pixels that never straddle two images."""
    item = 4 if problem.dtype == "float32" else 2
    in_place = (problem.kh, problem.kw, problem.stride) == (1, 1, (1, 1)) and \
        (problem.pad_top, problem.pad_left, problem.pad_bottom, problem.pad_right) == (0, 0, 0, 0) and \
        (problem.c // problem.groups * item) % 16 == 0
    plane = problem.h * problem.w * item
    return next((vec for vec in NHWC_VECS if in_place and plane % vec == 0), 0)


def _nhwc_pieces(problem: ConvProblem) -> tuple[tuple[int, int], str]:
    """((bytes per cp.async piece, channels of the copies), "") or ((0, 0), why the problem cannot run).

    1x1 problems that _nchw_a_vec accepts: its piece, and the input's channels (no copies). Else the
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


def _nhwc_refusal(problem: ConvProblem) -> str:
    """Why the channels-last GEMM cannot run ``problem`` ("" when it can): no piece fits, or the grid
    of the tile it would choose is past CUDA's limits."""
    why_not = _nhwc_pieces(problem)[1]
    if why_not:
        return why_not
    mx, ny, gz = _gemm_grid(problem, _choose_nhwc_config(problem)[0])
    if mx >= 2**31 or ny > MAX_GRID_Y or gz > MAX_GRID_Y:
        return f"grid {(mx, ny, gz)} past CUDA's limits"
    return ""


def _wgmma_refusal(problem: ConvProblem, compute_capability: int) -> str:
    """Why the wgmma tiles cannot run ``problem`` ("" when they can): they need the H100's sm_90a
    and k rows of 128 bytes gathered in 16-byte pieces from channels-last copies."""
    if compute_capability != WGMMA_COMPUTE_CAPABILITY:
        return f"wgmma needs compute capability {WGMMA_COMPUTE_CAPABILITY} (sm_90a), got {compute_capability or 'none'}"
    if _nhwc_pieces(problem)[0][0] != 16 or _nchw_a_vec(problem):
        return "wgmma needs 16-byte pieces from channels-last copies (this problem has narrower ones or none)"
    return ""


def _deep_nhwc(problem: ConvProblem) -> bool:
    """Whether k rows of 128 bytes pay: 16-byte pieces from copies, >= 64 bytes of channels per tap."""
    item = 4 if problem.dtype == "float32" else 2
    return _nhwc_pieces(problem)[0][0] == 16 and not _nchw_a_vec(problem) and problem.c // problem.groups * item >= 64


def _choose_nhwc_config(problem: ConvProblem, compute_capability: int = 0) -> tuple[GemmConfig, str]:
    """On compute capability 9.0, wherever 16-byte pieces are gathered from copies, the wgmma tiles:
    for up to 64 output channels per group, warpgroups of 64 channels x 128 pixels, two per block;
    for more, 128 pixels x 128 channels where that makes WGMMA_WIDE_TILE_BLOCKS blocks or more, else
    one warpgroup of 64 channels x 128 pixels per block (twice the blocks).

    Elsewhere (mma.sync), channels: the 96-channel tile for 65-96 output channels per group
    (AlexNet), the 128-channel one for more where it makes WIDE_TILE_BLOCKS blocks or more, else the
    64-channel one. Depth: k rows of 128 bytes where the gather copies 16-byte pieces of at least 64
    bytes of channels per tap, else of 64 bytes (narrower pieces make a deep tile many copies per
    thread; few channels per tap make it many taps; 1x1 problems read in place have short
    reductions)."""
    kg = problem.k // problem.groups
    item = 4 if problem.dtype == "float32" else 2
    if not _wgmma_refusal(problem, compute_capability):
        by_pixels = {c.bm: c for c in NHWC_CONFIGS[problem.dtype] if c.wgmma == WGMMA_CHANNEL_ROWS}
        if kg <= 64:
            return by_pixels[256], f"wgmma; {kg} output channels per group: one 64-channel tile"
        wide = next(c for c in NHWC_CONFIGS[problem.dtype] if c.wgmma == WGMMA_PIXEL_ROWS)
        blocks = math.prod(_gemm_grid(problem, wide))
        if blocks >= WGMMA_WIDE_TILE_BLOCKS:
            return wide, f"wgmma; {kg} output channels per group, {blocks} blocks of 128 channels"
        return by_pixels[128], (f"wgmma; {kg} output channels per group; 128-channel tiles would make {blocks} "
                                f"blocks (< {WGMMA_WIDE_TILE_BLOCKS}), 64-channel ones twice as many")
    deep = _deep_nhwc(problem)
    candidates = [c for c in NHWC_CONFIGS[problem.dtype] if (c.bk * item == 128) == deep and not c.wgmma]
    by_width = {c.bn: c for c in candidates}
    depth = f"k rows of {by_width[64].bk * item} bytes"
    if 64 < kg <= 96:
        return by_width[96], f"{kg} output channels per group fit one 96-channel tile; {depth}"
    if kg > 96:
        blocks = math.prod(_gemm_grid(problem, by_width[128]))
        if blocks >= WIDE_TILE_BLOCKS:
            return by_width[128], f"{kg} output channels per group, {blocks} blocks of 128 channels; {depth}"
        return by_width[64], (f"{kg} output channels per group; 128-channel tiles would make {blocks} blocks "
                              f"(< {WIDE_TILE_BLOCKS}), 64-channel ones twice as many; {depth}")
    return by_width[64], f"{kg} output channels per group: one 64-channel tile; {depth}"


def nhwc_name_expression(dtype: str, index_type: str, cfg: GemmConfig, vec: int, a_from_nchw: bool) -> str:
    flag = lambda b: "true" if b else "false"
    return (f"cupyconv::{NHWC_KERNEL}<{CTYPES[dtype]},{index_type},{cfg.bm},{cfg.bn},{cfg.bk},"
            f"{cfg.warps_m},{cfg.warps_n},{cfg.stages},{vec},{flag(a_from_nchw)},{cfg.wgmma}>")


def nhwc_specialisations(wgmma: bool) -> list[str]:
    """The mma.sync ones (any GPU), or the wgmma ones (sm_90a: 16-byte pieces from copies only)."""
    return [nhwc_name_expression(dtype, index, cfg, vec, a_from_nchw) for dtype in GEMM_DTYPES
            for index in INDEX_TYPES for cfg in NHWC_CONFIGS[dtype] if bool(cfg.wgmma) == wgmma
            for vec in ((16,) if wgmma else NHWC_VECS) for a_from_nchw in ((False,) if wgmma else (False, True))]


def make_nhwc_plan(problem: ConvProblem, config: str | None = None, reason: str = "",
                   compute_capability: int = 0) -> LaunchPlan:
    """The channels-last GEMM launch: grid (pixel tiles, channel tiles, groups), one block per tile."""
    why_not = _nhwc_refusal(problem)
    if why_not:
        raise ValueError(f"kernel {NHWC_KERNEL!r} cannot run this problem: {why_not}")
    vec, channels_padded = _nhwc_pieces(problem)[0]
    if config is not None:
        cfg = _forced_config(NHWC_CONFIGS[problem.dtype], config, f"config for {NHWC_KERNEL} in {problem.dtype}")
        why = "config forced by the caller"
        why_not = _wgmma_refusal(problem, compute_capability) if cfg.wgmma else ""
        if why_not:
            raise ValueError(f"config {config!r} cannot run this problem: {why_not}")
    else:
        cfg, why = _choose_nhwc_config(problem, compute_capability)
    a_from_nchw = _nchw_a_vec(problem) != 0
    if a_from_nchw:
        why += f"; 1x1: the NCHW input read in place, {vec}-byte pieces of pixels"
    elif channels_padded != problem.c:
        why += f"; input copied with {channels_padded - problem.c} zero channel(s) for {vec}-byte pieces"
    return LaunchPlan(
        kernel=NHWC_KERNEL, dtype=problem.dtype, index_type=_index_type(problem, 0 if a_from_nchw else problem.n * channels_padded * problem.h * problem.w),
        config=cfg, grid=_gemm_grid(problem, cfg), block=(cfg.threads, 1, 1),
        shared_bytes=_nhwc_shared_bytes(cfg, problem.dtype, a_from_nchw),
        reason=f"{reason}; {why}" if reason else why, vec=vec, channels_padded=channels_padded, a_from_nchw=a_from_nchw,
        arch=WGMMA_ARCH if cfg.wgmma else "")


@dataclasses.dataclass(frozen=True)
class ChannelsLastCopy:
    """One launch of kernels/nchw_to_nhwc.cu: [n][c][positions] -> [n][positions][channels_padded]."""

    kernel: str
    name_expression: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]


def channels_last_copy(dtype: str, n: int, c: int, positions: int, channels_padded: int,
                       round_tf32: bool) -> ChannelsLastCopy:
    """The copy kernel for these sizes; float32 rounded to TF32 on the way where ``round_tf32`` (the
    tensor-core GEMM's operands), kept exact otherwise (the FMA GEMM's transposed weight)."""
    round_tf32 = "true" if round_tf32 and dtype == "float32" else "false"
    if channels_padded <= NARROW_CHANNELS:
        kernel, grid, block = CHANNELS_LAST_NARROW, (math.ceil(positions / 256), n, 1), (256, 1, 1)
    else:
        kernel, grid, block = (CHANNELS_LAST_TILED, (math.ceil(positions / 32), math.ceil(channels_padded / 32), n),
                               (32, 8, 1))
    return ChannelsLastCopy(kernel, f"cupyconv::{kernel}<{CTYPES[dtype]},{round_tf32}>", grid, block)


def channels_last_specialisations() -> list[str]:
    return [f"cupyconv::{kernel}<{CTYPES[dtype]},{'true' if dtype == 'float32' else 'false'}>"
            for kernel in (CHANNELS_LAST_TILED, CHANNELS_LAST_NARROW) for dtype in GEMM_DTYPES] + \
        [f"cupyconv::{kernel}<float,false>" for kernel in (CHANNELS_LAST_TILED, CHANNELS_LAST_NARROW)]


# ---------------------------------------------------------------------------------------------------
# Depthwise family (kernels/depthwise_conv2d.cu): groups == C, any number of outputs per group.

@dataclasses.dataclass(frozen=True)
class DepthwiseConfig:
    """Output tile th x tw of one channel per lane, rpt consecutive rows of a column per thread, up to
    ``lanes`` lanes (channels side by side) per block. ``taps`` is (kh, kw, row stride) of the
    unrolled instance a plan runs (one of DEPTHWISE_TAPS), or (0, 0, 0): run-time taps."""

    name: str
    th: int
    tw: int
    rpt: int
    lanes: int
    taps: tuple[int, int, int] = (0, 0, 0)

    @property
    def threads(self) -> int:
        """Threads of one lane."""
        return self.th * self.tw // self.rpt


#: 32 x 32 tiles, and 16 x 16 ones four lanes at a time for outputs at most 16 wide (MobileNet's
#: 14x14 and 7x7 stages): 128 threads a block either way. 8 rows per thread: a 3x3 stride-1 thread
#: reads 10 patch rows for 8 outputs.
DEPTHWISE_CONFIGS = (DepthwiseConfig("dw_32x32", 32, 32, 8, 1), DepthwiseConfig("dw_16x16", 16, 16, 8, 4))
#: (kh, kw, row stride) compiled with unrolled taps and the weights in registers (row dilation 1):
#: the depthwise layers of MobileNet, EfficientNet and ConvNeXt. Anything else runs run-time taps.
DEPTHWISE_TAPS = ((3, 3, 1), (3, 3, 2), (5, 5, 1), (5, 5, 2), (7, 7, 1))
#: Channels per lane double while a block's input patches stay within DEPTHWISE_BLOCK_INPUT_BYTES and
#: at least DEPTHWISE_BLOCKS blocks (four per SM of a 132-SM H100) remain. From H100 timings of every
#: channel count (benchmarks/bench_depthwise.py, results/depthwise_sweep.txt): each MobileNetV2 layer
#: and dtype ran fastest with 11-26 KB of input per block -- fp32 stride-2 layers one channel per
#: block, 16-bit 56x56 layers 4-8 -- more made fewer, longer blocks with too few warps between them.
DEPTHWISE_BLOCKS = 4 * 132
DEPTHWISE_BLOCK_INPUT_BYTES = 24 * 1024
DEPTHWISE_MAX_CHANNELS_PER_LANE = 16
#: Patch buffers per lane at most: the copies of up to three channels in flight behind the one
#: computed (kernels/depthwise_conv2d.cu dispatches its cp.async wait on it).
DEPTHWISE_MAX_BUFFERS = 4
#: Shared memory a ring deeper than two buffers may take (~6 such blocks still fit an SM's 228 KB):
#: past it, a deeper ring displaces resident blocks that held as many bytes in flight.
DEPTHWISE_RING_BYTES = 32 * 1024
_STORAGE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}


def _depthwise_patch(problem: ConvProblem, cfg: DepthwiseConfig) -> tuple[int, int]:
    """(rows, columns) of the input patch of one output tile."""
    (sh, sw), (dh, dw) = problem.stride, problem.dilation
    return (cfg.th - 1) * sh + (problem.kh - 1) * dh + 1, (cfg.tw - 1) * sw + (problem.kw - 1) * dw + 1


def _depthwise_layout(problem: ConvProblem, cfg: DepthwiseConfig, channels_per_lane: int | None = None,
                      patch_buffers: int | None = None) -> tuple[int, int, int, int, int] | None:
    """(lanes, channels per lane, patch buffers, bytes per copy piece, row pitch in elements): the
    first that fits in shared memory, preferring all lanes, then the deepest ring (up to
    DEPTHWISE_MAX_BUFFERS and the lane's channels; past two buffers within DEPTHWISE_RING_BYTES), then
    the widest pieces; None if even one lane's one patch does not fit.

    A piece must divide the input row (16, 8, 4 bytes; 2 = plain 16-bit loads) so that it lies wholly
    inside the input or the padding; rows start at an aligned column, up to a piece left of the patch.
    """
    item = _STORAGE_BYTES[problem.dtype]
    rows, cols = _depthwise_patch(problem, cfg)
    tiles = math.ceil(problem.ho / cfg.th) * math.ceil(problem.wo / cfg.tw)
    widths = [b for b in (16, 8, 4, 2) if b >= item and problem.w * item % b == 0]
    lanes = cfg.lanes
    while lanes > max(problem.k, 1):
        lanes //= 2
    for lanes in [lanes >> i for i in range(lanes.bit_length())]:
        per_lane, most = channels_per_lane or 1, min(DEPTHWISE_MAX_CHANNELS_PER_LANE, math.ceil(problem.k / lanes))
        while channels_per_lane is None and per_lane < most:
            more = min(2 * per_lane, most)  # no more than the lane has: idle trips of the ring cost barriers
            if tiles * math.ceil(problem.k / (more * lanes)) * problem.n < DEPTHWISE_BLOCKS or \
                    lanes * more * rows * cols * item > DEPTHWISE_BLOCK_INPUT_BYTES:
                break
            per_lane = more
        for buffers in [patch_buffers] if patch_buffers else range(min(DEPTHWISE_MAX_BUFFERS, per_lane), 0, -1):
            budget = SHARED_MEMORY_BYTES if buffers <= 2 else DEPTHWISE_RING_BYTES
            for vec in widths:
                elements = vec // item
                pitch = math.ceil((cols + elements - 1) / elements) * elements
                if lanes * buffers * rows * pitch * item <= budget:
                    return lanes, per_lane, buffers, vec, pitch
    return None


def _choose_depthwise_config(problem: ConvProblem) -> DepthwiseConfig:
    return DEPTHWISE_CONFIGS[1] if problem.wo <= 16 else DEPTHWISE_CONFIGS[0]


def _depthwise_refusal(problem: ConvProblem) -> str:
    """Why the depthwise kernel cannot run ``problem`` ("" when it can)."""
    if problem.c // problem.groups != 1:
        return f"{problem.c // problem.groups} input channels per group (needs 1)"
    if problem.k > MAX_GRID_Y or problem.n > MAX_GRID_Y:
        return f"{problem.k} channels or batch {problem.n} past the grid limit {MAX_GRID_Y}"
    cfg = _choose_depthwise_config(problem)
    if _depthwise_layout(problem, cfg) is None:
        return f"the input patch of a {cfg.th}x{cfg.tw} tile exceeds {SHARED_MEMORY_BYTES} B (large kernel, stride or dilation)"
    return ""


def make_depthwise_plan(problem: ConvProblem, config: str | None = None, reason: str = "",
                        channels_per_lane: int | None = None, patch_buffers: int | None = None) -> LaunchPlan:
    """Grid (output tiles, channel blocks, N), block (tw, th / rpt, lanes): a block computes one output
    tile of lanes x channels-per-lane channels of one image.

    ``config`` forces a DepthwiseConfig by name, ``channels_per_lane`` the channels each lane computes
    one after another (tests: the pipelined channel loop on small problems), ``patch_buffers`` the ring's
    depth (1 to DEPTHWISE_MAX_BUFFERS; benchmarks/bench_depthwise.py); None lets the shape decide.
    """
    if patch_buffers is not None and not 1 <= patch_buffers <= DEPTHWISE_MAX_BUFFERS:
        raise ValueError(f"patch_buffers must be 1 to {DEPTHWISE_MAX_BUFFERS}, got {patch_buffers!r}")
    cfg = (_forced_config(DEPTHWISE_CONFIGS, config, f"config for {DEPTHWISE_KERNEL}") if config
           else _choose_depthwise_config(problem))
    layout = _depthwise_layout(problem, cfg, channels_per_lane, patch_buffers)
    rows, cols = _depthwise_patch(problem, cfg)
    if layout is None:
        raise ValueError(f"kernel {DEPTHWISE_KERNEL!r} cannot run this problem: its {cfg.th}x{cfg.tw} tile's "
                         f"{rows}x{cols} input patch needs {rows * cols * _STORAGE_BYTES[problem.dtype]} B of "
                         f"shared memory (> {SHARED_MEMORY_BYTES})")
    lanes, per_lane, buffers, vec, pitch = layout
    taps = (problem.kh, problem.kw, problem.stride[0])
    cfg = dataclasses.replace(cfg, taps=taps if taps in DEPTHWISE_TAPS and problem.dilation[0] == 1 else (0, 0, 0))
    tiles_w = math.ceil(problem.wo / cfg.tw)
    tiles = math.ceil(problem.ho / cfg.th) * tiles_w
    channels = lanes * per_lane
    why = f"config {cfg.name}" + (" (forced by the caller)" if config else f", output {problem.ho}x{problem.wo}")
    why += f", {lanes} lane(s) x {per_lane} channel(s) per block, {buffers} patch buffer(s) per lane"
    return LaunchPlan(
        kernel=DEPTHWISE_KERNEL, dtype=problem.dtype, index_type=_index_type(problem), config=cfg,
        grid=(tiles, math.ceil(problem.k / channels), problem.n), block=(cfg.tw, cfg.th // cfg.rpt, lanes),
        shared_bytes=lanes * buffers * rows * pitch * _STORAGE_BYTES[problem.dtype],
        reason=f"{reason}; {why}" if reason else why, tiles_w=tiles_w, tiles=tiles, channels_per_block=channels,
        vec=vec, pitch=pitch, patch_buffers=buffers)


def depthwise_specialisations() -> list[str]:
    return [depthwise_name_expression(dtype, index, dataclasses.replace(cfg, taps=taps))
            for dtype in CTYPES for index in INDEX_TYPES for cfg in DEPTHWISE_CONFIGS
            for taps in DEPTHWISE_TAPS + ((0, 0, 0),)]


def depthwise_name_expression(dtype: str, index_type: str, cfg: DepthwiseConfig) -> str:
    kh, kw, sh = cfg.taps
    return f"cupyconv::{DEPTHWISE_KERNEL}<{CTYPES[dtype]},{index_type},{cfg.th},{cfg.tw},{cfg.rpt},{kh},{kw},{sh}>"


# ---------------------------------------------------------------------------------------------------
# Depthwise columns (kernels/depthwise_column_conv2d.cu): small planes, a thread per output column
# segment reading its input rows through L1, no shared memory and no barriers.

@dataclasses.dataclass(frozen=True)
class ColumnConfig:
    """rpt consecutive output rows of one column per thread; ``taps`` as DepthwiseConfig's (one of
    DEPTHWISE_TAPS: the kernel has unrolled instances only)."""

    name: str
    rpt: int
    taps: tuple[int, int, int] = (0, 0, 0)


#: Rows per thread: 7 divides MobileNet's and ResNet's 7 x 2^n planes, 4 and 8 the rest. The plan
#: takes the one that computes the fewest rows past Ho, the longest on a tie (fewer rows read twice).
COLUMN_CONFIGS = (ColumnConfig("col_r4", 4), ColumnConfig("col_r7", 7), ColumnConfig("col_r8", 8))
#: Threads per block at most (whole output rows of as many channels as fit): the kernel shares nothing
#: between threads, so this only sets the scheduling grain (H100: 64 to 256 within 4 % at 7 rows a thread).
COLUMN_BLOCK = 128
#: Widest output the planner gives the column kernel (past it, depthwise_conv2d's tiles).
COLUMN_MAX_WIDTH = 16


def _column_refusal(problem: ConvProblem) -> str:
    """Why the column kernel cannot run ``problem`` ("" when it can)."""
    if problem.c // problem.groups != 1:
        return f"{problem.c // problem.groups} input channels per group (needs 1)"
    if problem.wo > MAX_BLOCK_THREADS:
        return f"output {problem.wo} wide: a block holds whole rows, at most {MAX_BLOCK_THREADS}"
    if problem.n > MAX_GRID_Y or math.ceil(problem.ho / min(c.rpt for c in COLUMN_CONFIGS)) > MAX_GRID_Y:
        return f"batch {problem.n} or {problem.ho} output rows past the grid limit {MAX_GRID_Y}"
    taps = (problem.kh, problem.kw, problem.stride[0])
    if taps not in DEPTHWISE_TAPS or problem.dilation[0] != 1:
        return (f"{problem.kh}x{problem.kw} taps at row stride {problem.stride[0]} and row dilation "
                f"{problem.dilation[0]} have no unrolled instance (kh, kw, row stride: {DEPTHWISE_TAPS}; row dilation 1)")
    return ""


def _choose_column_config(problem: ConvProblem) -> ColumnConfig:
    return min(COLUMN_CONFIGS, key=lambda c: (math.ceil(problem.ho / c.rpt) * c.rpt, -c.rpt))


def make_column_plan(problem: ConvProblem, config: str | None = None, reason: str = "",
                     rows_per_thread: int | None = None, block: int | None = None) -> LaunchPlan:
    """Grid (ceil(K / P), row segments, N), block (Wo, P): a thread computes rpt rows of one output
    column of one channel of one image, a block whole rows of P channels, as many as fit in
    COLUMN_BLOCK threads. ``config`` forces a ColumnConfig by name; ``rows_per_thread`` and ``block``
    (threads at most) force other values (benchmarks/bench_depthwise.py sweeps them)."""
    why_not = _column_refusal(problem)
    if why_not:
        raise ValueError(f"kernel {DEPTHWISE_COLUMN_KERNEL!r} cannot run this problem: {why_not}")
    if rows_per_thread is not None:
        cfg = ColumnConfig(f"col_r{rows_per_thread}", rows_per_thread)
    else:
        cfg = (_forced_config(COLUMN_CONFIGS, config, f"config for {DEPTHWISE_COLUMN_KERNEL}") if config
               else _choose_column_config(problem))
    cfg = dataclasses.replace(cfg, taps=(problem.kh, problem.kw, problem.stride[0]))
    channels = max(1, min(problem.k, (block or COLUMN_BLOCK) // problem.wo))
    why = f"config {cfg.name}" + (" (forced by the caller)" if config or rows_per_thread else f", output {problem.ho} rows")
    return LaunchPlan(kernel=DEPTHWISE_COLUMN_KERNEL, dtype=problem.dtype, index_type=_index_type(problem), config=cfg,
                      grid=(math.ceil(problem.k / channels), math.ceil(problem.ho / cfg.rpt), problem.n),
                      block=(problem.wo, channels, 1), shared_bytes=0, reason=f"{reason}; {why}" if reason else why)


def _describe_column_plan(plan: LaunchPlan) -> str:
    c = plan.config
    return (f"{plan.kernel} [{c.name}: {c.rpt} rows of one output column per thread, {c.taps[0]}x{c.taps[1]} taps "
            f"at row stride {c.taps[2]} unrolled]\n"
            f"  {plan.dtype}, {plan.index_type} indices; {plan.block[1]} channel(s) per block, no shared memory\n"
            f"  grid {plan.grid} (channel blocks, row segments, images), block {plan.block}\n"
            f"  why: {plan.reason}")


def column_name_expression(dtype: str, index_type: str, cfg: ColumnConfig) -> str:
    kh, kw, sh = cfg.taps
    return f"cupyconv::{DEPTHWISE_COLUMN_KERNEL}<{CTYPES[dtype]},{index_type},{cfg.rpt},{kh},{kw},{sh}>"


def column_specialisations() -> list[str]:
    return [column_name_expression(dtype, index, dataclasses.replace(cfg, taps=taps))
            for dtype in CTYPES for index in INDEX_TYPES for cfg in COLUMN_CONFIGS for taps in DEPTHWISE_TAPS]


# ---------------------------------------------------------------------------------------------------
# FMA implicit GEMM (kernels/simt_gemm_conv2d.cu): strict float32 (IEEE fmaf) where TF32 is not
# allowed. It gathers the NCHW input in place and reads a transposed copy of the weight.

@dataclasses.dataclass(frozen=True)
class SimtConfig:
    """Thread-block tile of the FMA implicit GEMM: bm output pixels x bn output channels, bk of the
    reduction per stage, `stages` cp.async buffers; warp tiles wm x wn, each thread 8 x 8 outputs."""

    name: str
    bm: int
    bn: int
    bk: int
    wm: int
    wn: int
    stages: int

    @property
    def threads(self) -> int:
        return 32 * (self.bm // self.wm) * (self.bn // self.wn)

    def shared_bytes(self, taps: int) -> int:
        """The stages, A [bk][bm] and B [bk][bn] floats each, then the tap table (an int4 per tap)."""
        return 4 * self.stages * self.bk * (self.bm + self.bn) + 16 * taps


#: Tiles chosen by _choose_simt_config from H100 timings of these and other tiles on the bench suites
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
)
_SIMT_BY_NAME = {c.name: c for c in SIMT_CONFIGS}
#: SMs of the H100 the tiles were timed on: blocks beyond a multiple of it start another wave.
SIMT_WAVE_BLOCKS = 132
#: The 128-channel tile does a multiply-add in ~10 % less time than the 64-channel one (it gathers
#: the input half as often per output channel).
SIMT_WIDE_TILE_SPEED = 1.1
#: Kernel taps the tap table holds at most (16 KB of shared memory); larger kernels run direct.
SIMT_MAX_TAPS = 1024


def _simt_weight_columns(problem: ConvProblem) -> int:
    return math.ceil(problem.k // problem.groups / 4) * 4


def _choose_simt_config(problem: ConvProblem) -> tuple[SimtConfig, str]:
    """Up to 32 output channels per group the 256 x 32 tile, up to 64 the 64 x 64 one, up to 96 the
    96-channel one, up to 128 the 64 x 128 one (the input gathered once, twice the blocks of 128 x 128:
    r50_down_3x3s2 0.212 ms against 0.245 with 128 x 64). More: 64- or 128-channel tiles of 128 pixels,
    whichever finishes first counting whole waves of
    SIMT_WAVE_BLOCKS blocks (wave quantisation decides the small late layers: ResNet-50's 7x7 and
    14x14 stages fill few waves of 128-channel tiles)."""
    kg = problem.k // problem.groups
    for limit, name in ((32, "simt_m256n32"), (64, "simt_m64n64"), (96, "simt_m128n96k16"), (128, "simt_m64n128k16")):
        if kg <= limit:
            return _SIMT_BY_NAME[name], f"{kg} output channels per group fit one {name} tile"

    def cost(cfg: SimtConfig) -> float:
        waves = math.ceil(math.prod(_gemm_grid(problem, cfg)) / SIMT_WAVE_BLOCKS)
        return waves * cfg.bn / (SIMT_WIDE_TILE_SPEED if cfg.bn == 128 else 1.0)

    narrow, wide = _SIMT_BY_NAME["simt_m128n64k16"], _SIMT_BY_NAME["simt_m128n128k16"]
    cfg = min((wide, narrow), key=cost)
    return cfg, (f"{kg} output channels per group; {cfg.bn}-channel tiles finish first "
                 f"({math.prod(_gemm_grid(problem, wide))} blocks of 128 or {math.prod(_gemm_grid(problem, narrow))} "
                 f"of 64 channels, waves of {SIMT_WAVE_BLOCKS})")


def _simt_refusal(problem: ConvProblem) -> str:
    """Why the FMA implicit GEMM cannot run ``problem`` ("" when it can)."""
    if problem.dtype != "float32":
        return f"it computes in float32 only, got {problem.dtype}"
    if problem.kh * problem.kw > SIMT_MAX_TAPS:
        return f"{problem.kh}x{problem.kw} kernel taps past its table of {SIMT_MAX_TAPS}"
    # Tap offsets within a plane are 32-bit.
    if (problem.h + (problem.kh - 1) * problem.dilation[0]) * (problem.w + (problem.kw - 1) * problem.dilation[1]) >= 2**31:
        return f"input planes of {problem.h}x{problem.w} past 32-bit tap offsets"
    mx, ny, gz = _gemm_grid(problem, _choose_simt_config(problem)[0])
    if mx >= 2**31 or ny > MAX_GRID_Y or gz > MAX_GRID_Y:
        return f"grid {(mx, ny, gz)} past CUDA's limits"
    return ""


def make_simt_plan(problem: ConvProblem, config: str | None = None, reason: str = "") -> LaunchPlan:
    """The FMA implicit-GEMM launch: grid (pixel tiles, channel tiles, groups), one block per tile."""
    if config is not None:
        cfg, why = _forced_config(SIMT_CONFIGS, config, f"config for {SIMT_KERNEL}"), "config forced by the caller"
    else:
        cfg, why = _choose_simt_config(problem)
    grid = _gemm_grid(problem, cfg)
    if grid[0] >= 2**31 or grid[1] > MAX_GRID_Y or grid[2] > MAX_GRID_Y:
        raise ValueError(f"{SIMT_KERNEL} grid {grid} exceeds CUDA's limits for output {problem.out_shape} "
                         f"with groups={problem.groups}")
    columns = _simt_weight_columns(problem)
    weight_copy = problem.groups * (problem.c // problem.groups) * problem.kh * problem.kw * columns
    return LaunchPlan(
        kernel=SIMT_KERNEL, dtype=problem.dtype, index_type=_index_type(problem, weight_copy), config=cfg,
        grid=grid, block=(cfg.threads, 1, 1), shared_bytes=cfg.shared_bytes(problem.kh * problem.kw),
        reason=f"{reason}; {why}" if reason else why, weight_columns=columns)


def _describe_simt_plan(plan: LaunchPlan) -> str:
    c = plan.config
    return (f"{plan.kernel} [{c.name}: block {c.bm} px x {c.bn} ch, k {c.bk} per stage, {c.stages} stages, "
            f"warps of {c.wm} px x {c.wn} ch, 8x8 outputs per thread, {c.threads} threads]\n"
            f"  float32 (IEEE FMA, no TF32), {plan.index_type} indices; {plan.shared_bytes} B shared memory\n"
            f"  grid {plan.grid} (pixel tiles, channel tiles, groups), block {plan.block}\n"
            f"  reads the NCHW input in place and a transposed weight copy [groups][Cg kh kw][{plan.weight_columns}]\n"
            f"  why: {plan.reason}")


def simt_name_expression(index_type: str, cfg: SimtConfig) -> str:
    return f"cupyconv::{SIMT_KERNEL}<{index_type},{cfg.bm},{cfg.bn},{cfg.bk},{cfg.wm},{cfg.wn},{cfg.stages}>"


def simt_specialisations() -> list[str]:
    return [simt_name_expression(index, cfg) for index in INDEX_TYPES for cfg in SIMT_CONFIGS]


# ---------------------------------------------------------------------------------------------------
# Winograd F(m x m, 3x3), m = 2 or 4, for strict float32 (kernels/winograd_conv2d.cu): transforms
# around a batched GEMM, which is the FMA implicit GEMM run as an (m + 2)^2-group 1x1 convolution.
# Other undilated, ungrouped kernels are the stride-1 3x3 convolution of their C' = C bh bw sh sw phase
# channels (3x3 blocks of taps, polyphase components; see the kernel file), taken the same way.

#: Output tile sizes m of the kernels: F(4x4) saves more multiplies (4x against 2.25x) and moves less
#: (V and M 2.25x the input and output, against 4x), F(2x2) rounds less.
WINOGRAD_TILES = (2, 4)
#: F(4x4)'s error grows with the reduction (2e-6 relative at 64 input channels, 3e-6 at 512 on random
#: data, against strict float32's 1e-5 bound): above this many (phase) channels F(2x2) runs instead.
WINOGRAD_4X4_MAX_CHANNELS = 512
#: Temporaries (the transformed input V, the GEMM's output M and the transformed weight: about 2.25x
#: (F(4x4)) or 4x (F(2x2)) the phases plus the output) a pass may take: larger batches run in passes.
WINOGRAD_MAX_WORKSPACE_BYTES = 2**31
#: Winograd pays where the multiplies saved (at the FMA GEMM's ~30 TFLOP/s) outweigh the time V and M
#: spend crossing memory twice (at ~2.5 TB/s): for 3x3 stride-1 layers, for F(4x4) where C K / (C + K)
#: exceeds ~16, for F(2x2) ~77. With margin: 24 and 48 (64 -> 64 channels take F(4x4); F(2x2) runs
#: from 128 -> 128 up). Strided layers count their phase channels and the multiplies they save
#: (_winograd_gain).
WINOGRAD_MIN_CHANNEL_RATIO = {4: 24, 2: 48}
#: Threads per block of the transforms (kernels/winograd_conv2d.cu: __launch_bounds__(256)); the input
#: transform's blocks each take this many tiles of one phase channel.
WINOGRAD_BLOCK = 256


def winograd_blocks(problem: ConvProblem) -> tuple[int, int]:
    """(bh, bw): blocks of 3 strides that cover the kernel down and across (1 x 1 for 3x3 stride 1 and
    AlexNet's 11x11 stride 4; 2 x 3 for the 5x9 at stride 1)."""
    return (math.ceil(math.ceil(problem.kh / problem.stride[0]) / 3),
            math.ceil(math.ceil(problem.kw / problem.stride[1]) / 3))


def winograd_channels(problem: ConvProblem) -> int:
    """C': the input channels of the stride-1 3x3 problem, one per channel and phase (u, v, p, q): bh x bw
    blocks of 3 strides, sh x sw polyphase components."""
    return problem.c * math.prod(winograd_blocks(problem)) * problem.stride[0] * problem.stride[1]


def _winograd_tile(problem: ConvProblem) -> int:
    return 4 if winograd_channels(problem) <= WINOGRAD_4X4_MAX_CHANNELS else 2


def _winograd_tiles(problem: ConvProblem, tile: int) -> tuple[int, int]:
    return math.ceil(problem.ho / tile), math.ceil(problem.wo / tile)


@functools.lru_cache(maxsize=4096)
def winograd_gemm_problem(problem: ConvProblem, tile: int, images: int | None = None) -> ConvProblem:
    """The batched GEMM as simt_gemm_conv2d sees it for ``images`` images (default all): one image of
    1 x T pixels (T tiles) with a^2 C' channels, a^2 groups (a = tile + 2), a 1x1 kernel and a^2 K
    outputs. Cached: launch.py asks for it on every call."""
    from .arguments import make_problem

    tiles = (problem.n if images is None else images) * math.prod(_winograd_tiles(problem, tile))
    positions, channels = (tile + 2) ** 2, winograd_channels(problem)
    return make_problem((1, positions * channels, 1, tiles), (positions * problem.k, channels, 1, 1), None,
                        "float32", 1, 0, 1, positions)


def _winograd_images(problem: ConvProblem, tile: int) -> int:
    """Images per pass: all, or as many as keep the temporaries (U, and V and M of the pass's tiles)
    within WINOGRAD_MAX_WORKSPACE_BYTES, in passes of equal size but the last (0: not even one)."""
    positions, channels = (tile + 2) ** 2, winograd_channels(problem)
    weight = 4 * positions * channels * math.ceil(problem.k / 4) * 4
    per_image = 4 * positions * (channels + problem.k) * math.prod(_winograd_tiles(problem, tile))
    fit = max(0, (WINOGRAD_MAX_WORKSPACE_BYTES - weight) // per_image)
    n = max(problem.n, 1)
    return fit and math.ceil(n / math.ceil(n / fit))


def _winograd_refusal(problem: ConvProblem, tile: int | None = None) -> str:
    """Why winograd_conv2d (with ``tile``, or the one it would choose) cannot run ``problem`` ("" when it can)."""
    if problem.dtype != "float32":
        return f"it computes in float32 only, got {problem.dtype}"
    if problem.dilation != (1, 1) or problem.groups != 1:
        return f"it needs dilation 1 and one group (got dilation {problem.dilation}, groups {problem.groups})"
    tile = tile or _winograd_tile(problem)
    images = _winograd_images(problem, tile)
    if not images:
        return f"its temporaries for one image would pass {WINOGRAD_MAX_WORKSPACE_BYTES // 2**20} MiB"
    return _simt_refusal(winograd_gemm_problem(problem, tile, images))


def _winograd_gain(problem: ConvProblem, tile: int) -> float:
    """Multiplies saved per output and phase channel, relative to a 3x3 stride-1 layer's: strided or
    larger kernels pad their taps to 3 bh sh x 3 bw sw (AlexNet's 121 to 144, the 5x9's 45 to 54),
    saving less per phase channel (below zero where padding outweighs the transform's saving)."""
    transformed = (tile + 2) ** 2 / tile**2
    direct = problem.kh * problem.kw * problem.c / winograd_channels(problem)
    return (direct - transformed) / (9 - transformed)


def _winograd_pays(problem: ConvProblem) -> bool:
    channels, tile = winograd_channels(problem), _winograd_tile(problem)
    ratio = channels * problem.k / (channels + problem.k) * _winograd_gain(problem, tile)
    return ratio >= WINOGRAD_MIN_CHANNEL_RATIO[tile]


def make_winograd_plan(problem: ConvProblem, config: str | None = None, reason: str = "",
                       tile: int | None = None) -> LaunchPlan:
    """Winograd's transforms (one thread per tile and channel) around the batched GEMM's own plan, in
    passes of winograd_images images; ``config`` forces the GEMM's tile, ``tile`` the output tile m
    (2 or 4; None: by channel count)."""
    if tile is not None and tile not in WINOGRAD_TILES:
        raise ValueError(f"tile must be one of {WINOGRAD_TILES}, got {tile!r}")
    tile = tile or _winograd_tile(problem)
    why_not = _winograd_refusal(problem, tile)
    if why_not:
        raise ValueError(f"kernel {WINOGRAD_KERNEL!r} cannot run this problem: {why_not}")
    images = _winograd_images(problem, tile)
    gemm, gemm_last = (make_simt_plan(winograd_gemm_problem(problem, tile, n), config)
                       for n in (images, problem.n % images or images))
    tiles_h, tiles_w = _winograd_tiles(problem, tile)
    index_type = "long long" if "long long" in (_index_type(problem), gemm.index_type) else "int"
    channels, (bh, bw), (sh, sw) = winograd_channels(problem), winograd_blocks(problem), problem.stride
    what = f"{channels} input channels"
    if channels != problem.c:
        splits = [f"{problem.c} channels"] + [f"{a}x{b} {name}" for a, b, name in
                                               ((bh, bw, "blocks of 3 strides"), (sh, sw, "phases")) if a * b > 1]
        what = f"{channels} phase channels ({' x '.join(splits)})"
    why = (f"F({tile}x{tile}, 3x3): {what}" +
           (f" <= {WINOGRAD_4X4_MAX_CHANNELS}" if tile == 4 else f" > {WINOGRAD_4X4_MAX_CHANNELS} (F(4x4) rounds more)"))
    if images < problem.n:
        why += f"; {math.ceil(problem.n / images)} passes of {images} image(s) keep the temporaries within " \
               f"{WINOGRAD_MAX_WORKSPACE_BYTES // 2**20} MiB"
    return LaunchPlan(
        kernel=WINOGRAD_KERNEL, dtype=problem.dtype, index_type=index_type, config=gemm.config,
        grid=gemm.grid, block=gemm.block, shared_bytes=gemm.shared_bytes,
        reason=f"{reason}; {why}" if reason else why,
        tiles_w=tiles_w, tiles=tiles_h * tiles_w, weight_columns=gemm.weight_columns, winograd_tile=tile,
        winograd_images=images, gemm=dataclasses.replace(gemm, index_type=index_type),
        gemm_last=dataclasses.replace(gemm_last, index_type=index_type))


def _describe_winograd_plan(plan: LaunchPlan) -> str:
    tiles_h, m = plan.tiles // plan.tiles_w, plan.winograd_tile
    gemm = "\n".join("    " + line for line in str(plan.gemm).splitlines())
    return (f"{plan.kernel} [F({m}x{m}, 3x3): {tiles_h}x{plan.tiles_w} output tiles of {m}x{m} per image; "
            f"transforms of the weight, the input and the output around {(m + 2) ** 2} GEMMs]\n"
            f"  float32 (IEEE arithmetic, no TF32), {plan.index_type} indices\n"
            f"  the {(m + 2) ** 2} GEMMs, as one grouped 1x1 convolution of {plan.winograd_images} image(s) "
            f"a pass:\n{gemm}\n"
            f"  why: {plan.reason}")


WINOGRAD_TRANSFORMS = ("winograd_weight_transform", "winograd_input_transform", "winograd_output_transform")


def winograd_specialisations() -> list[str]:
    return [winograd_name_expression(kernel, tile, index) for kernel in WINOGRAD_TRANSFORMS
            for tile in WINOGRAD_TILES for index in INDEX_TYPES]


def winograd_name_expression(kernel: str, tile: int, index_type: str) -> str:
    return f"cupyconv::{kernel}<{tile},{index_type}>"


#: Config name -> its family, for make_plan(config=...) without a kernel.
_CONFIG_NAMES = {
    DEPTHWISE_KERNEL: {c.name for c in DEPTHWISE_CONFIGS},
    DEPTHWISE_COLUMN_KERNEL: {c.name for c in COLUMN_CONFIGS},
    NHWC_KERNEL: {c.name for configs in NHWC_CONFIGS.values() for c in configs},
    GEMM_KERNEL: {c.name for configs in GEMM_CONFIGS.values() for c in configs},
    SIMT_KERNEL: {c.name for c in SIMT_CONFIGS},
}
