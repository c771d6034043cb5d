"""Where the tensor-core weight gradient's time goes (wgrad_tensor_cores.py), and what other tiles and
run counts would give:
    python benchmarks/profile/wgrad_parts.py [--mode fp16] [--layer vgg_conv3_2 ...] [--sweep]
For the ungrouped layers of bench.LAYERS, fp16/bf16 on NHWC arrays, TF32 on NCHW: GPU time (CUDA
events, median of 30 after warm-up) of the whole call with its default plan, of its GEMM launch
alone, and torch.nn.grad.conv2d_weight in its faster layout beside it. --sweep adds every tile that
can run the layer on this GPU at half, the default and twice the default run count, each as a whole
call."""
import argparse

import cupy
import torch
from ab_layers import event_median_ms  # this folder: the scripts run as files

from cupyconv import wgrad_tensor_cores as tc
from cupyconv.bench import LAYERS, MODE_DTYPE, relative_error
from cupyconv.compiler import compute_capability, get_kernel
from cupyconv.grad import weight_gradient

REPEATS = 30
LAYOUT = {"fp16": "channels_last", "bf16": "channels_last", "tf32": "nchw"}


def grad_operands(problem, dtype, nhwc: bool):
    """Random x and dy of ``problem`` as torch tensors of ``dtype`` (channels_last where ``nhwc``) and
    as CuPy views of the same memory in ``problem.layout`` (bfloat16 viewed as int16)."""
    fmt = torch.channels_last if nhwc else torch.contiguous_format
    x = torch.randn(problem.x_shape, device="cuda").to(dtype).contiguous(memory_format=fmt)
    dy = torch.randn(problem.out_shape, device="cuda").to(dtype).contiguous(memory_format=fmt)

    def view(t):
        t = t.permute(0, 2, 3, 1) if nhwc else t
        return cupy.from_dlpack(t.view(torch.int16) if t.dtype == torch.bfloat16 else t)

    return x, dy, view(x), view(dy)


def program_runner(program, plan, problem, stream, x, dy, out):
    """A function launching ``program(plan, problem)`` (a weight-gradient family's) on ``stream``, from CuPy ``x``
    and ``dy`` into ``out``."""
    from cupyconv.executor import program_executable
    from cupyconv.launch import run_program

    exe = program_executable(program, plan, problem, cupy.cuda.Device().id)

    def run():
        with stream:
            run_program(exe, x=x, grad_output=dy, out=out)
    return run


def run_error(run, out, ref, nhwc: bool, bf16: bool = False) -> float:
    """``run()``'s weight gradient in ``out`` (NaN-poisoned first; KHWC where ``nhwc``; int16 bits where ``bf16``)
    against ``ref`` (float64, KCHW): the relative error."""
    out.fill(cupy.nan)
    run()
    torch.cuda.synchronize()
    got = torch.from_dlpack(out)
    got = got.view(torch.bfloat16) if bf16 else got
    return relative_error(got.permute(0, 3, 1, 2) if nhwc else got, ref)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", action="append", choices=sorted(LAYOUT))
    parser.add_argument("--layer", action="append")
    parser.add_argument("--sweep", action="store_true")
    args = parser.parse_args()
    torch_dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16, "tf32": torch.float32}
    for mode in args.mode or ["fp16"]:
        torch.backends.cudnn.allow_tf32 = mode == "tf32"
        layout = LAYOUT[mode]
        for shape in LAYERS:
            if shape.groups != 1 or (args.layer and shape.name not in args.layer):
                continue
            problem = shape.problem(MODE_DTYPE[mode], layout)
            x, dy, xv, dyv = grad_operands(problem, torch_dtypes[mode], layout == "channels_last")
            out = cupy.empty(problem.weight_array_shape, dtype=xv.dtype)
            plan = tc.make_plan(problem, True, None, None, compute_capability())
            parts = {"whole call": lambda: weight_gradient(problem, xv, dyv, "cupy", mode == "tf32")}
            if not (plan.x_copy or plan.dy_copy):
                workspace = cupy.empty(plan.workspace_bytes // 4, dtype=cupy.float32)
                gemm = get_kernel(tc.KERNEL, plan.expression, plan.arch)
                p = problem
                ints = [cupy.int32(v) for v in (p.n, plan.channels, p.h, p.w, plan.out_channels, p.ho, p.wo, p.kh,
                                                p.kw, *p.stride, p.pad_top, p.pad_left, *p.dilation)]
                parts["GEMM"] = lambda: gemm(plan.grid, plan.block, (xv, dyv, workspace, *ints),
                                             shared_mem=plan.shared_bytes)
            if args.sweep:
                for cfg in tc.configs(problem, compute_capability()):
                    for splits in sorted({max(1, plan.splits // 2), plan.splits, 2 * plan.splits}):
                        try:
                            forced = tc.make_plan(problem, True, cfg.name, splits, compute_capability())
                        except ValueError:
                            continue
                        parts[f"{cfg.name}/{splits}"] = lambda f=forced: tc.conv2d_weight_cupy(xv, dyv, problem, out, f)
            with torch.no_grad():
                torch_ms = min(event_median_ms(lambda f=f: torch.nn.grad.conv2d_weight(
                    x.contiguous(memory_format=f), problem.weight_shape, dy.contiguous(memory_format=f),
                    shape.stride, shape.padding, shape.dilation), REPEATS) for f in (torch.contiguous_format, torch.channels_last))
            line = "  ".join(f"{name} {event_median_ms(fn, REPEATS):.4f}" for name, fn in parts.items())
            print(f"{shape.name:22s} {mode} {plan.config.name} grid {plan.grid}  torch {torch_ms:.4f}  {line}",
                  flush=True)


if __name__ == "__main__":
    main()
