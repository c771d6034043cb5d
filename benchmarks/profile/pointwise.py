"""GPU time of the 1x1 channels-last rows on pointwise_nhwc's tiles and on candidate tiles, beside the
channels-last GEMM's plan and torch's channels_last conv, in one process:
    python benchmarks/profile/pointwise.py [ROW ...]
Each time is the median over 30 samples of 20 back-to-back calls between CUDA events, divided by 20
(the calls' host time hides behind the queued kernels). Candidates are PointwiseConfig tiles not in the
table (benchmarks/NOTES.md, "A streaming kernel for 1x1 layers of few input channels")."""
import dataclasses
import sys

import cupy
import torch

from cupyconv.bench import LAYERS, MODE_DTYPE
from cupyconv.families import pointwise_nhwc
from cupyconv.families.pointwise_nhwc import PointwiseConfig
from cupyconv.launch import conv2d_cupy
from cupyconv.planner import NHWC_KERNEL, POINTWISE_KERNEL, make_plan

ROWS = ("r50_l1_1x1_64", "r50_l1_1x1_256", "mbv2_pw_1x1_144to24", "mbv2_pw_1x1_96to576", "r50_l3_1x1_256to1024")
#: name, bm, bn, channel bytes, stages, warps_m, warps_n, min_blocks (B_IN_REGISTERS where a warp's
#: weight fragments fit 32 registers at two blocks per SM at most: kernels/pointwise_nhwc.cu)
CANDIDATES = [PointwiseConfig(f"try_c{cb}_m{bm}n{bn}s{st}w{wm}x{wn}b{mb}", bm, bn, cb, st, wm, wn, mb)
              for bm, bn, cb, st, wm, wn, mb in (
                  (64, 128, 128, 3, 2, 4, 2), (64, 128, 128, 4, 2, 4, 2), (64, 64, 128, 3, 4, 2, 2),
                  (128, 128, 128, 3, 4, 2, 2), (64, 64, 256, 4, 2, 4, 2), (64, 64, 256, 3, 4, 2, 2),
                  (128, 64, 256, 3, 4, 2, 2))]


def batch_ms(run, calls: int = 20, samples: int = 30) -> float:
    for _ in range(3):
        run()
    times = []
    for _ in range(samples):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        for _ in range(calls):
            run()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) / calls)
    return sorted(times)[samples // 2]


def main(rows) -> None:
    shapes = {s.name: s for s in LAYERS}
    for name in rows:
        shape = shapes[name]
        for mode in ("fp16", "tf32"):
            problem = shape.problem(MODE_DTYPE[mode], "channels_last")
            item = 4 if mode == "tf32" else 2
            tdtype = torch.float16 if mode == "fp16" else torch.float32
            x = torch.randn(problem.n, problem.c, problem.h, problem.w, device="cuda", dtype=tdtype)
            x = x.to(memory_format=torch.channels_last)
            w = torch.randn(problem.k, problem.c, 1, 1, device="cuda", dtype=tdtype)
            b = torch.randn(problem.k, device="cuda", dtype=tdtype)
            torch.backends.cudnn.allow_tf32 = True
            results = [("torch CL", batch_ms(lambda: torch.nn.functional.conv2d(x, w, b)))]
            xc, wc, bc = (cupy.asarray(t.permute(0, 2, 3, 1).contiguous() if t.dim() == 4 and t is x else t)
                          for t in (x, w, b))
            out = cupy.empty(problem.out_array_shape, dtype=xc.dtype)
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
                    ms = batch_ms(lambda: conv2d_cupy(xc, wc, bc, problem, out, plan=plan, allow_tf32=True))
                except Exception as error:  # a candidate that does not compile or launch
                    print(f"{name} {mode} {label}: {type(error).__name__}: {str(error)[:200]}", flush=True)
                    continue
                results.append((label, ms))
            torch_ms = results[0][1]
            for label, ms in results:
                print(f"{name:22s} {mode} {label:32s} {ms * 1000:7.2f} us  {torch_ms / ms:5.2f}x torch", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ROWS)
