"""Layers of one input channel per group that are not depthwise layers of 2-D planes, timed on every
kernel that can run them, in one process: conv1d's height-1 problems (a wav2vec 2.0 front end of one
input channel, a Conformer depthwise layer) and 2-D layers of one input channel and many output ones
(grayscale first layers), on the rules' plan, the depthwise kernels' tiles (NCHW and NHWC), the
channels-last and NCHW-gather GEMMs (the latter on each of its tiles, in its NHWC instance on NHWC arrays)
and the direct kernel.
    python benchmarks/profile/one_channel.py [--dtype fp16 ...] [--layout nchw ...]
Medians of 50 runs each behind a spin kernel, interleaved; every plan checked against the rules' one."""
import argparse

from cupyconv.arguments import make_problem
from cupyconv.bench import MODE_DTYPE
from cupyconv.families.depthwise_nhwc import RUN_CONFIGS
from cupyconv.planner import DEPTHWISE_KERNEL, DEPTHWISE_NHWC_KERNEL, DIRECT_KERNEL, NHWC_KERNEL
from plan_timing import GEMM_TILES, TOLERANCE, gemm_tiles, rule_against_forced

#: name -> (x shape NCHW, weight shape, stride, padding, groups)
LAYERS = {
    "w2v_conv0_1to512_k10s5": ((8, 1, 1, 16000), (512, 1, 1, 10), (1, 5), 0, 1),
    "conformer_dw_512_k31": ((16, 512, 1, 1000), (512, 1, 1, 31), 1, (0, 15), 512),
    "dw1d_768_k15": ((8, 768, 1, 2048), (768, 1, 1, 15), 1, (0, 7), 768),
    "gray_1to32_3x3_224sq": ((32, 1, 224, 224), (32, 1, 3, 3), 1, 1, 1),
    "gray_1to64_7x7s2_224sq": ((32, 1, 224, 224), (64, 1, 7, 7), 2, 3, 1),
    "mnist_1to32_5x5_28sq": ((128, 1, 28, 28), (32, 1, 5, 5), 1, 2, 1),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", action="append", choices=sorted(TOLERANCE))
    parser.add_argument("--layout", action="append", choices=("nchw", "channels_last"))
    parser.add_argument("--layer", action="append", help="rows whose name contains this (default: all)")
    args = parser.parse_args()
    fixed = {"dw_32x32": (DEPTHWISE_KERNEL, "dw_32x32"), "dw_1x256": (DEPTHWISE_KERNEL, "dw_1x256"),
              "dw_1x1024_r8": (DEPTHWISE_KERNEL, "dw_1x1024_r8"),
              **{c: (DEPTHWISE_NHWC_KERNEL, c) for c in ("dw_nhwc_v16", *(r.name for r in RUN_CONFIGS))},
              "gemm": (NHWC_KERNEL, None),
              "direct": (DIRECT_KERNEL, None)}
    columns = [*fixed, *(f"gemm_nchw {tile}" for tile in GEMM_TILES)]
    print("| layer | mode | layout | rule's plan | rule ms |" + "".join(f" {k} ms |" for k in columns))
    print("| --- " * (5 + len(columns)) + "|")
    for name, (x_shape, w_shape, stride, padding, groups) in LAYERS.items():
        if args.layer and not any(part in name for part in args.layer):
            continue
        for mode in args.dtype or ("fp16", "bf16", "tf32"):
            for layout in args.layout or ("nchw", "channels_last"):
                nhwc = layout == "channels_last"
                shape = (x_shape[0], x_shape[2], x_shape[3], x_shape[1]) if nhwc else x_shape
                problem = make_problem(shape, w_shape, None, MODE_DTYPE[mode], stride, padding, 1, groups,
                                       "NHWC" if nhwc else "NCHW")
                plans, ms = rule_against_forced(problem, mode, {**fixed, **gemm_tiles(MODE_DTYPE[mode])},
                                                (name, mode, layout))
                rule = plans["rule"]
                print(f"| {name} | {mode} | {layout} | {rule.kernel} {getattr(rule.config, 'name', '')} | "
                      f"{ms['rule']:.4f} |" + "".join(f" {ms[k]:.4f} |" if k in ms else " - |" for k in columns),
                      flush=True)


if __name__ == "__main__":
    main()
