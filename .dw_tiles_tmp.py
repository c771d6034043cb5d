import dataclasses, math, sys
import cupy
sys.path.insert(0, "benchmarks/profile")
from ab_layers import event_median_ms
from cupyconv.bench import LARGE, LAYERS, MODE_DTYPE, bytes_moved
from cupyconv.launch import conv2d_cupy
from cupyconv.planner import make_plan
gbps = 3000.0
for shape in LAYERS + LARGE:
    if shape.groups != shape.c: continue
    for mode in ("fp16", "fp32"):
        problem = shape.problem(MODE_DTYPE[mode], "channels_last")
        dt = {"float16": cupy.float16, "float32": cupy.float32}[problem.dtype]
        x = cupy.random.standard_normal(problem.x_array_shape, dtype=cupy.float32).astype(dt)
        w = cupy.ones(problem.weight_array_shape, dtype=dt); out = cupy.empty(problem.out_array_shape, dtype=dt)
        floor = bytes_moved(problem) / gbps / 1e6
        plan = make_plan(problem)
        c = plan.config
        vb = c.block_vectors
        runs = math.ceil(problem.wo / c.pixels)
        res = []
        for tr, truns in ((1, 128 // vb), (2, 64 // vb), (4, 32 // vb), (128 // (4 * vb), 4), (128 // (2 * vb), 2), (128 // vb, 1)):
            if tr < 1 or truns < 1: continue
            cfg = dataclasses.replace(c, tile_rows=tr, tile_runs=truns)
            tiles = math.ceil(problem.ho / tr) * math.ceil(runs / truns)
            p = dataclasses.replace(plan, config=cfg, grid=(problem.n * tiles, plan.grid[1], 1), block=(vb, tr * truns, 1))
            ms = event_median_ms(lambda: conv2d_cupy(x, w, None, problem, out, plan=p))
            res.append(f"{tr}x{truns}:{ms:.4f}({100*floor/ms:.0f}%)")
        print(f"{shape.name:24s} {mode} {c.name} vb{vb} fixed {c.tile_rows}x{c.tile_runs}  " + " ".join(res), flush=True)
