"""Time the implicit-GEMM kernels -- both families, every tile -- against torch (same dtype; torch's
default TF32 for float32) on the two seed shapes, with CUDA events: warm-up, then the median of many
runs. Prints a table; * marks the planner's choice.

    PYTHONPATH=$PWD python3 benchmarks/bench_igemm.py
"""
import sys

import cupy
import torch

from cupyconv.arguments import make_problem
from cupyconv.bench import median_ms
from cupyconv.launch import conv2d_cupy
from cupyconv.planner import GEMM_CONFIGS, NHWC_CONFIGS, make_plan

SHAPES = {  # (N, C, H, W), (K, C, kh, kw), stride, padding, bias
    "alexnet_conv1": ((256, 3, 224, 224), (96, 3, 11, 11), 4, 2, True),
    "wide_5x9": ((8, 32, 512, 512), (64, 32, 5, 9), 1, 0, False),
}
DTYPES = {"tf32": ("float32", torch.float32), "float16": ("float16", torch.float16),
          "bfloat16": ("bfloat16", torch.bfloat16)}


def to_cupy(t):
    return None if t is None else cupy.from_dlpack(t.view(torch.int16) if t.dtype == torch.bfloat16 else t)


def main(configs_too: bool = True):
    torch.backends.cudnn.allow_tf32 = True  # torch's default for convolutions
    torch.backends.cudnn.benchmark = False
    rows = []
    for shape_name, (xs, ws, stride, padding, has_bias) in SHAPES.items():
        for name, (dtype, torch_dtype) in DTYPES.items():
            x = torch.randn(xs, device="cuda").to(torch_dtype)
            w = torch.randn(ws, device="cuda").to(torch_dtype)
            b = torch.randn(ws[0], device="cuda").to(torch_dtype) if has_bias else None
            problem = make_problem(xs, ws, b.shape if has_bias else None, dtype, stride, padding)
            out = torch.empty(problem.out_shape, device="cuda", dtype=torch_dtype)
            cx, cw, cb, co = to_cupy(x), to_cupy(w), to_cupy(b), to_cupy(out)
            t_torch = median_ms(lambda: torch.nn.functional.conv2d(x, w, b, stride, padding))
            chosen = make_plan(problem, allow_tf32=True)
            others = [c.name for c in GEMM_CONFIGS[dtype] + NHWC_CONFIGS[dtype] if c.name != chosen.config.name]
            plans = [chosen] + ([make_plan(problem, config=c) for c in others] if configs_too else [])
            for plan in plans:
                t = median_ms(lambda: conv2d_cupy(cx, cw, cb, problem, co, plan=plan))
                tflops = problem.flops / t / 1e9
                rows.append((shape_name, name, plan.config.name + (" *" if plan is chosen else ""),
                             t, t_torch, t / t_torch, tflops, problem.flops / t_torch / 1e9))
            del x, w, b, out, cx, cw, cb, co
            torch.cuda.empty_cache()
            cupy.get_default_memory_pool().free_all_blocks()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cupy {cupy.__version__}")
    print(f"{'shape':14s} {'dtype':9s} {'config (* chosen)':18s} {'ours ms':>8s} {'torch ms':>9s} "
          f"{'ratio':>6s} {'ours TF/s':>9s} {'torch TF/s':>10s}")
    for r in rows:
        print(f"{r[0]:14s} {r[1]:9s} {r[2]:18s} {r[3]:8.3f} {r[4]:9.3f} {r[5]:6.2f} {r[6]:9.1f} {r[7]:10.1f}")


if __name__ == "__main__":
    main(configs_too="--chosen-only" not in sys.argv)
