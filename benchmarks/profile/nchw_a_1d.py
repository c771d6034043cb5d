"""1-D NCHW convolutions: the rules' plan and each tile forced on it, in one process, so that two trees
(one whose channels-last GEMM copies x to channels-last first, one that reads it in place, shifting each
row by its tap) can be compared row by row:
    cd benchmarks/profile && PYTHONPATH=<tree>:. python3 nchw_a_1d.py [--dtype fp16 ...]
TCN-like layers (kernel 3, dilation 4, 'same') of 64-512 channels, the conv1d suite's TCN and WaveNet
rows. GPU time: medians of 50 interleaved runs each behind a spin kernel (plan_timing.time_plans), every
forced plan checked against the rules' within the dtype's tolerance."""
import argparse

from cupyconv.bench import CONV1D, MODE_DTYPE, Shape
from cupyconv.families import implicit_gemm_nhwc
from cupyconv.planner import NHWC_KERNEL
from plan_timing import TOLERANCE, rule_against_forced

SHAPES = [Shape(f"tcn_{c}_k3_d4_n{n}", n, c, c, 1, length, 1, 3, padding=(0, 4), dilation=(1, 4))
          for c, n, length in ((64, 16, 4096), (128, 16, 4096), (256, 4, 4096), (512, 16, 1024))] + \
    [s for s in CONV1D if s.name in ("tcn_256_k3_d4", "wavenet_64_k2_d8")]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", action="append", choices=sorted(TOLERANCE))
    args = parser.parse_args()
    print("| row | mode | rule's plan | in place | rule ms | forced tiles, ms (fastest first) |")
    print("| --- " * 6 + "|")
    for shape in SHAPES:
        for mode in args.dtype or ("fp16", "tf32"):
            problem = shape.problem(MODE_DTYPE[mode])
            tiles = {c.name: (NHWC_KERNEL, c.name) for c in implicit_gemm_nhwc.NHWC_CONFIGS[problem.dtype]
                     if not c.wgmma or c.name == implicit_gemm_nhwc.PIXEL_ROWS_CONFIG}
            plans, ms = rule_against_forced(problem, mode, tiles, (shape.name, mode))
            rule = plans["rule"]
            forced = ", ".join(f"{name.removeprefix('nhwc_')} {t:.4f}" for name, t in
                               sorted(ms.items(), key=lambda item: item[1]) if name != "rule")
            label = f"{rule.kernel} {rule.config.name if rule.config else ''}" + \
                (f" split {rule.splits}" if rule.splits > 1 else "")
            print(f"| {shape.name} | {mode} | {label} | {getattr(rule, 'a_from_nchw', False)} | {ms['rule']:.4f} | "
                  f"{forced} |", flush=True)


if __name__ == "__main__":
    main()
