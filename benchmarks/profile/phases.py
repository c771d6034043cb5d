"""GPU time of every channels-last GEMM tile on the one-launch route of the transposed suite's rows
(implicit_gemm_nhwc_phases), in channels_last, to choose the route's tile rule:
    python benchmarks/profile/phases.py [fp16 bf16 tf32]
Median of 200 CUDA-event timings per tile after warm-up; * marks the fixed rule's tile. The route's
phase_weights launch is in every time, as in a call."""
import dataclasses
import pathlib
import sys

import cupy

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from ab_layers import event_median_ms  # noqa: E402
from cupyconv.bench import MODE_DTYPE  # noqa: E402
from cupyconv.bench_grad import TRANSPOSED  # noqa: E402
from cupyconv.compiler import compute_capability  # noqa: E402
from cupyconv.conv_transpose import TransposePlan, make_transpose_problem, phases, program, transpose_plan  # noqa: E402
from cupyconv.executor import program_executable  # noqa: E402
from cupyconv.families.implicit_gemm_nhwc import NHWC_CONFIGS, phases_plan  # noqa: E402
from cupyconv.launch import run_program  # noqa: E402


def main(modes: list[str]) -> None:
    cc, device = compute_capability(), cupy.cuda.Device().id
    for name, n, c_in, c_out, h, w, k, stride, padding, output_padding in TRANSPOSED:
        for mode in modes:
            dtype = MODE_DTYPE[mode]
            tp = make_transpose_problem((n, h, w, c_in), (c_in, k, k, c_out), (c_out,), dtype, stride, padding,
                                        output_padding, 1, 1, "NHWC", "KHWC")
            channels = max(tp.c, 8)
            fixed = transpose_plan(tp, mode == "tf32", cc, channels)
            if fixed.gemm is None:
                continue
            storage = {"float32": cupy.float32, "float16": cupy.float16, "bfloat16": cupy.int16}[dtype]
            y, weight = (cupy.random.standard_normal(shape, dtype=cupy.float32).astype(
                cupy.float32 if dtype == "float32" else cupy.float16).view(storage)
                for shape in ((n, h, w, c_in), (c_in, k, k, c_out)))
            bias = cupy.zeros(c_out, dtype=storage)
            out = cupy.empty(tp.out_array_shape, dtype=storage)
            tapped = tuple(dataclasses.replace(ph.problem, weight_layout="KHWC")
                           for ph in phases(dataclasses.replace(tp, c=channels)) if ph.problem)
            for cfg in NHWC_CONFIGS[dtype]:
                try:
                    gemm = phases_plan(tapped, cc, cfg.name, allow_tf32=True)
                except ValueError:
                    continue
                if gemm is None or gemm.config != cfg:  # a tile the launch has no instance of: another's
                    continue
                exe = program_executable(program, TransposePlan(channels, (), gemm), tp, device)
                ms = event_median_ms(lambda: run_program(exe, x=y, weight=weight, bias=bias, out=out))
                mark = " *" if cfg == fixed.gemm.config and gemm.splits == fixed.gemm.splits else "  "
                print(f"{name:28s} {mode} {cfg.name:24s}{mark} splits {gemm.splits:2d} {ms:.4f} ms", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["fp16"])
