"""A squeeze-and-excitation block's gate applied as the projection's input scale: conv(x * gate) in one
call with cupyconv.conv2d(..., input_scale=gate), checked against the multiply then the convolution
(NumPy; CuPy in channels-last float16 when there is a GPU, where the 1x1 kernel scales x as it loads it).
On the GPU the gate's own layers run too: 1x1 convolutions of the pooled one-pixel planes, each a
matrix-vector product per image in one launch (one_pixel_conv2d; its plan is printed).

    python examples/squeeze_excitation.py
"""
import numpy as np

import cupyconv


def main() -> None:
    rng = np.random.default_rng(0)
    n, c, squeezed, k, size = 8, 96, 24, 32, 14
    x = rng.standard_normal((n, c, size, size))
    reduce_w, reduce_b = rng.standard_normal((squeezed, c, 1, 1)) * 0.1, rng.standard_normal(squeezed)
    expand_w, expand_b = rng.standard_normal((c, squeezed, 1, 1)) * 0.1, rng.standard_normal(c)
    project_w = rng.standard_normal((k, c, 1, 1)) * 0.1

    # The gate: pool, reduce (SiLU), expand (sigmoid) -- (N, C) per image and channel.
    pooled = x.mean(axis=(2, 3), keepdims=True)
    hidden = cupyconv.conv2d(pooled, reduce_w, reduce_b, activation="silu")
    gate = cupyconv.conv2d(hidden, expand_w, expand_b, activation="sigmoid").reshape(n, c)

    two_steps = cupyconv.conv2d(x * gate[:, :, None, None], project_w)
    one_step = cupyconv.conv2d(x, project_w, input_scale=gate)
    print(f"NumPy float64: max |difference| {np.abs(one_step - two_steps).max():.2e}")
    assert np.allclose(one_step, two_steps, rtol=1e-12, atol=1e-12)

    try:
        import cupy

        has_gpu = cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CuPy, no driver or no device
        has_gpu = False
    if has_gpu:
        on_gpu = lambda a: cupy.asarray(a, dtype=cupy.float32)
        print(cupyconv.plan(on_gpu(pooled), on_gpu(reduce_w), on_gpu(reduce_b), activation="silu"))
        hidden32 = cupyconv.conv2d(on_gpu(pooled), on_gpu(reduce_w), on_gpu(reduce_b), activation="silu")
        gate32 = cupyconv.conv2d(hidden32, on_gpu(expand_w), on_gpu(expand_b), activation="sigmoid").reshape(n, c)
        gate_error = float(cupy.abs(gate32 - on_gpu(gate)).max())
        print(f"CuPy float32 gate on the GPU: max |difference| {gate_error:.2e}")
        assert gate_error < 1e-5
        x16 = cupy.asarray(x.transpose(0, 2, 3, 1), dtype=cupy.float16)          # NHWC
        w16 = cupy.asarray(project_w.transpose(0, 2, 3, 1), dtype=cupy.float16)  # KHWC
        g16 = cupy.asarray(gate, dtype=cupy.float16)
        print(cupyconv.plan(x16, w16, layout="NHWC", weight_layout="KHWC", input_scale=g16))
        y16 = cupyconv.conv2d(x16, w16, layout="NHWC", weight_layout="KHWC", input_scale=g16)
        y = cupy.asnumpy(y16).astype(np.float64).transpose(0, 3, 1, 2)
        print(f"CuPy float16 NHWC on the GPU: relative error {np.abs(y - two_steps).max() / np.abs(two_steps).max():.2e}")


if __name__ == "__main__":
    main()
