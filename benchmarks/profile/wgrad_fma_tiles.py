"""Every FMA weight-gradient tile (wgrad.py, kernels/wgrad_gemm.cu), directly and as the GEMMs of the
Winograd weight gradient (wgrad_winograd.py), on every layer of bench.LAYERS that the rules give either, in
strict float32:
    PYTHONPATH=$repo python benchmarks/profile/wgrad_fma_tiles.py [--layout channels_last|nchw] [--layer NAME ...]
        [--tile NAME ...] [--winograd-only]
Per layer: torch.nn.grad.conv2d_weight in its faster layout (TF32 off), the rules' plan, then per tile (direct
"d", Winograd F(4x4) "w4" and F(2x2) "w2" where it can run) its run count from the rules and half, twice
and four times it, each a whole call (transforms, GEMM and reduction) timed as bench.py times rows (CUDA
events behind a spin, alternating, medians), and the relative error against float64 at the rules' run
count (a wrong one says WRONG)."""
import argparse

import cupy
import torch
from wgrad_parts import grad_operands, program_runner, run_error  # this folder: the scripts run as files

from cupyconv import wgrad, wgrad_winograd
from cupyconv.bench import LAYERS, MODE_FLOOR, alternating_ms, relative_error
from cupyconv.grad import weight_gradient_plan

REPEATS = 15


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layout", choices=("channels_last", "nchw"), default="channels_last")
    parser.add_argument("--layer", action="append")
    parser.add_argument("--tile", action="append")
    parser.add_argument("--winograd-only", action="store_true")
    args = parser.parse_args()
    torch.backends.cudnn.allow_tf32 = False
    stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
    nhwc = args.layout == "channels_last"
    for shape in LAYERS:
        if args.layer and shape.name not in args.layer:
            continue
        problem = shape.problem("float32", args.layout)
        family, rules = weight_gradient_plan(problem, False)
        winograd = not wgrad_winograd.refusal(problem)
        if family not in (wgrad, wgrad_winograd) or (args.winograd_only and not winograd):
            continue
        x, dy, xv, dyv = grad_operands(problem, torch.float32, nhwc)
        out = cupy.empty(problem.weight_array_shape, dtype=xv.dtype)
        args_ = (shape.stride, shape.padding, shape.dilation, shape.groups)
        with torch.no_grad():
            ref = torch.nn.grad.conv2d_weight(x.double(), problem.weight_shape, dy.double(), *args_)
            bound = max(MODE_FLOOR["fp32"], 2 * relative_error(
                torch.nn.grad.conv2d_weight(x, problem.weight_shape, dy, *args_), ref))

        def call(plan):
            module = wgrad if isinstance(plan, wgrad.WgradPlan) else wgrad_winograd
            return program_runner(module.program, plan, problem, stream, xv, dyv, out)

        def error(plan) -> float:
            return run_error(call(plan), out, ref, nhwc)

        fns = {"rules": call(rules)}
        fns.update({f"torch {f}": (lambda f=f: torch.nn.grad.conv2d_weight(
            x.contiguous(memory_format=f), problem.weight_shape, dy.contiguous(memory_format=f), *args_))
            for f in (torch.contiguous_format, torch.channels_last)})
        times = alternating_ms(fns, REPEATS)
        torch_ms = min(times[f"torch {f}"][0] for f in (torch.contiguous_format, torch.channels_last))
        if family is wgrad:
            name, runs = rules.config.name, rules.splits
        else:
            name, runs = f"winograd F({rules.tile}) {rules.passes.gemm.config.name}", rules.passes.runs
        print(f"{shape.name} fp32 {args.layout}: torch {torch_ms:.4f}  rules {name}/{runs} "
              f"{times['rules'][0]:.4f} ({torch_ms / times['rules'][0]:.2f}x, err {error(rules):.1e}, "
              f"bound {bound:.1e})", flush=True)
        ways = [("w4", lambda c, s: wgrad_winograd.make_plan(problem, 4, c, s)),
                ("w2", lambda c, s: wgrad_winograd.make_plan(problem, 2, c, s))] if winograd else []
        if not args.winograd_only:
            ways.insert(0, ("d", lambda c, s: wgrad.make_wgrad_plan(problem, c, s)))
        for way, make in ways:
            for cfg in wgrad.WGRAD_CONFIGS:
                if args.tile and cfg.name not in args.tile:
                    continue
                auto = make(cfg.name, None)
                auto_splits = auto.splits if way == "d" else auto.passes.gemm.splits
                plans = {}
                for s in sorted({max(1, auto_splits // 2), auto_splits, auto_splits * 2, auto_splits * 4}):
                    try:
                        plans[s] = make(cfg.name, s)
                    except ValueError:  # past a workspace cap
                        continue
                tile_times = alternating_ms({s: call(p) for s, p in plans.items()}, REPEATS)
                best = min(tile_times, key=lambda s: tile_times[s][0])
                err = error(auto)
                flag = "" if err <= bound else "  WRONG"
                print(f"  {way:2s} {cfg.name:18s} rules {auto_splits:>4} runs {tile_times[auto_splits][0]:.4f}  best "
                      f"{best:>4} runs {tile_times[best][0]:.4f}  err {err:.1e}{flag}  "
                      + " ".join(f"{s}:{t[0]:.4f}" for s, t in tile_times.items()), flush=True)


if __name__ == "__main__":
    main()
