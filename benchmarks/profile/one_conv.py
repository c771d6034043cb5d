"""Run one convolution a few times (for ncu):
    python3 benchmarks/profile/one_conv.py SHAPE fp32|tf32|float16 [nchw|nhwc [CONFIG]]

SHAPE: the two seeds (alexnet, wide), MobileNetV2's 14 x 14 depthwise layer (dw384) or ResNet-50's 3x3 of
256 channels on 14 x 14 (r50_l3) at batch 32; EfficientNet-B0's stem (stem: 3 -> 32 3x3 s2 on 224^2,
batch 32); wav2vec 2.0's first layer (w2v: 1 -> 512, k10 s5, batch 8) and a Conformer depthwise layer
(conformer_dw: 512 channels, k31, batch 16) as conv1d runs them; ResNet-50's 1x1 layers of 1024 -> 256 on 14 x 14
and 256 -> 128 on 56 x 56 and 256 -> 1024 on 14 x 14 and 2048 -> 512 on 7 x 7 at batch 32 (r50_1x1_1024to256,
r50_1x1_256to128, r50_1x1_256to1024, r50_1x1_2048to512). fp32 is strict float32, tf32 float32 on the tensor cores; nhwc runs on NHWC arrays
(default nchw); CONFIG forces a tile of the channels-last GEMM (implicit_gemm_nhwc's config names)."""
import sys

import cupy

import cupyconv

#: name -> (x NCHW, weight, stride, padding)
SHAPES = {"alexnet": ((256, 3, 224, 224), (96, 3, 11, 11), 4, 2), "wide": ((8, 32, 512, 512), (64, 32, 5, 9), 1, 0),
          "dw384": ((32, 384, 14, 14), (384, 1, 3, 3), 1, 1), "r50_l3": ((32, 256, 14, 14), (256, 256, 3, 3), 1, 1),
          "stem": ((32, 3, 224, 224), (32, 3, 3, 3), 2, 1), "w2v": ((8, 1, 1, 16000), (512, 1, 1, 10), (1, 5), 0),
          "conformer_dw": ((16, 512, 1, 1000), (512, 1, 1, 31), 1, (0, 15)),
          "r50_1x1_1024to256": ((32, 1024, 14, 14), (256, 1024, 1, 1), 1, 0),
          "r50_1x1_256to128": ((32, 256, 56, 56), (128, 256, 1, 1), 1, 0),
          "r50_1x1_256to1024": ((32, 256, 14, 14), (1024, 256, 1, 1), 1, 0),
          "r50_1x1_2048to512": ((32, 2048, 7, 7), (512, 2048, 1, 1), 1, 0)}
shape, mode = sys.argv[1], sys.argv[2]
layout = sys.argv[3].upper() if len(sys.argv) > 3 else "NCHW"
xs, ws, stride, padding = SHAPES[shape]
if layout == "NHWC":
    xs = (xs[0], xs[2], xs[3], xs[1])
dtype = cupy.float16 if mode == "float16" else cupy.float32
x = cupy.random.standard_normal(xs, dtype=cupy.float32).astype(dtype)
w = cupy.random.standard_normal(ws, dtype=cupy.float32).astype(dtype)
groups = xs[-1 if layout == "NHWC" else 1] if ws[1] == 1 and ws[0] > 1 and shape in ("dw384", "conformer_dw") else 1
if len(sys.argv) > 4:  # the tile forced: the planner's plan for it, run through the launch path tests use
    from cupyconv.arguments import make_problem
    from cupyconv.compiler import compute_capability
    from cupyconv.launch import conv2d_cupy
    from cupyconv.planner import NHWC_KERNEL, make_plan

    problem = make_problem(x.shape, w.shape, None, x.dtype.name, stride, padding, groups=groups, layout=layout)
    plan = make_plan(problem, config=sys.argv[4], kernel=NHWC_KERNEL, allow_tf32=mode == "tf32",
                     compute_capability=compute_capability())
    out = cupy.empty(problem.out_array_shape, dtype)
    for _ in range(3):
        conv2d_cupy(x, w, None, problem, out, plan=plan, allow_tf32=mode == "tf32")
else:
    for _ in range(3):
        cupyconv.conv2d(x, w, None, stride, padding, groups=groups, allow_tf32=mode == "tf32", layout=layout)
    plan = cupyconv.plan(x, w, None, stride, padding, groups=groups, allow_tf32=mode == "tf32", layout=layout)
cupy.cuda.Device().synchronize()
print(plan)
