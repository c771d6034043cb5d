"""GPU tests carry the `gpu` marker and are skipped, with the reason, where no CUDA device is present."""
import pytest

from devices import gpu_count


def pytest_collection_modifyitems(config, items):
    if gpu_count():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none found (cupy.cuda.runtime.getDeviceCount)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
