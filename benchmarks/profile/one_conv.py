"""Run one convolution a few times (for ncu): python3 benchmarks/profile/one_conv.py alexnet|wide|dw384|r50_l3 fp32|tf32|float16

The two seeds, MobileNetV2's 14 x 14 depthwise layer or ResNet-50's 3x3 of 256 channels on 14 x 14,
at batch 32. fp32 is strict float32, tf32 float32 on the tensor cores."""
import sys

import cupy

import cupyconv

SHAPES = {"alexnet": ((256, 3, 224, 224), (96, 3, 11, 11), 4, 2), "wide": ((8, 32, 512, 512), (64, 32, 5, 9), 1, 0),
          "dw384": ((32, 384, 14, 14), (384, 1, 3, 3), 1, 1), "r50_l3": ((32, 256, 14, 14), (256, 256, 3, 3), 1, 1)}
shape, mode = sys.argv[1], sys.argv[2]
xs, ws, stride, padding = SHAPES[shape]
dtype = cupy.float16 if mode == "float16" else cupy.float32
x = cupy.random.standard_normal(xs, dtype=cupy.float32).astype(dtype)
w = cupy.random.standard_normal(ws, dtype=cupy.float32).astype(dtype)
for _ in range(3):
    cupyconv.conv2d(x, w, None, stride, padding, groups=xs[1] if ws[1] == 1 else 1, allow_tf32=mode == "tf32")
cupy.cuda.Device().synchronize()
