"""GPU time of every depthwise_nhwc config on the depthwise rows of the layers and large suites, or
(--effnet) on EfficientNet-B0's depthwise layers at batch 32, in channels_last (to choose the fixed
rule's pixels per run; --only TEXT: the fixed rule's config and those whose names hold TEXT):
    python benchmarks/profile/dw_nhwc.py [--effnet] [--only down] [fp16 fp32 ...]
Median of 200 CUDA-event timings per config after warm-up, with the copy bandwidth's time beside."""
import pathlib
import sys

import cupy

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from ab_layers import event_median_ms  # noqa: E402
from cupyconv.bench import LARGE, LAYERS, MODE_DTYPE, Shape, bytes_moved  # noqa: E402
from cupyconv.families.depthwise_nhwc import CONFIG_NAMES  # noqa: E402
from cupyconv.launch import conv2d_cupy  # noqa: E402
from cupyconv.planner import DEPTHWISE_NHWC_KERNEL, make_plan  # noqa: E402

DTYPES = {"float16": cupy.float16, "bfloat16": cupy.int16, "float32": cupy.float32}
#: EfficientNet-B0's depthwise layers at batch 32: (channels, plane, kernel, stride).
EFFNET_ROWS = tuple(Shape(f"effnet_dw_{c}_{h}sq_k{k}s{s}", 32, c, c, h, h, k, k, stride=s, padding=k // 2, groups=c)
                    for c, h, k, s in ((32, 112, 3, 1), (96, 112, 3, 2), (144, 56, 3, 1), (144, 56, 5, 2),
                                       (240, 28, 5, 1), (240, 28, 3, 2), (480, 14, 3, 1), (480, 14, 5, 1),
                                       (672, 14, 5, 1), (672, 14, 5, 2), (1152, 7, 5, 1), (1152, 7, 3, 1)))


def main(modes: list[str], shapes, only: str = "") -> None:
    src = cupy.empty(2**28, dtype=cupy.float32)
    dst = cupy.empty_like(src)
    gbps = 2 * src.nbytes / event_median_ms(lambda: dst.__setitem__(Ellipsis, src), 20) / 1e6
    print(f"copy bandwidth {gbps:.0f} GB/s")
    for shape in shapes:
        if shape.groups != shape.c:
            continue
        for mode in modes:
            problem = shape.problem(MODE_DTYPE[mode], "channels_last")
            dtype = DTYPES[problem.dtype]
            x = cupy.random.standard_normal(problem.x_array_shape, dtype=cupy.float32)
            x = (x.view(cupy.uint32) >> 16).astype(cupy.uint16).view(dtype) if dtype == cupy.int16 else x.astype(dtype)
            w = cupy.ones(problem.weight_array_shape, dtype=dtype)
            out = cupy.empty(problem.out_array_shape, dtype=dtype)
            floor_ms = bytes_moved(problem) / gbps / 1e6
            fixed = make_plan(problem).config.name
            for config in sorted(CONFIG_NAMES):
                if only and only not in config and config != fixed:
                    continue
                try:
                    plan = make_plan(problem, config, DEPTHWISE_NHWC_KERNEL)
                except ValueError:
                    continue
                ms = event_median_ms(lambda: conv2d_cupy(x, w, None, problem, out, plan=plan))
                print(f"{shape.name:26s} {mode} {config:18s}{' *' if config == fixed else '  '} {ms:.4f} ms "
                      f"{100 * floor_ms / ms:3.0f}% of copy", flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    only = args.pop(args.index("--only") + 1) if "--only" in args else ""
    modes = [a for a in args if a not in ("--effnet", "--only")] or ["fp16", "bf16", "fp32"]
    main(modes, EFFNET_ROWS if "--effnet" in args else LAYERS + LARGE, only)
