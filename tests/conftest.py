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


@pytest.fixture
def nchw_a_wgmma(monkeypatch):
    """1x1 NCHW layers read in place on wgmma's pixel-row tile (families/implicit_gemm_nhwc.py
    NCHW_A_WGMMA, off by default) switched on for one test, the plan caches and the fronts' checked
    call signatures (which hold executables) emptied before and after so that no plan made under the
    switch outlives it."""
    from cupyconv import executor, planner, tuning
    from cupyconv.families import implicit_gemm_nhwc

    def clear():
        planner.make_plan.cache_clear()
        executor._fixed_rules_executable.cache_clear()
        for calls in tuning._SIGNATURE_CACHES:
            calls.clear()

    clear()
    monkeypatch.setattr(implicit_gemm_nhwc, "NCHW_A_WGMMA", True)
    yield
    clear()
