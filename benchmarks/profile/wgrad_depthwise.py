"""GPU time of the depthwise rows' weight gradient (cupyconv.wgrad_depthwise) beside torch's:
    python benchmarks/profile/wgrad_depthwise.py [--mode fp16 ...] [--layer mbv2_dw_3x3_144 ...] [--once] [--sweep]
For the depthwise layers of bench.LAYERS, in both layouts; the whole call (kernel and ordered reduction) and torch.nn.grad.conv2d_weight in its faster
layout, GPU time (CUDA events behind a spin: bench.alternating_ms), median of 30 interleaved runs.
--once runs each call once (for ncu); --sweep adds NHWC plans of other row segments, run counts and
channel vectors a block, and NCHW plans of one and two columns a lane, other segments and run counts."""
import argparse
import math

import cupy
import torch
from wgrad_parts import grad_operands  # this folder: the scripts run as files

from cupyconv import wgrad_depthwise
from cupyconv.bench import LAYERS, MODE_DTYPE, alternating_ms
from cupyconv.families.common import H100_SMS
from cupyconv.grad import weight_gradient

REPEATS = 30
LAYOUTS = ("channels_last", "nchw")
TORCH_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", action="append", choices=sorted(TORCH_DTYPES))
    parser.add_argument("--layout", action="append", choices=LAYOUTS)
    parser.add_argument("--layer", action="append")
    parser.add_argument("--once", action="store_true")
    parser.add_argument("--sweep", action="store_true")
    args = parser.parse_args()
    torch.backends.cudnn.allow_tf32 = False
    for mode in args.mode or ["fp16", "bf16", "fp32"]:
        for layout in args.layout or LAYOUTS:
            for shape in LAYERS:
                if shape.groups == 1 or (args.layer and shape.name not in args.layer):
                    continue
                problem = shape.problem(MODE_DTYPE[mode], layout)
                nhwc = layout == "channels_last"
                x, dy, xv, dyv = grad_operands(problem, TORCH_DTYPES[mode], nhwc)
                theirs = {f: (x.contiguous(memory_format=f), dy.contiguous(memory_format=f))
                          for f in (torch.contiguous_format, torch.channels_last)}
                calls = {f"torch {f}": lambda a=a, b=b: torch.nn.grad.conv2d_weight(
                    a, problem.weight_shape, b, shape.stride, shape.padding, shape.dilation, shape.groups)
                    for f, (a, b) in zip(("NCHW", "CL"), theirs.values())}
                plans = [wgrad_depthwise.make_plan(problem)]
                if args.sweep:
                    plans += (_other_plans if nhwc else _other_nchw_plans)(problem, plans[0])
                out = cupy.empty(problem.weight_array_shape, dtype=xv.dtype)
                # the default through grad's entry point, as a user calls it
                calls.update({plan: (lambda: weight_gradient(problem, xv, dyv, "cupy")) if i == 0 else
                              (lambda plan=plan: wgrad_depthwise.conv2d_weight_cupy(xv, dyv, problem, out, plan))
                              for i, plan in enumerate(plans)})
                with torch.no_grad():
                    if args.once:
                        for call in calls.values():
                            call()
                        torch.cuda.synchronize()
                        continue
                    times = alternating_ms(calls, REPEATS)
                torch_ms = min(times["torch NCHW"][0], times["torch CL"][0])
                for plan in plans:
                    ms = times[plan][0]
                    moved = (xv.nbytes + dyv.nbytes) / (ms * 1e-3) / 1e9
                    print(f"{shape.name:18s} {mode} {layout:13s} torch {torch_ms:.4f}  cupyconv {ms:.4f} ms  "
                          f"{torch_ms / ms:.2f}x  {moved:6.0f} GB/s  {plan}", flush=True)


def _other_plans(problem, default):
    """NHWC plans beside ``default``: row segments of 8 to a whole row, runs giving 1-4 blocks an SM's
    worth (H100_SMS), and all the channel vectors in one block where they leave 4 row lanes."""
    vector = wgrad_depthwise.vector_channels(problem)
    wanted = problem.k // vector
    layouts = {(default.grid[0], default.across)}
    if wanted <= 64:
        layouts.add((1, wanted))
    plans = []
    for blocks, vectors in sorted(layouts):
        for segment in sorted({8, 16, 32, math.ceil(problem.wo / 4) * 4}):
            items = problem.n * problem.ho * math.ceil(problem.wo / segment)
            for per_sm in (1, 2, 4):
                splits = max(1, min(math.ceil(H100_SMS * per_sm / blocks), items // (256 // vectors)))
                plan = wgrad_depthwise.DepthwisePlan((blocks, splits, 1), splits, vectors, segment)
                if plan != default and plan not in plans:
                    plans.append(plan)
    return plans


def _other_nchw_plans(problem, default):
    """NCHW plans beside ``default``: one column a lane and two (where allowed), each at its own rule's
    segment and at segments of 8 to a whole column, runs giving 1-4 blocks an SM's worth."""
    plans = []
    for columns in (1, 2) if wgrad_depthwise.column_pairs(problem) else (1,):
        rule = wgrad_depthwise.make_plan(problem, columns)
        blocks, lanes = rule.grid[0], 256 // rule.across
        for segment in sorted({rule.segment, 8, 16, 32, math.ceil(problem.ho / 4) * 4}):
            items = problem.n * math.ceil(problem.ho / segment)
            for per_sm in (1, 2, 4):
                splits = max(1, min(math.ceil(H100_SMS * per_sm / blocks), items // lanes))
                plan = rule._replace(grid=(blocks, splits, 1), splits=splits, segment=segment)
                if plan != default and plan not in plans:
                    plans.append(plan)
    return plans


if __name__ == "__main__":
    main()
