"""A/B GPU time of a few layers through conv2d_cupy in this tree (run it once per tree, same machine):
    python benchmarks/profile/ab_layers.py LABEL [ROW ...] [--layout NHWC] [--mode fp16 --mode bf16 ...]
(ROW: layers-suite or seed rows; default ROWS; modes default fp16 and tf32, layout NCHW.) Median of 200
CUDA-event timings after warm-up, weight prepared in the call as the layers suite does."""
import argparse
import dataclasses

import cupy

from cupyconv.bench import LAYERS, SEEDS, MODE_DTYPE
from cupyconv.launch import conv2d_cupy

ROWS = ("alexnet_conv1", "r50_l1_3x3_64", "r50_l4_3x3_512", "vgg_conv3_2", "dilated_3x3_d2")


def main(label: str, rows=ROWS, modes=("fp16", "tf32"), layout: str = "NCHW") -> None:
    for shape in SEEDS + LAYERS:
        if shape.name not in rows:
            continue
        for mode in modes:
            problem = dataclasses.replace(shape.problem(MODE_DTYPE[mode]), layout=layout, weight_layout="KCHW")
            dtype = cupy.float32 if MODE_DTYPE[mode] == "float32" else cupy.float16  # bfloat16 as its 16 bits
            random = lambda shape: cupy.random.standard_normal(shape, dtype=cupy.float32).astype(dtype)
            x, w = random(problem.x_array_shape), random(problem.weight_shape)
            b = random(problem.k) if problem.has_bias else None
            out = cupy.empty(problem.out_array_shape, dtype=dtype)
            ms = event_median_ms(lambda: conv2d_cupy(x, w, b, problem, out, allow_tf32=True))
            print(f"{label} {shape.name:16s} {mode} {layout} {ms:.4f} ms", flush=True)


def event_median_ms(run, repeats: int = 200, warmup: int = 10) -> float:
    """Median GPU time of ``run()`` in ms, each run alone between CUDA events on CuPy's current stream."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeats):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end))
    times.sort()
    return times[len(times) // 2]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("label")
    parser.add_argument("rows", nargs="*", default=ROWS)
    parser.add_argument("--mode", action="append", choices=tuple(MODE_DTYPE), dest="modes")
    parser.add_argument("--layout", choices=("NCHW", "NHWC"), default="NCHW")
    args = parser.parse_args()
    main(args.label, args.rows, args.modes or ("fp16", "tf32"), args.layout)
