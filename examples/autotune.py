"""Autotuning: with cupyconv.autotune(True), the first GPU call of each problem times the plans the
planner allows for it and keeps the fastest, in memory and in a cache file that later runs read (as
torch.backends.cudnn.benchmark does for cuDNN's algorithms).

    python examples/autotune.py        # CUPYCONV_AUTOTUNE=1 switches it on for any program

For a few layers it prints what the fixed rules chose, tunes (on the first call), prints what tuning
picked, compares the two results and times both. Run it twice: the second run reads the winners from
the cache file and times nothing. Without a GPU it says so and exits: NumPy calls are never tuned.
"""
import time

import numpy as np

import cupyconv
from cupyconv import tuning_cache

# (name, x shape, weight shape, dtype, padding, groups)
LAYERS = [
    ("ResNet-50 3x3 of 512 channels, batch 1, float16", (1, 512, 7, 7), (512, 512, 3, 3), "float16", 1, 1),
    ("VGG-16 3x3 of 256 channels, batch 8, strict float32", (8, 256, 56, 56), (256, 256, 3, 3), "float32", 1, 1),
    ("MobileNetV2 3x3 depthwise, batch 32, float32", (32, 144, 56, 56), (144, 1, 3, 3), "float32", 1, 144),
]


def gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CuPy, no driver or no device
        return False


def per_call_ms(call, repeats: int = 20) -> float:
    """Wall time per call of ``call`` in a loop, after one call of warm-up, as a model's loop sees it."""
    import cupy

    call()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(repeats):
        call()
    end.record()
    end.synchronize()
    return cupy.cuda.get_elapsed_time(start, end) / repeats


def main() -> None:
    if not gpu_available():
        name, x_shape, w_shape, dtype, padding, groups = LAYERS[0]
        plan = cupyconv.plan(np.empty(x_shape, dtype), np.empty(w_shape, dtype), padding=padding, groups=groups)
        print(f"No CUDA GPU found: nothing to tune (NumPy calls run on the CPU; {name}: tuned {plan.tuning}).")
        return
    import cupy

    print(f"winners are cached in {tuning_cache.path()}\n")
    previous = cupyconv.autotune()
    for name, x_shape, w_shape, dtype, padding, groups in LAYERS:
        x = cupy.random.standard_normal(x_shape, dtype=cupy.float32).astype(dtype)
        w = (cupy.random.standard_normal(w_shape, dtype=cupy.float32) * 0.05).astype(dtype)

        def conv():
            return cupyconv.conv2d(x, w, padding=padding, groups=groups)

        cupyconv.autotune(False)
        fixed = cupyconv.plan(x, w, padding=padding, groups=groups)
        untuned, untuned_ms = conv(), per_call_ms(conv)

        cupyconv.autotune(True)
        began = time.perf_counter()
        tuned = conv()  # the first call of the problem tunes it (or reads the cache file)
        cupy.cuda.get_current_stream().synchronize()
        first_ms = 1e3 * (time.perf_counter() - began)
        plan = cupyconv.plan(x, w, padding=padding, groups=groups)  # the cached winner: nothing timed again
        tuned_ms = per_call_ms(conv)

        as64 = lambda a: a.astype(cupy.float64)  # noqa: E731
        difference = float(cupy.linalg.norm(as64(tuned) - as64(untuned)) / cupy.linalg.norm(as64(untuned)))
        print(f"{name}\n  fixed rules: {fixed.kernel} {fixed.config.name}\n  tuned: {plan.tuning}\n"
              f"  first call {first_ms:.0f} ms (tuning included); per call {untuned_ms:.3f} ms untuned, "
              f"{tuned_ms:.3f} ms tuned; relative difference of the results {difference:.1e}\n")
    cupyconv.autotune(previous)


if __name__ == "__main__":
    main()
