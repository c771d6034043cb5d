"""A/B GPU time of a few layers through conv2d_cupy in this tree (run it once per tree, same machine):
    python benchmarks/profile/ab_layers.py LABEL [ROW ...]
(ROW: layers-suite or seed rows; default ROWS.) Median of 200 CUDA-event timings after warm-up, weight prepared in the call as the layers suite does."""
import sys

import cupy

from cupyconv.bench import LAYERS, SEEDS, MODE_DTYPE
from cupyconv.launch import conv2d_cupy

ROWS = ("alexnet_conv1", "r50_l1_3x3_64", "r50_l4_3x3_512", "vgg_conv3_2", "dilated_3x3_d2")


def main(label: str, rows=ROWS) -> None:
    for shape in SEEDS + LAYERS:
        if shape.name not in rows:
            continue
        for mode in ("fp16", "tf32"):
            problem = shape.problem(MODE_DTYPE[mode])
            dtype = cupy.float16 if mode == "fp16" else cupy.float32
            x = cupy.random.standard_normal(problem.x_shape, dtype=cupy.float32).astype(dtype)
            w = cupy.random.standard_normal(problem.weight_shape, dtype=cupy.float32).astype(dtype)
            b = cupy.random.standard_normal(problem.k, dtype=cupy.float32).astype(dtype) if problem.has_bias else None
            out = cupy.empty(problem.out_shape, dtype=dtype)
            ms = event_median_ms(lambda: conv2d_cupy(x, w, b, problem, out, allow_tf32=True))
            print(f"{label} {shape.name:16s} {mode} {ms:.4f} ms", flush=True)


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
    main(sys.argv[1], sys.argv[2:] or ROWS)
