"""First layers on channels-last images of a few channels (kernels/few_channel_nhwc.cu): 16-bit, a block's
input patch copied into shared memory row by row and its taps gathered there for mma.sync, a reduction
(C kh kw) of at most MAX_REDUCTION and at most MAX_OUT_CHANNELS outputs. MobileNetV2's and EfficientNet's
stem, 3 -> 32 3x3 stride 2, whose 6-byte pixels make no 16-byte pieces for the GEMM tiles' copies."""
from __future__ import annotations

import dataclasses
import math

from ..arguments import ConvProblem
from ..planner import LaunchPlan
from ..program import CallProgram
from .common import CTYPES, H100_SMS, INDEX_TYPES, SHARED_MEMORY_BYTES, conv_launch, forced_config, index_type

KERNEL = "few_channel_nhwc"
#: NHWC alone (NCHW problems are refused, not transposed); the weight in either layout, read once a block.
LAYOUTS = ("NHWC",)
WEIGHT_LAYOUTS = ("KCHW", "KHWC")
DTYPES = ("float16", "bfloat16")
#: FEW_TILE, FEW_THREADS and FEW_MAX_N_TILES in the kernel; MAX_REDUCTION its K_STEPS' 1-3 steps of 16.
TILE = 16
THREADS = 128
MAX_REDUCTION = 48
MAX_OUT_CHANNELS = 64
#: Persistent blocks: at most BLOCKS_PER_SM a (H100_SMS) SM, each taking tiles in turn, the next tile's patch
#: copied while this one's multiplies (160 registers at two k steps: three blocks of 128 threads an SM; at three
#: steps 184-197, two resident, the third waiting its turn).
BLOCKS_PER_SM = 3
#: The rules take it for inputs of at most RULE_MAX_CHANNELS channels (images; wider inputs make pieces for
#: the GEMM tiles' copies), with or without a fused epilogue; not under an input scale. H200, fp16 channels_last,
#: MobileNetV2's 3 -> 32 3x3 s2 stem: batch 32 54.3 -> 33.9 us (torch 31.3), batch 8 18.5 -> 14.5 (12.3), batch 1
#: 10.0 -> 10.3 (7.4); MobileNetV2 b32 graph 1.556 -> 1.531 ms, EfficientNet-B0 2.278 -> 2.259 (benchmarks/NOTES.md,
#: "RGB stems in channels_last"). A fused EfficientNet-B0 in fp16 lands at 3x torch's error with it on some inputs:
#: that model amplifies its stem's last bits 2x (profile/stem_sensitivity.py), so test_fusion_gpu bounds it by
#: torch's own error on inputs one ulp apart.
RULE_MAX_CHANNELS = 4


@dataclasses.dataclass(frozen=True)
class PatchConfig:
    """The one tile: TILE x TILE output pixels and every output channel a block."""

    name: str


CONFIGS = (PatchConfig(f"few_m{TILE}x{TILE}"),)
CONFIG_NAMES = frozenset(c.name for c in CONFIGS)


def _patch_elements(problem: ConvProblem) -> int:
    """Rows of the patch, each its columns' elements with room for the vector copies' shift (up to 7
    elements) and rounded up to whole 16-byte vectors (patch_pitch in the kernel)."""
    rows = (TILE - 1) * problem.stride[0] + (problem.kh - 1) * problem.dilation[0] + 1
    columns = (TILE - 1) * problem.stride[1] + (problem.kw - 1) * problem.dilation[1] + 1
    return rows * math.ceil((columns * problem.c + 7) / 8) * 8


def vector_rows(problem: ConvProblem) -> bool:
    """Whether rows of x hold whole 16-byte vectors (W C a multiple of 8), copied so; else 2-byte loads."""
    return problem.w * problem.c % 8 == 0


def _k_steps(problem: ConvProblem) -> int:
    """The reduction's steps of 16 (the kernel's K_STEPS; the weight's rows padded to them)."""
    return math.ceil(problem.c * problem.kh * problem.kw / 16)


def shared_bytes(problem: ConvProblem) -> int:
    """The weight [K][RP + 8], each warp's staged 16 x (K + 8) outputs and two patches (this tile's and the
    next's), 2 bytes each."""
    weight = problem.k * (16 * _k_steps(problem) + 8)
    return 2 * (weight + THREADS // 32 * 16 * (problem.k + 8) + 2 * _patch_elements(problem))


def refusal(problem: ConvProblem) -> str:
    """Why this kernel cannot run ``problem`` ("" when it can)."""
    p = problem
    if p.layout != "NHWC":
        return f"it computes NHWC arrays only (layout {p.layout})"
    if p.dtype not in DTYPES:
        return f"it runs {DTYPES} on the tensor cores (got {p.dtype})"
    if p.groups != 1:
        return f"it runs layers of one group (got {p.groups})"
    if p.c * p.kh * p.kw > MAX_REDUCTION:
        return (f"its reduction C kh kw is at most {MAX_REDUCTION} (got {p.c} x {p.kh} x {p.kw} = "
                f"{p.c * p.kh * p.kw})")
    if p.k % 8 or p.k > MAX_OUT_CHANNELS:
        return f"it takes multiples of 8 output channels up to {MAX_OUT_CHANNELS} (got {p.k})"
    if (needed := shared_bytes(p)) > SHARED_MEMORY_BYTES:
        return (f"its input patch ({TILE} x {TILE} outputs at stride {p.stride}, dilation {p.dilation}) and "
                f"weight need {needed} B of shared memory, over {SHARED_MEMORY_BYTES}")
    return ""


def pays(problem: ConvProblem) -> bool:
    """Whether the fixed rules take it: inputs of at most RULE_MAX_CHANNELS channels it can run, no input scale."""
    return problem.c <= RULE_MAX_CHANNELS and not problem.has_input_scale and not refusal(problem)


def make_plan(problem: ConvProblem, config: str | None = None, reason: str = "") -> LaunchPlan:
    """A 1-D grid of persistent blocks (at most BLOCKS_PER_SM an SM, at most one a TILE x TILE output tile)."""
    why_not = refusal(problem)
    if why_not:
        raise ValueError(f"kernel {KERNEL!r} cannot run this problem: {why_not}")
    cfg = forced_config(CONFIGS, config, f"config for {KERNEL}") if config is not None else CONFIGS[0]
    tiles_w, tiles_h = math.ceil(problem.wo / TILE), math.ceil(problem.ho / TILE)
    tiles = problem.n * tiles_w * tiles_h
    if tiles >= 2**31:
        raise ValueError(f"output {problem.out_shape} makes {tiles} tiles of {TILE} x {TILE}, over 2^31 - 1")
    why = (f"{problem.c} input channels, a reduction of {problem.c * problem.kh * problem.kw}: the patch of "
           f"{TILE} x {TILE} outputs copied row by row into shared memory, its taps gathered there")
    return LaunchPlan(kernel=KERNEL, dtype=problem.dtype, index_type=index_type(problem), config=cfg,
                      tiles_w=tiles_w, tiles=tiles_h, ktiles=_k_steps(problem),
                      grid=(min(tiles, BLOCKS_PER_SM * H100_SMS), 1, 1),
                      block=(THREADS, 1, 1),
                      shared_bytes=shared_bytes(problem), reason=f"{reason}; {why}" if reason else why)


def describe(plan: LaunchPlan) -> str:
    return (f"{plan.kernel} [{plan.config.name}: block {TILE}x{TILE} px x every output channel, {THREADS} threads, "
            f"mma.sync]\n"
            f"  {plan.dtype} (float32 accumulators), {plan.index_type} indices; {plan.shared_bytes} B shared memory\n"
            f"  grid {plan.grid}, block {plan.block}\n"
            f"  why: {plan.reason}")


def specialisation(dtype: str, index: str, k_steps: int) -> str:
    """The instance for ``k_steps`` steps of 16 of the reduction."""
    return f"cupyconv::{KERNEL}<{CTYPES[dtype]},{index},{k_steps}>"


def name_expression(plan: LaunchPlan) -> str:
    return specialisation(plan.dtype, plan.index_type, plan.ktiles)


def specialisations() -> list[str]:
    return [specialisation(dtype, index, k_steps) for dtype in DTYPES for index in INDEX_TYPES
            for k_steps in range(1, MAX_REDUCTION // 16 + 1)]


def program(plan: LaunchPlan, problem: ConvProblem) -> CallProgram:
    """One launch on the caller's operands; the kernel takes its tiling, the weight's layout and how it copies
    rows of x."""
    return CallProgram((conv_launch(plan, problem, plan.tiles_w, plan.tiles, int(problem.weight_layout == "KHWC"),
                                    int(vector_rows(problem))),))
