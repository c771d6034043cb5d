"""Depthwise convolution (kernels/depthwise_conv2d.cu): groups == C, any number of outputs per group;
an input patch per output tile in shared memory (a ring of patches per lane), several channels per block."""
from __future__ import annotations

import dataclasses
import math

from ..arguments import ConvProblem
from ..planner import LaunchPlan
from ..program import CallProgram
from .common import (CTYPES, INDEX_TYPES, MAX_GRID_Y, SHARED_MEMORY_BYTES, STORAGE_BYTES, conv_launch, forced_config,
                     index_type)

KERNEL = "depthwise_conv2d"


@dataclasses.dataclass(frozen=True)
class DepthwiseConfig:
    """Output tile th x tw of one channel per lane, rpt consecutive rows of a column per thread (or, one
    row high with rpt > 1, rpt consecutive outputs of the row: row_runs), up to
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

    @property
    def row_runs(self) -> bool:
        """A tile one row high whose threads compute ``rpt`` consecutive outputs of it (kernels/
        depthwise_conv2d.cu ROW_RUNS; run-time taps)."""
        return self.th == 1 and self.rpt > 1

    @property
    def lane_block(self) -> tuple[int, int]:
        """A lane's threads as the block's (x, y): a thread per column of ``rpt`` rows, or per run."""
        return (self.tw // self.rpt, 1) if self.row_runs else (self.tw, self.th // self.rpt)


#: 32 x 32 tiles, and 16 x 16 ones four lanes at a time for outputs at most 16 wide (MobileNet's
#: 14x14 and 7x7 stages): 128 threads a block either way. 8 rows per thread: a 3x3 stride-1 thread
#: reads 10 patch rows for 8 outputs.
#: Outputs one row high (conv1d's height-1 problems) take rows of 1024 outputs, 8 consecutive ones a
#: thread, their inputs rotated through registers (ROW_RUNS): a 32 x 32 tile there computes one row of 32
#: and copies a patch per 32 outputs (H100, conformer_dw_512_k31 fp16 NCHW: 1.75 ms on dw_32x32 against
#: torch's 0.043), rows of 256 outputs a thread each (ROW_CONFIG) 0.138 ms, the runs 0.039 (TF32 0.125
#: -> 0.063; benchmarks/NOTES.md, "Runs along rows"). ROW_CONFIG stays for column strides past 1
#: (wav2vec 2.0's 1 -> 512 layer of stride 5 in float32: 0.175 ms on it, 0.208 in runs) and for patches
#: the runs' rows overflow (large dilations).
ROW_CONFIG = "dw_1x256"
ROW_RUNS_CONFIG = "dw_1x1024_r8"
DEPTHWISE_CONFIGS = (DepthwiseConfig("dw_32x32", 32, 32, 8, 1), DepthwiseConfig("dw_16x16", 16, 16, 8, 4),
                     DepthwiseConfig(ROW_RUNS_CONFIG, 1, 1024, 8, 1), DepthwiseConfig(ROW_CONFIG, 1, 256, 1, 1))
CONFIG_NAMES = frozenset(c.name for c in DEPTHWISE_CONFIGS)
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


def _patch(problem: ConvProblem, cfg: DepthwiseConfig) -> tuple[int, int]:
    """(rows, columns) of the input patch of one output tile."""
    (sh, sw), (dh, dw) = problem.stride, problem.dilation
    return (cfg.th - 1) * sh + (problem.kh - 1) * dh + 1, (cfg.tw - 1) * sw + (problem.kw - 1) * dw + 1


def _layout(problem: ConvProblem, cfg: DepthwiseConfig, channels_per_lane: int | None = None,
            patch_buffers: int | None = None) -> tuple[int, int, int, int, int] | None:
    """(lanes, channels per lane, patch buffers, bytes per copy piece, row pitch in elements): the
    first that fits in shared memory, preferring all lanes, then the deepest ring (up to
    DEPTHWISE_MAX_BUFFERS and the lane's channels; past two buffers within DEPTHWISE_RING_BYTES), then
    the widest pieces; None if even one lane's one patch does not fit.

    A piece must divide the input row (16, 8, 4 bytes; 2 = plain 16-bit loads) so that it lies wholly
    inside the input or the padding; rows start at an aligned column, up to a piece left of the patch.
    """
    item = STORAGE_BYTES[problem.dtype]
    rows, cols = _patch(problem, cfg)
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


def _choose_config(problem: ConvProblem) -> DepthwiseConfig:
    if problem.ho == 1:
        runs = DEPTHWISE_CONFIGS[2]
        return runs if problem.stride[1] == 1 and _layout(problem, runs) else DEPTHWISE_CONFIGS[3]
    return DEPTHWISE_CONFIGS[1] if problem.wo <= 16 else DEPTHWISE_CONFIGS[0]


def refusal(problem: ConvProblem) -> str:
    """Why the depthwise kernel cannot run ``problem`` ("" when it can)."""
    if problem.c // problem.groups != 1:
        return f"{problem.c // problem.groups} input channels per group (needs 1)"
    if problem.k > MAX_GRID_Y or problem.n > MAX_GRID_Y:
        return f"{problem.k} channels or batch {problem.n} past the grid limit {MAX_GRID_Y}"
    cfg = _choose_config(problem)
    if _layout(problem, cfg) is None:
        return f"the input patch of a {cfg.th}x{cfg.tw} tile exceeds {SHARED_MEMORY_BYTES} B (large kernel, stride or dilation)"
    return ""


def make_plan(problem: ConvProblem, config: str | None = None, reason: str = "",
              channels_per_lane: int | None = None, patch_buffers: int | None = None) -> LaunchPlan:
    """Grid (output tiles, channel blocks, N), block (tw, th / rpt, lanes): a block computes one output
    tile of lanes x channels-per-lane channels of one image.

    ``config`` forces a DepthwiseConfig by name, ``channels_per_lane`` the channels each lane computes
    one after another (tests: the pipelined channel loop on small problems), ``patch_buffers`` the ring's
    depth (1 to DEPTHWISE_MAX_BUFFERS; benchmarks/bench_depthwise.py); None lets the shape decide.
    """
    if patch_buffers is not None and not 1 <= patch_buffers <= DEPTHWISE_MAX_BUFFERS:
        raise ValueError(f"patch_buffers must be 1 to {DEPTHWISE_MAX_BUFFERS}, got {patch_buffers!r}")
    cfg = forced_config(DEPTHWISE_CONFIGS, config, f"config for {KERNEL}") if config else _choose_config(problem)
    layout = _layout(problem, cfg, channels_per_lane, patch_buffers)
    rows, cols = _patch(problem, cfg)
    if layout is None:
        raise ValueError(f"kernel {KERNEL!r} cannot run this problem: its {cfg.th}x{cfg.tw} tile's "
                         f"{rows}x{cols} input patch needs {rows * cols * STORAGE_BYTES[problem.dtype]} B of "
                         f"shared memory (> {SHARED_MEMORY_BYTES})")
    lanes, per_lane, buffers, vec, pitch = layout
    taps = (problem.kh, problem.kw, problem.stride[0])
    unrolled = taps in DEPTHWISE_TAPS and problem.dilation[0] == 1 and cfg.th > 1  # the 2-D tiles' columns
    cfg = dataclasses.replace(cfg, taps=taps if unrolled else (0, 0, 0))
    tiles_w = math.ceil(problem.wo / cfg.tw)
    tiles = math.ceil(problem.ho / cfg.th) * tiles_w
    channels = lanes * per_lane
    why = f"config {cfg.name}" + (" (forced by the caller)" if config else f", output {problem.ho}x{problem.wo}")
    why += f", {lanes} lane(s) x {per_lane} channel(s) per block, {buffers} patch buffer(s) per lane"
    return LaunchPlan(
        kernel=KERNEL, dtype=problem.dtype, index_type=index_type(problem), config=cfg,
        grid=(tiles, math.ceil(problem.k / channels), problem.n), block=(*cfg.lane_block, lanes),
        shared_bytes=lanes * buffers * rows * pitch * STORAGE_BYTES[problem.dtype],
        reason=f"{reason}; {why}" if reason else why, tiles_w=tiles_w, tiles=tiles, channels_per_block=channels,
        vec=vec, pitch=pitch, patch_buffers=buffers)


def describe(plan: LaunchPlan) -> str:
    """The printed plan: tile, taps, patch ring, launch shape and why."""
    c = plan.config
    taps = f"{c.taps[0]}x{c.taps[1]} taps at row stride {c.taps[2]} unrolled" if c.taps[0] else "run-time taps"
    per_thread = f"{c.rpt} consecutive outputs of the row" if c.row_runs else f"{c.rpt} rows"
    return (f"{plan.kernel} [{c.name}: {c.th}x{c.tw} px of one channel per lane, {per_thread} per thread, "
            f"{plan.block[2]} lane(s) x {c.threads} threads; {taps}]\n"
            f"  {plan.dtype}, {plan.index_type} indices; a ring of {plan.patch_buffers} input patch(es) per "
            f"lane, rows of {plan.pitch} elements copied in {plan.vec}-byte pieces, {plan.shared_bytes} B "
            f"shared memory\n"
            f"  grid {plan.grid} (tiles, channel blocks, images), block {plan.block}, "
            f"{plan.channels_per_block} channels per block\n"
            f"  why: {plan.reason}")


def specialisation(dtype: str, index: str, cfg: DepthwiseConfig) -> str:
    """The C++ template instance of ``cfg`` (its taps unrolled, or run-time taps where (0, 0, 0))."""
    kh, kw, sh = cfg.taps
    return f"cupyconv::{KERNEL}<{CTYPES[dtype]},{index},{cfg.th},{cfg.tw},{cfg.rpt},{kh},{kw},{sh}>"


def name_expression(plan: LaunchPlan) -> str:
    """The specialisation ``plan`` launches."""
    return specialisation(plan.dtype, plan.index_type, plan.config)


def specialisations() -> list[str]:
    """Every dtype, index width and tile, with each of DEPTHWISE_TAPS unrolled (the 2-D tiles) and with
    run-time taps."""
    return [specialisation(dtype, index, dataclasses.replace(cfg, taps=taps))
            for dtype in CTYPES for index in INDEX_TYPES for cfg in DEPTHWISE_CONFIGS
            for taps in (DEPTHWISE_TAPS if cfg.th > 1 else ()) + ((0, 0, 0),)]


def program(plan: LaunchPlan, problem: ConvProblem) -> CallProgram:
    """One launch on the caller's operands; the kernel also takes its tiles per output row, channels
    per block and patch layout."""
    return CallProgram((conv_launch(plan, problem, plan.tiles_w, plan.channels_per_block, plan.vec, plan.pitch,
                                    plan.patch_buffers),))
