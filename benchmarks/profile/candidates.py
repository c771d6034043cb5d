"""Every plan the tuner would try on a layers-suite row (or a layer given by its shape), timed against
each other and against torch in one process: where the fixed rules leave time on the table, and whether
any plan we have beats cuDNN.
    python benchmarks/profile/candidates.py --row r50_l3_1x1_256to1024 [--row ...] [--dtype fp16 ...]
        [--layout channels_last ...] [--top 8]
    python benchmarks/profile/candidates.py --shape se_96to4=8,96,4,1,1,1,1,bias --dtype fp32 --layout nchw
--shape NAME=n,c,k,h,w,kh,kw[,stride,padding,groups][,bias] names a layer of bench.Shape's fields.
Medians of 50 interleaved runs behind a spin kernel (plan_timing.time_plans: one set of operands, each
plan's output checked against the rules' plan); torch's conv of the same shape in both layouts timed
likewise (bench.alternating_ms). Candidates: tuning.candidates (the rules' plan first)."""
import argparse

import torch

from cupyconv.bench import LARGE, LAYERS, MODE_DTYPE, SEEDS, Shape, alternating_ms
from cupyconv.compiler import compute_capability
from cupyconv.tuning import candidates, label
from plan_timing import TOLERANCE, time_plans

TORCH_DTYPE = {"fp16": torch.float16, "bf16": torch.bfloat16, "tf32": torch.float32, "fp32": torch.float32}


def parse_shape(text: str) -> Shape:
    """A --shape argument, NAME=n,c,k,h,w,kh,kw[,stride,padding,groups][,bias], as a bench.Shape."""
    name, _, fields = text.partition("=")
    values = fields.split(",")
    bias = values[-1] == "bias"
    numbers = [int(v) for v in values[:-1 if bias else None]]
    if not name or not 7 <= len(numbers) <= 10:
        raise argparse.ArgumentTypeError(f"--shape wants NAME=n,c,k,h,w,kh,kw[,stride,padding,groups][,bias], "
                                         f"got {text!r}")
    n, c, k, h, w, kh, kw, *rest = numbers
    options = dict(zip(("stride", "padding", "groups"), rest))
    return Shape(name, n, c, k, h, w, kh, kw, bias=bias, **options)


def torch_ms(shape, mode: str) -> dict:
    """Median GPU ms of torch's conv2d on ``shape`` in NCHW and channels_last (TF32 on for tf32)."""
    torch.backends.cudnn.allow_tf32 = mode == "tf32"
    dtype = TORCH_DTYPE[mode]
    x = torch.randn(shape.n, shape.c, shape.h, shape.w, device="cuda", dtype=dtype)
    w = torch.randn(shape.k, shape.c // shape.groups, shape.kh, shape.kw, device="cuda", dtype=dtype)
    args = (torch.randn(shape.k, device="cuda", dtype=dtype) if shape.bias else None, shape.stride, shape.padding, shape.dilation, shape.groups)
    cl = [t.to(memory_format=torch.channels_last) for t in (x, w)]
    times = alternating_ms({"nchw": lambda: torch.nn.functional.conv2d(x, w, *args),
                            "channels_last": lambda: torch.nn.functional.conv2d(*cl, *args)}, repeats=50)
    return {k: t[0] for k, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--row", action="append", default=[], help="a layers-suite row (bench.LAYERS, SEEDS, LARGE)")
    parser.add_argument("--shape", action="append", type=parse_shape, default=[],
                        help="a layer: NAME=n,c,k,h,w,kh,kw[,stride,padding,groups][,bias]")
    parser.add_argument("--dtype", action="append", choices=sorted(TOLERANCE))
    parser.add_argument("--layout", action="append", choices=("nchw", "channels_last"))
    parser.add_argument("--top", type=int, default=8, help="candidates shown per row, fastest first")
    args = parser.parse_args()
    cc = compute_capability()
    shapes = {s.name: s for s in SEEDS + LAYERS + LARGE}
    shapes.update((s.name, s) for s in args.shape)
    if not args.row + args.shape:
        parser.error("name at least one --row or --shape")
    for name in args.row + [s.name for s in args.shape]:
        for mode in args.dtype or ("fp16", "tf32"):
            theirs = torch_ms(shapes[name], mode)
            for layout in args.layout or ("channels_last",):
                problem = shapes[name].problem(MODE_DTYPE[mode], layout)
                plans = {}
                for index, (_, plan) in enumerate(candidates(problem, allow_tf32=mode != "fp32", compute_capability=cc)):
                    plans.setdefault(("rule: " if index == 0 else "") + label(plan), plan)
                rule = next(iter(plans))
                times = time_plans(problem, mode, plans, rule, [k for k in plans if k != rule], (name, mode))
                best_torch = min(theirs.values())
                print(f"\n{name} {mode} {layout}: torch NCHW {theirs['nchw'] * 1e3:.1f} us, channels_last "
                      f"{theirs['channels_last'] * 1e3:.1f} us; {len(plans)} candidates", flush=True)
                for plan_name, ms in sorted(times.items(), key=lambda kv: kv[1])[:args.top] + \
                        ([(rule, times[rule])] if sorted(times.values()).index(times[rule]) >= args.top else []):
                    print(f"  {ms * 1e3:7.1f} us  {best_torch / ms:5.2f}x  {plan_name}", flush=True)


if __name__ == "__main__":
    main()
