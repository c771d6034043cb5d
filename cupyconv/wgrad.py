"""The weight gradient of conv2d (torch.nn.grad.conv2d_weight): the FMA implicit GEMM of
kernels/wgrad_gemm.cu and its ordered reduction, deterministic (no atomics: the same bits on every run).

For group g, dW_g[m, j] = sum over l of dy[n, g Kg + m, p, q] x[n, g Cg + c, p sh + r dh - pt, q sw + s dw - pl],
with m < Kg = K / groups, j = (c, r, s) < J = Cg kh kw, l = (n, p, q) < L = N Ho Wo. The reduction over l
is cut into ``splits`` runs of whole l tiles, fixed by the problem alone; each run writes its partial
sums, in the accumulator type, to a workspace [splits][groups][Kg][J], and ``wgrad_reduce`` adds the runs
in run order and writes dW in the weight's layout, rounded once.

This module holds the family's tile table, its choice and refusal, the plan (WgradPlan) and its
program (the launches as data, run by executor.py like the forward's).
"""
from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from .arguments import ConvProblem
from .families.common import CTYPES, INDEX_TYPES, MAX_GRID_Y, STORAGE_BYTES, forced_config
from .program import GRAD_OUTPUT, OUT, WORKSPACE, X, CallProgram, Launch, Pointer

KERNEL = "wgrad_gemm"
REDUCE_KERNEL = "wgrad_reduce"
#: Threads per block of wgrad_reduce.
REDUCE_BLOCK = 256
#: wgrad_reduce cuts the runs into REDUCE_SLICES slices added in parallel (then in slice order) where
#: there are at least REDUCE_SLICED_RUNS runs of fewer than REDUCE_SLICED_ELEMENTS sums (a thread an
#: element would leave the GPU a few long chains of loads: mbv2_dw_3x3_144's 1296 sums of 264 runs took
#: longer than its kernel); otherwise one thread an element adds them in run order (on the H100, slices
#: made r50_l2_3x3_128's 147456 sums of 16 or more runs 7 % slower).
REDUCE_SLICES = 8
REDUCE_SLICED_RUNS = 16
REDUCE_SLICED_ELEMENTS = 65536
#: Bytes of the accumulator type (float32; float64 for float64).
ACC_BYTES = {"float16": 4, "bfloat16": 4, "float32": 4, "float64": 8}
ACC_CTYPES = {"float16": "float", "bfloat16": "float", "float32": "float", "float64": "double"}


@dataclasses.dataclass(frozen=True)
class WgradConfig:
    """Thread-block tile: bm output channels x bj columns (c, r, s), l tiles of bl, ``slices`` groups of
    threads each taking bl / slices of a tile's l (added in order at the end); ``thread_tile`` squared
    outputs a thread (4 or 8: float32 only, in NHWC 4 channels a load). ``speed``: the FMA rate relative to the
    64 x 64 tile that the choice assumes."""

    name: str
    bm: int
    bj: int
    bl: int
    slices: int
    speed: float
    thread_tile: int = 4

    @property
    def threads(self) -> int:
        return (self.bm // self.thread_tile) * (self.bj // self.thread_tile) * self.slices

    def resident_blocks(self, dtype: str) -> int:
        """Blocks an SM holds (kernels/wgrad_gemm.cu's wgrad_min_blocks, for 32-bit indices)."""
        return 2 if self.thread_tile == 4 and ACC_BYTES[dtype] == 4 else 1

    def takes(self, dtype: str) -> bool:
        """Whether the tile has an instance for ``dtype`` (8 x 8 thread tiles: float32 only)."""
        return self.thread_tile == 4 or dtype == "float32"

    def refusal(self, problem: ConvProblem) -> str:
        """Why the tile cannot run ``problem`` ("" when it can): 8 x 8 thread tiles take float32, and in NHWC
        read 4 channels a load, so output and input channels per group in fours."""
        if not self.takes(problem.dtype):
            return (f"{self.name} ({self.thread_tile} x {self.thread_tile} outputs a thread) takes float32 only, "
                    f"got {problem.dtype}")
        kg, cg = problem.k // problem.groups, problem.c // problem.groups
        if self.thread_tile == 8 and problem.layout == "NHWC" and (kg % 4 or cg % 4):
            return (f"{self.name} reads NHWC 4 channels a load: channels per group must be multiples of 4, got "
                    f"{kg} output and {cg} input channels")
        return ""


#: The tiles, 256 threads each. 128 x 128 (8 x 8 outputs a thread, one block an SM) runs 1.1-1.4x faster
#: than 64 x 64 where both fill their tiles (H200 sweep of the layers suite, profile/wgrad_fma_tiles.py;
#: 128 x 128 with l tiles of 8, 128 x 64 and 64 x 128 of 128 threads lost to it everywhere). The other
#: speeds are estimates from the loads per FMA: 16 x 64 and 64 x 16 where one side is small (Kg or J <=
#: 32); 16 x 16 for depthwise and other tiny GEMMs (Kg = 1, J = 9: 28 x less waste).
WGRAD_CONFIGS = (
    WgradConfig("wgrad_m128j128", 128, 128, 16, 1, 1.4, 8),
    WgradConfig("wgrad_m64j64", 64, 64, 16, 1, 1.0),
    WgradConfig("wgrad_m16j64", 16, 64, 32, 4, 0.6),
    WgradConfig("wgrad_m64j16", 64, 16, 32, 4, 0.6),
    WgradConfig("wgrad_m16j16", 16, 16, 64, 16, 0.35),
)
CONFIG_NAMES = frozenset(c.name for c in WGRAD_CONFIGS)

#: SMs of an H100: the runs' timing model counts waves of WAVE_BLOCKS SMs (the rule is fixed, not the
#: device's, so that the result's bits depend on the problem alone).
WAVE_BLOCKS = 132
#: The runs' timing model (_run_time), in iterations of a 128 x 128 x 16 tile at one block an SM: a
#: block's fixed cost (its setup and the write of its partial sums), and the reduction's per run and
#: million partial sums. Fitted to an H200 sweep of 144 (layer, tile) pairs at 3-4 run counts each
#: (profile/wgrad_fma_tiles.py; the direct GEMM and Winograd's; profile/wgrad_fma_fit.py): the model's pick
#: is 0.2 % slower than the fastest measured on average, at most 9 %.
BLOCK_FIXED_ITERATIONS = 1.0
REDUCE_ITERATIONS_PER_MILLION = 4.0
#: Each run of the reduction covers at least this many l (a chunk of the kernel's blocked sum). 512 had
#: left short reductions too few blocks (mbv2_pw_1x1_96to576's 6272 l: 60 blocks of 128 x 128).
MIN_RUN_L = 256
#: At most this many runs (the reduction adds them one after another).
MAX_SPLITS = 1024
#: Workspace cap for splits > 1 (one run, the size of the weight in the accumulator type, is always allowed).
MAX_WORKSPACE_BYTES = 2**28
#: Planes, windows and the sentinel row of kernels/wgrad_gemm.cu (WGRAD_NO_ROW = -2^30) stay in int.
MAX_PLANE_EXTENT = 2**29


@dataclasses.dataclass(frozen=True)
class WgradPlan:
    """The launches of one weight gradient: the GEMM (``gemm_expression`` on ``grid`` x ``block``) into a
    workspace of ``workspace_bytes`` ([splits][K][J] in the accumulator type), then ``reduce_expression``
    on ``reduce_grid`` (with reduce_shape's block) into the weight. ``reason`` says why this config and splits."""

    config: WgradConfig
    dtype: str
    layout: str
    weight_layout: str
    index_type: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    splits: int
    workspace_bytes: int
    gemm_expression: str
    reduce_expression: str
    reduce_grid: tuple[int, int, int]
    reason: str

    def __str__(self) -> str:
        return self.describe(reduction=True)

    def describe(self, reduction: bool) -> str:
        """The printed plan; without its reduction where another launch adds the runs (Winograd's)."""
        c = self.config
        return (f"{KERNEL} [{c.name}: {c.bm} out channels x {c.bj} (c, r, s) columns, l tiles of {c.bl}, "
                f"{c.slices} slice(s), {c.threads} threads of {c.thread_tile} x {c.thread_tile}]\n"
                f"  {self.dtype} ({ACC_CTYPES[self.dtype]} accumulators), {self.layout} -> {self.weight_layout}, "
                f"{self.index_type} indices\n"
                f"  grid {self.grid} ((j tiles x m tiles x groups), runs), block {self.block}; "
                f"workspace {self.workspace_bytes} B\n"
                f"  {self.gemm_expression}\n" +
                (f"  {self.reduce_expression} grid {self.reduce_grid}\n" if reduction else "") +
                f"  why: {self.reason}")


def _gemm_sizes(problem: ConvProblem) -> tuple[int, int, int]:
    """(Kg, J, L): the GEMM's rows, columns and reduction length per group."""
    p = problem
    return p.k // p.groups, p.c // p.groups * p.kh * p.kw, p.n * p.ho * p.wo


def _tiles(problem: ConvProblem, cfg: WgradConfig) -> int:
    """Output tiles over all groups: the grid's x."""
    kg, j, _ = _gemm_sizes(problem)
    return math.ceil(j / cfg.bj) * math.ceil(kg / cfg.bm) * problem.groups


def _choose_config(problem: ConvProblem) -> tuple[WgradConfig, str]:
    """The tile of least padded area per unit of speed (the first on ties: the larger tile)."""
    kg, j, _ = _gemm_sizes(problem)

    def cost(cfg: WgradConfig) -> float:
        return math.ceil(kg / cfg.bm) * cfg.bm * math.ceil(j / cfg.bj) * cfg.bj / cfg.speed

    candidates = [c for c in WGRAD_CONFIGS if not c.refusal(problem)]
    cfg = min(candidates, key=cost)
    others = ", ".join(f"{c.name} {cost(c):.0f}" for c in candidates if c is not cfg)
    return cfg, (f"Kg={kg} x J={j} per group: {cfg.name} wastes least (padded area / estimated speed "
                 f"{cost(cfg):.0f}, against {others})")


def refusal(problem: ConvProblem) -> str:
    """Why the wgrad kernels cannot run ``problem`` ("" when they can)."""
    p = problem
    j = _gemm_sizes(p)[1]
    if p.dtype not in CTYPES:
        return f"dtype {p.dtype!r} is not one of {sorted(CTYPES)}"
    extent = max(p.h + p.pad_top + p.pad_bottom + p.dilation[0] * p.kh,
                 p.w + p.pad_left + p.pad_right + p.dilation[1] * p.kw,
                 p.ho * p.stride[0], p.wo * p.stride[1])
    if extent >= MAX_PLANE_EXTENT:
        return f"input or window extent {extent} past the kernel's int geometry ({MAX_PLANE_EXTENT})"
    if p.h * p.w >= 2**31 or p.ho * p.wo >= 2**31:
        return f"planes of {p.h}x{p.w} (input) or {p.ho}x{p.wo} (output) past 32-bit plane offsets"
    if p.k * j >= 2**31:
        return f"a weight of {p.k * j} elements past wgrad_reduce's 32-bit element index"
    return ""


def _run_time(problem: ConvProblem, cfg: WgradConfig, splits: int) -> float:
    """The time of ``splits`` runs in the model's units: whole waves of the resident blocks, each the
    blocks' iterations over their run's l tiles plus a fixed cost, and the reduction reading every run."""
    _, j, length = _gemm_sizes(problem)
    slots = WAVE_BLOCKS * cfg.resident_blocks(problem.dtype)
    iteration = cfg.bm * cfg.bj * cfg.bl / (128 * 128 * 16) * cfg.resident_blocks(problem.dtype)
    waves = math.ceil(_tiles(problem, cfg) * splits / slots)
    runs_l_tiles = math.ceil(math.ceil(length / cfg.bl) / splits)
    return (waves * (runs_l_tiles * iteration + BLOCK_FIXED_ITERATIONS)
            + REDUCE_ITERATIONS_PER_MILLION * splits * problem.k * j / 1e6)


def _auto_splits(problem: ConvProblem, cfg: WgradConfig) -> tuple[int, str]:
    """Runs of the reduction, from the problem alone: the count _run_time models fastest, each run at least
    MIN_RUN_L of l, at most MAX_SPLITS runs, the workspace within MAX_WORKSPACE_BYTES and the grid's y
    within CUDA's limit."""
    _, j, length = _gemm_sizes(problem)
    l_tiles = math.ceil(length / cfg.bl)
    by_length = l_tiles // math.ceil(MIN_RUN_L / cfg.bl)
    by_workspace = MAX_WORKSPACE_BYTES // (problem.k * j * ACC_BYTES[problem.dtype])
    most = max(1, min(by_length, by_workspace, MAX_SPLITS, MAX_GRID_Y))
    splits = min(range(1, most + 1), key=lambda s: _run_time(problem, cfg, s))
    return splits, (f"{splits} run(s) of the {length} l, the fastest of 1-{most} in the runs' timing model "
                    f"({_tiles(problem, cfg)} tiles, {cfg.resident_blocks(problem.dtype)} block(s) an SM; runs of "
                    f">= {MIN_RUN_L} l allow {by_length}, the workspace cap {by_workspace})")


def _check_splits(splits, problem: ConvProblem) -> None:
    """ValueError unless a caller's forced ``splits`` is an int from 1 to CUDA's grid y limit with the
    workspace within MAX_WORKSPACE_BYTES (splits 1 always fits)."""
    if isinstance(splits, bool) or not isinstance(splits, (int, np.integer)) or not 1 <= splits <= MAX_GRID_Y:
        raise ValueError(f"splits must be an int from 1 to {MAX_GRID_Y} (CUDA's grid y limit), got {splits!r}")
    nbytes = _workspace_bytes(problem, int(splits))
    if splits > 1 and nbytes > MAX_WORKSPACE_BYTES:
        raise ValueError(f"splits={splits} needs a workspace of {nbytes} B, past the cap of {MAX_WORKSPACE_BYTES} B "
                         f"(weight {problem.weight_shape} in {ACC_CTYPES[problem.dtype]})")


def _workspace_bytes(problem: ConvProblem, splits: int) -> int:
    """Bytes of ``splits`` runs' partial sums, [splits][K][J] in the accumulator type."""
    return splits * problem.k * _gemm_sizes(problem)[1] * ACC_BYTES[problem.dtype]


def gemm_specialisation(dtype: str, channels_last: bool, index: str, cfg: WgradConfig) -> str:
    """The C++ template instance of the GEMM for ``dtype``, x and dy NHWC where ``channels_last``."""
    return (f"cupyconv::{KERNEL}<{CTYPES[dtype]},{'true' if channels_last else 'false'},{index},"
            f"{cfg.bm},{cfg.bj},{cfg.bl},{cfg.slices},{cfg.thread_tile}>")


def reduce_specialisation(dtype: str) -> str:
    """The C++ template instance of the runs' reduction writing ``dtype``."""
    return f"cupyconv::{REDUCE_KERNEL}<{CTYPES[dtype]},{ACC_CTYPES[dtype]}>"


# typed: splits=True or 2.0 must reach the checks, not the plan cached for 1 or 2.
@functools.lru_cache(maxsize=None, typed=True)
def make_wgrad_plan(problem: ConvProblem, config: str | None = None, splits: int | None = None) -> WgradPlan:
    """The launch plan of the weight gradient of ``problem``.

    Args:
        problem: the forward convolution (cupyconv.arguments.make_problem); its layout says how x and
            grad_output are held (NCHW or NHWC), its weight_layout how the gradient is written (KCHW or KHWC).
            The epilogue fields (bias, activation, residual) play no part.
        config: a name from WGRAD_CONFIGS to force the tile (tests); None chooses by shape.
        splits: the runs of the reduction to force (tests); None chooses from the problem (_auto_splits).

    Raises:
        ValueError: naming why, for a problem the kernels cannot run, an unknown config, or splits that
            are not an int in range or whose workspace passes MAX_WORKSPACE_BYTES.
    """
    why_not = refusal(problem)
    if why_not:
        raise ValueError(f"{KERNEL} cannot run {problem}: {why_not}")
    if config is not None:
        cfg, why = forced_config(WGRAD_CONFIGS, config, f"config for {KERNEL}"), "config forced by the caller"
        if cfg.refusal(problem):
            raise ValueError(f"config {config!r} cannot run {problem}: {cfg.refusal(problem)}")
    else:
        cfg, why = _choose_config(problem)
    if splits is None:
        splits, why_splits = _auto_splits(problem, cfg)
    else:
        _check_splits(splits, problem)
        splits, why_splits = int(splits), f"splits forced by the caller: {splits}"
    grid = (_tiles(problem, cfg), splits, 1)
    if grid[0] >= 2**31:
        raise ValueError(f"{KERNEL} grid {grid} past CUDA's limits for weight {problem.weight_shape} with "
                         f"groups={problem.groups}")
    j = _gemm_sizes(problem)[1]
    workspace = _workspace_bytes(problem, splits)
    largest = max(math.prod(problem.x_shape), math.prod(problem.out_shape), workspace // ACC_BYTES[problem.dtype])
    index = "int" if largest < 2**31 else "long long"
    channels_last = problem.layout == "NHWC"
    return WgradPlan(
        config=cfg, dtype=problem.dtype, layout=problem.layout, weight_layout=problem.weight_layout,
        index_type=index, grid=grid, block=(cfg.threads, 1, 1), splits=splits, workspace_bytes=workspace,
        gemm_expression=gemm_specialisation(problem.dtype, channels_last, index, cfg),
        reduce_expression=reduce_specialisation(problem.dtype),
        reduce_grid=reduce_shape(problem.k * j, splits)[0], reason=f"{why}; {why_splits}")


def wgrad_specialisations() -> list[str]:
    """Every name expression a plan can use: the GEMM for each dtype, layout, index width and tile, and
    the reduction for each dtype."""
    return [gemm_specialisation(dtype, channels_last, index, cfg) for dtype in CTYPES for channels_last in (False, True)
            for index in INDEX_TYPES for cfg in WGRAD_CONFIGS if cfg.takes(dtype)] + \
        [reduce_specialisation(dtype) for dtype in CTYPES]


def reduce_launch(dtype: str, splits: int, elements: int, cg: int, taps: int, ws_channels_last: bool,
                  weight_khwc: bool, partial: Pointer, out: Pointer, ws_cg: int | None = None,
                  ws_elements: int | None = None) -> Launch:
    """wgrad_reduce adding ``splits`` runs of partial sums at ``partial`` into the ``elements`` of the
    weight gradient at ``out`` (Cg = ``cg`` channels and ``taps`` taps a row; KHWC where
    ``weight_khwc``). A run holds ``ws_elements`` sums (default: ``elements``), (r, s, c)-ordered
    where ``ws_channels_last``, with ``ws_cg`` channels a tap (default: ``cg``; more: zero
    channels the reduction skips, as it skips rows past the weight's)."""
    grid, block = reduce_shape(elements, splits)
    return Launch(REDUCE_KERNEL, reduce_specialisation(dtype), grid, block, 0,
                  (partial, out, splits, elements, cg, taps, int(ws_channels_last), int(weight_khwc), ws_cg or cg,
                   ws_elements or elements))


def reduce_shape(elements: int, splits: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """wgrad_reduce's grid and block for ``elements`` sums of ``splits`` runs: (256 / slices, slices)
    threads a block, slices as REDUCE_SLICES, REDUCE_SLICED_RUNS and REDUCE_SLICED_ELEMENTS say."""
    slices = REDUCE_SLICES if splits >= REDUCE_SLICED_RUNS and elements < REDUCE_SLICED_ELEMENTS else 1
    width = REDUCE_BLOCK // slices
    return (math.ceil(elements / width), 1, 1), (width, slices, 1)


def gemm_launch(plan: WgradPlan, problem: ConvProblem, x: Pointer, dy: Pointer, partial: Pointer) -> Launch:
    """The GEMM of ``plan`` reading ``problem``'s x and dy at ``x`` and ``dy``, writing its runs' partial
    sums at ``partial`` (plan.workspace_bytes of them)."""
    p = problem
    return Launch(KERNEL, plan.gemm_expression, plan.grid, plan.block, 0, (
        x, dy, partial, p.n, p.c, p.h, p.w, p.k, p.ho, p.wo, p.kh, p.kw, p.stride[0],
        p.stride[1], p.pad_top, p.pad_left, p.dilation[0], p.dilation[1], p.groups, plan.splits))


def program(plan: WgradPlan, problem: ConvProblem) -> CallProgram:
    """The GEMM from X and GRAD_OUTPUT into the runs' partial sums (the workspace), and their
    reduction into OUT."""
    p = problem
    partial = Pointer(WORKSPACE)
    gemm = gemm_launch(plan, p, Pointer(X), Pointer(GRAD_OUTPUT), partial)
    reduce = reduce_launch(p.dtype, plan.splits, p.k * _gemm_sizes(p)[1], p.c // p.groups, p.kh * p.kw,
                           p.layout == "NHWC", p.weight_layout == "KHWC", partial, Pointer(OUT))
    return CallProgram((gemm, reduce), plan.workspace_bytes)


def _check_array(name: str, array, shape: tuple[int, ...], itemsize: int) -> None:
    if tuple(array.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(array.shape)}")
    if array.dtype.itemsize != itemsize:
        raise TypeError(f"{name} must have {itemsize}-byte elements, got dtype {array.dtype}")
    if not array.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous, got strides {array.strides} for shape {tuple(array.shape)}")


def conv2d_weight_cupy(x, grad_output, problem: ConvProblem, out, plan: WgradPlan | None = None):
    """The gradient of conv2d with respect to its weight, as torch.nn.grad.conv2d_weight, into ``out``.

    Runs on CuPy's current device and stream; the workspace is the one launch.py keeps per stream
    (from CuPy's pool).

    Args:
        x: the forward input, a C-contiguous CuPy array of shape problem.x_array_shape ((N, C, H, W), or
            (N, H, W, C) where problem.layout is 'NHWC') and problem.dtype (16-bit types may come as any
            2-byte dtype view, e.g. bfloat16 as int16).
        grad_output: the gradient of the forward output, C-contiguous, shape problem.out_array_shape, same
            element size.
        problem: the forward convolution (cupyconv.arguments.make_problem).
        out: the weight gradient, C-contiguous, shape problem.weight_array_shape ((K, C/groups, kh, kw), or
            (K, kh, kw, C/groups) where problem.weight_layout is 'KHWC'); written entirely (zeros for N = 0).
        plan: a WgradPlan from make_wgrad_plan(problem, ...); None plans with the defaults.

    Returns:
        ``out``.
    """
    import cupy

    from .executor import program_executable
    from .launch import run_program

    itemsize = STORAGE_BYTES[problem.dtype]
    _check_array("x", x, problem.x_array_shape, itemsize)
    _check_array("grad_output", grad_output, problem.out_array_shape, itemsize)
    _check_array("out", out, problem.weight_array_shape, itemsize)
    if plan is None:
        plan = make_wgrad_plan(problem)
    elif (plan.dtype, plan.layout, plan.weight_layout) != (problem.dtype, problem.layout, problem.weight_layout):
        raise ValueError(f"plan is for {plan.dtype} {plan.layout} -> {plan.weight_layout}, the problem is "
                         f"{problem.dtype} {problem.layout} -> {problem.weight_layout}")
    run_program(program_executable(program, plan, problem, cupy.cuda.Device().id), x=x, grad_output=grad_output,
                out=out)
    return out
