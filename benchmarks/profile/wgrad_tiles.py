"""Every tensor-core weight-gradient tile on every ungrouped layer of bench.LAYERS, in 16 bits or TF32 on
channels-last arrays, over a range of run counts (wgrad_tensor_cores.py):
    PYTHONPATH=$repo python benchmarks/profile/wgrad_tiles.py [--mode fp16|bf16|tf32] [--layer NAME ...]
        [--tile NAME ...] [--layout nchw]
(--layout nchw: NCHW arrays, whose TF32 1x1 layers take the K-major tiles; the other layers' copies are timed
with the GEMM.)
Per layer: torch.nn.grad.conv2d_weight in its faster layout, the rules' plan, the rules' plan without Hopper's
tiles (mma.sync: "sm80"), then per tile the run count
the rules' timing model gives it and the fastest of SPLITS (and, for the TMA tiles with a stream-K instance, stream-K: "sk"), each a
whole call (copies, GEMM, reduction)
timed as bench.py times rows (CUDA events behind a spin, alternating, medians), and the tile's relative
error against float64 at both counts (a wrong tile says WRONG)."""
import argparse

import cupy
import torch
from wgrad_parts import grad_operands, program_runner, run_error  # this folder: the scripts run as files

from cupyconv import wgrad_tensor_cores as tc
from cupyconv.bench import LAYERS, MODE_DTYPE, MODE_FLOOR, alternating_ms, relative_error
from cupyconv.compiler import compute_capability

SPLITS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
REPEATS = 15


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", action="append", choices=("fp16", "bf16", "tf32"))
    parser.add_argument("--layer", action="append")
    parser.add_argument("--tile", action="append")
    parser.add_argument("--layout", choices=("channels_last", "nchw"), default="channels_last")
    args = parser.parse_args()
    capability = compute_capability()
    stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
    for mode in args.mode or ["fp16"]:
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "tf32": torch.float32}[mode]
        for shape in LAYERS:
            if shape.groups != 1 or (args.layer and shape.name not in args.layer):
                continue
            problem = shape.problem(MODE_DTYPE[mode], args.layout)
            nhwc = args.layout == "channels_last"
            x, dy, xv, dyv = grad_operands(problem, dtype, nhwc)
            out = cupy.empty(problem.weight_array_shape, dtype=xv.dtype)
            args_ = (shape.stride, shape.padding, shape.dilation)
            with torch.no_grad():
                ref = torch.nn.grad.conv2d_weight(x.double(), problem.weight_shape, dy.double(), *args_)
                bound = max(MODE_FLOOR[mode], 2 * relative_error(
                    torch.nn.grad.conv2d_weight(x, problem.weight_shape, dy, *args_), ref))

            def call(plan):
                return program_runner(tc.program, plan, problem, stream, xv, dyv, out)

            def error(plan) -> float:
                return run_error(call(plan), out, ref, nhwc, mode == "bf16")

            rules = tc.make_plan(problem, True, None, None, capability)
            sm80 = tc.make_plan(problem, True, None, None, 80)
            fns = {"rules": call(rules), "sm80": call(sm80)}
            fns.update({f"torch {f}": (lambda f=f: torch.nn.grad.conv2d_weight(
                x.contiguous(memory_format=f), problem.weight_shape, dy.contiguous(memory_format=f), *args_))
                for f in (torch.contiguous_format, torch.channels_last)})
            times = alternating_ms(fns, REPEATS)
            torch_ms = min(times[f"torch {f}"][0] for f in (torch.contiguous_format, torch.channels_last))
            schedule = "sk" if rules.stream_k_blocks else rules.splits
            print(f"{shape.name} {mode}: torch {torch_ms:.4f}  rules {rules.config.name}/{schedule} "
                  f"{times['rules'][0]:.4f} (err {error(rules):.1e}, bound {bound:.1e})  sm80 {sm80.config.name}/"
                  f"{sm80.splits} {times['sm80'][0]:.4f}", flush=True)
            for cfg in tc.configs(problem, capability):
                if not cfg.wgmma or (args.tile and cfg.name not in args.tile):
                    continue
                modelled = tc.make_plan(problem, True, cfg.name, None, capability)
                modelled_key = "sk" if modelled.stream_k_blocks else modelled.splits
                choices = set(tc._split_choices(problem, cfg))
                plans = {s: tc.make_plan(problem, True, cfg.name, s, capability)
                         for s in sorted(choices & set(SPLITS) | {modelled.splits})}
                if cfg.stream_k:
                    plans["sk"] = tc.make_plan(problem, True, cfg.name, None, capability, True)
                tile_times = alternating_ms({s: call(p) for s, p in plans.items()}, REPEATS)
                best = min(tile_times, key=lambda s: tile_times[s][0])
                errors = {s: error(plans[s]) for s in {best, modelled_key} | ({"sk"} if cfg.stream_k else set())}
                flag = "" if max(errors.values()) <= bound else "  WRONG"
                print(f"  {cfg.name:18s} model {modelled_key!s:>4} runs {tile_times[modelled_key][0]:.4f}  "
                      f"best {best!s:>4} runs {tile_times[best][0]:.4f}  err {max(errors.values()):.1e}{flag}  "
                      + " ".join(f"{s}:{t[0]:.4f}" for s, t in tile_times.items()), flush=True)


if __name__ == "__main__":
    main()
