"""The PyTorch adapter's training path on a GPU: conv2d's gradients by cupyconv's kernels (and by
torch's, behind set_backward) against torch's float64 autograd in every dtype mode and both memory
formats, gradcheck and double backward, ConvTranspose2d and Conv1d against nn's, a converted model's
SGD step, the backward inside a CUDA graph, its stream and allocator, and the weight gradient's
bitwise repeatability.

Every test draws fresh random inputs (never zeros), so a wrong or unwritten gradient fails.
"""
import copy

import pytest

torch = pytest.importorskip("torch", reason="the adapter needs torch")
F = torch.nn.functional
nn = torch.nn

from checks import relative_error  # noqa: E402  (tests/ is on sys.path through conftest.py)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
              pytest.mark.usefixtures("strict_torch_fp32")]

#: mode -> (dtype, TF32 on). float32 is strict unless the mode is tf32.
MODES = {"float64": (torch.float64, False), "float32": (torch.float32, False), "tf32": (torch.float32, True),
         "float16": (torch.float16, False), "bfloat16": (torch.bfloat16, False)}
# Relative-error floors against float64 (those of tests/test_grad_gpu.py); TF32 and 16-bit results may
# also reach twice torch's own error in the same mode (flash-attention's rule), whichever is larger.
FLOOR = {"float64": 1e-12, "float32": 1e-5, "tf32": 2e-3, "float16": 2e-3, "bfloat16": 1.5e-2}
MODE_OF = {torch.float64: "float64", torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


@pytest.fixture
def ct():
    import cupyconv.torch

    previous = cupyconv.torch.set_backward("cupyconv")
    yield cupyconv.torch
    cupyconv.torch.set_backward(previous)


@pytest.fixture
def kernel_calls(ct, monkeypatch):
    """Counts of cupyconv's gradients computed by the adapter's backward, and the stream each ran on:
    a gradient program launched (its executable asked for and found: torch's current stream), or
    cupyconv.grad's function called on CuPy arrays (CuPy's current stream)."""
    import cupy

    calls = {"input": 0, "weight": 0, "streams": set()}

    def counted(name, function):
        def call(*args, **kwargs):
            calls[name] += 1
            calls["streams"].add(cupy.cuda.get_current_stream().ptr)
            return function(*args, **kwargs)
        return call

    def counted_executable(name, function):
        def call(*args, **kwargs):
            exe = function(*args, **kwargs)
            if exe is not None:
                calls[name] += 1
                calls["streams"].add(torch.cuda.current_stream().cuda_stream)
            return exe
        return call

    monkeypatch.setattr(ct, "input_gradient", counted("input", ct.input_gradient))
    monkeypatch.setattr(ct, "weight_gradient", counted("weight", ct.weight_gradient))
    monkeypatch.setattr(ct, "input_gradient_executable", counted_executable("input", ct.input_gradient_executable))
    monkeypatch.setattr(ct, "weight_gradient_executable", counted_executable("weight", ct.weight_gradient_executable))
    return calls


def check(ours, theirs, ref, mode, name, factor=2.0):
    """ours and torch's result (same dtype) against the float64 ``ref``: flash-attention's rule."""
    assert ours is not None, f"{name}: no gradient"
    assert ours.shape == ref.shape, f"{name}: shape {tuple(ours.shape)} != {tuple(ref.shape)}"
    assert ours.dtype == MODES[mode][0], f"{name}: dtype {ours.dtype}"
    assert torch.isfinite(ours).all(), f"{name}: NaN or inf"
    error = relative_error(ours, ref)
    allowed = FLOOR[mode]
    if mode in ("tf32", "float16", "bfloat16"):
        allowed = max(allowed, factor * relative_error(theirs, ref))
    assert error <= allowed, f"{name}: {mode} relative error {error:.3g} > {allowed:.3g}"


def randn(*shape, seed, dtype=torch.float64):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", dtype=torch.float64, generator=g).to(dtype)


def gradients(function, inputs, grad_out, **kwargs):
    """(output, gradients of each input) of function(*inputs, **kwargs) for ``grad_out``."""
    leaves = [t.detach().clone(memory_format=torch.preserve_format).requires_grad_() for t in inputs]
    y = function(*leaves, **kwargs)
    return y.detach(), torch.autograd.grad(y, leaves, grad_out)


# --- conv2d's gradients ----------------------------------------------------------------------------

class Case:
    def __init__(self, id, x, weight, stride=1, padding=0, dilation=1, groups=1):
        self.id, self.x, self.weight = id, x, weight
        self.args = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)


CASES = [
    Case("3x3", (2, 16, 12, 12), (24, 16, 3, 3), padding=1),
    Case("groups", (2, 16, 10, 11), (32, 4, 3, 3), padding=1, groups=4),
    Case("depthwise5x5", (2, 24, 13, 12), (24, 1, 5, 5), padding=2, groups=24),
    Case("stride2", (2, 16, 15, 14), (32, 16, 3, 3), stride=2, padding=1),
    Case("dilation2", (2, 8, 14, 13), (16, 8, 3, 3), padding=2, dilation=2),
    Case("same_even", (2, 8, 11, 12), (12, 8, 4, 2), padding="same", dilation=(1, 2)),  # asymmetric padding
]


def conv_inputs(case, dtype, channels_last=False, seed=0):
    x, w = randn(*case.x, seed=seed, dtype=dtype), randn(*case.weight, seed=seed + 1, dtype=dtype)
    b = randn(case.weight[0], seed=seed + 2, dtype=dtype)
    if channels_last:
        x, w = x.contiguous(memory_format=torch.channels_last), w.contiguous(memory_format=torch.channels_last)
    grad = randn(*F.conv2d(x.double(), w.double(), None, **case.args).shape, seed=seed + 3, dtype=dtype)
    return x, w, b, grad


def check_conv2d_gradients(ct, case, mode, channels_last, monkeypatch):
    dtype, tf32 = MODES[mode]
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", tf32)
    x, w, b, grad = conv_inputs(case, dtype, channels_last)
    y, ours = gradients(ct.conv2d, (x, w, b), grad, **case.args)
    y_theirs, theirs = gradients(F.conv2d, (x, w, b), grad, **case.args)
    y_ref, ref = gradients(F.conv2d, (x.double(), w.double(), b.double()), grad.double(), **case.args)
    for name, a, t, r in zip(("output", "grad x", "grad weight", "grad bias"), (y, *ours), (y_theirs, *theirs),
                             (y_ref, *ref)):
        check(a, t, r, mode, name)
    return ours


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_conv2d_gradients_by_cupyconv(ct, kernel_calls, case, mode, channels_last, monkeypatch):
    ours = check_conv2d_gradients(ct, case, mode, channels_last, monkeypatch)
    assert (kernel_calls["input"], kernel_calls["weight"]) == (1, 1), "the backward must run cupyconv's kernels"
    if channels_last and mode != "float64":  # NHWC arrays come back as channels_last tensors
        assert ours[0].is_contiguous(memory_format=torch.channels_last)
        assert ours[1].is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", [CASES[1], CASES[5]], ids=lambda c: c.id)
def test_conv2d_gradients_by_torch_behind_the_switch(ct, kernel_calls, case, mode, monkeypatch):
    assert ct.set_backward("torch") == "cupyconv"
    check_conv2d_gradients(ct, case, mode, False, monkeypatch)
    assert (kernel_calls["input"], kernel_calls["weight"]) == (0, 0)


def test_only_needed_gradients_and_unbatched(ct, kernel_calls):
    case = CASES[3]
    x, w, b, grad = conv_inputs(case, torch.float32)
    w_leaf = w.clone().requires_grad_()
    (ct.conv2d(x, w_leaf, b, **case.args) * grad).sum().backward()
    assert (kernel_calls["input"], kernel_calls["weight"]) == (0, 1)
    w64 = w.double().requires_grad_()
    expected = torch.autograd.grad(F.conv2d(x.double(), w64, b.double(), **case.args), w64, grad.double())[0]
    assert relative_error(w_leaf.grad, expected) <= 1e-5
    x_leaf = x[0].clone().requires_grad_()  # unbatched: (C, H, W)
    (ct.conv2d(x_leaf, w, b, **case.args) * grad[0]).sum().backward()
    x64 = x[0].double().requires_grad_()
    expected = torch.autograd.grad(F.conv2d(x64, w.double(), b.double(), **case.args), x64, grad[0].double())[0]
    assert relative_error(x_leaf.grad, expected) <= 1e-5


# --- gradcheck and double backward ----------------------------------------------------------------

GRADCHECK_CONV = [
    Case("same_even", (1, 4, 6, 7), (6, 2, 4, 2), padding="same", groups=2),
    Case("stride2", (2, 3, 7, 7), (4, 3, 3, 3), stride=2, padding=1),
    Case("dilation_depthwise", (1, 4, 7, 6), (4, 1, 3, 3), stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=4),
    Case("stride3", (1, 2, 9, 9), (3, 2, 4, 4), stride=3, padding=2),
]
# (x shape, weight shape, stride, padding, output_padding, groups, dilation)
GRADCHECK_TRANSPOSE = [
    ((1, 4, 4, 5), (4, 3, 4, 4), 2, 1, 0, 1, 1),
    ((2, 4, 3, 4), (4, 2, 3, 3), 2, 1, 1, 2, 1),
    ((1, 3, 4, 3), (3, 2, 3, 2), (1, 2), (0, 1), (2, 1), 1, (3, 2)),  # output_padding >= stride
]


def small(*shape, seed):
    return randn(*shape, seed=seed).requires_grad_()


@pytest.mark.parametrize("case", GRADCHECK_CONV, ids=lambda c: c.id)
def test_conv2d_gradcheck(ct, kernel_calls, case):
    x, w, b = small(*case.x, seed=30), small(*case.weight, seed=31), small(case.weight[0], seed=32)
    assert torch.autograd.gradcheck(lambda x, w, b: ct.conv2d(x, w, b, **case.args), (x, w, b))
    assert kernel_calls["input"] and kernel_calls["weight"]


def transpose_args(case):
    _, _, stride, padding, output_padding, groups, dilation = case
    return dict(stride=stride, padding=padding, output_padding=output_padding, groups=groups, dilation=dilation)


@pytest.mark.parametrize("case", GRADCHECK_TRANSPOSE, ids=str)
def test_conv_transpose2d_gradcheck(ct, kernel_calls, case):
    x, w = small(*case[0], seed=33), small(*case[1], seed=34)
    b = small(case[1][1] * case[5], seed=35)
    assert torch.autograd.gradcheck(lambda x, w, b: ct.conv_transpose2d(x, w, b, **transpose_args(case)), (x, w, b))
    assert kernel_calls["weight"]


def test_double_backward(ct):
    case = GRADCHECK_CONV[0]
    x, w, b = small(*case.x, seed=36), small(*case.weight, seed=37), small(case.weight[0], seed=38)
    assert torch.autograd.gradgradcheck(lambda x, w, b: ct.conv2d(x, w, b, **case.args), (x, w, b))
    tcase = GRADCHECK_TRANSPOSE[2]
    xt, wt, bt = small(*tcase[0], seed=39), small(*tcase[1], seed=40), small(tcase[1][1], seed=41)
    assert torch.autograd.gradgradcheck(lambda x, w, b: ct.conv_transpose2d(x, w, b, **transpose_args(tcase)),
                                        (xt, wt, bt))


def test_grad_of_grad_equals_torch(ct):
    """create_graph, then the gradient of a gradient: the weight's second derivative through x's
    gradient (a gradient penalty), as torch computes it."""
    case = CASES[1]
    x, w, b, _ = conv_inputs(case, torch.float64)

    def penalty(conv):
        x_leaf, w_leaf = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = conv(x_leaf, w_leaf, b, **case.args)
        (grad_x,) = torch.autograd.grad(y.square().sum(), x_leaf, create_graph=True)
        return torch.autograd.grad(grad_x.square().sum(), w_leaf)[0]

    torch.testing.assert_close(penalty(ct.conv2d), penalty(F.conv2d), rtol=1e-10, atol=1e-10)


# --- ConvTranspose2d and Conv1d modules ---------------------------------------------------------------

TRANSPOSE_MODULES = [
    dict(in_channels=16, out_channels=8, kernel_size=4, stride=2, padding=1),  # DCGAN's up-sampling
    dict(in_channels=12, out_channels=8, kernel_size=3, stride=2, padding=1, output_padding=1, groups=4),
    dict(in_channels=8, out_channels=6, kernel_size=3, stride=(1, 2), padding=(2, 1), output_padding=(2, 1),
         dilation=(3, 2)),  # output_padding >= stride along the rows
]
CONV1D_MODULES = [
    dict(in_channels=16, out_channels=24, kernel_size=3, padding=1),
    dict(in_channels=16, out_channels=16, kernel_size=5, stride=2, padding=2, dilation=2, groups=4,
         padding_mode="reflect"),
    dict(in_channels=8, out_channels=12, kernel_size=4, padding="same"),
]


def check_module(ours_class, theirs_class, kwargs, mode, x):
    """Forward and backward of the cupyconv module against the nn module (same parameters) and its
    float64 copy."""
    dtype = MODES[mode][0]
    torch.manual_seed(42)
    theirs = theirs_class(**kwargs, device="cuda", dtype=dtype)
    ours = ours_class(**kwargs, device="cuda", dtype=dtype)
    ours.load_state_dict(theirs.state_dict())
    reference = copy.deepcopy(theirs).double()
    grad = None
    results = []
    for module, inp in ((ours, x), (theirs, x), (reference, x.double())):
        leaf = inp.detach().clone(memory_format=torch.preserve_format).requires_grad_()
        y = module(leaf)
        if grad is None:
            grad = randn(*y.shape, seed=43, dtype=dtype)
        y.backward(grad if y.dtype == dtype else grad.double())
        results.append([y.detach(), leaf.grad, module.weight.grad, module.bias.grad])
    for name, a, t, r in zip(("output", "grad x", "grad weight", "grad bias"), *results):
        check(a, t, r, mode, name)
    return results[0]


@pytest.mark.parametrize("mode, channels_last", [("float64", False), ("float32", False), ("float32", True),
                                                 ("float16", True), ("bfloat16", False)])
@pytest.mark.parametrize("kwargs", TRANSPOSE_MODULES, ids=["dcgan", "groups_output_padding", "dilation"])
def test_conv_transpose2d_module(ct, kernel_calls, kwargs, mode, channels_last):
    x = randn(2, kwargs["in_channels"], 7, 9, seed=44, dtype=MODES[mode][0])
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    y = check_module(ct.ConvTranspose2d, nn.ConvTranspose2d, kwargs, mode, x)[0]
    assert kernel_calls["weight"] == 1 and kernel_calls["input"] == 0  # grad x is a cupyconv conv2d
    assert y.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)


@pytest.mark.parametrize("mode", ["float64", "float32", "float16"])
@pytest.mark.parametrize("kwargs", CONV1D_MODULES, ids=["k3", "strided_grouped_reflect", "same_even"])
def test_conv1d_module(ct, kernel_calls, kwargs, mode):
    x = randn(2, kwargs["in_channels"], 50, seed=45, dtype=MODES[mode][0])
    check_module(ct.Conv1d, nn.Conv1d, kwargs, mode, x)
    assert (kernel_calls["input"], kernel_calls["weight"]) == (1, 1)


def test_conv_transpose2d_output_size_and_unbatched(ct):
    torch.manual_seed(46)
    theirs = nn.ConvTranspose2d(6, 4, 3, stride=2, padding=1, device="cuda", dtype=torch.float64)
    ours = ct.ConvTranspose2d(6, 4, 3, stride=2, padding=1, device="cuda", dtype=torch.float64)
    ours.load_state_dict(theirs.state_dict())
    x = randn(2, 6, 5, 6, seed=47)
    with torch.no_grad():
        for size in ([10, 12], [9, 11]):
            torch.testing.assert_close(ours(x, output_size=size), theirs(x, output_size=size), rtol=1e-12,
                                       atol=1e-12)
        torch.testing.assert_close(ours(x[1]), theirs(x[1]), rtol=1e-12, atol=1e-12)


# --- a converted model trains ---------------------------------------------------------------------------

class Head(nn.Module):
    """Conv2d -> ReLU -> ConvTranspose2d -> a Conv1d over the flattened rows."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.up = nn.ConvTranspose2d(16, 8, 4, stride=2, padding=1)
        self.line = nn.Conv1d(8, 6, 5, padding=2)

    def forward(self, x):
        return self.line(self.up(torch.relu(self.conv(x))).flatten(2))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_converted_model_sgd_step(ct, kernel_calls, dtype):
    torch.manual_seed(48)
    reference = Head().to("cuda", dtype)
    model = ct.convert(copy.deepcopy(reference))
    assert [type(m) for m in model.children()] == [ct.Conv2d, ct.ConvTranspose2d, ct.Conv1d]
    before = [p.detach().clone() for p in reference.parameters()]
    x = randn(4, 3, 12, 12, seed=49, dtype=dtype)
    target = randn(4, 6, 576, seed=50, dtype=dtype)
    losses = []
    for m in (model, reference):
        optimizer = torch.optim.SGD(m.parameters(), lr=0.5, momentum=0.9)
        loss = (m(x) - target).square().mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    # conv: x needs no gradient; up: grad x is a cupyconv conv2d; line: both.
    assert kernel_calls["weight"] == 3 and kernel_calls["input"] == 1
    tolerance = 1e-10 if dtype == torch.float64 else 1e-4
    assert abs(losses[0] - losses[1]) <= tolerance * abs(losses[1])
    for (name, p), q, p0 in zip(model.named_parameters(), reference.parameters(), before):
        assert not torch.equal(q, p0), f"{name}: the step changed nothing"
        assert relative_error(p - p0, (q - p0).double()) <= tolerance, name


# --- CUDA graphs, streams, allocator, determinism --------------------------------------------------------

def make_layer(ct, op, dtype=torch.float32):
    torch.manual_seed(51)
    if op == "conv2d":
        return ct.Conv2d(8, 16, 3, padding=1, device="cuda", dtype=dtype), nn.Conv2d
    return ct.ConvTranspose2d(8, 16, 4, stride=2, padding=1, device="cuda", dtype=dtype), nn.ConvTranspose2d


def float64_gradients(layer, nn_class, x, grad):
    reference = copy.deepcopy(layer)
    reference.__class__ = nn_class
    reference = reference.double()
    reference.zero_grad(set_to_none=True)  # the copy brought the captured gradients along
    leaf = x.detach().double().requires_grad_()
    y = reference(leaf)
    y.backward(grad.double())
    return y.detach(), leaf.grad, reference.weight.grad, reference.bias.grad


@pytest.mark.parametrize("op", ["conv2d", "conv_transpose2d"])
def test_backward_captured_in_cuda_graph(ct, kernel_calls, op):
    """Forward and backward captured (torch's whole-network recipe) and replayed on new inputs: the
    gradients' memory comes from the graph's pool, their kernels run on the capture stream."""
    layer, nn_class = make_layer(ct, op)
    static_x = randn(2, 8, 10, 10, seed=52, dtype=torch.float32).requires_grad_()
    with torch.no_grad():
        static_grad = randn(*layer(static_x).shape, seed=53, dtype=torch.float32)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: compiles every kernel outside the capture
        for _ in range(3):
            layer.zero_grad(set_to_none=True)
            static_x.grad = None
            layer(static_x).backward(static_grad)
    torch.cuda.current_stream().wait_stream(side)
    layer.zero_grad(set_to_none=True)
    static_x.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = layer(static_x)
        static_y.backward(static_grad)
    for seed in (54, 55):
        with torch.no_grad():
            static_x.copy_(randn(*static_x.shape, seed=seed, dtype=torch.float32))
            static_grad.copy_(randn(*static_grad.shape, seed=seed + 10, dtype=torch.float32))
        torch.cuda.empty_cache()  # memory freed after the capture goes back to the driver ...
        garbage = torch.full((1 << 22,), float("nan"), device="cuda")  # ... and is handed out again
        graph.replay()
        torch.cuda.synchronize()
        expected = float64_gradients(layer, nn_class, static_x, static_grad)
        for name, got, ref in zip(("output", "grad x", "grad weight", "grad bias"),
                                  (static_y, static_x.grad, layer.weight.grad, layer.bias.grad), expected):
            assert relative_error(got, ref) <= 1e-5, f"{name} after replay"
        del garbage


def test_backward_on_torch_stream_with_torch_memory(ct, kernel_calls):
    """The backward of a call made on a side stream runs there (autograd's rule), and CuPy takes no
    memory from its own pool: every temporary comes from torch's caching allocator."""
    import cupy

    case = CASES[3]
    x, w, b, grad = conv_inputs(case, torch.float32, seed=60)
    gradients(ct.conv2d, (x, w, b), grad, **case.args)  # compiles the kernels
    kernel_calls["streams"].clear()
    pool = cupy.get_default_memory_pool()
    used = pool.used_bytes()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)  # a slow stream: a backward elsewhere would read too early
        _, ours = gradients(ct.conv2d, (x, w, b), grad, **case.args)
    side.synchronize()
    assert kernel_calls["streams"] == {side.cuda_stream}
    assert pool.used_bytes() == used, "CuPy allocated from its own pool"
    _, ref = gradients(F.conv2d, (x.double(), w.double(), b.double()), grad.double(), **case.args)
    for got, expected in zip(ours, ref):
        assert relative_error(got, expected) <= 1e-5


@pytest.mark.parametrize("op, mode, channels_last", [("conv2d", "float32", False), ("conv2d", "float16", True),
                                                     ("conv2d", "bfloat16", False),
                                                     ("conv_transpose2d", "float32", False)])
def test_weight_gradient_bitwise_repeatable(ct, op, mode, channels_last):
    """Ten backward runs of a long reduction (N Ho Wo = 8 x 28 x 28) give the same bits."""
    dtype = MODES[mode][0]
    x = randn(8, 32, 28, 28, seed=61, dtype=dtype)
    w = randn(32, 32, 3, 3, seed=62, dtype=dtype)
    if channels_last:
        x, w = x.contiguous(memory_format=torch.channels_last), w.contiguous(memory_format=torch.channels_last)
    function = ct.conv2d if op == "conv2d" else ct.conv_transpose2d
    with torch.no_grad():
        grad = randn(*function(x, w, None, 1, 1).shape, seed=63, dtype=dtype)
    results = []
    for _ in range(10):
        w_leaf = w.clone(memory_format=torch.preserve_format).requires_grad_()
        function(x, w_leaf, None, 1, 1).backward(grad)
        results.append(w_leaf.grad)
    assert all(torch.equal(r, results[0]) for r in results[1:]), "the weight gradient changed between runs"
    torch_function = F.conv2d if op == "conv2d" else F.conv_transpose2d
    w64 = w.double().requires_grad_()
    expected = torch.autograd.grad(torch_function(x.double(), w64, None, 1, 1), w64, grad.double())[0]
    w_theirs = w.clone().requires_grad_()
    theirs = torch.autograd.grad(torch_function(x, w_theirs, None, 1, 1), w_theirs, grad)[0]
    check(results[0], theirs, expected, mode, "grad weight")
