"""How many CUDA GPUs this machine has (0 without CuPy, a driver or a device)."""


def gpu_count() -> int:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no CuPy, no driver or no device: all mean "no GPU here"
        return 0
