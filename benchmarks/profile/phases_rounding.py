"""What rounding y to TF32 in the phase launch costs (implicit_gemm_nhwc_phases' ROUND_A, in shared memory on
its wgmma tiles): GPU time of each TF32 row of the transposed suite on the one-launch route as planned, and with
the launch's ROUND_A instance swapped for the unrounding one (timing only: its sums are not TF32's):
    python benchmarks/profile/phases_rounding.py [NHWC NCHW]
Median of 200 CUDA-event timings after warm-up, the whole program (phase_weights, transposes) in each."""
import dataclasses
import pathlib
import sys

import cupy

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from ab_layers import event_median_ms  # noqa: E402
from cupyconv.bench_grad import TRANSPOSED  # noqa: E402
from cupyconv.compiler import compute_capability  # noqa: E402
from cupyconv.conv_transpose import make_transpose_problem, program, transpose_plan  # noqa: E402
from cupyconv.executor import program_executable  # noqa: E402
from cupyconv.families.implicit_gemm_nhwc import PHASES_KERNEL  # noqa: E402
from cupyconv.launch import run_program  # noqa: E402


def unrounded(plan, tp):
    """``program(plan, tp)`` with the phase launch's ROUND_A flag (its second last) false."""
    call = program(plan, tp)

    def swapped(launch):
        if launch.kernel != PHASES_KERNEL:
            return launch
        flags = launch.name_expression.rstrip(">").split(",")
        return dataclasses.replace(launch, name_expression=",".join(flags[:-2] + ["false", flags[-1]]) + ">")

    return dataclasses.replace(call, launches=tuple(swapped(launch) for launch in call.launches))


def main(layouts: list[str]) -> None:
    cc, device = compute_capability(), cupy.cuda.Device().id
    for layout in layouts:
        for name, n, c_in, c_out, h, w, k, stride, padding, output_padding in TRANSPOSED:
            y_shape = (n, h, w, c_in) if layout == "NHWC" else (n, c_in, h, w)
            tp = make_transpose_problem(y_shape, (c_in, c_out, k, k), (c_out,), "float32", stride, padding,
                                        output_padding, 1, 1, layout)
            plan = transpose_plan(tp, True, cc, max(tp.c, 8))
            if plan.gemm is None:
                continue
            y = cupy.random.standard_normal(y_shape, dtype=cupy.float32)
            weight = cupy.random.standard_normal((c_in, c_out, k, k), dtype=cupy.float32)
            bias = cupy.zeros(c_out, dtype=cupy.float32)
            out = cupy.empty(tp.out_array_shape, dtype=cupy.float32)
            times = []
            for make in (program, unrounded):
                exe = program_executable(make, plan, tp, device)
                times.append(event_median_ms(lambda: run_program(exe, x=y, weight=weight, bias=bias, out=out)))
            print(f"{name:28s} {layout} {plan.gemm.config.name:28s} rounded {times[0]:.4f} ms, unrounded "
                  f"{times[1]:.4f} ms ({times[0] / times[1]:.2f}x)", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["NHWC", "NCHW"])
