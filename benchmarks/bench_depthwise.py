"""Time the depthwise kernel at every channels-per-lane count (which sets the number of blocks) and
patch-ring depth (channels per lane, or one more: then every channel of a lane is copied before the
first is computed) against torch on the depthwise layers of a cupyconv.bench suite, with CUDA events:
warm-up, then the median of many runs. Prints a table; * marks the planner's choice. This is how the
planner's DEPTHWISE_BLOCKS is chosen; the reported figures come from `python -m cupyconv.bench`.

    PYTHONPATH=$PWD python3 benchmarks/bench_depthwise.py [--suite seeds|layers|all]
"""
import argparse

import cupy
import torch

from cupyconv.bench import SUITES, median_ms
from cupyconv.launch import conv2d_cupy
from cupyconv.planner import DEPTHWISE_KERNEL, DEPTHWISE_MAX_BUFFERS, make_depthwise_plan, make_plan

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def to_cupy(t):
    return None if t is None else cupy.from_dlpack(t.view(torch.int16) if t.dtype == torch.bfloat16 else t)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=sorted(SUITES), default="layers")
    args = parser.parse_args()
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    rows = []
    for shape in SUITES[args.suite]:
        for name, torch_dtype in DTYPES.items():
            problem = shape.problem(str(torch_dtype).replace("torch.", ""))
            chosen = make_plan(problem)
            if chosen.kernel != DEPTHWISE_KERNEL:
                continue
            x = torch.randn(problem.x_shape, device="cuda").to(torch_dtype)
            w = torch.randn(problem.weight_shape, device="cuda").to(torch_dtype)
            out = torch.empty(problem.out_shape, device="cuda", dtype=torch_dtype)
            cx, cw, co = to_cupy(x), to_cupy(w), to_cupy(out)
            t_torch = median_ms(lambda: torch.nn.functional.conv2d(x, w, None, shape.stride, shape.padding,
                                                                   shape.dilation, shape.groups))
            for per_lane in (1, 2, 3, 4, 6, 8, 16):
                for buffers in sorted({min(DEPTHWISE_MAX_BUFFERS, b) for b in (per_lane, per_lane + 1)}):
                    try:
                        plan = make_depthwise_plan(problem, channels_per_lane=per_lane, patch_buffers=buffers)
                    except ValueError:  # the ring does not fit in shared memory
                        continue
                    t = median_ms(lambda: conv2d_cupy(cx, cw, None, problem, co, plan=plan))
                    star = " *" if (plan.channels_per_block, plan.patch_buffers) == \
                        (chosen.channels_per_block, chosen.patch_buffers) else ""
                    rows.append((shape.name, name, f"{per_lane}/lane x{plan.block[2]}, B={plan.patch_buffers}, "
                                 f"{plan.grid[0] * plan.grid[1] * plan.grid[2]} blocks{star}", t, t_torch))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cupy {cupy.__version__}")
    print(f"{'shape':22s} {'dtype':6s} {'layout (* chosen)':36s} {'ours ms':>8s} {'torch ms':>9s} {'speed-up':>8s}")
    for r in rows:
        print(f"{r[0]:22s} {r[1]:6s} {r[2]:36s} {r[3]:8.4f} {r[4]:9.4f} {r[4] / r[3]:8.2f}")


if __name__ == "__main__":
    main()
