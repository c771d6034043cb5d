"""cupyconv in a few lines: AlexNet's first layer, a MobileNet depthwise layer and a prepared weight,
on the GPU when there is one, else on NumPy.

    python examples/quickstart.py
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
    batch = 8 if gpu_available() else 2
    x = rng.standard_normal((batch, 3, 224, 224), dtype=np.float32)
    weight = rng.standard_normal((96, 3, 11, 11), dtype=np.float32) * 0.05
    bias = rng.standard_normal(96, dtype=np.float32)

    # The NumPy path: same call, same result, on the CPU.
    y_cpu = cupyconv.conv2d(x, weight, bias, stride=4, padding=2)
    print(f"NumPy (CPU): {x.shape} -> {y_cpu.shape}")

    if not gpu_available():
        print("No CUDA GPU found: ran on NumPy only. Install with the cuda12 or cuda13 extra on a GPU machine.")
        return
    import cupy

    xg, wg, bg = (cupy.asarray(a) for a in (x, weight, bias))
    print(cupyconv.plan(xg, wg, bg, stride=4, padding=2))  # which kernel runs, and why
    y_gpu = cupyconv.conv2d(xg, wg, bg, stride=4, padding=2)
    error = float(np.linalg.norm(cupy.asnumpy(y_gpu) - y_cpu) / np.linalg.norm(y_cpu))
    print(f"GPU ({cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}): {y_gpu.shape}, "
          f"relative difference from NumPy {error:.1e}")

    # A depthwise layer (groups == channels) on 14 x 14 planes: the plan names the small-plane kernel.
    xd = rng.standard_normal((4, 384, 14, 14), dtype=np.float32)
    wd = rng.standard_normal((384, 1, 3, 3), dtype=np.float32)
    print(cupyconv.plan(cupy.asarray(xd), cupy.asarray(wd), padding=1, groups=384))
    yd = cupyconv.conv2d(cupy.asarray(xd), cupy.asarray(wd), padding=1, groups=384)
    yd_cpu = cupyconv.conv2d(xd, wd, padding=1, groups=384)
    error = float(np.linalg.norm(cupy.asnumpy(yd) - yd_cpu) / np.linalg.norm(yd_cpu))
    print(f"depthwise {xd.shape} -> {yd.shape}, relative difference from NumPy {error:.1e}")

    # A loop over batches: prepare the weight once (AlexNet's conv1 runs on Winograd in strict float32,
    # which reads a transformed weight), and the transform is made on the first call only.
    prepared = cupyconv.prepare_weight(wg)
    for step in range(3):
        y_step = cupyconv.conv2d(cupy.asarray(x[::-1]) if step % 2 else xg, prepared, bg, stride=4, padding=2)
    wg *= 0.5  # an in-place change of the weight: CuPy arrays have no version counter, so say so
    prepared.refresh()
    y_half = cupyconv.conv2d(xg, prepared, bg, stride=4, padding=2)
    expected = cupyconv.conv2d(x, weight * 0.5, bias, stride=4, padding=2)
    error = float(np.linalg.norm(cupy.asnumpy(y_half) - expected) / np.linalg.norm(expected))
    print(f"prepared weight, after refresh(): relative difference from NumPy {error:.1e} ({y_step.shape})")


if __name__ == "__main__":
    main()
