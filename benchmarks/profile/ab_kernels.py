"""GPU time of each launch of a call's program, one by one (run it once per tree to A/B kernels):
    python benchmarks/profile/ab_kernels.py LABEL
Median of 200 CUDA-event timings per launch after warm-up."""
import pathlib
import sys

import cupy

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from ab_layers import event_median_ms  # noqa: E402
from cupyconv.bench import LAYERS, MODE_DTYPE, SEEDS
from cupyconv.executor import addresses, executable
from cupyconv.program import align

ROWS = ("r50_l4_3x3_512", "vgg_conv3_2", "r50_l1_3x3_64")


def main(label: str) -> None:
    for shape in SEEDS + LAYERS:
        if shape.name not in ROWS:
            continue
        problem = shape.problem(MODE_DTYPE["fp16"])
        exe = executable(problem, True, 0)
        buffers = [cupy.empty(n, dtype=cupy.uint8) for n in (
            problem.n * problem.c * problem.h * problem.w * 2, problem.k * problem.c * problem.kh * problem.kw * 2,
            align(exe.weight.nbytes) if exe.weight else 256, problem.k * 2, problem.n * problem.k * problem.ho * problem.wo * 2,
            max(256, exe.workspace_bytes))]
        for b in buffers[:2]:
            b.view(cupy.float16)[...] = cupy.random.standard_normal(b.size // 2).astype(cupy.float16)
        operands = addresses(*(b.data.ptr for b in buffers))
        stream = cupy.cuda.get_current_stream().ptr
        for name, launch in [("weight", l) for l in exe._weight_launches] + [("call", l) for l in exe._launches]:
            ms = event_median_ms(lambda: launch(operands, stream))
            print(f"{label} {shape.name:16s} {name:6s} grid {launch.launch_shape[:3]} {ms:.4f} ms", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
