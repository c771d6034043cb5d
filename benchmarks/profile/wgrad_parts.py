"""Where the tensor-core weight gradient's time goes (wgrad_tensor_cores.py), part by part:
    python benchmarks/profile/wgrad_parts.py [--mode fp16] [--layer vgg_conv3_2 ...]
For layers of bench.LAYERS (ungrouped ones), fp16/bf16 on NHWC arrays, TF32 on NCHW: GPU time (CUDA
events, median of 30 after warm-up) of x's transpose to [C][H][W][N], dy's to [K][Ho][Wo][N], the
dual forward GEMM with its split-K reduction, the transpose into the weight's layout, and the
whole call; torch.nn.grad.conv2d_weight in its faster layout beside it, and the GEMM alone at
other run counts (--splits)."""
import argparse
import dataclasses
import statistics

import cupy
import torch

from cupyconv import wgrad_tensor_cores as tc
from cupyconv.bench import LAYERS, MODE_DTYPE
from cupyconv.compiler import compute_capability
from cupyconv.executor import executable_for_plan
from cupyconv.families import implicit_gemm_nhwc
from cupyconv.grad import weight_gradient
from cupyconv.launch import run

REPEATS = 30
LAYOUT = {"fp16": "channels_last", "bf16": "channels_last", "tf32": "nchw"}


def ms(fn) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(REPEATS):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", action="append", choices=sorted(LAYOUT))
    parser.add_argument("--layer", action="append")
    parser.add_argument("--splits", action="append", type=int, default=[])
    args = parser.parse_args()
    torch_dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16, "tf32": torch.float32}
    for mode in args.mode or ["fp16"]:
        torch.backends.cudnn.allow_tf32 = mode == "tf32"
        layout = LAYOUT[mode]
        for shape in LAYERS:
            if shape.groups != 1 or (args.layer and shape.name not in args.layer):
                continue
            problem = shape.problem(MODE_DTYPE[mode], layout)
            nhwc = layout == "channels_last"
            x = torch.randn(problem.x_shape, device="cuda").to(torch_dtypes[mode])
            dy = torch.randn(problem.out_shape, device="cuda").to(torch_dtypes[mode])
            fmt = torch.channels_last if nhwc else torch.contiguous_format
            x, dy = x.contiguous(memory_format=fmt), dy.contiguous(memory_format=fmt)
            view = lambda t: cupy.from_dlpack((t.permute(0, 2, 3, 1) if nhwc else t).view(torch.int16)
                                              if t.dtype == torch.bfloat16 else (t.permute(0, 2, 3, 1) if nhwc else t))
            xv, dyv = view(x), view(dy)
            dual, plan = tc.make_plan(problem, compute_capability())
            x_t = tc._images_last(xv, problem, dual.c)
            dy_t = tc._images_last(dyv, problem, dual.c)
            out = cupy.empty(dual.out_array_shape, dtype=xv.dtype)
            weight = cupy.empty(problem.weight_array_shape, dtype=xv.dtype)
            device = cupy.cuda.Device().id

            def gemm(p=plan):
                return lambda: run(executable_for_plan(p, dual, device), x_t, dy_t, None, out)

            parts = {
                "x transpose": lambda: tc._images_last(xv, problem, dual.c),
                "dy transpose": lambda: tc._images_last(dyv, problem, dual.c),
                f"GEMM ({plan.splits} runs)": gemm(),
                "to weight": lambda: weight.__setitem__(Ellipsis, out[:, :problem.kh, :problem.kw, :].transpose(
                    3, 1, 2, 0) if nhwc else out[:, :problem.kh, :problem.kw, :].transpose(3, 0, 1, 2)),
                "whole call": lambda: weight_gradient(problem, xv, dyv, "cupy", mode == "tf32"),
            }
            for splits in args.splits:
                forced = implicit_gemm_nhwc.make_plan(dual, None, "", compute_capability(), splits=splits)
                parts[f"GEMM ({splits} runs)"] = gemm(dataclasses.replace(forced, layout="NHWC", weight_layout="KHWC"))
            with torch.no_grad():
                torch_ms = min(ms(lambda f=f: torch.nn.grad.conv2d_weight(x.contiguous(memory_format=f), problem.weight_shape,
                                                                          dy.contiguous(memory_format=f), shape.stride,
                                                                          shape.padding, shape.dilation))
                               for f in (torch.contiguous_format, torch.channels_last))
            line = "  ".join(f"{name} {ms(fn):.3f}" for name, fn in parts.items())
            print(f"{shape.name:22s} {mode} {plan.config.name:22s} grid {plan.grid}  {line}  torch {torch_ms:.3f} ms",
                  flush=True)


if __name__ == "__main__":
    main()
