"""Training a small convolutional network with cupyconv alone: the forward pass by conv2d, the
backward by cupyconv.grad (input and weight gradients) and a sum for the bias, plain SGD. On the GPU
with CuPy when there is one, else on NumPy: CuPy 14 has no convolution of its own, forward or
backward.

    python examples/train_cupy.py

The task: learn a fixed random 3x3 "teacher" convolution (stride 2, then ReLU, then a 3x3
transposed convolution back to the input's size) from random images, by SGD with momentum: the
loss falls from about 10 to about 0.01 in 300 steps.
"""
import numpy as np

import cupyconv


def backend():
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            return cupy
    except Exception:  # no CuPy, no driver or no device
        pass
    return np


def main() -> None:
    xp = backend()
    rng = np.random.default_rng(0)
    conv = dict(stride=2, padding=1)
    up = dict(stride=2, padding=1, output_padding=1)
    shapes = {"w1": (16, 4, 3, 3), "b1": (16,), "w2": (16, 4, 3, 3), "b2": (4,)}  # w2: (C_in, C_out, kh, kw)
    teacher = {name: xp.asarray(rng.standard_normal(s).astype(np.float32) * 0.3) for name, s in shapes.items()}
    params = {name: xp.asarray(rng.standard_normal(s).astype(np.float32) * 0.3) for name, s in shapes.items()}

    def forward(p, x):
        h = cupyconv.conv2d(x, p["w1"], p["b1"], **conv)
        a = xp.maximum(h, 0)
        return h, a, cupyconv.conv_transpose2d(a, p["w2"], p["b2"], **up)

    lr, momentum, batch = 0.1, 0.9, 16 if xp is not np else 4
    velocity = {name: xp.zeros_like(p) for name, p in params.items()}
    for step in range(301):
        x = xp.asarray(rng.standard_normal((batch, 4, 16, 16)).astype(np.float32))
        target = forward(teacher, x)[2]
        h, a, y = forward(params, x)
        dy = 2 * (y - target) / y.size  # of the mean squared error
        # Backward of conv_transpose2d(a, w2): it is the input gradient of conv2d(y-shaped, w2), so
        # d a = conv2d(dy, w2) and d w2 = conv2d_weight(dy as the input, w2's shape, a as grad_output).
        grads = {"b2": dy.sum(axis=(0, 2, 3)),
                 "w2": cupyconv.grad.conv2d_weight(dy, shapes["w2"], a, **conv)}
        dh = cupyconv.conv2d(dy, params["w2"], **conv) * (h > 0)
        grads["b1"] = dh.sum(axis=(0, 2, 3))
        grads["w1"] = cupyconv.grad.conv2d_weight(x, shapes["w1"], dh, **conv)
        for name in params:  # SGD with momentum
            velocity[name] = momentum * velocity[name] + grads[name]
            params[name] -= lr * velocity[name]
        if step % 50 == 0:
            print(f"step {step:3d}  loss {float(((y - target) ** 2).mean()):.3e}")
    print(f"trained on {'the GPU (CuPy)' if xp is not np else 'the CPU (NumPy)'}")


if __name__ == "__main__":
    main()
