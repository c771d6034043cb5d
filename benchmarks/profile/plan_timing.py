"""Plans of one problem timed against each other in one process, for the profile scripts (stream_k.py,
producer.py): the same random operands, NaN-poisoned outputs, interleaved runs behind a spin kernel
(bench.alternating_ms: the GPU's time alone), the weight prepared in the call as the layers suite does."""
import dataclasses

import cupy

from cupyconv.bench import alternating_ms
from cupyconv.compiler import compute_capability
from cupyconv.launch import conv2d_cupy
from cupyconv.planner import make_plan

#: Relative error of a checked plan's output against the reference plan's.
TOLERANCE = {"fp16": 1e-2, "bf16": 1e-2, "tf32": 2e-3, "fp32": 1e-5}


def time_plans(problem, mode: str, plans: dict, reference: str, checked, label=()) -> dict:
    """Median GPU ms of 50 runs of each of ``plans`` (name -> LaunchPlan, laid out as ``problem``); the
    outputs of the ``checked`` names agree with the ``reference`` one's (AssertionError naming ``label``
    and the plan otherwise)."""
    plans = {k: dataclasses.replace(p, layout=problem.layout, weight_layout=problem.weight_layout)
             for k, p in plans.items()}
    x, w, b = (cupy.random.standard_normal(s, dtype=cupy.float32) for s in
               (problem.x_array_shape, problem.weight_array_shape, (problem.k,)))
    cast = (lambda a: a.astype(cupy.float16)) if mode == "fp16" else \
        (lambda a: (a.view(cupy.uint32) >> 16).astype(cupy.uint16).view(cupy.int16)) if mode == "bf16" \
        else (lambda a: a)
    x, w, b = cast(x), cast(w), cast(b) if problem.has_bias else None
    outs = {k: cupy.empty(problem.out_array_shape, dtype=x.dtype) for k in plans}
    for out in outs.values():  # NaN, so that an element never written fails the check
        out.view(cupy.uint16).fill(0x7FC0) if mode == "bf16" else out.fill(cupy.nan)
    times = alternating_ms({k: (lambda p=p, out=outs[k]: conv2d_cupy(x, w, b, problem, out, p, allow_tf32=True))
                            for k, p in plans.items()}, repeats=50)
    as_float = {k: (o.view(cupy.uint16).astype(cupy.uint32) << 16).view(cupy.float32) if mode == "bf16"
                else o.astype(cupy.float32) for k, o in outs.items()}
    ref = as_float[reference]
    for k in checked:
        error = float(cupy.linalg.norm(as_float[k] - ref) / cupy.linalg.norm(ref))
        assert error < TOLERANCE[mode], (*label, k, error)
    return {k: t[0] for k, t in times.items()}


#: The NCHW-gather GEMM's tiles, by pixels x channels (their names carry each dtype's k depth).
GEMM_TILES = ("m128n32", "m128n64", "m128n128")


def gemm_tiles(dtype: str) -> dict:
    """Column name -> (kernel, config) of each of GEMM_TILES in ``dtype``, to force."""
    from cupyconv.families.implicit_gemm_conv2d import GEMM_CONFIGS, KERNEL

    return {f"gemm_nchw {tile}": (KERNEL, cfg.name) for tile in GEMM_TILES for cfg in GEMM_CONFIGS[dtype]
            if cfg.name.startswith(tile + "k")}


def rule_against_forced(problem, mode: str, forced: dict, label=()) -> tuple[dict, dict]:
    """The fixed rules' plan of ``problem`` ("rule") and each forced (kernel, config[, options]) of ``forced``
    (name -> tuple; options: make_plan's family knobs, e.g. {"splits": 4}) that can run it, timed by
    time_plans against the rule's output: (plans, name -> median ms)."""
    cc = compute_capability()
    plans = {"rule": make_plan(problem, allow_tf32=mode != "fp32", compute_capability=cc)}
    for name, (kernel, config, *options) in forced.items():
        try:
            plans[name] = make_plan(problem, config, kernel, True, cc, **(options[0] if options else {}))
        except ValueError:  # a kernel or tile that cannot run this problem: left out
            pass
    return plans, time_plans(problem, mode, plans, "rule", [k for k in plans if k != "rule"], label)
