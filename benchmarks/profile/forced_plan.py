"""Run one layers-suite row a few times on a forced channels-last GEMM tile (for ncu):
    python3 benchmarks/profile/forced_plan.py ROW MODE LAYOUT CONFIG [SPLITS]
e.g. r50_l3_3x3_256 fp16 channels_last nhwc_wgmma_producer_m128n128_pair."""
import sys

import cupy

from cupyconv.bench import LARGE, LAYERS, MODE_DTYPE, SEEDS
from cupyconv.compiler import compute_capability
from cupyconv.launch import conv2d_cupy
from cupyconv.planner import NHWC_KERNEL, make_plan

row, mode, layout, config = sys.argv[1:5]
splits = int(sys.argv[5]) if len(sys.argv) > 5 else 1
shape = next(s for s in SEEDS + LAYERS + LARGE if s.name == row)
problem = shape.problem(MODE_DTYPE[mode], layout)
plan = make_plan(problem, config, NHWC_KERNEL, True, compute_capability(), splits=splits)
storage = cupy.float32 if problem.dtype == "float32" else cupy.float16
x = cupy.random.standard_normal(problem.x_array_shape, dtype=cupy.float32).astype(storage)
w = cupy.random.standard_normal(problem.weight_array_shape, dtype=cupy.float32).astype(storage)
out = cupy.empty(problem.out_array_shape, dtype=storage)
for _ in range(3):
    conv2d_cupy(x, w, None, problem, out, plan, allow_tf32=True)
cupy.cuda.Device().synchronize()
print(plan)
