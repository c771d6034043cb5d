"""The squeeze-excitation pooling on the GPU (cupyconv/pooling.py, kernels/mean_pixels.cu): the mean
over each image's pixels of channels_last tensors against torch in float64, into NaN-poisoned outputs,
bitwise the same run after run; and the fused module's use of it."""
import pytest

from checks import relative_error
from devices import gpu_count

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_count(), reason="needs a CUDA GPU (cupy finds none)")]
torch = pytest.importorskip("torch", reason="the GPU tests compare with torch")

from cupyconv import pooling  # noqa: E402
from cupyconv.torch import _launch  # noqa: E402
from cupyconv.torch_fusion import _mean_pixels  # noqa: E402

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
TOLERANCE = {"float16": 2e-3, "bfloat16": 1e-2, "float32": 1e-5}
SHAPES = [(32, 32, 112, 112), (32, 1152, 7, 7), (1, 96, 56, 56), (3, 20, 5, 7), (2, 6, 3, 3), (4, 2000, 8, 8)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_mean_pixels_against_float64(shape, dtype):
    n, c, h, w = shape
    torch.manual_seed(sum(shape))
    x = (torch.randn(shape, device="cuda", dtype=torch.float64) + 0.5).to(DTYPES[dtype]).to(
        memory_format=torch.channels_last)
    exe = pooling.executable(n, c, h * w, dtype, 0)
    outs = []
    for _ in range(2):
        out = torch.full((n, c), float("nan"), device="cuda", dtype=x.dtype)
        _launch(exe, 0, x=x, out=out)
        outs.append(out)
    torch.cuda.synchronize()
    ref = x.double().mean((2, 3))
    assert not outs[0].isnan().any() and relative_error(outs[0], ref) < TOLERANCE[dtype]
    assert torch.equal(outs[0], outs[1]), "not deterministic"


def test_fused_pooling_takes_the_kernel_for_channels_last_alone():
    x = torch.randn(4, 64, 9, 9, device="cuda", dtype=torch.float16)
    cl = x.to(memory_format=torch.channels_last)
    with torch.no_grad():
        ours = _mean_pixels(cl)
        assert ours.shape == (4, 64, 1, 1)
        assert relative_error(ours, x.double().mean((2, 3), keepdim=True)) < 2e-3
        torch.testing.assert_close(_mean_pixels(x), torch.nn.functional.adaptive_avg_pool2d(x, 1), rtol=0, atol=0)
    grad = cl.clone().requires_grad_()
    _mean_pixels(grad).sum().backward()  # torch's pooling where autograd records
    torch.testing.assert_close(grad.grad, torch.full_like(grad, 1 / 81))
