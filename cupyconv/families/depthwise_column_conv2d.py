"""Depthwise convolution of small planes (kernels/depthwise_column_conv2d.cu): a thread per output
column segment (or pair of columns, loaded as pairs of elements) reading its input rows through L1, no
shared memory and no barriers."""
from __future__ import annotations

import dataclasses
import math

from ..arguments import ConvProblem
from ..planner import LaunchPlan
from ..program import CallProgram
from .common import (CTYPES, INDEX_TYPES, MAX_BLOCK_THREADS, MAX_GRID_Y, PAIR_DTYPES, conv_launch, forced_config,
                     index_type)
from .depthwise_conv2d import DEPTHWISE_TAPS

KERNEL = "depthwise_column_conv2d"


@dataclasses.dataclass(frozen=True)
class ColumnConfig:
    """rpt consecutive output rows of one column per thread; ``taps`` as DepthwiseConfig's (one of
    DEPTHWISE_TAPS: the kernel has unrolled instances only); ``pair_odd`` -1, or where a thread takes two
    columns loaded as pairs, the left padding's parity."""

    name: str
    rpt: int
    taps: tuple[int, int, int] = (0, 0, 0)
    pair_odd: int = -1


#: Rows per thread: 7 divides MobileNet's and ResNet's 7 x 2^n planes, 4 and 8 the rest. The plan
#: takes the one that computes the fewest rows past Ho, the longest on a tie (fewer rows read twice) --
#: but the shortest for row stride 2 where that one's grid has fewer than SHORT_ROWS_MAX_BLOCKS blocks (four waves): a
#: strided thread reads twice the rows an output row, and a small grid waits on its longest threads. H200,
#: MobileNetV2's depthwise layers at batch 1, NCHW, GPU time behind a spin (results/
#: candidates_depthwise_mobilenet_v2_b1_nchw_h200.txt), us, col_r4 against the longest rows': fp16 96 s2 on
#: 112^2 (168 blocks) 5.2 against 5.6, 144 s2 on 56^2 4.9 against 5.8, 192 s2 on 28^2 4.8 against 5.8, 576 s2
#: on 14^2 5.1 against 6.2; TF32 5.7/6.0, 5.3/5.4, 5.2/5.3, 5.0/5.1. At stride 1 it was within 0.1 us either way.
#: At batch 8, fp16 (candidates_dw_s2_b8_h200.txt): 144 s2 on 56^2 (512 blocks) 6.6 against 7.2, 192 s2 on 28^2 5.6
#: against 6.5; 96 s2 on 112^2 (1344 blocks) 10.0 against 9.5: the longest rows there.
COLUMN_CONFIGS = (ColumnConfig("col_r4", 4), ColumnConfig("col_r7", 7), ColumnConfig("col_r8", 8))
SHORT_ROWS_MAX_BLOCKS = 528
CONFIG_NAMES = frozenset(c.name for c in COLUMN_CONFIGS)
#: Threads per block at most (whole output rows of as many channels as fit): the kernel shares nothing
#: between threads, so this only sets the scheduling grain (H100: 64 to 256 within 4 % at 7 rows a thread).
COLUMN_BLOCK = 128
#: Widest output the planner gives the column kernel (past it, depthwise_conv2d's tiles), and where its
#: threads take pairs of columns (column_pairs): pairs beat the tiles on every NCHW plane timed, outputs 28
#: to 224 wide, 3x3 to 7x7, strides 1 and 2 (H200: fp16 1.3-2.2x, float32 1.1-1.5x; benchmarks/NOTES.md).
COLUMN_MAX_WIDTH = 16
COLUMN_PAIRS_MAX_WIDTH = 224


def refusal(problem: ConvProblem) -> str:
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


def column_pairs(problem: ConvProblem) -> bool:
    """Whether a thread can take two output columns, loading pairs: a PAIR_DTYPES element, rows and output
    rows of even lengths (pairs aligned), the column stride the row stride (compiled) and no column
    dilation; the kernel's taps unrolled (refusal "")."""
    p = problem
    return (p.dtype in PAIR_DTYPES and p.w % 2 == 0 and p.wo % 2 == 0 and p.stride[1] == p.stride[0] and
            p.dilation[1] == 1 and not refusal(p))


def _choose_config(problem: ConvProblem, pairs: bool, block: int | None) -> tuple[ColumnConfig, str]:
    """The rules' rows per thread (COLUMN_CONFIGS above) for the blocks ``pairs`` and ``block`` make, and why."""
    fitting = min(COLUMN_CONFIGS, key=lambda c: (math.ceil(problem.ho / c.rpt) * c.rpt, -c.rpt))
    why = f"config {fitting.name}, output {problem.ho} rows"
    blocks = math.prod(_grid(problem, fitting, pairs, block))
    shortest = min(COLUMN_CONFIGS, key=lambda c: c.rpt)
    if problem.stride[0] == 2 and blocks < SHORT_ROWS_MAX_BLOCKS and fitting != shortest:
        return shortest, (f"config {shortest.name}: row stride 2 and {blocks} blocks of {fitting.name} (< "
                          f"{SHORT_ROWS_MAX_BLOCKS}), the shortest rows")
    return fitting, why


def _block(problem: ConvProblem, pairs: bool, block: int | None = None) -> tuple[int, int, int]:
    """A block: whole output rows (of pairs of columns where ``pairs``) of as many channels as fit in ``block``
    threads (COLUMN_BLOCK)."""
    threads = problem.wo // 2 if pairs else problem.wo
    return threads, max(1, min(problem.k, (block or COLUMN_BLOCK) // threads)), 1


def _grid(problem: ConvProblem, cfg: ColumnConfig, pairs: bool, block: int | None = None) -> tuple[int, int, int]:
    """(channel groups, row segments of cfg.rpt rows, images)."""
    return (math.ceil(problem.k / _block(problem, pairs, block)[1]), math.ceil(problem.ho / cfg.rpt), problem.n)


def make_plan(problem: ConvProblem, config: str | None = None, reason: str = "",
              rows_per_thread: int | None = None, block: int | None = None, pairs: bool | None = None) -> LaunchPlan:
    """Grid (ceil(K / P), row segments, N), block (Wo, P): a thread computes rpt rows of one output
    column of one channel of one image, a block whole rows of P channels, as many as fit in
    COLUMN_BLOCK threads. ``config`` forces a ColumnConfig by name; ``rows_per_thread`` and ``block``
    (threads at most) force other values (benchmarks/bench_depthwise.py sweeps them), ``pairs`` (default:
    column_pairs) a thread's two columns loaded as pairs."""
    why_not = refusal(problem)
    if why_not:
        raise ValueError(f"kernel {KERNEL!r} cannot run this problem: {why_not}")
    if pairs and not column_pairs(problem):
        raise ValueError(f"pairs of output columns need {'/'.join(PAIR_DTYPES)}, rows of even lengths and the "
                         f"column stride the row stride; got {problem.dtype} {problem.x_shape} -> {problem.out_shape}, "
                         f"stride {problem.stride}, dilation {problem.dilation}")
    pairs = column_pairs(problem) if pairs is None else pairs
    if rows_per_thread is not None or config:
        cfg = ColumnConfig(f"col_r{rows_per_thread}", rows_per_thread) if rows_per_thread is not None else \
            forced_config(COLUMN_CONFIGS, config, f"config for {KERNEL}")
        why = f"config {cfg.name} (forced by the caller)"
    else:
        cfg, why = _choose_config(problem, pairs, block)
    cfg = dataclasses.replace(cfg, taps=(problem.kh, problem.kw, problem.stride[0]),
                              pair_odd=problem.pad_left % 2 if pairs else -1)
    return LaunchPlan(kernel=KERNEL, dtype=problem.dtype, index_type=index_type(problem), config=cfg,
                      grid=_grid(problem, cfg, pairs, block), block=_block(problem, pairs, block), shared_bytes=0,
                      reason=f"{reason}; {why}" if reason else why)


def describe(plan: LaunchPlan) -> str:
    """The printed plan: rows per thread, taps, launch shape and why."""
    c = plan.config
    columns = "two output columns, loaded as pairs," if c.pair_odd >= 0 else "one output column"
    return (f"{plan.kernel} [{c.name}: {c.rpt} rows of {columns} per thread, {c.taps[0]}x{c.taps[1]} taps "
            f"at row stride {c.taps[2]} unrolled]\n"
            f"  {plan.dtype}, {plan.index_type} indices; {plan.block[1]} channel(s) per block, no shared memory\n"
            f"  grid {plan.grid} (channel blocks, row segments, images), block {plan.block}\n"
            f"  why: {plan.reason}")


def specialisation(dtype: str, index: str, cfg: ColumnConfig) -> str:
    """The C++ template instance of ``cfg`` with its taps unrolled."""
    kh, kw, sh = cfg.taps
    return f"cupyconv::{KERNEL}<{CTYPES[dtype]},{index},{cfg.rpt},{kh},{kw},{sh},{cfg.pair_odd}>"


def name_expression(plan: LaunchPlan) -> str:
    """The specialisation ``plan`` launches."""
    return specialisation(plan.dtype, plan.index_type, plan.config)


def specialisations() -> list[str]:
    """Every dtype, index width and rows per thread, with each of DEPTHWISE_TAPS unrolled; PAIR_DTYPES also
    with pairs of columns, for either parity of the left padding."""
    return [specialisation(dtype, index, dataclasses.replace(cfg, taps=taps, pair_odd=odd))
            for dtype in CTYPES for index in INDEX_TYPES for cfg in COLUMN_CONFIGS for taps in DEPTHWISE_TAPS
            for odd in ((-1, 0, 1) if dtype in PAIR_DTYPES else (-1,))]


def program(plan: LaunchPlan, problem: ConvProblem) -> CallProgram:
    """One launch on the caller's operands (the kernel derives its tiling from the problem and the grid)."""
    return CallProgram((conv_launch(plan, problem),))
