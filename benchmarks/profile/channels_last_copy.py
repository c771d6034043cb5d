"""Bandwidth of the channels-last copy every NCHW operand that is not read in place goes through
(kernels/nchw_to_nhwc.cu: nchw_to_nhwc_tiled, or _narrow for few channels), against a plain copy of the same bytes
(cupy.copyto), on the layers suite's activation shapes:
    PYTHONPATH=$repo python benchmarks/profile/channels_last_copy.py [float16 float32 ...]
GPU time as bench.py times rows (CUDA events behind a spin, alternating, medians); GB/s counts the bytes read and
written once each. The copy is checked against x.transpose(0, 2, 3, 1)."""
import sys

import cupy

from cupyconv.arguments import make_problem
from cupyconv.bench import alternating_ms
from cupyconv.executor import program_executable
from cupyconv.families.implicit_gemm_nhwc import channels_last_copy
from cupyconv.launch import run_program
from cupyconv.program import OUT, X, CallProgram, Pointer

#: (name, N, C, H, W): the inputs of the layers suite's slowest NCHW weight-gradient rows, large and small.
SHAPES = (("vgg_conv1_2", 32, 64, 224, 224), ("r50_l1_3x3_64", 32, 64, 56, 56), ("r50_l2_3x3_128", 32, 128, 28, 28),
          ("r50_l3_3x3_256", 32, 256, 14, 14), ("r50_l4_3x3_512", 32, 512, 7, 7))


def main(dtypes: list[str]) -> None:
    device = cupy.cuda.Device().id
    print("| shape | dtype | MB moved | channels-last copy ms | GB/s | plain copy ms | GB/s | ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for dtype in dtypes:
        for name, n, c, h, w in SHAPES:
            launch = channels_last_copy(dtype, n, c, h * w, c, False, Pointer(X), Pointer(OUT))
            problem = make_problem((n, c, h, w), (c, c, 1, 1), None, dtype)  # the program's operands by name
            exe = program_executable(lambda plan, p: CallProgram((launch,)), None, problem, device)
            x = cupy.random.standard_normal((n, c, h, w), dtype=cupy.float32).astype(dtype)
            y, z = cupy.full((n, h, w, c), cupy.nan, dtype=dtype), cupy.empty_like(x)
            times = alternating_ms({"channels_last": lambda: run_program(exe, x=x, out=y),
                                    "copy": lambda: cupy.copyto(z, x)})
            assert bool((y == x.transpose(0, 2, 3, 1)).all()), name
            moved = 2 * x.nbytes
            ms, plain = times["channels_last"][0], times["copy"][0]
            print(f"| {name} {n}x{c}x{h}x{w} | {dtype} | {moved / 1e6:.1f} | {ms:.4f} | {moved / ms / 1e6:.0f} | "
                  f"{plain:.4f} | {moved / plain / 1e6:.0f} | {ms / plain:.2f}x |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["float16", "float32"])
