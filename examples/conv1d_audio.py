"""conv1d for audio and sequence models: a wav2vec 2.0-style front end (one input channel, 10 taps at
stride 5, then a strided 3-tap layer, GELU in the epilogue) and a Conformer's depthwise layer (31 taps,
one channel per group, SiLU), on (N, C, L) arrays and on channels-last (N, L, C) ones.

    python examples/conv1d_audio.py

Runs on the GPU when there is one (CuPy, float16 too), else on NumPy (the same calls, smaller sizes).
A signal of length L is planned as a 1 x L image: cupyconv.plan on the 2-D view shows the kernel.
"""
import numpy as np

import cupyconv


def gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CuPy, no driver or no device
        return False


def layers(rng, channels: int) -> dict:
    """Weights (K, C / groups, k) of the three layers, scaled to keep activations near 1."""
    def weight(k, c, taps):
        return (rng.standard_normal((k, c, taps)) / np.sqrt(c * taps)).astype(np.float32)

    return {"wave": weight(channels, 1, 10), "strided": weight(channels, channels, 3),
            "depthwise": weight(channels, 1, 31)}


def forward(x, w: dict, layout: str = "NCL"):
    """The three layers in ``layout`` (weights given as (K, C / groups, k); KLC for NLC arrays)."""
    xp = np if isinstance(x, np.ndarray) else __import__("cupy")
    klc = layout == "NLC"
    arranged = {name: xp.ascontiguousarray(xp.asarray(a).transpose(0, 2, 1)) if klc else xp.asarray(a)
                for name, a in w.items()}
    args = dict(layout=layout, weight_layout="KLC" if klc else "KCL")
    h = cupyconv.conv1d(x, arranged["wave"], stride=5, activation="gelu", **args)
    h = cupyconv.conv1d(h, arranged["strided"], stride=2, activation="gelu", **args)
    channels = w["depthwise"].shape[0]
    return cupyconv.conv1d(h, arranged["depthwise"], padding=15, groups=channels, activation="silu", **args)


def relative_difference(a, b) -> float:
    a, b = (np.asarray(getattr(t, "get", lambda: t)(), dtype=np.float64) for t in (a, b))
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def main() -> None:
    rng = np.random.default_rng(0)
    gpu = gpu_available()
    batch, length, channels = (8, 16000, 512) if gpu else (2, 1600, 32)
    wave = rng.standard_normal((batch, 1, length), dtype=np.float32)
    w = layers(rng, channels)

    y_cpu = forward(wave, w)  # the NumPy path: (N, C, L) in, (N, C, Lo) out
    print(f"NumPy (CPU), NCL: {wave.shape} -> {y_cpu.shape}")
    y_nlc = forward(np.ascontiguousarray(wave.transpose(0, 2, 1)), w, "NLC")  # channels last: (N, L, C)
    print(f"NumPy (CPU), NLC: {y_nlc.shape}, relative difference from NCL "
          f"{relative_difference(y_nlc.transpose(0, 2, 1), y_cpu):.1e}")
    if not gpu:
        print("No CUDA GPU found: ran on NumPy only. Install with the cuda12 or cuda13 extra on a GPU machine.")
        return
    import cupy

    h = cupy.zeros((batch, channels, 1, 1599), cupy.float16)  # the depthwise layer's 2-D view
    print(cupyconv.plan(h, cupy.zeros((channels, 1, 1, 31), cupy.float16), padding=(0, 15), groups=channels,
                        activation="silu"))
    for dtype in (np.float32, np.float16):
        x = cupy.asarray(wave, dtype=dtype)
        wd = {name: a.astype(dtype) for name, a in w.items()}
        for layout, xin in (("NCL", x), ("NLC", cupy.ascontiguousarray(x.transpose(0, 2, 1)))):
            y = forward(xin, wd, layout)
            y = y.transpose(0, 2, 1) if layout == "NLC" else y
            print(f"GPU {np.dtype(dtype).name} {layout}: {y.shape}, relative difference from NumPy float32 "
                  f"{relative_difference(y, y_cpu):.1e}")


if __name__ == "__main__":
    main()
