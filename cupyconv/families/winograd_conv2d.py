"""Winograd F(m x m, 3x3), m = 2 or 4, for strict float32 (kernels/winograd_conv2d.cu): transforms
around a batched GEMM, which is the FMA implicit GEMM (simt_gemm_conv2d) run as an (m + 2)^2-group
1x1 convolution. Other undilated, ungrouped kernels are the stride-1 3x3 convolution of their
C' = C bh bw sh sw phase channels (3x3 blocks of taps, polyphase components; see the kernel file),
taken the same way.

The transformed weight U is prepared once; the transformed input V and the GEMM's output M are
temporaries in the workspace, for passes of as many images as keep them within
WINOGRAD_MAX_WORKSPACE_BYTES. With split-K the GEMM writes its runs of partial sums of M instead, and
the output transform adds them in run order (no reduction launch).
"""
from __future__ import annotations

import dataclasses
import functools
import math

from ..arguments import ConvProblem, make_problem
from ..planner import LaunchPlan
from ..program import (BIAS, OUT, PREPARED, RESIDUAL, WEIGHT, WORKSPACE, X, CallProgram, Launch, Pointer, WeightPreparation,
                       align)
from . import simt_gemm_conv2d as simt
from .common import INDEX_TYPES, STORAGE_BYTES, epilogue_args, index_type, partial_bytes

KERNEL = "winograd_conv2d"
#: Its config names are those of the GEMM's tiles, which select simt_gemm_conv2d when given alone.
CONFIG_NAMES = frozenset()
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
#: (_gain).
WINOGRAD_MIN_CHANNEL_RATIO = {4: 24, 2: 48}
#: Threads per block of the transforms (kernels/winograd_conv2d.cu: __launch_bounds__(256)); the input
#: transform's blocks each take this many tiles of one phase channel.
WINOGRAD_BLOCK = 256
WINOGRAD_TRANSFORMS = ("winograd_weight_transform", "winograd_input_transform", "winograd_output_transform")
#: The transforms and the GEMM compute in float32: U, V and M hold floats.
_FLOAT = STORAGE_BYTES["float32"]


def winograd_blocks(problem: ConvProblem) -> tuple[int, int]:
    """(bh, bw): blocks of 3 strides that cover the kernel down and across (1 x 1 for 3x3 stride 1 and
    AlexNet's 11x11 stride 4; 2 x 3 for the 5x9 at stride 1)."""
    return (math.ceil(math.ceil(problem.kh / problem.stride[0]) / 3),
            math.ceil(math.ceil(problem.kw / problem.stride[1]) / 3))


def winograd_channels(problem: ConvProblem) -> int:
    """C': the input channels of the stride-1 3x3 problem, one per channel and phase (u, v, p, q): bh x bw
    blocks of 3 strides, sh x sw polyphase components."""
    return problem.c * math.prod(winograd_blocks(problem)) * problem.stride[0] * problem.stride[1]


def _tile(problem: ConvProblem) -> int:
    return 4 if winograd_channels(problem) <= WINOGRAD_4X4_MAX_CHANNELS else 2


def _tiles(problem: ConvProblem, tile: int) -> tuple[int, int]:
    return math.ceil(problem.ho / tile), math.ceil(problem.wo / tile)


@functools.lru_cache(maxsize=4096)
def winograd_gemm_problem(problem: ConvProblem, tile: int, images: int | None = None) -> ConvProblem:
    """The batched GEMM as simt_gemm_conv2d sees it for ``images`` images (default all): one image of
    1 x T pixels (T tiles) with a^2 C' channels, a^2 groups (a = tile + 2), a 1x1 kernel and a^2 K
    outputs. Cached: plans and programs ask for it per pass."""
    tiles = (problem.n if images is None else images) * math.prod(_tiles(problem, tile))
    positions, channels = (tile + 2) ** 2, winograd_channels(problem)
    return make_problem((1, positions * channels, 1, tiles), (positions * problem.k, channels, 1, 1), None,
                        "float32", 1, 0, 1, positions)


def _images(problem: ConvProblem, tile: int) -> int:
    """Images per pass: all, or as many as keep the temporaries (U, and V and M of the pass's tiles)
    within WINOGRAD_MAX_WORKSPACE_BYTES, in passes of equal size but the last (0: not even one)."""
    positions, channels = (tile + 2) ** 2, winograd_channels(problem)
    weight = _FLOAT * positions * channels * math.ceil(problem.k / 4) * 4
    per_image = _FLOAT * positions * (channels + problem.k) * math.prod(_tiles(problem, tile))
    fit = max(0, (WINOGRAD_MAX_WORKSPACE_BYTES - weight) // per_image)
    n = max(problem.n, 1)
    return fit and math.ceil(n / math.ceil(n / fit))


def refusal(problem: ConvProblem, tile: int | None = None) -> str:
    """Why winograd_conv2d (with ``tile``, or the one it would choose) cannot run ``problem`` ("" when it can)."""
    if problem.dtype != "float32":
        return f"it computes in float32 only, got {problem.dtype}"
    if problem.dilation != (1, 1) or problem.groups != 1:
        return f"it needs dilation 1 and one group (got dilation {problem.dilation}, groups {problem.groups})"
    tile = tile or _tile(problem)
    images = _images(problem, tile)
    if not images:
        return f"its temporaries for one image would pass {WINOGRAD_MAX_WORKSPACE_BYTES // 2**20} MiB"
    return simt.refusal(winograd_gemm_problem(problem, tile, images))


def _gain(problem: ConvProblem, tile: int) -> float:
    """Multiplies saved per output and phase channel, relative to a 3x3 stride-1 layer's: strided or
    larger kernels pad their taps to 3 bh sh x 3 bw sw (AlexNet's 121 to 144, the 5x9's 45 to 54),
    saving less per phase channel (below zero where padding outweighs the transform's saving)."""
    transformed = (tile + 2) ** 2 / tile**2
    direct = problem.kh * problem.kw * problem.c / winograd_channels(problem)
    return (direct - transformed) / (9 - transformed)


def pays(problem: ConvProblem) -> bool:
    """Whether the multiplies saved outweigh the transforms' traffic (WINOGRAD_MIN_CHANNEL_RATIO)."""
    channels, tile = winograd_channels(problem), _tile(problem)
    ratio = channels * problem.k / (channels + problem.k) * _gain(problem, tile)
    return ratio >= WINOGRAD_MIN_CHANNEL_RATIO[tile]


def tiles(problem: ConvProblem) -> tuple[int, ...]:
    """The output tiles m a caller weighing plans by their times (the autotuner) may run ``problem``
    with: those that can run it and do fewer multiplies than the direct sum, F(4x4) only up to
    WINOGRAD_4X4_MAX_CHANNELS phase channels (past them it rounds more than the planner allows)."""
    return tuple(tile for tile in WINOGRAD_TILES
                 if (tile == 2 or winograd_channels(problem) <= WINOGRAD_4X4_MAX_CHANNELS)
                 and _gain(problem, tile) > 0 and not refusal(problem, tile))


def make_plan(problem: ConvProblem, config: str | None = None, reason: str = "",
              tile: int | None = None, splits: int | None = None) -> LaunchPlan:
    """Winograd's transforms (one thread per tile and channel) around the batched GEMM's own plan, in
    passes of winograd_images images; ``config`` forces the GEMM's tile, ``tile`` the output tile m
    (2 or 4; None: by channel count), ``splits`` the GEMMs' split-K runs (None: the GEMM's rule)."""
    if tile is not None and tile not in WINOGRAD_TILES:
        raise ValueError(f"tile must be one of {WINOGRAD_TILES}, got {tile!r}")
    tile = tile or _tile(problem)
    why_not = refusal(problem, tile)
    if why_not:
        raise ValueError(f"kernel {KERNEL!r} cannot run this problem: {why_not}")
    images = _images(problem, tile)
    gemm, gemm_last = (simt.make_plan(winograd_gemm_problem(problem, tile, n), config, splits=splits)
                       for n in (images, problem.n % images or images))
    tiles_h, tiles_w = _tiles(problem, tile)
    index = "long long" if "long long" in (index_type(problem), gemm.index_type) else "int"
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
        kernel=KERNEL, dtype=problem.dtype, index_type=index, config=gemm.config,
        grid=gemm.grid, block=gemm.block, shared_bytes=gemm.shared_bytes,
        reason=f"{reason}; {why}" if reason else why,
        tiles_w=tiles_w, tiles=tiles_h * tiles_w, weight_columns=gemm.weight_columns, winograd_tile=tile,
        winograd_images=images, gemm=dataclasses.replace(gemm, index_type=index),
        gemm_last=dataclasses.replace(gemm_last, index_type=index))


def describe(plan: LaunchPlan) -> str:
    """The printed plan: output tiles, the GEMMs' own plan (a pass's) and why."""
    tiles_h, m = plan.tiles // plan.tiles_w, plan.winograd_tile
    gemm = "\n".join("    " + line for line in simt.describe(plan.gemm, "winograd_output_transform").splitlines())
    return (f"{plan.kernel} [F({m}x{m}, 3x3): {tiles_h}x{plan.tiles_w} output tiles of {m}x{m} per image; "
            f"transforms of the weight, the input and the output around {(m + 2) ** 2} GEMMs]\n"
            f"  float32 (IEEE arithmetic, no TF32), {plan.index_type} indices\n"
            f"  the {(m + 2) ** 2} GEMMs, as one grouped 1x1 convolution of {plan.winograd_images} image(s) "
            f"a pass:\n{gemm}\n"
            f"  why: {plan.reason}")


def specialisation(kernel: str, tile: int, index: str, split_k: bool = False) -> str:
    """The C++ template instance of transform ``kernel`` (one of WINOGRAD_TRANSFORMS) for F(tile x tile);
    the output transform's with ``split_k`` adds the GEMM's runs of partial sums. The input transform's
    reads NCHW (its NHWC instance is the weight gradient's: cupyconv/wgrad_winograd.py)."""
    if kernel == "winograd_output_transform":
        return f"cupyconv::{kernel}<{tile},{index},{str(split_k).lower()}>"
    if split_k:
        raise ValueError(f"only winograd_output_transform adds split-K's partial sums, not {kernel}")
    if kernel == "winograd_input_transform":
        return f"cupyconv::{kernel}<{tile},{index},false>"
    return f"cupyconv::{kernel}<{tile},{index}>"


def name_expression(plan: LaunchPlan) -> str:
    """The batched GEMM's specialisation: the plan's config, grid, block and shared memory are the GEMM's
    too (the transforms' are in its program)."""
    return plan.gemm.name_expression


def specialisations() -> list[str]:
    """The transforms for each tile and index width (the GEMM's are simt_gemm_conv2d's)."""
    return [specialisation(kernel, tile, index, split_k) for kernel in WINOGRAD_TRANSFORMS
            for tile in WINOGRAD_TILES for index in INDEX_TYPES
            for split_k in ((False, True) if kernel == "winograd_output_transform" else (False,))]


def _transform(kernel: str, plan: LaunchPlan, blocks: int, *args, split_k: bool = False) -> Launch:
    return Launch(kernel, specialisation(kernel, plan.winograd_tile, plan.index_type, split_k), (blocks, 1, 1),
                  (WINOGRAD_BLOCK, 1, 1), 0, args)


def _blocks(threads: int) -> int:
    return math.ceil(threads / WINOGRAD_BLOCK)


def program(plan: LaunchPlan, problem: ConvProblem) -> CallProgram:
    """The weight transform into U (the prepared weight, of the C' phase channels), then per pass of
    plan.winograd_images images the input transform into V, the GEMMs into M (plan.gemm, or
    plan.gemm_last for a shorter last pass; with split-K, M's runs of partial sums), the output transform
    (adding those runs) into that pass's images of the output. V and M live in the workspace, a pass's
    images are contiguous in x and out."""
    p, m, images = problem, plan.winograd_tile, plan.winograd_images
    positions, tiles_h, tiles_w = (m + 2) ** 2, plan.tiles // plan.tiles_w, plan.tiles_w
    channels, (bh, bw), (sh, sw) = winograd_channels(p), winograd_blocks(p), p.stride
    u = WeightPreparation(
        (KERNEL, p.dtype, p.weight_shape, p.stride, m), _FLOAT * positions * channels * plan.weight_columns,
        (_transform("winograd_weight_transform", plan, _blocks(channels * plan.weight_columns), Pointer(WEIGHT),
                    Pointer(PREPARED), p.c, p.k, plan.weight_columns, p.kh, p.kw, sh, sw, bh, bw),))
    v, y = Pointer(WORKSPACE), Pointer(WORKSPACE, align(_FLOAT * positions * channels * images * plan.tiles))
    image_in, image_out = _FLOAT * p.c * p.h * p.w, _FLOAT * p.k * p.ho * p.wo
    launches, m_bytes = [], _FLOAT * positions * p.k * images * plan.tiles
    for first in range(0, p.n, images):
        count = min(images, p.n - first)
        tiles = count * plan.tiles
        gemm, gemm_problem = plan.gemm if count == images else plan.gemm_last, winograd_gemm_problem(p, m, count)
        m_bytes = max(m_bytes, partial_bytes(gemm.splits, gemm_problem))
        launches += [
            # Each block takes WINOGRAD_BLOCK tiles of one phase channel.
            _transform("winograd_input_transform", plan, channels * _blocks(tiles), Pointer(X, first * image_in), v,
                       count, p.c, p.h, p.w, p.pad_top, p.pad_left, sh, sw, bh, bw, tiles_h, tiles_w),
            # With split-K the output transform adds the runs' partial sums of M (no reduction launch).
            simt.gemm_launch(gemm, gemm_problem, v, Pointer(PREPARED), y),
            _transform("winograd_output_transform", plan, _blocks(p.k * tiles), y, Pointer(BIAS),
                       Pointer(OUT, first * image_out), int(p.has_bias),
                       *epilogue_args(p, Pointer(RESIDUAL, first * image_out)), gemm.splits, count, p.k, p.ho, p.wo,
                       tiles_h, tiles_w, split_k=gemm.splits > 1)]
    # V, then M (with split-K, the GEMM's runs of partial sums of M).
    return CallProgram(tuple(launches), y.offset + m_bytes, u)
