"""Time the two depthwise kernels against torch on depthwise layers: depthwise_conv2d (shared-memory
patches) at every channels-per-lane count (which sets the number of blocks) and patch-ring depth
(channels per lane, or one more: then every channel of a lane is copied before the first is
computed), and depthwise_column_conv2d (a thread per output column, no shared memory) at every rows
per thread. CUDA events, warm-up, the variants and torch alternating run by run, medians; several
input sets in rotation where one fits in L2, as `python -m cupyconv.bench` does. Prints a table;
* marks the planner's choice. This is how the planner's DEPTHWISE_BLOCKS and COLUMN_MAX_WIDTH were
chosen; the reported figures come from `python -m cupyconv.bench`.

    PYTHONPATH=$PWD python3 benchmarks/bench_depthwise.py [--suite seeds|layers|all|mobilenet] [--ring]
        [--small] [--rows R ...] [--blocks B ...]
"""
import argparse
import math

import cupy
import torch

from cupyconv.bench import L2_BYTES, SUITES, Shape, alternating_ms, bytes_moved
from cupyconv.launch import conv2d_cupy
from cupyconv.families import depthwise_column_conv2d, depthwise_conv2d
from cupyconv.families.depthwise_column_conv2d import COLUMN_BLOCK, COLUMN_CONFIGS, COLUMN_MAX_WIDTH
from cupyconv.families.depthwise_conv2d import DEPTHWISE_MAX_BUFFERS
from cupyconv.planner import DEPTHWISE_COLUMN_KERNEL, DEPTHWISE_KERNEL, make_plan

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
#: Every distinct depthwise layer of MobileNetV2 at batch 32 (channels, input size, stride).
MOBILENET = tuple(Shape(f"mbv2_dw_{c}_{hw}{'s2' if s == 2 else ''}", 32, c, c, hw, hw, 3, 3, stride=s, padding=1,
                        groups=c)
                  for c, hw, s in ((32, 112, 1), (96, 112, 2), (144, 56, 1), (144, 56, 2), (192, 28, 1),
                                   (192, 28, 2), (384, 14, 1), (576, 14, 1), (576, 14, 2), (960, 7, 1)))


def to_cupy(t):
    return None if t is None else cupy.from_dlpack(t.view(torch.int16) if t.dtype == torch.bfloat16 else t)


def variants(problem, ring: bool, rows: list[int], blocks: list[int]):
    """(label, plan) of every layout to time: each tile-kernel channel count (and ring depth with
    ``ring``), and where the column kernel takes the problem, each of its ``rows`` per thread (default:
    its configs') in blocks of each of ``blocks`` threads."""
    for per_lane in (1, 2, 3, 4, 6, 8, 16):
        depths = {min(DEPTHWISE_MAX_BUFFERS, b) for b in ((per_lane, per_lane + 1) if ring else (per_lane,))}
        for buffers in sorted(depths):
            try:
                plan = depthwise_conv2d.make_plan(problem, channels_per_lane=per_lane, patch_buffers=buffers)
            except ValueError:  # the ring does not fit in shared memory
                continue
            yield (f"tiles {per_lane}/lane x{plan.block[2]}, B={plan.patch_buffers}, "
                   f"{math.prod(plan.grid)} blocks"), plan
    for rpt in rows or [c.rpt for c in COLUMN_CONFIGS]:
        for block in blocks:
            try:
                plan = depthwise_column_conv2d.make_plan(problem, rows_per_thread=rpt, block=block)
            except ValueError:  # taps without an unrolled instance
                return
            yield f"columns {rpt} rows/thread, {math.prod(plan.grid)} x {plan.block[:2]}", plan


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=sorted(SUITES) + ["mobilenet"], default="layers")
    parser.add_argument("--ring", action="store_true", help="also time each ring one deeper than its channels")
    parser.add_argument("--rows", type=int, action="append", help="column kernel's rows per thread (repeatable)")
    parser.add_argument("--blocks", type=int, action="append", help=f"column kernel's threads per block at most "
                        f"(repeatable; default {COLUMN_BLOCK})")
    parser.add_argument("--small", action="store_true", help=f"only outputs at most {COLUMN_MAX_WIDTH} wide")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    shapes = MOBILENET if args.suite == "mobilenet" else SUITES[args.suite]
    rows = []
    for shape in shapes:
        for name, torch_dtype in DTYPES.items():
            problem = shape.problem(str(torch_dtype).replace("torch.", ""))
            chosen = make_plan(problem)
            if chosen.kernel not in (DEPTHWISE_KERNEL, DEPTHWISE_COLUMN_KERNEL) or \
                    (args.small and problem.wo > COLUMN_MAX_WIDTH):
                continue
            sets = max(1, min(4, math.ceil(2 * L2_BYTES / bytes_moved(problem))))
            tensors = [(torch.randn(problem.x_shape, device="cuda").to(torch_dtype),
                        torch.randn(problem.weight_shape, device="cuda").to(torch_dtype),
                        torch.empty(problem.out_shape, device="cuda", dtype=torch_dtype)) for _ in range(sets)]
            views = [tuple(to_cupy(t) for t in ts) for ts in tensors]
            counter = {}

            def rotating(label, fn):
                counter[label] = 0

                def run():
                    fn(counter[label] % sets)
                    counter[label] += 1
                return run

            fns = {"torch": rotating("torch", lambda i: torch.nn.functional.conv2d(
                tensors[i][0], tensors[i][1], None, shape.stride, shape.padding, shape.dilation, shape.groups))}
            for label, plan in variants(problem, args.ring, args.rows, args.blocks or [COLUMN_BLOCK]):
                if (plan.kernel, plan.config, plan.grid, plan.patch_buffers) == \
                        (chosen.kernel, chosen.config, chosen.grid, chosen.patch_buffers):
                    label += " *"
                fns[label] = rotating(label, lambda i, plan=plan: conv2d_cupy(
                    views[i][0], views[i][1], None, problem, views[i][2], plan=plan))
            times = alternating_ms(fns, args.repeats)
            t_torch = times.pop("torch")[0]
            rows += [(shape.name, name, label, t, t_torch) for label, (t, _) in times.items()]
            del tensors, views
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cupy {cupy.__version__}")
    print(f"{'shape':20s} {'dtype':5s} {'layout (* chosen)':44s} {'ours ms':>8s} {'torch ms':>9s} {'speed-up':>8s}")
    for r in rows:
        print(f"{r[0]:20s} {r[1]:5s} {r[2]:44s} {r[3]:8.4f} {r[4]:9.4f} {r[4] / r[3]:8.2f}")


if __name__ == "__main__":
    main()
