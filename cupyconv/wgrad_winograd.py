"""The weight gradient of 3x3 stride-1 convolutions in strict float32 by Winograd F(m x m, 3x3), m = 4 or 2
(kernels/winograd_conv2d.cu, whose header has the algebra): the input's transform V = B^T d B and the
output gradient's dM = A dY A^T per m x m tile, then per position xi of the (m + 2)^2 a GEMM reducing over
the T tiles, dU[xi] = dM[xi] V[xi]^T, and the filter's gradient G^T dU G. F(4x4) does 4x fewer multiplies
than the direct sum, F(2x2) 2.25x; V and dM are 2.25x (4x) the input and the output gradient and cross
memory twice.

The GEMMs are wgrad.py's FMA GEMM run as the weight gradient of a 1x1 convolution with a^2 groups of one
image of 1 x T pixels (NCHW arrays: V [a^2][C][T] and dM [a^2][K][T]; NHWC: [T][a^2][C] and [T][a^2][K],
so that every transform reads and writes along channels), in runs of the reduction fixed by the problem
alone. The filter gradient's transform adds the runs in run order, so the result is the same bits on
every run, and the GEMM's blocked sums keep the error from growing with the tiles. Batches whose V and
dM would pass half of WINOGRAD_WGRAD_MAX_WORKSPACE_BYTES run in passes of as many images as fit, each pass's
GEMM writing runs of its own.

Rounding (a float32 NumPy emulation on random data, 64-512 channels): F(4x4) 1-4e-6 relative error,
F(2x2) 3-7e-7, the direct sum ~3e-7; strict float32's bound is 1e-5.

This module holds the family's choice and refusal, the plan (WinogradWgradPlan) and its program.
"""
from __future__ import annotations

import dataclasses
import functools
import math

from . import wgrad
from .arguments import ConvProblem, make_problem
from .families.common import INDEX_TYPES
from .program import GRAD_OUTPUT, OUT, WORKSPACE, WORKSPACE_ALIGNMENT, X, CallProgram, Launch, Pointer, align

INPUT_TRANSFORM = "winograd_input_transform"
OUTPUT_GRADIENT_TRANSFORM = "winograd_output_gradient_transform"
WEIGHT_GRADIENT_TRANSFORM = "winograd_weight_gradient_transform"
#: Output tile sizes m the kernels take; F(4x4) by default (fewer multiplies, less traffic), F(2x2) rounds less.
WINOGRAD_WGRAD_TILES = (2, 4)
WINOGRAD_WGRAD_TILE = 4
#: V, dM and the GEMM's runs of partial sums together: larger batches run in passes.
WINOGRAD_WGRAD_MAX_WORKSPACE_BYTES = 2**31
#: Winograd pays where the multiplies saved outweigh V's and dM's traffic: C K / (C + K) at least this
#: (H200: 64 -> 64 channels, 32, ran 1.9x faster than the direct GEMM; as the forward's F(4x4) rule, 24).
WINOGRAD_WGRAD_MIN_CHANNEL_RATIO = 24
#: Threads per block of the transforms (__launch_bounds__(256)); the NCHW input transform's blocks take
#: this many tiles of one channel.
BLOCK = 256
_FLOAT = 4


@dataclasses.dataclass(frozen=True)
class WinogradPasses:
    """Passes of ``images`` images (``count`` of them, the last with ``gemm_last``), whose GEMMs write ``runs``
    runs of partial sums in all; ``workspace_bytes`` hold V and dM (a pass's) and the runs."""

    images: int
    count: int
    gemm: wgrad.WgradPlan
    gemm_last: wgrad.WgradPlan
    runs: int
    workspace_bytes: int


@dataclasses.dataclass(frozen=True)
class WinogradWgradPlan:
    """F(tile x tile, 3x3) in ``passes``."""

    tile: int
    dtype: str
    layout: str
    weight_layout: str
    index_type: str
    passes: WinogradPasses
    reason: str

    def __str__(self) -> str:
        m, passes = self.tile, self.passes
        gemm = "\n".join("    " + line for line in passes.gemm.describe(reduction=False).splitlines())
        return (f"winograd weight gradient [F({m}x{m}, 3x3): transforms of the input and the output gradient, "
                f"{(m + 2) ** 2} GEMMs over the tiles, the filter gradient's transform adding {passes.runs} run(s)]\n"
                f"  float32 (IEEE arithmetic, no TF32), {self.layout} -> {self.weight_layout}, {self.index_type} "
                f"indices, {passes.count} pass(es) of {passes.images} image(s); workspace {passes.workspace_bytes} B\n"
                f"  the GEMMs of a pass:\n{gemm}\n"
                f"  why: {self.reason}")


def _tiles(problem: ConvProblem, tile: int) -> tuple[int, int]:
    return math.ceil(problem.ho / tile), math.ceil(problem.wo / tile)


@functools.lru_cache(maxsize=4096)
def gemm_problem(problem: ConvProblem, tile: int, images: int) -> ConvProblem:
    """The GEMMs of a pass of ``images`` images as wgrad.py sees them: the weight gradient of a 1x1
    convolution with a^2 groups of one image of 1 x T pixels, a^2 C channels and a^2 K outputs, in the
    problem's layout (its gradient [a^2 K][C] is dU, the same memory in either weight layout)."""
    positions, t = (tile + 2) ** 2, images * math.prod(_tiles(problem, tile))
    if problem.layout == "NHWC":
        return make_problem((1, 1, t, positions * problem.c), (positions * problem.k, 1, 1, problem.c), None,
                            "float32", 1, 0, 1, positions, "NHWC", "KHWC")
    return make_problem((1, positions * problem.c, 1, t), (positions * problem.k, problem.c, 1, 1), None,
                        "float32", 1, 0, 1, positions)


def _transformed_bytes(problem: ConvProblem, tile: int, images: int) -> int:
    """V and dM of ``images`` images, each aligned."""
    positions, t = (tile + 2) ** 2, images * math.prod(_tiles(problem, tile))
    return align(_FLOAT * positions * problem.c * t) + align(_FLOAT * positions * problem.k * t)


def _images(problem: ConvProblem, tile: int) -> int:
    """Images per pass: all, or as many as keep V and dM within half of
    WINOGRAD_WGRAD_MAX_WORKSPACE_BYTES (the runs take the rest), in passes of equal size but the last
    (0: not even one image fits)."""
    per_image = _transformed_bytes(problem, tile, 1)
    fit = WINOGRAD_WGRAD_MAX_WORKSPACE_BYTES // 2 // per_image
    n = max(problem.n, 1)
    return fit and math.ceil(n / math.ceil(n / fit))


@functools.lru_cache(maxsize=4096)
def _passes(problem: ConvProblem, tile: int, config: str | None, splits: int | None) -> WinogradPasses | str:
    """The passes and their GEMMs' plans, or why there are none."""
    p = problem
    images = _images(p, tile)
    if not images:
        return f"V and dM of one image would pass {WINOGRAD_WGRAD_MAX_WORKSPACE_BYTES // 2**21} MiB"
    why_not = wgrad.refusal(gemm_problem(p, tile, images))
    if why_not:
        return why_not
    passes = math.ceil(p.n / images)
    gemm, gemm_last = (wgrad.make_wgrad_plan(gemm_problem(p, tile, n), config, splits)
                       for n in (images, p.n - (passes - 1) * images))
    runs = (passes - 1) * gemm.splits + gemm_last.splits
    run_bytes = _FLOAT * (tile + 2) ** 2 * p.k * p.c
    if passes > 1 and run_bytes % WORKSPACE_ALIGNMENT:
        return f"passes need runs of partial sums of whole {WORKSPACE_ALIGNMENT}-byte pieces, got {run_bytes} B"
    workspace = _transformed_bytes(p, tile, images) + runs * run_bytes
    if workspace > WINOGRAD_WGRAD_MAX_WORKSPACE_BYTES:
        return f"V, dM and {runs} runs of partial sums need {workspace} B, past {WINOGRAD_WGRAD_MAX_WORKSPACE_BYTES} B"
    return WinogradPasses(images, passes, gemm, gemm_last, runs, workspace)


def refusal(problem: ConvProblem, tile: int = WINOGRAD_WGRAD_TILE) -> str:
    """Why the Winograd weight gradient cannot run ``problem`` with F(tile x tile) ("" when it can)."""
    p = problem
    if p.dtype != "float32":
        return f"it computes in float32 only, got {p.dtype}"
    if (p.kh, p.kw) != (3, 3) or p.stride != (1, 1) or p.dilation != (1, 1) or p.groups != 1:
        return (f"it takes 3x3 kernels at stride 1, undilated and ungrouped (got {p.kh}x{p.kw}, stride {p.stride}, "
                f"dilation {p.dilation}, groups {p.groups})")
    if p.n == 0:
        return "a batch of 0 has no tiles"
    passes = _passes(p, tile, None, None)
    return passes if isinstance(passes, str) else ""


def pays(problem: ConvProblem) -> bool:
    """Whether the multiplies saved outweigh V's and dM's traffic (WINOGRAD_WGRAD_MIN_CHANNEL_RATIO)."""
    return problem.c * problem.k / (problem.c + problem.k) >= WINOGRAD_WGRAD_MIN_CHANNEL_RATIO


def make_plan(problem: ConvProblem, tile: int | None = None, config: str | None = None,
              splits: int | None = None) -> WinogradWgradPlan:
    """The Winograd weight gradient of ``problem``: ``tile`` forces m (2 or 4; None: 4), ``config`` and
    ``splits`` the GEMMs' tile and runs a pass (None: wgrad.py's rules).

    Raises:
        ValueError: naming why, where the kernels cannot run the problem or the arguments are not valid.
    """
    if tile is not None and tile not in WINOGRAD_WGRAD_TILES:
        raise ValueError(f"tile must be one of {WINOGRAD_WGRAD_TILES}, got {tile!r}")
    tile = tile or WINOGRAD_WGRAD_TILE
    why_not = refusal(problem, tile)
    if why_not:
        raise ValueError(f"the Winograd weight gradient cannot run {problem}: {why_not}")
    p, passes = problem, _passes(problem, tile, config, splits)
    if isinstance(passes, str):  # forced GEMM tiles or runs may need more workspace than the rules'
        raise ValueError(f"the Winograd weight gradient cannot run {p} so: {passes}")
    largest = max(math.prod(p.x_shape), math.prod(p.out_shape), passes.workspace_bytes // _FLOAT)
    index = "int" if largest < 2**31 else "long long"
    why = (f"F({tile}x{tile}, 3x3) for a 3x3 stride-1 layer of C K / (C + K) = {p.c * p.k / (p.c + p.k):.0f} "
           f"(Winograd from {WINOGRAD_WGRAD_MIN_CHANNEL_RATIO}): {(tile + 2) ** 2 / (tile * tile) / 9:.2f}x the "
           f"direct sum's multiplies")
    if passes.count > 1:
        why += f"; {passes.count} passes of {passes.images} image(s) keep V and dM within the workspace cap"
    return WinogradWgradPlan(tile=tile, dtype=p.dtype, layout=p.layout, weight_layout=p.weight_layout,
                             index_type=index, passes=passes, reason=why)


def specialisation(kernel: str, tile: int, index: str, channels_last: bool = False) -> str:
    """The C++ template instance of ``kernel`` (one of the three transforms this path launches)."""
    if kernel == WEIGHT_GRADIENT_TRANSFORM:
        return f"cupyconv::{kernel}<{tile},{index}>"
    return f"cupyconv::{kernel}<{tile},{index},{str(channels_last).lower()}>"


def specialisations() -> list[str]:
    """Every instance a plan can launch that the forward's Winograd does not (its NCHW input transform is
    shared; the GEMM's are wgrad.py's)."""
    return ([specialisation(INPUT_TRANSFORM, tile, index, True) for tile in WINOGRAD_WGRAD_TILES
             for index in INDEX_TYPES]
            + [specialisation(OUTPUT_GRADIENT_TRANSFORM, tile, index, channels_last) for tile in WINOGRAD_WGRAD_TILES
               for index in INDEX_TYPES for channels_last in (False, True)]
            + [specialisation(WEIGHT_GRADIENT_TRANSFORM, tile, index) for tile in WINOGRAD_WGRAD_TILES
               for index in INDEX_TYPES])


def _transform(kernel: str, plan: WinogradWgradPlan, threads: int, *args) -> Launch:
    return Launch(kernel, specialisation(kernel, plan.tile, plan.index_type, plan.layout == "NHWC"),
                  (math.ceil(threads / BLOCK), 1, 1), (BLOCK, 1, 1), 0, args)


def program(plan: WinogradWgradPlan, problem: ConvProblem) -> CallProgram:
    """Per pass of plan.passes.images images: the input's and the output gradient's transforms into V and dM,
    then the GEMMs into that pass's runs of partial sums of dU; last the filter gradient's transform,
    adding every run in order, into OUT. The workspace holds V, dM and the runs; a pass's images are
    contiguous in x and grad_output in either layout."""
    p, m, channels_last, passes = problem, plan.tile, plan.layout == "NHWC", plan.passes
    tiles_h, tiles_w = _tiles(p, m)
    positions = (m + 2) ** 2
    v = Pointer(WORKSPACE)
    dm = Pointer(WORKSPACE, align(_FLOAT * positions * p.c * passes.images * tiles_h * tiles_w))
    runs_offset = _transformed_bytes(p, m, passes.images)
    image_in, image_out = _FLOAT * p.c * p.h * p.w, _FLOAT * p.k * p.ho * p.wo
    launches, written = [], 0
    for first in range(0, p.n, passes.images):
        count = min(passes.images, p.n - first)
        gemm = passes.gemm if count == passes.images else passes.gemm_last
        t = count * tiles_h * tiles_w
        # NCHW: a block per 256 tiles of one channel; NHWC: a thread per (tile, channel), channels fastest.
        input_threads = p.c * math.ceil(t / BLOCK) * BLOCK if not channels_last else p.c * t
        launches += [
            _transform(INPUT_TRANSFORM, plan, input_threads, Pointer(X, first * image_in), v, count, p.c, p.h, p.w,
                       p.pad_top, p.pad_left, 1, 1, 1, 1, tiles_h, tiles_w),
            _transform(OUTPUT_GRADIENT_TRANSFORM, plan, p.k * t, Pointer(GRAD_OUTPUT, first * image_out), dm, count,
                       p.k, p.ho, p.wo, tiles_h, tiles_w),
            wgrad.gemm_launch(gemm, gemm_problem(p, m, count), v, dm, Pointer(WORKSPACE, runs_offset + written))]
        written += gemm.workspace_bytes
    launches.append(_transform(WEIGHT_GRADIENT_TRANSFORM, plan, p.k * p.c, Pointer(WORKSPACE, runs_offset),
                               Pointer(OUT), p.k, p.c, passes.runs, int(p.weight_layout == "KHWC")))
    return CallProgram(tuple(launches), passes.workspace_bytes)
