"""GPU time of the 1x1 channels-last rows on pointwise_nhwc's tiles and on candidate tiles, beside the
channels-last GEMM's plan, in one process:
    python benchmarks/profile/pointwise.py [ROW ...]
Each time is the median over 30 samples of 24 back-to-back calls between CUDA events, divided by 24
(the calls' host time hides behind the queued kernels), the calls taking SETS input and output arrays in
turn so that x and y come from DRAM as in one call (one set left x in L2: tiles measured 35 % apart
between two calls). Candidates are PointwiseConfig tiles not in the table (benchmarks/NOTES.md, "A
streaming kernel for 1x1 layers of few input channels")."""
import dataclasses
import sys

import cupy

from cupyconv.bench import LARGE, LAYERS, MODE_DTYPE, Shape
from cupyconv.families import pointwise_nhwc
from cupyconv.families.pointwise_nhwc import PointwiseConfig
from cupyconv.launch import conv2d_cupy
from cupyconv.planner import NHWC_KERNEL, POINTWISE_KERNEL, make_plan

#: Projections of MobileNetV2 and EfficientNet-B0 at batch 32 that the suites lack: few output channels
#: (16, 24) of few input channels, and 480 -> 80.
MODEL_ROWS = (Shape("mbv2_pw_1x1_32to16_112sq", 32, 32, 16, 112, 112, 1, 1),
              Shape("mbv2_pw_1x1_96to24_56sq", 32, 96, 24, 56, 56, 1, 1),
              Shape("effnet_pw_1x1_480to80_14sq", 32, 480, 80, 14, 14, 1, 1))
ROWS = ("r50_l1_1x1_64", "r50_l1_1x1_256", "mbv2_pw_1x1_144to24", "mbv2_pw_1x1_96to576", "r50_l3_1x1_256to1024",
        "large_1x1_64to64_256sq", "large_1x1_32to128_512sq", "large_1x1_256to64_128sq")
#: name, bm, bn, channel bytes, stages, warps_m, warps_n, min_blocks (B_IN_REGISTERS where a warp's
#: weight fragments fit 32 registers at two blocks per SM at most: kernels/pointwise_nhwc.cu)
CANDIDATES = [PointwiseConfig(f"try_c{cb}_m{bm}n{bn}s{st}w{wm}x{wn}b{mb}", bm, bn, cb, st, wm, wn, mb)
              for bm, bn, cb, st, wm, wn, mb in (
                  (64, 64, 128, 3, 4, 2, 3), (128, 64, 128, 3, 4, 2, 2), (64, 128, 128, 3, 2, 4, 2),
                  (64, 32, 512, 2, 4, 2, 2), (128, 32, 512, 2, 4, 2, 1), (128, 32, 512, 2, 8, 1, 1),
                  (64, 32, 1024, 2, 4, 2, 1), (32, 32, 1024, 3, 2, 2, 1),
                  (64, 32, 128, 3, 4, 2, 3), (64, 32, 256, 3, 4, 2, 2), (64, 64, 256, 3, 4, 2, 2))]
SETS = 3


def batch_ms(run, calls: int = 24, samples: int = 30) -> float:
    """``run(i)`` for i = 0 .. calls - 1 (the array set i % SETS), timed as above."""
    for i in range(SETS):
        run(i)
    times = []
    for _ in range(samples):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        for i in range(calls):
            run(i % SETS)
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) / calls)
    return sorted(times)[samples // 2]


def main(rows) -> None:
    shapes = {s.name: s for s in LAYERS + LARGE + MODEL_ROWS}
    for name in rows:
        shape = shapes[name]
        for mode in ("fp16", "tf32"):
            problem = shape.problem(MODE_DTYPE[mode], "channels_last")
            item = 4 if mode == "tf32" else 2
            dtype = cupy.float16 if mode == "fp16" else cupy.float32
            random = lambda shape: cupy.random.standard_normal(shape, dtype=cupy.float32).astype(dtype)
            xs = [random(problem.x_array_shape) for _ in range(SETS)]
            outs = [cupy.empty(problem.out_array_shape, dtype=dtype) for _ in range(SETS)]
            w, b = random(problem.weight_array_shape), random((problem.k,))
            gemm = make_plan(problem, kernel=NHWC_KERNEL, compute_capability=90)
            plans = [(f"gemm {gemm.config.name}", gemm)]
            for cfg in pointwise_nhwc.POINTWISE_CONFIGS[problem.dtype] + tuple(CANDIDATES):
                if problem.c * item > cfg.channel_bytes or cfg.shared_bytes(problem.dtype) > 227 * 1024:
                    continue
                base = make_plan(problem, kernel=POINTWISE_KERNEL)
                grid = pointwise_nhwc._grid(problem, cfg)
                plans.append((cfg.name, dataclasses.replace(base, config=cfg, grid=grid, block=(cfg.threads, 1, 1),
                                                            shared_bytes=cfg.shared_bytes(problem.dtype))))
            for label, plan in plans:
                try:
                    ms = batch_ms(lambda i: conv2d_cupy(xs[i], w, b, problem, outs[i], plan=plan, allow_tf32=True))
                except Exception as error:  # a candidate that does not compile or launch
                    print(f"{name} {mode} {label}: {type(error).__name__}: {str(error)[:200]}", flush=True)
                    continue
                print(f"{name:22s} {mode} {label:32s} {ms * 1000:7.2f} us", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ROWS)
