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


@pytest.fixture
def strict_torch_fp32():
    """torch's float32 convolutions and matmuls in strict IEEE float32 (no TF32) for one test, restored
    afterwards: float32 references are exact to 1e-5, and cupyconv.torch follows the same switch."""
    torch = pytest.importorskip("torch")
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved
