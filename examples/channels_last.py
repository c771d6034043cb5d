"""Channels-last (NHWC) convolution: on CuPy arrays with layout="NHWC", and a torch model in
torch.channels_last through cupyconv.torch, where the tensor cores read and write NHWC in place.

    python examples/channels_last.py

Runs on the GPU when there is one (CuPy; torch optional), else on NumPy (the same call, same result).
"""
import numpy as np

import cupyconv


def gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CuPy, no driver or no device
        return False


def main() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 28, 28, 64), dtype=np.float32)     # (N, H, W, C)
    weight = rng.standard_normal((128, 3, 3, 64), dtype=np.float32) * 0.05  # (K, kh, kw, C)
    args = dict(padding=1, layout="NHWC", weight_layout="KHWC")

    y_cpu = cupyconv.conv2d(x, weight, **args)
    reference = cupyconv.conv2d(np.ascontiguousarray(x.transpose(0, 3, 1, 2)),
                                np.ascontiguousarray(weight.transpose(0, 3, 1, 2)), padding=1)
    assert np.allclose(y_cpu, reference.transpose(0, 2, 3, 1), rtol=1e-4, atol=1e-4)
    print(f"NumPy, NHWC: {x.shape} -> {y_cpu.shape} (N, Ho, Wo, K), equal to the NCHW result transposed")
    if not gpu_available():
        print("no GPU: the CuPy and torch parts are skipped")
        return

    import cupy

    xg, wg = cupy.asarray(x, dtype=cupy.float16), cupy.asarray(weight, dtype=cupy.float16)
    print(cupyconv.plan(xg, wg, **args))
    y = cupyconv.conv2d(xg, wg, **args)
    error = float(np.linalg.norm(cupy.asnumpy(y).astype(np.float64) - y_cpu) / np.linalg.norm(y_cpu))
    print(f"CuPy float16, NHWC in place: {y.shape}, relative error {error:.1e} against float32")

    try:
        import torch
    except ImportError:
        print("no torch: the model part is skipped")
        return
    from cupyconv.torch import convert

    model = torch.nn.Sequential(torch.nn.Conv2d(64, 128, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(128, 128, 3, padding=1, groups=128))
    model = model.cuda().half().eval().to(memory_format=torch.channels_last)
    images = torch.randn(8, 64, 28, 28, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    with torch.no_grad():
        expected = model(images)
        out = convert(model)(images)
    print(f"torch channels_last model: output channels_last {out.is_contiguous(memory_format=torch.channels_last)}, "
          f"max difference from torch {float((out - expected).abs().max()):.2e}")


if __name__ == "__main__":
    main()
