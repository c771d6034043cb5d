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
#: Images the planner gives this kernel at most: a warp multiplies its weight row by a config's images at once
#: and a batch of more reads the row again per warp (from L2), where a GEMM tile reads it once for its pixels;
#: float32 layers that widen (C < K, squeeze-excitation's excitation) up to MAX_FLOAT32_WIDENING_IMAGES. H200,
#: GPU time of every candidate plan (benchmarks/results/candidates_one_pixel_h200.txt), us, this kernel's best
#: config against the rules' plan before it and torch: 1152 -> 48 at batch 32 TF32 5.7 (torch 12.3), fp16 5.4
#: (9.5); at 64 6.0 against 15.6 on the channels-last GEMM, fp16 5.5 against 17.0; at 128 6.6 against 15.8,
#: fp16 5.9 against 22.6; 48 -> 1152 at 64 TF32 8.5 against 13.1, fp16 8.9 against 15.0, strict fp32 8.6
#: against 9.5 on the FMA GEMM; at 128 fp16 13.1 against 21.6, TF32 12.1 against 13.2, but strict fp32 12.1
#: against 9.6 on the FMA GEMM's 4 x 4 tile.
MAX_IMAGES = 128
MAX_FLOAT32_WIDENING_IMAGES = 64
#: A config's warps, K x ceil(N / images), at least this many where a config of more images per warp
#: allows (else the config of one image): a long reduction on few output channels wants the warps, a short
#: one the images a warp. 1152 -> 48 at batch 32 (same file): 5.7 us on one image a warp (1536 warps), 6.1
#: on two, 8.0 on eight (192); 48 -> 1152: 6.7 on eight (4608), 7.3 on four.
MIN_WARPS = 1024
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
    """Whether the planner takes it for ``problem`` (one it can run): batches of at most MAX_IMAGES, of
    MAX_FLOAT32_WIDENING_IMAGES for float32 layers of more outputs than inputs."""
    widening = problem.dtype == "float32" and problem.c < problem.k
    return problem.n <= (MAX_FLOAT32_WIDENING_IMAGES if widening else MAX_IMAGES)


def load_bytes(problem: ConvProblem) -> int:
    """Bytes of a lane's loads: a 16-byte piece where C is whole pieces (rows then start on 16 bytes:
    the fronts align the operands), else one element."""
    item = STORAGE_BYTES[problem.dtype]
    return PIECE_BYTES if problem.c * item % PIECE_BYTES == 0 else item


def _config(problem: ConvProblem) -> OnePixelConfig:
    """The config of the most images a warp (not past the batch's) that still makes MIN_WARPS warps, else
    the config of one image."""
    warps = lambda c: problem.k * math.ceil(problem.n / c.images)
    fitting = [c for c in CONFIGS if c.images == 1 or (c.images // 2 < problem.n and warps(c) >= MIN_WARPS)]
    return fitting[-1]


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
        warps = problem.k * math.ceil(problem.n / cfg.images)
        why = f"{cfg.images} of {problem.n} image(s) a warp: {warps} warps (at least {MIN_WARPS} where more allow)"
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
