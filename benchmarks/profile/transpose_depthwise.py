"""Strided depthwise input gradients: transpose_depthwise's one launch against the phase route (a depthwise
forward convolution a phase, windows and outputs copied), GPU time by CUDA events (median of --repeats after 3
warm-up runs), for the rule that picks between them.

    PYTHONPATH=$repo python benchmarks/profile/transpose_depthwise.py --dtype float16 --layout NHWC
"""
import argparse

from ab_layers import event_median_ms  # this folder: the scripts run as files
from cupyconv import conv_transpose, transpose_depthwise
from cupyconv.arguments import make_problem
from cupyconv.conv_transpose import input_gradient_problem, transposed
from transpose_few import random

# name: a forward depthwise conv's (x NCHW, kernel, stride, padding) whose input gradient it is.
PROBLEMS = {
    "mbv2_dw_3x3_96s2": ((32, 96, 112, 112), 3, 2, 1),
    "mbv2_dw_3x3_144s2": ((32, 144, 56, 56), 3, 2, 1),
    "mbv2_dw_3x3_576s2": ((32, 576, 14, 14), 3, 2, 1),
    "effb0_dw_5x5_240s2": ((32, 240, 28, 28), 5, 2, 2),
    "mbv2_dw_3x3_96s2_b1": ((1, 96, 112, 112), 3, 2, 1),
}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--layout", default="NHWC")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("names", nargs="*")
    args = parser.parse_args()
    pays = transpose_depthwise.pays
    for name in args.names or PROBLEMS:
        (n, c, h, w), kernel, stride, padding = PROBLEMS[name]
        nhwc = args.layout == "NHWC"
        p = make_problem((n, h, w, c) if nhwc else (n, c, h, w), (c, 1, kernel, kernel), None, args.dtype, stride,
                         padding, 1, c, args.layout, "KCHW")
        tp = input_gradient_problem(p)
        y = random((tp.n, tp.hy, tp.wy, tp.k) if nhwc else (tp.n, tp.k, tp.hy, tp.wy), args.dtype)
        weight = random((tp.k, 1, tp.kh, tp.kw), args.dtype)
        row = [f"{name:22s} {args.dtype} {args.layout}"]
        for route in ("depthwise", "phases"):
            transpose_depthwise.pays = (lambda tp: route == "depthwise")
            conv_transpose.transposed_executable.cache_clear()
            ms = event_median_ms(lambda: transposed(y, weight, None, tp, "cupy"), args.repeats, 3)
            row.append(f"{route} {ms:.3f} ms")
        transpose_depthwise.pays = pays
        print(" | ".join(row), flush=True)


if __name__ == "__main__":
    main()
