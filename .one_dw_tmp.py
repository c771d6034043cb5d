import sys, cupy
from cupyconv.bench import LARGE, MODE_DTYPE
from cupyconv.launch import conv2d_cupy
from cupyconv.planner import make_plan
name, mode, config = sys.argv[1:4]
shape = next(s for s in LARGE if s.name == name)
problem = shape.problem(MODE_DTYPE[mode], "channels_last")
dt = {"float16": cupy.float16, "float32": cupy.float32, "bfloat16": cupy.int16}[problem.dtype]
x = cupy.random.standard_normal(problem.x_array_shape, dtype=cupy.float32).astype(cupy.float16).view(cupy.int16).astype(dt) if dt == cupy.int16 else cupy.random.standard_normal(problem.x_array_shape, dtype=cupy.float32).astype(dt)
w = cupy.ones(problem.weight_array_shape, dtype=dt); out = cupy.empty(problem.out_array_shape, dtype=dt)
plan = make_plan(problem, config, "depthwise_nhwc")
for _ in range(3): conv2d_cupy(x, w, None, problem, out, plan=plan)
cupy.cuda.Device().synchronize()
