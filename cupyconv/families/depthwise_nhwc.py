"""Depthwise convolution on NHWC arrays (kernels/depthwise_nhwc.cu): a thread per vector of
consecutive channels of one output pixel, 16-byte loads and stores where the channels allow. The
weight is prepared once as [kh kw][C], so that it is read in vectors too. MobileNet's and
EfficientNet's depthwise layers in channels_last (one channel per group, no channel multiplier)."""
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
    """``vec`` consecutive channels per thread (one load of vec elements per tap)."""

    name: str
    vec_bytes: int


#: 16-, 8-, 4- and 2-byte vectors: the plan takes the widest whose channel count divides C.
NHWC_DEPTHWISE_CONFIGS = tuple(VectorConfig(f"dw_nhwc_v{b}", b) for b in (16, 8, 4, 2))
CONFIG_NAMES = frozenset(c.name for c in NHWC_DEPTHWISE_CONFIGS)


def _fits(cfg: VectorConfig, problem: ConvProblem) -> bool:
    item = STORAGE_BYTES[problem.dtype]
    return cfg.vec_bytes >= item and problem.c % (cfg.vec_bytes // item) == 0


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
    """A 1-D grid of BLOCK-thread blocks, a thread per output pixel and vector of channels."""
    why_not = refusal(problem)
    if why_not:
        raise ValueError(f"kernel {KERNEL!r} cannot run this problem: {why_not}")
    if config is not None:
        cfg = forced_config(NHWC_DEPTHWISE_CONFIGS, config, f"config for {KERNEL}")
        if not _fits(cfg, problem):
            raise ValueError(f"config {config!r} cannot run this problem: {problem.c} channels are not whole "
                             f"{cfg.vec_bytes}-byte vectors of {problem.dtype}")
        why = "config forced by the caller"
    else:
        cfg = next(c for c in NHWC_DEPTHWISE_CONFIGS if _fits(c, problem) or c.vec_bytes == STORAGE_BYTES[problem.dtype])
        why = f"{problem.c} channels in {cfg.vec_bytes}-byte vectors"
    threads = problem.n * problem.ho * problem.wo * problem.c // _vec(cfg, problem.dtype)
    return LaunchPlan(kernel=KERNEL, dtype=problem.dtype, index_type=index_type(problem, threads), config=cfg,
                      grid=(math.ceil(threads / BLOCK), 1, 1), block=(BLOCK, 1, 1), shared_bytes=0,
                      reason=f"{reason}; {why}" if reason else why)


def _vec(cfg: VectorConfig, dtype: str) -> int:
    return max(1, cfg.vec_bytes // STORAGE_BYTES[dtype])


def describe(plan: LaunchPlan) -> str:
    """The printed plan: vector width, launch shape and why."""
    c = plan.config
    return (f"{plan.kernel} [{c.name}: {_vec(c, plan.dtype)} channels of one output pixel per thread]\n"
            f"  {plan.dtype}, {plan.index_type} indices; weight prepared as [kh kw][C]\n"
            f"  grid {plan.grid}, block {plan.block}\n"
            f"  why: {plan.reason}")


def specialisation(dtype: str, index: str, vec: int) -> str:
    return f"cupyconv::{KERNEL}<{CTYPES[dtype]},{index},{vec}>"


def name_expression(plan: LaunchPlan) -> str:
    return specialisation(plan.dtype, plan.index_type, _vec(plan.config, plan.dtype))


def specialisations() -> list[str]:
    """Every dtype, index width and vector width that dtype has."""
    return list(dict.fromkeys(specialisation(dtype, index, _vec(cfg, dtype)) for dtype in CTYPES
                              for index in INDEX_TYPES for cfg in NHWC_DEPTHWISE_CONFIGS
                              if cfg.vec_bytes >= STORAGE_BYTES[dtype]))


def _weight_preparation(problem: ConvProblem) -> WeightPreparation:
    """The weight [C][kh kw] transposed to [kh kw][C], exact."""
    from .implicit_gemm_nhwc import channels_last_copy

    p, taps = problem, problem.kh * problem.kw
    copy = channels_last_copy(p.dtype, 1, p.c, taps, p.c, False, Pointer(WEIGHT), Pointer(PREPARED))
    return WeightPreparation((KERNEL, p.dtype, p.weight_shape), p.c * taps * STORAGE_BYTES[p.dtype], (copy,))


def program(plan: LaunchPlan, problem: ConvProblem) -> CallProgram:
    """One launch on the caller's x and output and the prepared weight."""
    return CallProgram((conv_launch(plan, problem, weight=Pointer(PREPARED)),), 0, _weight_preparation(problem))
