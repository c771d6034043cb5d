"""Transposed convolutions of few output channels: transpose_few_channels' one launch against the phase route
(channels widened to 8, a GEMM a phase; --tf32: on the tensor cores), GPU time by CUDA events (median of --repeats after 3 warm-up runs), for the
rule that picks between them; ``--only few --repeats 1`` runs the kernel alone a few times (for ncu).

    PYTHONPATH=$repo python benchmarks/profile/transpose_few.py --dtype float16 --layout NHWC [--only few]
"""
import argparse
import cupy

from ab_layers import event_median_ms  # this folder: the scripts run as files
from cupyconv import conv_transpose, transpose_few_channels
from cupyconv.arguments import make_problem
from cupyconv.conv_transpose import input_gradient_problem, make_transpose_problem, transposed

# name: (y shape NCHW, c_out, kernel, stride, padding, output_padding) or a forward conv's (x NCHW, k, kernel,
# stride, padding) whose input gradient it is (marked "dgrad").
PROBLEMS = {
    "r50_stem_dgrad": ("dgrad", (32, 3, 224, 224), 64, 7, 2, 3),
    "r50_stem_dgrad_b8": ("dgrad", (8, 3, 224, 224), 64, 7, 2, 3),
    "stem_3x3s2_dgrad_k32": ("dgrad", (32, 3, 224, 224), 32, 3, 2, 1),
    "vgg_conv1_1_dgrad": ("dgrad", (16, 3, 224, 224), 64, 3, 1, 1),
    "dcgan_g5": ("transposed", (128, 64, 32, 32), 3, 4, 2, 1, 0),
    "k256_4x4s2": ("transposed", (32, 256, 64, 64), 3, 4, 2, 1, 0),
    "k512_7x7s2": ("dgrad", (16, 3, 224, 224), 512, 7, 2, 3),
}


def problem(name, dtype, layout):
    spec = PROBLEMS[name]
    nhwc = layout == "NHWC"
    if spec[0] == "dgrad":
        _, (n, c, h, w), k, kernel, stride, padding = spec
        p = make_problem((n, h, w, c) if nhwc else (n, c, h, w), (k, c, kernel, kernel), None, dtype, stride, padding,
                         1, 1, layout, "KCHW")
        return input_gradient_problem(p), False
    _, (n, c, h, w), c_out, kernel, stride, padding, extra = spec
    return make_transpose_problem((n, h, w, c) if nhwc else (n, c, h, w), (c, c_out, kernel, kernel), (c_out,), dtype,
                                  stride, padding, extra, 1, 1, layout, "KCHW"), True


def random(shape, dtype):
    """Normal values of ``dtype`` (bfloat16 as the int16 bits the kernels read)."""
    values = cupy.random.standard_normal(shape, dtype=cupy.float32)
    if dtype == "bfloat16":
        return (values.view(cupy.uint32) >> 16).astype(cupy.uint16).view(cupy.int16)
    return values.astype(dtype)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--layout", default="NHWC")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--only", choices=["few", "phases"])
    parser.add_argument("--tf32", action="store_true", help="float32 calls may take TF32 (the phase route's tensor cores)")
    parser.add_argument("names", nargs="*")
    args = parser.parse_args()
    pays = transpose_few_channels.pays
    for name in args.names or PROBLEMS:
        tp, has_bias = problem(name, args.dtype, args.layout)
        y = random((tp.n, tp.hy, tp.wy, tp.k) if args.layout == "NHWC" else (tp.n, tp.k, tp.hy, tp.wy), args.dtype)
        w = random((tp.k, tp.c, tp.kh, tp.kw), args.dtype)
        b = random((tp.c,), args.dtype) if has_bias else None
        row = [name]
        for route in ("few", "phases"):
            if args.only and route != args.only:
                continue
            transpose_few_channels.pays = (lambda tp: route == "few")
            conv_transpose.transposed_executable.cache_clear()
            ms = event_median_ms(lambda: transposed(y, w, b, tp, "cupy", allow_tf32=args.tf32), args.repeats, 3)
            row.append(f"{route} {ms:.3f} ms")
        transpose_few_channels.pays = pays
        print(" | ".join(row), flush=True)


if __name__ == "__main__":
    main()
