"""Stream-K on and off in one process: GPU time of every layers / large suite row whose fixed-rules plan
takes stream-K, with the same tile forced to whole tiles, in the modes and layouts asked
    python benchmarks/profile/stream_k.py [--dtype fp16 ...] [--layout channels_last ...]
Median of 200 CUDA-event timings after warm-up (ab_layers.event_median_ms), the weight prepared in the
call as the layers suite does; each row checked: the two plans agree within the dtype's tolerance."""
import argparse
import dataclasses

import cupy

from ab_layers import event_median_ms
from cupyconv.bench import LARGE, LAYERS, MODE_DTYPE, SEEDS
from cupyconv.compiler import compute_capability
from cupyconv.launch import conv2d_cupy
from cupyconv.planner import NHWC_KERNEL, make_plan

TOLERANCE = {"fp16": 1e-2, "bf16": 1e-2, "tf32": 2e-3}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", action="append", choices=sorted(TOLERANCE))
    parser.add_argument("--layout", action="append", choices=("nchw", "channels_last"))
    args = parser.parse_args()
    cc = compute_capability()
    print("| row | mode | layout | tile | tiles | stream-K blocks | whole tiles ms | stream-K ms | speed-up |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for shape in SEEDS + LAYERS + LARGE:
        for mode in args.dtype or ("fp16", "bf16", "tf32"):
            for layout in args.layout or ("channels_last", "nchw"):
                problem = shape.problem(MODE_DTYPE[mode], layout)
                plan = make_plan(problem, allow_tf32=True, compute_capability=cc)
                if not plan.stream_k_blocks:
                    continue
                whole = make_plan(problem, plan.config.name, NHWC_KERNEL, True, cc, stream_k=False)
                whole = dataclasses.replace(whole, layout=plan.layout, weight_layout=plan.weight_layout)
                x, w, b = (cupy.random.standard_normal(s, dtype=cupy.float32) for s in
                           (problem.x_array_shape, problem.weight_array_shape, (problem.k,)))
                cast = (lambda a: a.astype(cupy.float16)) if mode == "fp16" else \
                    (lambda a: (a.view(cupy.uint32) >> 16).astype(cupy.uint16).view(cupy.int16)) if mode == "bf16" \
                    else (lambda a: a)
                x, w, b = cast(x), cast(w), cast(b) if problem.has_bias else None
                outs = [cupy.empty(problem.out_array_shape, dtype=x.dtype) for _ in range(2)]
                for out in outs:  # NaN, so that an element never written fails the check
                    out.view(cupy.uint16).fill(0x7FC0) if mode == "bf16" else out.fill(cupy.nan)
                times = [event_median_ms(lambda: conv2d_cupy(x, w, b, problem, out, p, allow_tf32=True))
                         for p, out in ((whole, outs[0]), (plan, outs[1]))]
                ref, got = (o.view(cupy.uint16).astype(cupy.uint32) << 16 if mode == "bf16" else o for o in outs)
                ref, got = (o.view(cupy.float32) if mode == "bf16" else o.astype(cupy.float32) for o in (ref, got))
                error = float(cupy.linalg.norm(got - ref) / cupy.linalg.norm(ref))
                assert error < TOLERANCE[mode], (shape.name, mode, layout, error)
                print(f"| {shape.name} | {mode} | {layout} | {plan.config.name} | {plan.grid[0] * plan.grid[1]} | "
                      f"{plan.stream_k_blocks} | {times[0]:.4f} | {times[1]:.4f} | {times[0] / times[1]:.2f}x |",
                      flush=True)


if __name__ == "__main__":
    main()
