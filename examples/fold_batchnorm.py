"""A convolution followed by an eval-mode BatchNorm, folded into one convolution with
cupyconv.fold_batchnorm, checked against the two steps (NumPy; CuPy when there is a GPU).

    python examples/fold_batchnorm.py
"""
import numpy as np

import cupyconv


def batch_norm(y, mean, var, gamma, beta, eps):
    """BatchNorm in eval mode over the channel axis of an NCHW array."""
    shape = (1, -1, 1, 1)
    return (y - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) * gamma.reshape(shape) + beta.reshape(shape)


def main() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 16, 28, 28))
    weight = rng.standard_normal((32, 16, 3, 3)) * 0.1
    mean, var = rng.standard_normal(32), rng.uniform(0.1, 2.0, 32)
    gamma, beta, eps = rng.standard_normal(32), rng.standard_normal(32), 1e-5

    two_steps = batch_norm(cupyconv.conv2d(x, weight, None, padding=1), mean, var, gamma, beta, eps)
    folded_weight, folded_bias = cupyconv.fold_batchnorm(weight, None, mean, var, gamma, beta, eps)
    one_step = cupyconv.conv2d(x, folded_weight, folded_bias, padding=1)
    print(f"NumPy float64: max |difference| {np.abs(one_step - two_steps).max():.2e}")

    try:
        import cupy

        has_gpu = cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CuPy, no driver or no device
        has_gpu = False
    if has_gpu:
        gpu = [cupy.asarray(a, dtype=cupy.float16) for a in (weight, mean, var, gamma, beta)]
        w16, b16 = cupyconv.fold_batchnorm(gpu[0], None, *gpu[1:], eps=eps)
        y16 = cupyconv.conv2d(cupy.asarray(x, dtype=cupy.float16), w16, b16, padding=1)
        error = np.abs(cupy.asnumpy(y16).astype(np.float64) - two_steps).max() / np.abs(two_steps).max()
        print(f"CuPy float16 on the GPU: relative error {error:.2e}")


if __name__ == "__main__":
    main()
