"""Time every implicit-GEMM tile configuration against torch on a suite of cupyconv.bench, with CUDA
events: warm-up, then the median of many runs. fp32 times the strict-float32 FMA GEMM's tiles against
torch with TF32 off; tf32, float16 and bfloat16 both tensor-core families' tiles against torch in the
same dtype (torch's default TF32). Prints a table; * marks the planner's choice. This is how tile
choices are made; the reported figures come from `python -m cupyconv.bench`.

    PYTHONPATH=$PWD python3 benchmarks/bench_igemm.py [--suite seeds|layers|all] [--dtype fp32|tf32|float16|bfloat16]
        [--chosen-only] [--nhwc-only]
"""
import argparse

import cupy
import torch

from cupyconv.bench import SUITES, median_ms
from cupyconv.compiler import compute_capability
from cupyconv.launch import conv2d_cupy
from cupyconv.families.implicit_gemm_conv2d import GEMM_CONFIGS
from cupyconv.families.implicit_gemm_nhwc import NHWC_CONFIGS
from cupyconv.families.simt_gemm_conv2d import SIMT_CONFIGS
from cupyconv.planner import SIMT_KERNEL, make_plan

DTYPES = {"fp32": ("float32", torch.float32), "tf32": ("float32", torch.float32),
          "float16": ("float16", torch.float16), "bfloat16": ("bfloat16", torch.bfloat16)}


def to_cupy(t):
    return None if t is None else cupy.from_dlpack(t.view(torch.int16) if t.dtype == torch.bfloat16 else t)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=sorted(SUITES), default="seeds")
    parser.add_argument("--chosen-only", action="store_true", help="only the planner's choice")
    parser.add_argument("--nhwc-only", action="store_true", help="skip the NCHW-gather family")
    parser.add_argument("--dtype", choices=sorted(DTYPES), action="append", help="repeatable; default all")
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = False
    rows = []
    for shape in SUITES[args.suite]:
        for name in args.dtype or DTYPES:
            dtype, torch_dtype = DTYPES[name]
            strict = name == "fp32"
            torch.backends.cudnn.allow_tf32 = not strict  # else torch's default for convolutions
            problem = shape.problem(dtype)
            chosen = make_plan(problem, allow_tf32=not strict, compute_capability=compute_capability())
            if chosen.kernel not in ((SIMT_KERNEL,) if strict else ("implicit_gemm_nhwc", "implicit_gemm_conv2d")):
                continue
            x = torch.randn(problem.x_shape, device="cuda").to(torch_dtype)
            w = torch.randn(problem.weight_shape, device="cuda").to(torch_dtype)
            b = torch.randn(problem.k, device="cuda").to(torch_dtype) if shape.bias else None
            out = torch.empty(problem.out_shape, device="cuda", dtype=torch_dtype)
            cx, cw, cb, co = to_cupy(x), to_cupy(w), to_cupy(b), to_cupy(out)
            t_torch = median_ms(lambda: torch.nn.functional.conv2d(x, w, b, shape.stride, shape.padding,
                                                                   shape.dilation, shape.groups))
            configs = SIMT_CONFIGS if strict else NHWC_CONFIGS[dtype] + (() if args.nhwc_only else GEMM_CONFIGS[dtype])
            plans = [chosen]
            for cfg in configs if not args.chosen_only else ():
                if cfg.name != chosen.config.name:
                    try:
                        plans.append(make_plan(problem, config=cfg.name, compute_capability=compute_capability()))
                    except ValueError:  # a family that cannot run this problem
                        pass
            for plan in plans:
                t = median_ms(lambda: conv2d_cupy(cx, cw, cb, problem, co, plan=plan))
                rows.append((shape.name, name, plan.config.name + (" *" if plan is chosen else ""),
                             t, t_torch, problem.flops / t / 1e9))
            del x, w, b, out, cx, cw, cb, co
            torch.cuda.empty_cache()
            cupy.get_default_memory_pool().free_all_blocks()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cupy {cupy.__version__}")
    print(f"{'shape':22s} {'dtype':9s} {'config (* chosen)':24s} {'ours ms':>8s} {'torch ms':>9s} "
          f"{'speed-up':>8s} {'TFLOP/s':>8s}")
    for r in rows:
        print(f"{r[0]:22s} {r[1]:9s} {r[2]:24s} {r[3]:8.3f} {r[4]:9.3f} {r[4] / r[3]:8.2f} {r[5]:8.1f}")


if __name__ == "__main__":
    main()
