"""The PyTorch adapter on a GPU: results against nn.Conv2d and float64 over the shared grid in every
dtype, padding modes, channels_last, zero copy, streams, autograd, torch.compile, inference_mode,
CUDA graphs, whole torchvision models, precision switches and a second GPU.

Every launch goes through the ``launches`` fixture, which fills the output with NaN first (so an
element the kernel never writes fails) and records what the kernel was given.
"""
import copy
import math
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch", reason="the adapter needs torch")
F = torch.nn.functional
nn = torch.nn

from cases import GRID  # noqa: E402  (tests/ is on sys.path through conftest.py)
from checks import relative_error

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
              pytest.mark.usefixtures("strict_torch_fp32")]

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
# Relative-error floors against float64; 16-bit results may also reach twice torch's own error in the
# same dtype (flash-attention's rule), whichever is larger. float32 is strict IEEE on both sides: the
# strict_torch_fp32 fixture (conftest.py) turns torch's TF32 off, which also keeps cupyconv.torch off its TF32 path.
FLOOR = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}
ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}


@pytest.fixture(autouse=True)
def launches(monkeypatch):
    """Every cupyconv call of the test: the output filled with NaN first (all bytes 0xFF: NaN in every
    dtype) on the call's stream, and a record of the addresses, stream and device it ran with, the
    problem and plan it ran, whether it reads a prepared weight and whether it prepares that weight itself."""
    import cupy

    from cupyconv import executor

    launch = executor.Executable.launch
    records = []

    def poisoned_launch(self, x, weight, prepared, bias, out, workspace, prepare_weight, stream, residual=0, flags=0,
                        input_scale=0):
        p = self.problem
        cupy.cuda.runtime.memsetAsync(out, 0xFF, math.prod(p.out_shape) * ITEMSIZE[p.dtype], stream)
        records.append(dict(x=x, weight=weight, bias=bias if p.has_bias else None, out=out, stream=stream,
                            device=cupy.cuda.runtime.getDevice(), problem=p, plan=self.plan,
                            reads_prepared=self.weight is not None, prepares=prepare_weight))
        return launch(self, x, weight, prepared, bias, out, workspace, prepare_weight, stream, residual, flags,
                      input_scale)

    monkeypatch.setattr(executor.Executable, "launch", poisoned_launch)
    return records


def check_against_torch(ours, theirs, ref, dtype, factor=2.0):
    """ours and torch's result in ``dtype`` against the float64 ``ref``: flash-attention's rule."""
    assert ours.shape == ref.shape and ours.dtype == dtype
    assert not ours.isnan().any(), "an output element was never written (or is NaN)"
    error = relative_error(ours, ref)
    allowed = FLOOR[dtype]
    if dtype in (torch.float16, torch.bfloat16):
        allowed = max(allowed, factor * relative_error(theirs, ref))
    assert error <= allowed, f"{dtype} relative error {error:.3g} > {allowed:.3g}"


def module_pair(case, dtype, padding_mode="zeros", seed=0):
    """A cupyconv Conv2d and an nn.Conv2d with the same (random) parameters, on the GPU."""
    from cupyconv.torch import Conv2d

    kwargs = dict(in_channels=case.c, out_channels=case.k, kernel_size=(case.kh, case.kw), stride=case.stride,
                  padding=case.padding, dilation=case.dilation, groups=case.groups, bias=case.bias,
                  padding_mode=padding_mode, device="cuda", dtype=dtype)
    torch.manual_seed(seed)
    theirs = nn.Conv2d(**kwargs)
    ours = Conv2d(**kwargs)
    ours.load_state_dict(theirs.state_dict())
    return ours, theirs


def random_input(case, dtype, seed=1, **kwargs):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(case.n, case.c, case.h, case.w, device="cuda", dtype=torch.float64, generator=g,
                       **kwargs).to(dtype)


def float64_copy(module):
    return copy.deepcopy(module).double()


# --- results ------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", GRID, ids=lambda c: c.id)
def test_grid_against_nn_conv2d(case, dtype, launches):
    ours, theirs = module_pair(case, dtype)
    x = random_input(case, dtype)
    x_before = x.clone()
    with torch.no_grad():
        y = ours(x)
        check_against_torch(y, theirs(x), float64_copy(theirs)(x.double()), dtype)
    assert torch.equal(x, x_before), "the input was modified"
    assert len(launches) == (1 if case.n else 0)


@pytest.mark.parametrize("padding_mode", ["reflect", "replicate", "circular"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("case", [c for c in GRID if c.n and c.padding not in (0, "valid")
                                  and min(c.h, c.w) > 4], ids=lambda c: c.id)
def test_padding_modes(case, dtype, padding_mode):
    ours, theirs = module_pair(case, dtype, padding_mode)
    x = random_input(case, dtype)
    with torch.no_grad():
        check_against_torch(ours(x), theirs(x), float64_copy(theirs)(x.double()), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_channels_last_in_channels_last_out(dtype):
    case = GRID[9]  # grouped, strided
    ours, theirs = module_pair(case, dtype)
    x = random_input(case, dtype).contiguous(memory_format=torch.channels_last)
    ours.to(memory_format=torch.channels_last)  # a non-contiguous weight, too
    with torch.no_grad():
        y = ours(x)
        check_against_torch(y, theirs(x), float64_copy(theirs)(x.double()), dtype)
    # The memory format torch's conv gives: channels_last, but contiguous in float64.
    assert (y.is_contiguous(memory_format=torch.channels_last) and not y.is_contiguous()) == (dtype != torch.float64)
    with torch.no_grad():  # a contiguous x with the channels_last weight: as torch's conv
        expected = F.conv2d(x.contiguous(), ours.weight, ours.bias, ours.stride, ours.padding, ours.dilation,
                            ours.groups)
        assert ours(x.contiguous()).is_contiguous(memory_format=torch.channels_last) == \
            expected.is_contiguous(memory_format=torch.channels_last)
        assert ours.to(memory_format=torch.contiguous_format)(x.contiguous()).is_contiguous()


def test_non_contiguous_and_unbatched_inputs():
    from cupyconv.torch import conv2d

    g = torch.Generator(device="cuda").manual_seed(4)
    x = torch.randn(2, 20, 21, 6, device="cuda", generator=g).permute(0, 3, 1, 2)[:, 1:5, ::2, 1:]
    w = torch.randn(3, 4, 3, 4, device="cuda", generator=g)[..., ::2]
    b = torch.randn(6, device="cuda", generator=g)[::2]
    ref = F.conv2d(x.double(), w.double(), b.double(), (1, 2), 1)
    check_against_torch(conv2d(x, w, b, (1, 2), 1), None, ref, torch.float32)
    check_against_torch(conv2d(x[1], w, b, (1, 2), 1), None, ref[1], torch.float32)


# --- zero copy, streams, devices ----------------------------------------------------------------

def test_zero_copy_data_pointers_and_torch_allocation(launches):
    import cupy

    from cupyconv.torch import conv2d

    g = torch.Generator(device="cuda").manual_seed(5)
    x, w, b = (torch.randn(*s, device="cuda", dtype=torch.bfloat16, generator=g)
               for s in ((2, 8, 20, 20), (16, 8, 3, 3), (16,)))
    pool_before = cupy.get_default_memory_pool().used_bytes()
    conv2d(x, w, b, padding=1)  # the first call of a signature makes the stream's workspace
    torch.cuda.synchronize()
    allocated_before = torch.cuda.memory_allocated()
    launches.clear()
    y = conv2d(x, w, b, padding=1)
    # The output (25600 bytes, a whole number of the allocator's 512-byte blocks) is all that a call
    # seen before allocates.
    assert torch.cuda.memory_allocated() - allocated_before == y.untyped_storage().nbytes()
    assert cupy.get_default_memory_pool().used_bytes() == pool_before, "CuPy allocated memory"
    (record,) = launches
    assert (record["x"], record["weight"], record["bias"]) == (x.data_ptr(), w.data_ptr(), b.data_ptr())
    assert record["out"] == y.data_ptr()
    ref = F.conv2d(x.double(), w.double(), b.double(), padding=1)
    check_against_torch(y, F.conv2d(x, w, b, padding=1), ref, torch.bfloat16)


def test_runs_on_torch_current_stream_after_slow_producer(launches):
    from cupyconv.torch import Conv2d

    torch.manual_seed(6)
    layer = Conv2d(3, 8, 3, padding=1, device="cuda", dtype=torch.float64)
    source = torch.randn(4, 3, 64, 64, device="cuda", dtype=torch.float64)
    expected = F.conv2d(source, layer.weight, layer.bias, padding=1).detach()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        x = torch.full_like(source, float("nan"))
        torch.cuda._sleep(200_000_000)  # a slow producer: x is written long after the launch is queued
        x.copy_(source)
        y = layer(x)
    assert launches[-1]["stream"] == side.cuda_stream
    side.synchronize()
    torch.testing.assert_close(y, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_module_on_second_gpu(launches):
    from cupyconv.torch import Conv2d, conv2d

    torch.manual_seed(8)
    layer = Conv2d(4, 6, 3, padding=1, device="cuda:1")
    x = torch.randn(2, 4, 16, 16, device="cuda:1")
    with torch.cuda.device(0), torch.no_grad():  # torch's current device is another GPU
        y = layer(x)
        with pytest.raises(ValueError, match="weight is on cuda:0 but x is on cuda:1"):
            conv2d(x, layer.weight.to("cuda:0"))
    assert y.device == x.device and launches[-1]["device"] == 1
    assert launches[-1]["stream"] == torch.cuda.current_stream(1).cuda_stream
    ref = F.conv2d(x.double(), layer.weight.double(), layer.bias.double(), padding=1)
    check_against_torch(y, None, ref, torch.float32)


_DDP_SCRIPT = textwrap.dedent('''
    import copy, sys
    import torch, torch.distributed as dist, torch.multiprocessing as mp
    from torch import nn
    from cupyconv.torch import Conv2d, convert

    def run(rank, world, init_file):
        dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=world)
        torch.cuda.set_device(rank)
        torch.backends.cudnn.allow_tf32 = False
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 3)).cuda(rank)
        reference = copy.deepcopy(model)
        ddp = nn.parallel.DistributedDataParallel(convert(model), device_ids=[rank])
        assert all(isinstance(m, Conv2d) for m in ddp.module if isinstance(m, nn.Conv2d))
        g = torch.Generator(device="cuda").manual_seed(1)
        batch = torch.randn(2 * world, 3, 12, 12, device="cuda", generator=g)
        ddp(batch[2 * rank:2 * rank + 2]).square().mean().backward()
        reference(batch).square().mean().backward()
        for ours, theirs in zip(ddp.module.parameters(), reference.parameters()):
            torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-4, atol=1e-6)
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(run, args=(2, sys.argv[1]), nprocs=2)
''')


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_distributed_data_parallel_two_gpus(tmp_path):
    import torch.distributed as dist

    if not dist.is_nccl_available():
        pytest.skip("NCCL is not available")
    script = tmp_path / "ddp.py"
    script.write_text(_DDP_SCRIPT)
    root = pathlib.Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, str(script), str(tmp_path / "init")], check=True, env=env, timeout=300)


# --- autograd -----------------------------------------------------------------------------------

# Small enough for gradcheck's finite differences: strides, dilation, asymmetric 'same', groups.
GRAD_CASES = [c for c in GRID if c.n and c.h * c.w * c.c <= 900 and c.kh * c.kw <= 25]


@pytest.mark.parametrize("case", GRAD_CASES, ids=lambda c: c.id)
def test_gradcheck_float64(case):
    from cupyconv.torch import conv2d

    g = torch.Generator(device="cuda").manual_seed(9)
    make = lambda *s: torch.randn(*s, device="cuda", dtype=torch.float64, generator=g).requires_grad_()
    x = make(min(case.n, 2), case.c, case.h, case.w)
    w = make(case.k, case.c // case.groups, case.kh, case.kw)
    b = make(case.k) if case.bias else None
    inputs = (x, w) if b is None else (x, w, b)
    assert torch.autograd.gradcheck(
        lambda *t: conv2d(*t, stride=case.stride, padding=case.padding, dilation=case.dilation, groups=case.groups),
        inputs)


@pytest.mark.parametrize("case", [c for c in GRID if c.n], ids=lambda c: c.id)
def test_float32_gradients_match_nn_conv2d(case):
    ours, theirs = module_pair(case, torch.float32)
    x = random_input(case, torch.float32)
    x_ours, x_theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ours, y_theirs = ours(x_ours), theirs(x_theirs)
    grad_out = torch.randn_like(y_theirs)
    (y_ours * grad_out).sum().backward()
    (y_theirs * grad_out).sum().backward()
    pairs = [(x_ours.grad, x_theirs.grad), (ours.weight.grad, theirs.weight.grad)]
    if case.bias:
        pairs.append((ours.bias.grad, theirs.bias.grad))
    for got, expected in pairs:
        assert got is not None
        assert relative_error(got, expected.double()) <= 1e-5


# --- torch.compile, inference_mode, CUDA graphs -------------------------------------------------

def _small_model(dtype=torch.float32):
    from cupyconv.torch import convert

    torch.manual_seed(10)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(16, 16, 4, padding="same", groups=4, padding_mode="reflect"), nn.ReLU(),
                          nn.Conv2d(16, 8, 3, stride=2, bias=False)).to("cuda", dtype)
    reference = copy.deepcopy(model)
    return convert(model), reference


def test_torch_compile_fullgraph(launches):
    model, reference = _small_model()
    x = torch.randn(4, 3, 32, 32, device="cuda", requires_grad=True)
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(model)(x)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    launches.clear()
    y = compiled(x)
    assert len(launches) == 3, "the compiled model must run cupyconv's kernels"
    check_against_torch(y, None, float64_copy(reference)(x.double()), torch.float32)
    y.square().sum().backward()
    x_ref = x.detach().clone().requires_grad_()
    reference(x_ref).square().sum().backward()
    assert relative_error(x.grad, x_ref.grad.double()) <= 1e-5
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        assert relative_error(ours.grad, theirs.grad.double()) <= 1e-5


def test_inference_mode(launches):
    model, reference = _small_model(torch.float16)
    x = torch.randn(2, 3, 32, 32, device="cuda", dtype=torch.float16)
    with torch.inference_mode():
        y = model(x)
        expected = reference(x)
    assert y.is_inference() and len(launches) == 3
    check_against_torch(y, expected, float64_copy(reference)(x.double()), torch.float16)


def capture(model, static_x):
    """(CUDA graph, static output) of one no-grad forward, after a warm-up on a side stream that
    compiles the kernels outside the capture (torch's recipe)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(2):
            model(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        static_y = model(static_x)
    return graph, static_y


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_cuda_graph_capture_and_replay(launches, dtype):
    """Captured and replayed on new inputs: strict float32 and float16 read temporary copies (the
    transposed weight, channels-last operands), which must come from the graph's own memory."""
    model, reference = _small_model(dtype)
    model.eval()
    static_x = torch.randn(2, 3, 32, 32, device="cuda", dtype=dtype)
    graph, static_y = capture(model, static_x)
    for seed in (11, 12):
        g = torch.Generator(device="cuda").manual_seed(seed)
        new_x = torch.randn(static_x.shape, device="cuda", generator=g, dtype=dtype)
        static_x.copy_(new_x)
        torch.cuda.empty_cache()  # memory freed after the capture goes back to the driver, as in a long run
        garbage = torch.full((1 << 22,), float("nan"), device="cuda")  # ... and is handed out again
        graph.replay()
        torch.cuda.synchronize()
        with torch.no_grad():
            check_against_torch(static_y, reference(new_x), float64_copy(reference)(new_x.double()), dtype)
        del garbage


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_static_weights_graph_reads_forms_made_before_capture(launches, dtype):
    """convert(..., static_weights=True): the capture prepares no weight and reads the forms made before
    it; a weight changed in place reaches the graph once the forms are remade -- by refresh_weight_caches,
    by load_state_dict, by a call outside the capture -- and not before (the contract): after each, a
    replay equals a fresh model's output bit for bit."""
    from cupyconv.torch import convert, refresh_weight_caches

    model, _ = _small_model(dtype)
    convert(model, static_weights=True)
    model.eval()
    static_x = torch.randn(2, 3, 32, 32, device="cuda", dtype=dtype)
    graph, static_y = capture(model, static_x)
    in_capture = launches[2 * len(launches) // 3:]
    assert any(r["reads_prepared"] for r in in_capture), "the model has a prepared weight to read"
    assert not any(r["prepares"] for r in in_capture), "no weight is prepared inside the capture"

    def fresh():
        with torch.no_grad():
            return copy.deepcopy(model)(static_x)

    graph.replay()
    assert torch.equal(static_y, fresh())
    before = static_y.clone()
    prepared = next(m for r, m in zip(in_capture, [m for m in model if isinstance(m, nn.Conv2d)])
                    if r["reads_prepared"])

    def change():
        with torch.no_grad():
            prepared.weight.copy_(torch.randn_like(prepared.weight))

    change()
    graph.replay()
    assert torch.equal(static_y, before), "a static-weights graph reads the forms as last made"
    refresh_weight_caches(model)
    graph.replay()
    assert torch.equal(static_y, fresh()) and not torch.equal(static_y, before)
    model.load_state_dict({k: torch.randn_like(v) for k, v in model.state_dict().items()})
    graph.replay()
    assert torch.equal(static_y, fresh())
    change()
    with torch.no_grad():
        model(static_x)  # outside a capture: the forms are remade in their buffers
    graph.replay()
    assert torch.equal(static_y, fresh())


def test_graph_of_a_depthwise_layer_reads_the_weight_in_place(launches):
    """A channels_last fp16 depthwise layer that the rules run on a staged walk: its CUDA graph prepares no
    weight (the kernel reads the module's own), and a replay after the weight changed in place, with no
    refresh, equals a fresh layer's output bit for bit."""
    from cupyconv.families import depthwise_nhwc
    from cupyconv.torch import convert

    torch.manual_seed(17)
    layer = nn.Conv2d(576, 576, 3, padding=1, groups=576, bias=False).cuda().half()
    layer = convert(nn.Sequential(layer)).eval().to(memory_format=torch.channels_last)
    static_x = torch.randn(4, 576, 14, 14, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    graph, static_y = capture(layer, static_x)
    in_capture = launches[-1]
    assert in_capture["plan"].kernel == depthwise_nhwc.KERNEL and in_capture["plan"].config.staged
    assert not in_capture["reads_prepared"] and not in_capture["prepares"]

    def fresh():
        with torch.no_grad():
            return F.conv2d(static_x.double(), layer[0].weight.double(), None, 1, 1, 1, 576)

    for seed in (3, 4):
        with torch.no_grad():
            layer[0].weight.copy_(torch.randn(layer[0].weight.shape, generator=torch.Generator().manual_seed(seed))
                                  .to(layer[0].weight))
        graph.replay()
        torch.cuda.synchronize()
        assert not static_y.isnan().any()
        assert relative_error(static_y, fresh()) < 2e-3
        with torch.no_grad():
            assert torch.equal(static_y, copy.deepcopy(layer)(static_x))


# --- whole models -------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("name", ["resnet18", "alexnet"])
def test_converted_torchvision_model_logits(name, dtype, launches):
    torchvision = pytest.importorskip("torchvision", reason="torchvision is not installed")
    from cupyconv.torch import Conv2d, convert

    torch.manual_seed(13)
    original = getattr(torchvision.models, name)(weights=None).to("cuda", dtype).eval()
    converted = convert(copy.deepcopy(original))
    conv_count = sum(isinstance(m, nn.Conv2d) for m in original.modules())
    assert sum(type(m) is Conv2d for m in converted.modules()) == conv_count
    x = torch.randn(2, 3, 224, 224, device="cuda", dtype=dtype)
    with torch.no_grad():
        ours, theirs = converted(x), original(x)
        ref = float64_copy(original)(x.double())
    assert len(launches) == conv_count
    # A whole network compounds rounding differences layer by layer: 3x torch's error for 16 bits.
    check_against_torch(ours, theirs, ref, dtype, factor=3.0)
    assert relative_error(ours, theirs.double()) <= (1e-4 if dtype == torch.float32 else 1e-2)


# --- precision switches -------------------------------------------------------------------------

@pytest.mark.parametrize("allow_tf32", [False, True])
def test_float32_precision_follows_cudnn_switch(allow_tf32, launches, monkeypatch):
    case = GRID[18]  # AlexNet conv1 geometry, small
    ours, theirs = module_pair(case, torch.float32)
    x = random_input(case, torch.float32)
    ref = float64_copy(theirs)(x.double()).detach()
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", allow_tf32)
    with torch.no_grad():
        y, torch_y = ours(x), theirs(x)
    plan = launches[-1]["plan"]
    assert (plan.kernel in ("implicit_gemm_nhwc", "implicit_gemm_conv2d")) == allow_tf32, str(plan)
    assert not y.isnan().any()
    if allow_tf32:  # TF32's bound (issue 5), or twice torch's error where cuDNN's TF32 error is larger;
        # cuDNN may pick a non-TF32 algorithm for a small shape, so torch's error alone is no bound.
        assert relative_error(y, ref) <= max(2e-3, 2 * relative_error(torch_y, ref))
    else:
        assert relative_error(y, ref) <= 1e-5, "float32 without TF32 must be strict"


def test_errors_before_any_launch(launches):
    from cupyconv.torch import conv2d

    x = torch.randn(2, 4, 9, 9, device="cuda")
    w = torch.randn(6, 4, 3, 3, device="cuda")
    bad_calls = [
        (lambda: conv2d(x, w.cpu()), ValueError, "weight is on cpu but x is on cuda:0"),
        (lambda: conv2d(x, w.half()), TypeError, "weight has dtype torch.float16"),
        (lambda: conv2d(x, w, groups=3), ValueError, "groups=3 must divide"),
        (lambda: conv2d(x, w, torch.randn(5, device="cuda")), ValueError, r"bias must have shape \(6,\)"),
        (lambda: conv2d(x, w, padding="same", stride=2), ValueError, "padding='same' needs stride 1"),
        (lambda: conv2d(x.int(), w.int()), TypeError, "x has dtype torch.int32"),
    ]
    for call, error, message in bad_calls:
        with pytest.raises(error, match=message):
            call()
    assert launches == []
