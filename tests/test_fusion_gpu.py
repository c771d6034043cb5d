"""The fused epilogue through the torch adapter on the GPU: conv2d(..., activation=, residual=) on
torch tensors in both memory formats, and convert(model, fuse=True) on torchvision's ResNet-50,
MobileNetV2 and EfficientNet-B0 (every convolution fused), in CUDA graphs (refolded in place after
load_state_dict) and under torch.compile. Outputs are NaN-poisoned before every launch (the
launches fixture) and checked against float64.
"""
import copy

import pytest

from checks import relative_error

torch = pytest.importorskip("torch", reason="the adapter needs torch")
import torch.nn.functional as F  # noqa: E402

from test_fusion_cpu import MODELS, _randomise  # noqa: E402  (tests/ is on sys.path through conftest.py)
from test_torch_cpu import _torch_epilogue  # noqa: E402
from test_torch_gpu import capture, check_against_torch, launches  # noqa: E402,F401  (launches: autouse fixture)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
              pytest.mark.usefixtures("strict_torch_fp32")]

ACTIVATIONS = [None, "relu", "relu6", "silu", "gelu", "sigmoid", "tanh"]


# --- the functional epilogue --------------------------------------------------------------------

@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
def test_functional_epilogue_against_float64(activation, dtype, channels_last, launches):
    import cupyconv.torch as ct

    g = torch.Generator(device="cuda").manual_seed(4)
    x = torch.randn(4, 32, 14, 14, device="cuda", generator=g)
    w = torch.randn(48, 32, 3, 3, device="cuda", generator=g) / 17
    b = torch.randn(48, device="cuda", generator=g)
    residual = 3 * torch.randn(4, 48, 14, 14, device="cuda", generator=g)
    if channels_last:
        x, w = (t.contiguous(memory_format=torch.channels_last) for t in (x, w))
    x, w, b = (t.to(dtype) for t in (x, w, b))
    # The residual in the other memory format: read through a copy in the output's.
    residual = residual.to(dtype) if channels_last else residual.to(dtype).contiguous(
        memory_format=torch.channels_last)
    ref = _torch_epilogue(F.conv2d(x.double(), w.double(), b.double(), padding=1), residual.double(), activation)
    theirs = _torch_epilogue(F.conv2d(x, w, b, padding=1), residual, activation)
    with torch.no_grad():
        ours = ct.conv2d(x, w, b, padding=1, activation=activation, residual=residual)
    assert len(launches) == 1
    assert ours.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    check_against_torch(ours, theirs, ref, dtype)


def test_functional_epilogue_with_gradients():
    import cupyconv.torch as ct

    x = torch.randn(2, 8, 9, 9, device="cuda", dtype=torch.float64, requires_grad=True)
    w = torch.randn(8, 8, 3, 3, device="cuda", dtype=torch.float64, requires_grad=True)
    r = torch.randn(2, 8, 9, 9, device="cuda", dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w, r: ct.conv2d(x, w, padding=1, activation="gelu", residual=r),
                                    (x, w, r))


# --- fused models -------------------------------------------------------------------------------

def _torchvision_model(name, dtype, channels_last):
    torchvision = pytest.importorskip("torchvision", reason="torchvision is not installed")
    from cupyconv.bench_models import calibrate_batch_norm

    torch.manual_seed(13)
    model = getattr(torchvision.models, name)(weights=None).to("cuda").eval()
    g = torch.Generator(device="cuda").manual_seed(0)
    calibrate_batch_norm(model, torch.randn(4, 3, 224, 224, device="cuda", generator=g))
    with torch.no_grad():  # statistics and affines a trained model would have: not the identity
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.copy_(0.2 * m.running_var.sqrt() * torch.randn_like(m.running_mean))
                m.weight.mul_(0.5 + torch.rand_like(m.weight))
                m.bias.copy_(0.1 * torch.randn_like(m.bias))
    model = model.to(dtype)
    return model.to(memory_format=torch.channels_last) if channels_last else model


@pytest.mark.parametrize("name", ["resnet50", "mobilenet_v2", "efficientnet_b0"])
@pytest.mark.parametrize("dtype, channels_last", [(torch.float32, False), (torch.float16, True),
                                                  (torch.bfloat16, True)], ids=["fp32-nchw", "fp16-cl", "bf16-cl"])
def test_fused_torchvision_model_against_float64(name, dtype, channels_last, launches):
    import cupyconv.torch as ct
    from cupyconv.torch_fusion import FusedConv2d

    original = _torchvision_model(name, dtype, channels_last)
    convs = sum(isinstance(m, torch.nn.Conv2d) for m in original.modules())
    fused = ct.convert(copy.deepcopy(original), fuse=True)
    assert sum(isinstance(m, FusedConv2d) for m in fused.modules()) == convs, "every convolution is fused"
    assert not any(n.op == "call_module" and isinstance(fused.get_submodule(n.target), torch.nn.BatchNorm2d)
                   for n in fused.graph.nodes)
    x = torch.randn(2, 3, 224, 224, device="cuda").to(dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        ours, theirs = fused(x), original(x)
        ref = copy.deepcopy(original).double()(x.double())
        # torch's own spread: its error on inputs one ulp apart at a tenth of their elements (EfficientNet-B0
        # in fp16 moves 2x under such changes of its first layer's output: profile/stem_sensitivity.py), the
        # largest of three draws -- one draw is narrower than the differences two correct kernels make.
        spread = [(original(nudged), copy.deepcopy(original).double()(nudged.double()))
                  for nudged in (_one_ulp_off(x, seed) for seed in range(3))] if dtype != torch.float32 else []
    assert len(launches) == convs
    theirs_error = max([relative_error(theirs, ref)] + [relative_error(t, r) for t, r in spread])
    check_against_torch(ours, theirs, ref, dtype, factor=3.0 * theirs_error / relative_error(theirs, ref))


def _one_ulp_off(x, seed):
    """``x`` (16-bit) with a random tenth of its finite nonzero elements one ulp up or down in magnitude."""
    g = torch.Generator(device=x.device).manual_seed(seed)
    bits = x.view(torch.int16)
    step = torch.where(torch.rand(x.shape, device=x.device, generator=g) < 0.5, 1, -1).to(torch.int16)
    moved = (bits + step).view(x.dtype)
    pick = (torch.rand(x.shape, device=x.device, generator=g) < 0.1) & torch.isfinite(moved) & (x != 0)
    return torch.where(pick, moved, x)


def test_cuda_graph_of_a_fused_model_follows_load_state_dict():
    import cupyconv.torch as ct

    build, x_shape, _ = MODELS["bottleneck"]
    torch.manual_seed(2)
    original = _randomise(build()).cuda().eval()
    fused = ct.convert(copy.deepcopy(original), fuse=True)
    static_x = torch.randn(x_shape, device="cuda")
    graph, static_y = capture(fused, static_x)
    graph.replay()
    with torch.no_grad():
        torch.testing.assert_close(static_y, original(static_x), rtol=1e-5, atol=1e-5)
        other = _randomise(copy.deepcopy(original), seed=9)
        fused.load_state_dict(other.state_dict())  # refolded in place: the graph reads the new values
        graph.replay()
        torch.testing.assert_close(static_y, other(static_x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_cuda_graph_of_a_fused_model_reads_its_folded_weights(dtype, launches):
    """A fused module's folded weight is its own, refolded in place (load_state_dict; clear_weight_caches
    after a change through .data), so replays follow both. In fp16 every layer of this block reads it in
    place (the depthwise layer's walk stages it: depthwise_nhwc.stages_weight), so nothing is prepared in
    the capture. In strict float32 the folded layers read forms made before the capture; the
    squeeze-and-excitation's two 1x1 convolutions (on 1 x 1 planes) have no BatchNorm to fold, so their weight
    is Conv2d's, read in place at each replay (one_pixel_conv2d) in either dtype."""
    import cupyconv.torch as ct

    build, x_shape, _ = MODELS["mbconv"]
    torch.manual_seed(2)
    cl = torch.channels_last

    def on_gpu(model):
        return model.cuda().to(dtype).eval().to(memory_format=cl)

    original = on_gpu(_randomise(build()))
    fused = ct.convert(copy.deepcopy(original), fuse=True)
    static_x = torch.randn(x_shape, device="cuda").to(dtype).contiguous(memory_format=cl)
    graph, static_y = capture(fused, static_x)  # two forwards, then the captured one
    in_capture = launches[2 * len(launches) // 3:]
    assert in_capture
    squeeze_excitation = [r for r in in_capture if r["problem"].h == r["problem"].w == 1]
    assert len(squeeze_excitation) == 2
    assert not any(r["prepares"] for r in in_capture), "nothing is prepared in the capture"
    assert not any(r["reads_prepared"] for r in squeeze_excitation), "Conv2d's weight read in place"
    if dtype == torch.float16:
        assert not any(r["reads_prepared"] for r in in_capture), "every layer reads the folded weight in place"
    else:
        assert any(r["reads_prepared"] for r in in_capture), "the folded layers read forms made before the capture"

    def check(model):
        static_x.copy_(torch.randn_like(static_x))
        graph.replay()
        with torch.no_grad():
            ref = copy.deepcopy(model).double()(static_x.double())
            check_against_torch(static_y, model(static_x), ref, dtype)

    check(original)
    other = on_gpu(_randomise(build(), seed=9))
    fused.load_state_dict(other.state_dict())  # refolded, forms refreshed, in place
    check(other)
    name = [n for n, m in other.named_modules() if isinstance(m, torch.nn.BatchNorm2d)][1]  # the depthwise's
    for model in (other, fused):
        model.get_submodule(name).running_var.data *= 4  # not versioned: clear_weight_caches refolds
    ct.clear_weight_caches(fused)
    check(other)


def test_compile_fullgraph_of_a_fused_model_on_the_gpu():
    import cupyconv.torch as ct

    build, x_shape, _ = MODELS["mbconv"]
    torch.manual_seed(2)
    original = _randomise(build()).cuda().eval()
    fused = ct.convert(copy.deepcopy(original), fuse=True)
    compiled = torch.compile(fused, fullgraph=True)
    x = torch.randn(x_shape, device="cuda")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), original(x), rtol=1e-5, atol=1e-5)
