"""The channels-last GEMM's 128 x 128 wgmma tile with and without its producer warpgroup, in one process:
GPU time of each layers / large suite row whose fixed-rules plan takes the 128 x 128 pixel-row tile
(or of the rows named), that plan against the same tile fed by a producer warpgroup (or against the
tiles named by --config)
    python benchmarks/profile/producer.py [--dtype fp16 ...] [--layout channels_last ...] [--row NAME ...]
        [--config TILE ...]
Medians of 50 runs each behind a spin kernel, interleaved (bench.alternating_ms), the weight prepared
in the call as the layers suite does; each row checked: the plans agree within the dtype's tolerance."""
import argparse
import dataclasses

import cupy

from cupyconv.bench import LARGE, LAYERS, MODE_DTYPE, SEEDS, alternating_ms
from cupyconv.compiler import compute_capability
from cupyconv.families.implicit_gemm_nhwc import NHWC_CONFIGS, PIXEL_ROWS_CONFIG
from cupyconv.launch import conv2d_cupy
from cupyconv.planner import NHWC_KERNEL, make_plan

TOLERANCE = {"fp16": 1e-2, "bf16": 1e-2, "tf32": 2e-3}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", action="append", choices=sorted(TOLERANCE))
    parser.add_argument("--layout", action="append", choices=("nchw", "channels_last"))
    parser.add_argument("--row", action="append", help="rows to time whatever tile the rules take")
    parser.add_argument("--config", action="append", help="channels-last tiles to time instead of the producer's")
    args = parser.parse_args()
    cc = compute_capability()
    producers = args.config or [c.name for c in NHWC_CONFIGS["float16"] if c.producer_warps]
    print("| row | mode | layout | rule's plan | tiles | rule ms | 128 x 128 ms |" + "".join(f" {p} ms |" for p in producers)
          + " best producer / rule |")
    print("| --- " * (7 + len(producers)) + "|")
    for shape in SEEDS + LAYERS + LARGE:
        for mode in args.dtype or ("fp16", "bf16", "tf32"):
            for layout in args.layout or ("channels_last", "nchw"):
                problem = shape.problem(MODE_DTYPE[mode], layout)
                plan = make_plan(problem, allow_tf32=True, compute_capability=cc)
                if (shape.name not in args.row) if args.row else plan.config.name != PIXEL_ROWS_CONFIG:
                    continue
                if plan.kernel != NHWC_KERNEL:
                    continue
                try:
                    plans = {"rule": plan, "plain": make_plan(problem, PIXEL_ROWS_CONFIG, NHWC_KERNEL, True, cc,
                                                              stream_k=False),
                             **{p: make_plan(problem, p, NHWC_KERNEL, True, cc) for p in producers}}
                except ValueError:  # a float32 input read in place, which the producer's tile does not round
                    continue
                plans = {k: dataclasses.replace(p, layout=plan.layout, weight_layout=plan.weight_layout)
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
                times = alternating_ms({k: (lambda p=p, out=outs[k]: conv2d_cupy(x, w, b, problem, out, p,
                                                                                  allow_tf32=True))
                                        for k, p in plans.items()}, repeats=50)
                as_float = {k: (o.view(cupy.uint16).astype(cupy.uint32) << 16).view(cupy.float32) if mode == "bf16"
                            else o.astype(cupy.float32) for k, o in outs.items()}
                for k in producers:
                    ref = as_float["plain"]
                    error = float(cupy.linalg.norm(as_float[k] - ref) / cupy.linalg.norm(ref))
                    assert error < TOLERANCE[mode], (shape.name, mode, layout, k, error)
                ms = {k: t[0] for k, t in times.items()}
                best = min(ms[p] for p in producers)
                print(f"| {shape.name} | {mode} | {layout} | {plan.config.name}"
                      f"{' stream-K' if plan.stream_k_blocks else ''}{f' split {plan.splits}' if plan.splits > 1 else ''}"
                      f" | {plan.grid[0] * plan.grid[1] * plan.grid[2]} | {ms['rule']:.4f} | {ms['plain']:.4f} |"
                      + "".join(f" {ms[p]:.4f} |" for p in producers) + f" {ms['rule'] / best:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
