"""Run suite rows a few times each, cupyconv and (--torch) torch's conv2d, for ncu:
    ncu --section SpeedOfLight ... python3 benchmarks/profile/rows.py fp16 channels_last r50_l1_1x1_256 ... [--torch]
        [--config=TILE ...]

Rows are named as in cupyconv/bench.py (SEEDS, LAYERS, LARGE); the mode is fp16, bf16, tf32 or fp32
(strict); channels_last passes NHWC arrays and a KHWC weight, as the layers suite does. --config=TILE
runs each row again on that channels-last GEMM tile, forced (three calls each)."""
import sys

import cupy

import cupyconv
from cupyconv.bench import LARGE, LAYERS, MODE_DTYPE, SEEDS


def main() -> None:
    mode, layout, *names = sys.argv[1:]
    with_torch = "--torch" in names
    configs = [n.split("=", 1)[1] for n in names if n.startswith("--config=")]
    names = [n for n in names if n != "--torch" and not n.startswith("--config=")]
    shapes = {s.name: s for s in SEEDS + LAYERS + LARGE}
    for name in names:
        shape = shapes[name]
        problem = shape.problem(MODE_DTYPE[mode], layout)
        dtype = cupy.float16 if mode == "fp16" else cupy.float32
        x = cupy.random.standard_normal(problem.x_array_shape, dtype=cupy.float32).astype(dtype)
        w = cupy.random.standard_normal(problem.weight_array_shape, dtype=cupy.float32).astype(dtype)
        nhwc = layout == "channels_last"
        kwargs = dict(stride=shape.stride, padding=shape.padding, dilation=shape.dilation, groups=shape.groups,
                      allow_tf32=mode == "tf32", layout="NHWC" if nhwc else "NCHW",
                      weight_layout="KHWC" if nhwc else "KCHW")
        prepared = cupyconv.prepare_weight(w)
        for _ in range(3):
            cupyconv.conv2d(x, prepared, None, **kwargs)
        for config in configs:  # the same problem on forced tiles, through the launch layer
            from cupyconv.launch import conv2d_cupy
            from cupyconv.planner import make_plan
            out = cupy.empty(problem.out_array_shape, dtype=dtype)
            plan = make_plan(problem, config, allow_tf32=True, compute_capability=90)
            for _ in range(3):
                conv2d_cupy(x, w, None, problem, out, plan, allow_tf32=True)
        if with_torch:
            import torch
            torch.backends.cudnn.allow_tf32 = mode == "tf32"
            tx = torch.from_dlpack(x)
            tw = torch.from_dlpack(w)
            if nhwc:  # the same memory as NCHW views in channels_last
                tx, tw = tx.permute(0, 3, 1, 2), tw.permute(0, 3, 1, 2)
            for _ in range(3):
                torch.nn.functional.conv2d(tx, tw, None, shape.stride, shape.padding, shape.dilation, shape.groups)
    cupy.cuda.Device().synchronize()


if __name__ == "__main__":
    main()
