"""1x1 convolutions of one-pixel planes (kernels/one_pixel_conv2d.cu): (N, C, 1, 1) -> (N, K, 1, 1), a
matrix-vector product per image, one warp an output channel, in one launch. Every dtype; NCHW and NHWC,
KCHW and KHWC alike (the same memory for such planes and kernels).

Squeeze-and-excitation's layers after their pooling are such layers (EfficientNet-B0's 1152 -> 48 and
48 -> 1152). The GEMM families run them as one pixel tile, mostly padding, and the long reductions as
split-K with a second launch that adds the runs; in a model at batch 1 each launch is a step of the
chain (benchmarks/NOTES.md, "Squeeze-and-excitation layers in one launch")."""
from __future__ import annotations

import dataclasses
import math

from ..arguments import ConvProblem
from ..planner import LaunchPlan
from ..program import CallProgram
from .common import CTYPES, MAX_GRID_Y, STORAGE_BYTES, conv_launch, forced_config

KERNEL = "one_pixel_conv2d"
LAYOUTS = ("NCHW", "NHWC")
WEIGHT_LAYOUTS = ("KCHW", "KHWC")
DTYPES = tuple(CTYPES)
#: Output channels per block: one a warp (ONE_PIXEL_WARPS in the kernel).
WARPS = 4
#: Images the planner gives this kernel at most: a warp multiplies its weight row by IMAGES images at once
#: and a batch of more reads the row again per IMAGES (from L2), where a GEMM tile reads it once for
#: its pixels.
MAX_IMAGES = 32
#: Bytes of a vector piece: a lane's loads where the channels are whole pieces (else single elements).
PIECE_BYTES = 16


@dataclasses.dataclass(frozen=True)
class OnePixelConfig:
    """A warp's images: it multiplies its output channel's weight row by ``images`` images' x at once."""

    name: str
    images: int


CONFIGS = tuple(OnePixelConfig(f"one_pixel_n{images}", images) for images in (1, 2, 4, 8))
CONFIG_NAMES = frozenset(c.name for c in CONFIGS)


def refusal(problem: ConvProblem) -> str:
    """Why this kernel cannot run ``problem`` ("" when it can): not a 1x1 kernel on one-pixel planes
    without padding, more than one group, or offsets past 32 bits."""
    p = problem
    if (p.h, p.w, p.kh, p.kw, p.pad_top, p.pad_bottom, p.pad_left, p.pad_right) != (1, 1, 1, 1, 0, 0, 0, 0):
        return (f"it runs 1x1 kernels on unpadded one-pixel planes; got a {p.h}x{p.w} input, a {p.kh}x{p.kw} "
                f"kernel, padding {(p.pad_top, p.pad_bottom, p.pad_left, p.pad_right)}")
    if p.groups != 1:
        return f"it runs one group, not {p.groups}"
    if max(p.n * p.c, p.k * p.c, p.n * p.k) >= 2**31:
        return f"x {p.x_shape}, the weight {p.weight_shape} or the output {p.out_shape} past 2^31 elements"
    return ""


def pays(problem: ConvProblem) -> bool:
    """Whether the planner takes it for ``problem`` (one it can run): batches of at most MAX_IMAGES."""
    return problem.n <= MAX_IMAGES


def load_bytes(problem: ConvProblem) -> int:
    """Bytes of a lane's loads: a 16-byte piece where C is whole pieces (rows then start on 16 bytes:
    the fronts align the operands), else one element."""
    item = STORAGE_BYTES[problem.dtype]
    return PIECE_BYTES if problem.c * item % PIECE_BYTES == 0 else item


def _config(problem: ConvProblem) -> OnePixelConfig:
    """The fewest images a warp that cover the batch, at most the widest config's."""
    return next((c for c in CONFIGS if c.images >= problem.n), CONFIGS[-1])


def make_plan(problem: ConvProblem, config: str | None = None, reason: str = "") -> LaunchPlan:
    """A warp per output channel and ``images`` images (forced by ``config``, else _config); grid
    (ceil(K / WARPS), ceil(N / images))."""
    why_not = refusal(problem)
    if why_not:
        raise ValueError(f"kernel {KERNEL!r} cannot run this problem: {why_not}")
    if config is not None:
        cfg, why = forced_config(CONFIGS, config, f"config for {KERNEL}"), "config forced by the caller"
    else:
        cfg = _config(problem)
        why = f"{problem.n} image(s): {cfg.images} a warp"
    grid = (math.ceil(problem.k / WARPS), math.ceil(problem.n / cfg.images), 1)
    if grid[1] > MAX_GRID_Y:
        raise ValueError(f"{problem.n} images in blocks of {cfg.images} need grid {grid}, past CUDA's limits")
    return LaunchPlan(kernel=KERNEL, dtype=problem.dtype, index_type="int", config=cfg, grid=grid,
                      block=(32 * WARPS, 1, 1), shared_bytes=0, vec=load_bytes(problem),
                      reason=f"{reason}; {why}" if reason else why)


def describe(plan: LaunchPlan) -> str:
    """The printed plan: images a warp, loads, launch shape and why."""
    c = plan.config
    loads = f"{plan.vec}-byte pieces" if plan.vec > STORAGE_BYTES[plan.dtype] else "single elements"
    return (f"{plan.kernel} [{c.name}: a warp per output channel x {c.images} image(s), {WARPS} warps a block]\n"
            f"  {plan.dtype}, accumulated in {'double' if plan.dtype == 'float64' else 'float'} (IEEE FMA), "
            f"x, the weight and the output read and written in place in {loads}; one launch, no workspace\n"
            f"  grid {plan.grid}, block {plan.block}\n"
            f"  why: {plan.reason}")


def specialisation(dtype: str, cfg: OnePixelConfig, load: int) -> str:
    """The C++ template instance of ``cfg`` for ``dtype`` with loads of ``load`` bytes."""
    return f"cupyconv::{KERNEL}<{CTYPES[dtype]},{cfg.images},{load // STORAGE_BYTES[dtype]}>"


def name_expression(plan: LaunchPlan) -> str:
    return specialisation(plan.dtype, plan.config, plan.vec)


def specialisations() -> list[str]:
    """Every config of every dtype, with 16-byte pieces and with single elements."""
    return [specialisation(dtype, cfg, load) for dtype in DTYPES for cfg in CONFIGS
            for load in (PIECE_BYTES, STORAGE_BYTES[dtype])]


def program(plan: LaunchPlan, problem: ConvProblem) -> CallProgram:
    """One launch on the caller's x, weight and output."""
    return CallProgram((conv_launch(plan, problem),))
