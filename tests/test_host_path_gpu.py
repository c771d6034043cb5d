"""The host path on a GPU: calls whose checked signature and executable are reused must still read
each call's own arrays; prepared weights (CuPy's PreparedWeight, the torch module's cache) must follow
every change of the weight; nothing is allocated or launched for an output too large to exist.

Outputs are poisoned with NaN before the calls (CuPy: the ``out`` given; torch: the executor's run is
wrapped as in test_torch_gpu.py), so an element never written fails.
"""
import copy

import pytest

torch = pytest.importorskip("torch", reason="the references are torch's")
cupy = pytest.importorskip("cupy", reason="the GPU path needs CuPy")
F = torch.nn.functional

import cupyconv  # noqa: E402
from checks import relative_error  # noqa: E402
from devices import gpu_count  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_count(), reason="needs a CUDA GPU"),
              pytest.mark.usefixtures("strict_torch_fp32")]

# (name, x shape, weight shape, conv kwargs, dtype, allow_tf32): one layer per family that reads a
# prepared weight (FMA GEMM's transposed copy, Winograd's transform, the tensor-core GEMM's
# channels-last copy in TF32 and fp16) and two that read the weight as it is.
LAYERS = [
    ("simt", (2, 16, 12, 12), (24, 16, 1, 1), {}, "float32", False),
    ("winograd", (2, 64, 14, 14), (64, 64, 3, 3), {"padding": 1}, "float32", False),
    ("nhwc_tf32", (2, 32, 10, 10), (48, 32, 3, 3), {"padding": 1}, "float32", True),
    ("nhwc_fp16", (2, 32, 10, 10), (48, 32, 3, 3), {"padding": 1, "stride": 2}, "float16", False),
    ("depthwise", (2, 16, 20, 20), (16, 1, 3, 3), {"padding": 1, "groups": 16}, "float32", False),
    ("direct_fp64", (2, 6, 9, 9), (4, 6, 3, 3), {}, "float64", False),
]
BOUND = {("float32", False): 1e-5, ("float32", True): 3e-3, ("float16", False): 3e-3, ("float64", False): 1e-12}


def _random(shape, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", dtype=torch.float64, generator=g).to(getattr(torch, dtype))


def _cupy_conv(x, w, kwargs, allow_tf32):
    """cupyconv.conv2d on CuPy views of x and w, into a NaN-poisoned output."""
    ref = F.conv2d(x.double(), _as_torch(w).double(), **kwargs)
    out = cupy.full(ref.shape, cupy.nan, dtype=cupy.from_dlpack(x).dtype)
    y = cupyconv.conv2d(cupy.from_dlpack(x), w if isinstance(w, (cupyconv.PreparedWeight, cupy.ndarray))
                        else cupy.from_dlpack(w),
                        out=out, allow_tf32=allow_tf32, **kwargs)
    assert y is out
    return torch.from_dlpack(out), ref


def _as_torch(w):
    """The weight (a tensor, a CuPy array or a PreparedWeight) as a torch tensor, sharing memory."""
    if isinstance(w, cupyconv.PreparedWeight):
        w = w.array
    return w if isinstance(w, torch.Tensor) else torch.from_dlpack(w)


@pytest.mark.parametrize("name, x_shape, w_shape, kwargs, dtype, allow_tf32", LAYERS, ids=[l[0] for l in LAYERS])
def test_repeated_signature_reads_each_calls_arrays(name, x_shape, w_shape, kwargs, dtype, allow_tf32):
    """Five calls of one signature, each on new x and w (and a PreparedWeight of each w): every
    result is right, so the reused executable packed nothing of an earlier call's arrays."""
    for seed in range(5):
        x, w = _random(x_shape, dtype, 2 * seed), _random(w_shape, dtype, 2 * seed + 1)
        for weight in (w, cupyconv.prepare_weight(cupy.from_dlpack(w))):
            y, ref = _cupy_conv(x, weight, kwargs, allow_tf32)
            assert not y.isnan().any()
            assert relative_error(y, ref) <= BOUND[dtype, allow_tf32], (seed, type(weight).__name__)


@pytest.mark.parametrize("name, x_shape, w_shape, kwargs, dtype, allow_tf32", LAYERS, ids=[l[0] for l in LAYERS])
def test_prepared_weight_follows_refresh(name, x_shape, w_shape, kwargs, dtype, allow_tf32):
    x, w = _random(x_shape, dtype, 20), _random(w_shape, dtype, 21)
    prepared = cupyconv.prepare_weight(cupy.from_dlpack(w))
    first, _ = _cupy_conv(x, prepared, kwargs, allow_tf32)
    prepared.array[...] = cupy.from_dlpack(_random(w_shape, dtype, 22))  # an in-place update
    prepared.refresh()
    y, ref = _cupy_conv(x, prepared, kwargs, allow_tf32)
    assert relative_error(y, ref) <= BOUND[dtype, allow_tf32]
    assert not torch.equal(first, y)
    plain, _ = _cupy_conv(x, prepared.array, kwargs, allow_tf32)
    assert torch.equal(y, plain), "a prepared weight must give the unprepared call's bits"


def _module_and_input(name):
    from cupyconv.torch import Conv2d

    _, x_shape, w_shape, kwargs, dtype, allow_tf32 = next(l for l in LAYERS if l[0] == name)
    torch.backends.cudnn.allow_tf32 = allow_tf32  # restored by the strict_torch_fp32 fixture
    torch.manual_seed(30)
    layer = Conv2d(x_shape[1], w_shape[0], w_shape[2:], device="cuda", dtype=getattr(torch, dtype), **kwargs)
    return layer, _random(x_shape, dtype, 31)


def _fresh_result(layer, x):
    """What a new module with ``layer``'s current parameters computes (no cache behind it)."""
    fresh = copy.deepcopy(layer)
    with torch.no_grad():
        return fresh(x)


@pytest.mark.parametrize("name", [l[0] for l in LAYERS])
def test_module_weight_cache_follows_updates(name):
    """In-place update, optimizer step, load_state_dict: after each, the module's result equals a
    fresh module's, bit for bit, and differs from the one before."""
    layer, x = _module_and_input(name)
    with torch.no_grad():
        before = layer(x)
        assert torch.equal(layer(x), before)  # the cached weight, a second time

    updates = {
        "in-place": lambda: layer.weight.mul_(-0.5),
        "optimizer step": lambda: _sgd_step(layer, x),
        "load_state_dict": lambda: layer.load_state_dict(
            {k: torch.randn_like(v) for k, v in layer.state_dict().items()}),
    }
    for what, update in updates.items():
        with torch.no_grad() if what == "in-place" else torch.enable_grad():
            update()
        with torch.no_grad():
            after = layer(x)
        assert not after.isnan().any(), what
        assert torch.equal(after, _fresh_result(layer, x)), f"stale prepared weight after {what}"
        assert not torch.equal(after, before), what
        before = after


def _sgd_step(layer, x):
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.5)
    layer(x).float().square().mean().backward()
    optimizer.step()


@pytest.mark.parametrize("name", ["simt", "nhwc_fp16", "winograd"])
def test_cuda_graph_replay_reads_the_weight_of_replay_time(name):
    """Captured after the module's weight cache was filled, then the weight changes in place: a
    replay computes with the new weight, as torch's own convolution in the graph would."""
    layer, x = _module_and_input(name)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        layer(x)  # compiles, fills the cache
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        y = layer(x)
    with torch.no_grad():
        layer.weight.copy_(torch.randn_like(layer.weight))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, _fresh_result(layer, x))


def test_gradgradcheck_eager_path():
    """Double backward through the eager autograd.Function (torch's gradient formulas are differentiable)."""
    from cupyconv.torch import conv2d

    g = torch.Generator(device="cuda").manual_seed(40)
    x = torch.randn(2, 3, 7, 6, device="cuda", dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(4, 3, 3, 2, device="cuda", dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(4, device="cuda", dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda *t: conv2d(*t, stride=(2, 1), padding=1), (x, w, b))


def test_huge_output_raises_before_any_allocation():
    """padding=10**9 gives a (1, 2, 2e9+3, 2e9+3) output: a ValueError naming that shape, with nothing
    allocated (CuPy's pool, torch's allocator) -- today it reached the allocator asking for 8.7e18 bytes."""
    from cupyconv.torch import conv2d

    x, w = cupy.ones((1, 3, 5, 5), dtype=cupy.float32), cupy.ones((2, 3, 3, 3), dtype=cupy.float32)
    pool = cupy.get_default_memory_pool()
    used = pool.used_bytes()
    with pytest.raises(ValueError, match=r"output of shape \(1, 2, 2000000003, 2000000003\)"):
        cupyconv.conv2d(x, w, padding=10**9)
    assert pool.used_bytes() == used
    tx, tw = torch.ones(1, 3, 5, 5, device="cuda"), torch.ones(2, 3, 3, 3, device="cuda")
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_allocated()
    with pytest.raises(ValueError, match=r"output of shape \(1, 2, 2000000003, 2000000003\)"):
        conv2d(tx, tw, padding=10**9)
    assert torch.cuda.memory_allocated() == allocated


def test_out_overlap_is_checked_on_a_cached_signature():
    """The overlap of ``out`` with an input is not part of the call signature: a second call of a
    signature seen before still refuses an ``out`` that is its own input."""
    x = cupy.random.standard_normal((1, 4, 8, 8), dtype=cupy.float32)
    w = cupy.random.standard_normal((4, 4, 1, 1), dtype=cupy.float32)
    out = cupy.empty_like(x)
    cupyconv.conv2d(x, w, out=out)
    with pytest.raises(ValueError, match="out shares memory with x"):
        cupyconv.conv2d(x, w, out=x)
    other = cupy.empty_like(x)
    with pytest.raises(ValueError, match="out shares memory with x"):
        cupyconv.conv2d(other, w, out=other)
