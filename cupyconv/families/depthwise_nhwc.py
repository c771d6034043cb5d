"""Depthwise convolution on NHWC arrays (kernels/depthwise_nhwc.cu): vectors of consecutive
channels per thread, 16-byte loads and stores where the channels allow. The weight is prepared once
as [kh kw][C], so that it is read in vectors too. MobileNet's and EfficientNet's depthwise layers in
channels_last (one channel per group, no channel multiplier).

A thread computes one output pixel (any kernel, stride and dilation), or, for kernels ROW_KERNEL_WIDTHS
wide with column strides ROW_STRIDES and no column dilation, a run of ROW_PIXELS pixels along a row
that loads and widens each input column and weight once per kernel row (the per-pixel way does both
per tap, which binds before HBM does: benchmarks/NOTES.md, "Depthwise NHWC rows"); other kernel widths
of column stride 1 run runs with run-time taps (RUN_CONFIGS; the dtype's RUN_CONFIG). Square row kernels of
equal strides and no dilation may also walk down ``rows`` output rows a thread (WALK_CONFIGS), loading each
input row once for all the output rows whose windows hold it. The 16-bit walks of 8-byte vectors (the fixed
rules' 16-bit walks) read the weight in place instead of prepared where the launch has few blocks
(stages_weight)."""
from __future__ import annotations

import dataclasses
import math

from ..arguments import ConvProblem
from ..planner import LaunchPlan
from ..program import PREPARED, WEIGHT, CallProgram, Pointer, WeightPreparation
from .common import CTYPES, INDEX_TYPES, STORAGE_BYTES, conv_launch, forced_config, index_type

KERNEL = "depthwise_nhwc"
#: It computes NHWC alone (NCHW problems are refused, not transposed). Its weight, (C, 1, kh, kw) or
#: (C, kh, kw, 1), is the same memory in either weight layout.
LAYOUTS = ("NHWC",)
WEIGHT_LAYOUTS = ("KCHW", "KHWC")
BLOCK = 256


@dataclasses.dataclass(frozen=True)
class VectorConfig:
    """``vec_bytes`` of consecutive channels per thread, for one output pixel (``pixels`` 1) or a run
    of ``pixels`` along a row, in ``rows`` output rows down a column. A row plan's config carries the
    kernel width ``kw`` and column stride ``sw`` its instance is compiled for (0 in the table: the
    problem's, filled in by make_plan), and whether it reads the weight in place (``staged``: set by
    make_plan, stages_weight)."""

    name: str
    vec_bytes: int
    pixels: int = 1
    kw: int = 0
    sw: int = 0
    rows: int = 1
    staged: bool = False


#: Row instances: kernel widths and column strides (MobileNet's and EfficientNet's 3x3 and 5x5,
#: stride 1 and 2; 7x7 for ConvNeXt), and pixels per run: 4 reads a 3x3 row's 6 columns for 4 pixels
#: where the per-pixel way reads 12, with 32 float accumulators for 8 fp16 channels; 2 reads 4 for 2,
#: with half the registers.
ROW_KERNEL_WIDTHS = (3, 5, 7)
ROW_STRIDES = (1, 2)
ROW_PIXELS = (4, 2)
ROW_VEC_BYTES = 16
#: Threads per block: 128 for rows (their 55-110 registers fit more threads an SM in blocks of 128;
#: 2-10 % faster than 256 on the H100, benchmarks/NOTES.md), 256 per pixel.
ROW_BLOCK = 128
#: float64 stays per pixel: 16 bytes hold 2 channels, and its 7-wide rows spill.
ROW_DTYPES = ("float16", "bfloat16", "float32")
#: The row config first (the plan takes it where the problem allows), then 16-, 8-, 4- and 2-byte
#: vectors per pixel: the widest whose channel count divides C.
NHWC_DEPTHWISE_CONFIGS = (*(VectorConfig(f"dw_nhwc_v{ROW_VEC_BYTES}_row{p}", ROW_VEC_BYTES, p) for p in ROW_PIXELS),
                          *(VectorConfig(f"dw_nhwc_v{b}", b) for b in (16, 8, 4, 2)))
#: Runs of 4 or 8 pixels for kernels of any other width (column stride 1, no column dilation; kw -1
#: in the instance: run-time taps, the run's input columns rotated through registers), for conv1d's long
#: kernels, which the per-pixel way reads with two loads and two conversions per tap. A run loads and
#: widens a tap's weight once for its pixels: where widening costs most (fp16) runs of 8 in 8-byte
#: vectors (95 registers), float32 runs of 8 in 16-byte ones, bf16 runs of 4 (H100, conformer_dw_512_k31
#: channels_last against the per-pixel way: fp16 0.073 -> 0.048 ms, TF32 0.106 -> 0.052, bf16 0.087 ->
#: 0.052; benchmarks/NOTES.md, "Runs along rows"). Kernels one column wide stay per pixel: a run has no
#: column to share.
RUN_CONFIGS = tuple(VectorConfig(f"dw_nhwc_v{b}_run{p}", b, p, kw=-1, sw=1) for b, p in ((16, 4), (8, 8), (16, 8)))
RUN_CONFIG = {"float16": RUN_CONFIGS[1], "bfloat16": RUN_CONFIGS[0], "float32": RUN_CONFIGS[2]}
#: Runs that also walk down output rows (kernels square, strides equal, no dilation: the row stride is
#: the compiled column stride and a kernel row a compiled column): (vector bytes, pixels, rows). A column
#: of a 3x3, stride-1 layer's output rows then fetches each input row from L2 once per (rows + 2) / rows
#: output rows, not three times.
WALK_SHAPES = ((16, 2, 2), (16, 2, 4), (16, 4, 2), (8, 2, 2), (8, 2, 4), (8, 4, 2), (8, 4, 4))
WALK_CONFIGS = tuple(VectorConfig(f"dw_nhwc_v{b}_row{p}_down{r}", b, p, rows=r) for b, p, r in WALK_SHAPES)
#: The fixed rule's walk by (dtype, kernel width, stride), where it fits (else the row rule). Float32 runs of
#: 2 pixels down 4 rows at stride 1 and of 4 down 2 at stride 2 were 1.1-1.4x faster than the rows on every
#: layer timed; 16 bits take 8-byte vectors (half the accumulators of 16-byte ones), 4 pixels down 2 rows at
#: stride 1 and 2 down 2 at stride 2, but not where the rows were faster: fp16 5x5 stride 2 and bf16 7x7 (H200,
#: 22 layers: benchmarks/NOTES.md, "NHWC depthwise runs that walk down output rows").
WALK_RULE = {
    **{("float32", kw, s): "dw_nhwc_v16_row2_down4" if s == 1 else "dw_nhwc_v16_row4_down2"
       for kw in ROW_KERNEL_WIDTHS for s in ROW_STRIDES},
    **{(dtype, kw, 1): "dw_nhwc_v8_row4_down2" for dtype in ("float16", "bfloat16") for kw in (3, 5)},
    ("float16", 7, 1): "dw_nhwc_v8_row4_down2",
    ("float16", 3, 2): "dw_nhwc_v8_row2_down2",
    ("bfloat16", 3, 2): "dw_nhwc_v8_row2_down2",
    ("bfloat16", 5, 2): "dw_nhwc_v8_row2_down2",
}
WALK_BY_NAME = {c.name: c for c in WALK_CONFIGS}
#: Walks of STAGED_VEC_BYTES vectors in 16 bits may read the weight in place (the kernel's STAGED): a block
#: copies its channels' [kh kw] rows of the caller's [C][kh kw] weight into shared memory once (at most
#: ROW_BLOCK vectors of 4 channels: 9 KB for a 3x3, 25 KB for a 5x5, 50 KB for a 7x7), so that no launch
#: prepares the weight. Inside a CUDA graph that launch runs before every call (the weight is the caller's to
#: change between replays): 1.2-1.7 us on each of MobileNetV2's and EfficientNet-B0's depthwise layers (H200,
#: fp16 channels_last, benchmarks/profile/model_conv_spans.py). Each block's copy costs it an L2 round trip
#: before its first tap, which a launch of few blocks pays once and one of thousands pays many times over:
#: MobileNetV2's 3x3 layers at batch 8 and 32 ran 0.5-1.3 us faster a call staged up to 1,176 blocks, 1.4-2.4 us
#: slower from 3,136 (benchmarks/NOTES.md, "Each convolution inside the model's graph"), so a walk stages up to
#: STAGED_MAX_BLOCKS blocks. Float32 walks (16-byte vectors: up to 100 KB a block) keep the prepared weight.
STAGED_VEC_BYTES = 8
STAGED_MAX_BLOCKS = 2048
CONFIG_NAMES = frozenset(c.name for c in (*NHWC_DEPTHWISE_CONFIGS, *RUN_CONFIGS, *WALK_CONFIGS))


def _row_refusal(problem: ConvProblem) -> str:
    """Why the row instances cannot run ``problem`` ("" when they can)."""
    if problem.dtype not in ROW_DTYPES:
        return f"rows are compiled for {ROW_DTYPES}, not {problem.dtype}"
    if problem.kw not in ROW_KERNEL_WIDTHS or problem.stride[1] not in ROW_STRIDES or problem.dilation[1] != 1:
        return (f"rows are compiled for kernel widths {ROW_KERNEL_WIDTHS}, column strides {ROW_STRIDES} and no "
                f"column dilation; got width {problem.kw}, stride {problem.stride[1]}, dilation {problem.dilation[1]}")
    return ""


def _walk_refusal(problem: ConvProblem) -> str:
    """Why the walking instances cannot run ``problem`` ("" when they can)."""
    why = _row_refusal(problem)
    if not why and (problem.kh != problem.kw or problem.stride[0] != problem.stride[1] or problem.dilation[0] != 1):
        why = (f"walks down rows need a square kernel, equal strides and no dilation; got {problem.kh}x{problem.kw}, "
               f"stride {problem.stride}, dilation {problem.dilation}")
    return why


def _row_pixels(problem: ConvProblem) -> int:
    """The fixed rule's pixels per run: 4, but 2 for 16-bit column strides of 2, whose runs of 4 span
    9-15 columns of 8 channels (90-130 registers; 2 was 15-25 % faster on the H100's MobileNetV2 and
    5x5 stride-2 rows, benchmarks/NOTES.md)."""
    return 2 if problem.stride[1] > 1 and STORAGE_BYTES[problem.dtype] == 2 else 4


def _fits(cfg: VectorConfig, problem: ConvProblem) -> bool:
    item = STORAGE_BYTES[problem.dtype]
    if cfg.kw < 0 and not (problem.dtype in ROW_DTYPES and problem.stride[1] == problem.dilation[1] == 1):
        return False
    return (cfg.vec_bytes >= item and problem.c % (cfg.vec_bytes // item) == 0
            and (cfg.pixels == 1 or cfg.kw < 0 or not _row_refusal(problem))
            and (cfg.rows == 1 or not _walk_refusal(problem)))


def refusal(problem: ConvProblem) -> str:
    """Why this kernel cannot run ``problem`` ("" when it can): NCHW arrays, or not one channel per
    group with as many outputs."""
    if problem.layout != "NHWC":
        return f"it computes NHWC arrays only (layout {problem.layout})"
    if not problem.groups == problem.c == problem.k:
        return (f"needs one channel per group and no multiplier (groups == C == K), got groups {problem.groups}, "
                f"C {problem.c}, K {problem.k}")
    return ""


def make_plan(problem: ConvProblem, config: str | None = None, reason: str = "") -> LaunchPlan:
    """A 1-D grid of BLOCK-thread blocks (ROW_BLOCK for rows), a thread per vector of channels and
    output pixel (or run of a row's pixels, in each of a walk's output rows)."""
    why_not = refusal(problem)
    if why_not:
        raise ValueError(f"kernel {KERNEL!r} cannot run this problem: {why_not}")
    if config is not None:
        cfg = forced_config(NHWC_DEPTHWISE_CONFIGS + RUN_CONFIGS + WALK_CONFIGS, config, f"config for {KERNEL}")
        if not _fits(cfg, problem):
            runs = (f"runs of any width need {ROW_DTYPES}, column stride 1 and no column dilation (got "
                    f"{problem.dtype}, stride {problem.stride[1]}, dilation {problem.dilation[1]})")
            why_not = (runs if cfg.kw < 0 else _walk_refusal(problem) if cfg.rows > 1
                       else _row_refusal(problem) if cfg.pixels > 1 else "")
            raise ValueError(f"config {config!r} cannot run this problem: {why_not}{'; or ' if why_not else ''}"
                             f"{problem.c} channels are not whole {cfg.vec_bytes}-byte vectors of {problem.dtype}")
        why = "config forced by the caller"
    else:
        cfg = next(c for c in NHWC_DEPTHWISE_CONFIGS if (_fits(c, problem) and c.pixels in (1, _row_pixels(problem)))
                   or c.vec_bytes == STORAGE_BYTES[problem.dtype])
        runs = RUN_CONFIG.get(problem.dtype)
        walk = WALK_BY_NAME.get(WALK_RULE.get((problem.dtype, problem.kw, problem.stride[1])))
        if walk is not None and _fits(walk, problem):
            cfg = walk
        elif cfg.pixels == 1 and problem.kw > 1 and runs and _fits(runs, problem):
            cfg = runs
        why = f"{problem.c} channels in {cfg.vec_bytes}-byte vectors"
        if cfg.pixels > 1:
            why += (f", runs of {cfg.pixels} pixels along rows ({problem.kw} wide, column stride {problem.stride[1]}"
                    f"{', run-time taps' if cfg.kw < 0 else ''})")
        if cfg.rows > 1:
            why += f" walking down {cfg.rows} output rows"
    if cfg.pixels > 1 and cfg.kw >= 0:
        cfg = dataclasses.replace(cfg, kw=problem.kw, sw=problem.stride[1])
    threads = (problem.n * math.ceil(problem.ho / cfg.rows) * math.ceil(problem.wo / cfg.pixels) * problem.c
               // _vec(cfg, problem.dtype))
    block = ROW_BLOCK if cfg.pixels > 1 else BLOCK
    blocks = math.ceil(threads / block)
    if stages_weight(cfg, problem.dtype, blocks):
        cfg = dataclasses.replace(cfg, staged=True)
        why += f"; the weight read in place ({blocks} blocks <= {STAGED_MAX_BLOCKS})"
    return LaunchPlan(kernel=KERNEL, dtype=problem.dtype, index_type=index_type(problem, threads), config=cfg,
                      grid=(blocks, 1, 1), block=(block, 1, 1),
                      shared_bytes=_staged_bytes(cfg, problem) if cfg.staged else 0,
                      reason=f"{reason}; {why}" if reason else why)


def _vec(cfg: VectorConfig, dtype: str) -> int:
    return max(1, cfg.vec_bytes // STORAGE_BYTES[dtype])


def can_stage(cfg: VectorConfig, dtype: str) -> bool:
    """Whether ``cfg`` in ``dtype`` has an instance that reads the weight in place (STAGED_VEC_BYTES)."""
    return cfg.rows > 1 and cfg.vec_bytes == STAGED_VEC_BYTES and STORAGE_BYTES[dtype] == 2


def stages_weight(cfg: VectorConfig, dtype: str, blocks: int) -> bool:
    """Whether a launch of ``blocks`` blocks of ``cfg`` reads the weight in place (STAGED_MAX_BLOCKS)."""
    return can_stage(cfg, dtype) and blocks <= STAGED_MAX_BLOCKS


def _staged_bytes(cfg: VectorConfig, problem: ConvProblem) -> int:
    """A staged block's shared memory: the [kh kw] rows of its at most ROW_BLOCK channel vectors."""
    vec = _vec(cfg, problem.dtype)
    return min(ROW_BLOCK, problem.c // vec) * vec * problem.kh * problem.kw * STORAGE_BYTES[problem.dtype]


def describe(plan: LaunchPlan) -> str:
    """The printed plan: vector width, launch shape and why."""
    c = plan.config
    width = "run-time width" if c.kw < 0 else f"{c.kw} wide"
    pixels = (f"a run of {c.pixels} output pixels along a row ({width}, column stride {c.sw})" if c.pixels > 1
              else "one output pixel")
    if c.rows > 1:
        pixels += f" in each of {c.rows} output rows"
    weight = (f"weight read in place, {plan.shared_bytes} bytes of it staged a block" if c.staged
              else "weight prepared as [kh kw][C]")
    return (f"{plan.kernel} [{c.name}: {_vec(c, plan.dtype)} channels of {pixels} per thread]\n"
            f"  {plan.dtype}, {plan.index_type} indices; {weight}\n"
            f"  grid {plan.grid}, block {plan.block}\n"
            f"  why: {plan.reason}")


def specialisation(dtype: str, index: str, vec: int, kw: int = 0, sw: int = 1, pixels: int = 1, rows: int = 1,
                   weight_staged: bool = False) -> str:
    """An instance: per pixel (kw 0), or rows of ``pixels`` for a kernel ``kw`` wide (-1: any), column stride ``sw``,
    in ``rows`` output rows (a kernel ``kw`` tall, row stride ``sw``), the weight read in place where
    ``weight_staged``."""
    return f"cupyconv::{KERNEL}<{CTYPES[dtype]},{index},{vec},{kw},{sw},{pixels},{rows},{str(weight_staged).lower()}>"


def name_expression(plan: LaunchPlan) -> str:
    c = plan.config
    return specialisation(plan.dtype, plan.index_type, _vec(c, plan.dtype),
                          *((c.kw, c.sw, c.pixels, c.rows, c.staged) if c.pixels > 1 else ()))


def specialisations() -> list[str]:
    """Every dtype, index width and vector width that dtype has, per pixel; the row instances (16-byte
    vectors) of every kernel width and column stride, and of run-time widths; and every walk of every
    kernel width and stride (the 16-bit 8-byte ones also staged)."""
    per_pixel = [specialisation(dtype, index, _vec(cfg, dtype)) for dtype in CTYPES for index in INDEX_TYPES
                 for cfg in NHWC_DEPTHWISE_CONFIGS if cfg.pixels == 1 and cfg.vec_bytes >= STORAGE_BYTES[dtype]]
    rows = [specialisation(dtype, index, ROW_VEC_BYTES // STORAGE_BYTES[dtype], kw, sw, pixels)
            for dtype in ROW_DTYPES for index in INDEX_TYPES for kw in ROW_KERNEL_WIDTHS for sw in ROW_STRIDES
            for pixels in ROW_PIXELS]
    runs = [specialisation(dtype, index, cfg.vec_bytes // STORAGE_BYTES[dtype], cfg.kw, cfg.sw, cfg.pixels)
            for dtype in ROW_DTYPES for index in INDEX_TYPES for cfg in RUN_CONFIGS]
    walks = [specialisation(dtype, index, cfg.vec_bytes // STORAGE_BYTES[dtype], kw, sw, cfg.pixels, cfg.rows, staged)
             for dtype in ROW_DTYPES for index in INDEX_TYPES for kw in ROW_KERNEL_WIDTHS for sw in ROW_STRIDES
             for cfg in WALK_CONFIGS if cfg.vec_bytes >= STORAGE_BYTES[dtype]
             for staged in ((False, True) if can_stage(cfg, dtype) else (False,))]
    return list(dict.fromkeys(per_pixel + rows + runs + walks))


def _weight_preparation(problem: ConvProblem) -> WeightPreparation:
    """The weight [C][kh kw] transposed to [kh kw][C], exact."""
    from .implicit_gemm_nhwc import channels_last_copy

    p, taps = problem, problem.kh * problem.kw
    copy = channels_last_copy(p.dtype, 1, p.c, taps, p.c, False, Pointer(WEIGHT), Pointer(PREPARED))
    return WeightPreparation((KERNEL, p.dtype, p.weight_shape), p.c * taps * STORAGE_BYTES[p.dtype], (copy,))


def program(plan: LaunchPlan, problem: ConvProblem) -> CallProgram:
    """One launch on the caller's x and output, and on the caller's weight where the plan stages it
    (stages_weight), else on the prepared weight."""
    if plan.config.staged:
        return CallProgram((conv_launch(plan, problem),))
    return CallProgram((conv_launch(plan, problem, weight=Pointer(PREPARED)),), 0, _weight_preparation(problem))
