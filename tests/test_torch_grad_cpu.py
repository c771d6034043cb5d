"""The PyTorch adapter's gradients, ConvTranspose2d and Conv1d without a GPU: the modules against nn's,
convert() with the new classes, set_backward, and the backward formulas themselves.

The formulas run here on NumPy: the bridge (cupyconv.torch._arrays) gives NumPy arrays for CPU
tensors, so _kernel_gradients (conv2d's backward by cupyconv.grad) and _ConvTranspose2dFunction
(the transposed convolution's forward and backward) run the same code as on CUDA but for the
DLPack exchange, the stream and the allocator.
"""
import os
import subprocess
import sys
import types
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cupyconv.grad
import cupyconv.torch as ct

# --- cases --------------------------------------------------------------------------------------

# (x shape, weight shape, stride, padding, output_padding, groups, dilation): groups, dilation,
# asymmetric strides, output_padding below the stride and (with a larger dilation) at or above it.
TRANSPOSE_CASES = [
    ((2, 4, 5, 6), (4, 3, 3, 3), 2, 1, 1, 1, 1),
    ((1, 4, 5, 5), (4, 2, 4, 4), 2, 1, 0, 2, 1),
    ((2, 3, 4, 5), (3, 2, 3, 2), (1, 2), (0, 1), (2, 1), 1, (3, 2)),
    ((1, 6, 3, 4), (6, 1, 3, 3), 3, 2, (2, 0), 6, (2, 1)),
    ((1, 2, 4, 4), (2, 3, 2, 3), 1, 0, 0, 1, 1),
    ((2, 4, 3, 3), (4, 2, 4, 4), (2, 3), (1, 0), (1, 2), 2, (1, 1)),
]

# (x shape, weight shape, stride, padding, dilation, groups)
CONV1D_CASES = [
    ((2, 3, 17), (5, 3, 3), 1, 0, 1, 1),
    ((2, 4, 16), (6, 2, 4), 1, "same", 1, 2),
    ((1, 6, 19), (6, 1, 5), 2, 2, 2, 6),
    ((3, 4, 23), (8, 4, 7), (3,), (1,), (1,), 1),
    ((1, 4, 9), (4, 4, 2), 1, "valid", 3, 1),
]

# conv2d (x shape, weight shape, stride, padding, dilation, groups) for the kernel-gradient formula.
CONV_CASES = [
    ((2, 3, 9, 10), (5, 3, 3, 3), 1, 1, 1, 1),
    ((2, 4, 8, 7), (6, 2, 4, 2), 1, "same", 1, 2),
    ((1, 6, 11, 9), (6, 1, 3, 3), (2, 1), (1, 2), (1, 2), 6),
    ((2, 3, 13, 13), (4, 3, 5, 5), 3, 2, 1, 1),
    ((1, 4, 9, 10), (8, 4, 3, 4), 1, "same", (2, 1), 1),
]


def _generator(case):
    return torch.Generator().manual_seed(abs(hash(repr(case))) % 2**31)


def _transpose_inputs(case, dtype=torch.float64, bias=True, requires_grad=False):
    x_shape, w_shape, stride, padding, output_padding, groups, dilation = case
    g = _generator(case)
    make = lambda *s: torch.randn(*s, dtype=dtype, generator=g).requires_grad_(requires_grad)
    x, w = make(*x_shape), make(*w_shape)
    b = make(w_shape[1] * groups) if bias else None
    return x, w, b, dict(stride=stride, padding=padding, output_padding=output_padding, groups=groups,
                         dilation=dilation)


def _conv_inputs(case, dtype=torch.float64, requires_grad=False):
    x_shape, w_shape, stride, padding, dilation, groups = case
    g = _generator(case)
    make = lambda *s: torch.randn(*s, dtype=dtype, generator=g).requires_grad_(requires_grad)
    return (make(*x_shape), make(*w_shape), make(w_shape[0]),
            dict(stride=stride, padding=padding, dilation=dilation, groups=groups))


def _kwargs_of(module):
    return {name: getattr(module, name) for name in ("stride", "padding", "dilation", "groups")}


# --- ConvTranspose2d and Conv1d: drop-in modules --------------------------------------------------

TRANSPOSE_CONSTRUCTORS = [
    dict(in_channels=4, out_channels=6, kernel_size=3, stride=2, padding=1, output_padding=1),
    dict(in_channels=4, out_channels=6, kernel_size=(4, 3), stride=(2, 1), padding=(1, 0), groups=2, bias=False),
    dict(in_channels=3, out_channels=2, kernel_size=3, stride=1, dilation=3, output_padding=2, dtype=torch.float64),
]
CONV1D_CONSTRUCTORS = [
    dict(in_channels=3, out_channels=8, kernel_size=3),
    dict(in_channels=4, out_channels=6, kernel_size=5, stride=2, padding=2, dilation=2, groups=2, bias=False),
    dict(in_channels=4, out_channels=4, kernel_size=4, padding="same", padding_mode="reflect"),
    dict(in_channels=4, out_channels=4, kernel_size=3, padding=2, padding_mode="circular", groups=4),
    dict(in_channels=2, out_channels=5, kernel_size=2, padding=1, padding_mode="replicate", dtype=torch.float64),
]
MODULE_PAIRS = [(ct.ConvTranspose2d, nn.ConvTranspose2d, kwargs) for kwargs in TRANSPOSE_CONSTRUCTORS] + \
               [(ct.Conv1d, nn.Conv1d, kwargs) for kwargs in CONV1D_CONSTRUCTORS]


def _module_input(theirs_class, kwargs, batch=3):
    g = torch.Generator().manual_seed(5)
    spatial = (7, 6) if theirs_class is nn.ConvTranspose2d else (19,)
    return torch.randn(batch, kwargs["in_channels"], *spatial, dtype=kwargs.get("dtype", torch.float32), generator=g)


def _loaded_pair(ours_class, theirs_class, kwargs):
    """(ours, theirs, x): torch's module, ours with its state_dict, and an input for both."""
    theirs = theirs_class(**kwargs)
    ours = ours_class(**kwargs)
    ours.load_state_dict(theirs.state_dict())
    return ours, theirs, _module_input(theirs_class, kwargs)


@pytest.mark.parametrize("ours_class, theirs_class, kwargs", MODULE_PAIRS)
def test_module_constructor_and_init_match(ours_class, theirs_class, kwargs):
    torch.manual_seed(7)
    ours = ours_class(**kwargs)
    torch.manual_seed(7)
    theirs = theirs_class(**kwargs)
    assert isinstance(ours, theirs_class)
    for name in ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "groups",
                 "padding_mode", "output_padding", "transposed"):
        assert getattr(ours, name) == getattr(theirs, name), name
    ours_params, theirs_params = dict(ours.named_parameters()), dict(theirs.named_parameters())
    assert ours_params.keys() == theirs_params.keys()
    for name, p in ours_params.items():
        assert p.dtype == theirs_params[name].dtype and torch.equal(p, theirs_params[name]), name
    assert ours.weight.std() > 0


@pytest.mark.parametrize("ours_class, theirs_class, kwargs", MODULE_PAIRS)
def test_module_state_dict_both_ways_and_cpu_results(ours_class, theirs_class, kwargs):
    ours, theirs, x = _loaded_pair(ours_class, theirs_class, kwargs)
    torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=0)
    torch.testing.assert_close(ours(x[0]), theirs(x[0]), rtol=0, atol=0)  # unbatched
    fresh = theirs_class(**kwargs)
    fresh.load_state_dict(ours_class(**kwargs).state_dict())
    ours.load_state_dict(fresh.state_dict())
    torch.testing.assert_close(ours(x), fresh(x), rtol=0, atol=0)


@pytest.mark.parametrize("ours_class, theirs_class, kwargs", MODULE_PAIRS)
def test_module_gradients_on_cpu_equal_nn(ours_class, theirs_class, kwargs):
    ours, theirs, x = _loaded_pair(ours_class, theirs_class, kwargs)
    x_ours, x_theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ours, y_theirs = ours(x_ours), theirs(x_theirs)
    grad = torch.randn_like(y_theirs)
    (y_ours * grad).sum().backward()
    (y_theirs * grad).sum().backward()
    torch.testing.assert_close(x_ours.grad, x_theirs.grad)
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)


def test_conv_transpose2d_module_output_size():
    kwargs = dict(in_channels=4, out_channels=3, kernel_size=3, stride=2, padding=1)
    theirs = nn.ConvTranspose2d(**kwargs)
    ours = ct.ConvTranspose2d(**kwargs)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(2, 4, 5, 6)
    for size in ([10, 12], [9, 11], (2, 3, 10, 11)):
        y = ours(x, output_size=size)
        assert y.shape[-2:] == tuple(size[-2:])
        torch.testing.assert_close(y, theirs(x, output_size=size), rtol=0, atol=0)
    with pytest.raises(ValueError):
        ours(x, output_size=[13, 12])  # nn's own check: out of the reachable range


def test_conv_transpose2d_module_refuses_padding_modes_as_nn():
    with pytest.raises(ValueError, match="Only \"zeros\" padding mode|Only `zeros` padding mode"):
        ct.ConvTranspose2d(2, 2, 3, padding_mode="reflect")(torch.randn(1, 2, 4, 4))


def test_reprs_say_cupyconv():
    assert repr(ct.ConvTranspose2d(4, 6, 3, stride=2)) == \
        repr(nn.ConvTranspose2d(4, 6, 3, stride=2)).replace("ConvTranspose2d(", "cupyconv.ConvTranspose2d(", 1)
    assert repr(ct.Conv1d(4, 6, 3, padding_mode="reflect")) == \
        repr(nn.Conv1d(4, 6, 3, padding_mode="reflect")).replace("Conv1d(", "cupyconv.Conv1d(", 1)


# --- the functional forms on the CPU ------------------------------------------------------------

@pytest.mark.parametrize("case", TRANSPOSE_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_conv_transpose2d_cpu_equals_torch(case, dtype):
    x, w, b, args = _transpose_inputs(case, dtype)
    torch.testing.assert_close(ct.conv_transpose2d(x, w, b, **args), F.conv_transpose2d(x, w, b, **args),
                               rtol=0, atol=0)
    torch.testing.assert_close(ct.conv_transpose2d(x[0], w, None, **args), F.conv_transpose2d(x[0], w, None, **args),
                               rtol=0, atol=0)


@pytest.mark.parametrize("case", CONV1D_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_conv1d_cpu_equals_torch(case, dtype):
    x_shape, w_shape, stride, padding, dilation, groups = case
    g = _generator(case)
    x, w, b = (torch.randn(*s, dtype=dtype, generator=g) for s in (x_shape, w_shape, (w_shape[0],)))
    args = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    torch.testing.assert_close(ct.conv1d(x, w, b, **args), F.conv1d(x, w, b, **args), rtol=0, atol=0)
    torch.testing.assert_close(ct.conv1d(x[0], w, None, **args), F.conv1d(x[0], w, None, **args), rtol=0, atol=0)


@pytest.mark.parametrize("call, error, message", [
    (lambda: ct.conv_transpose2d(torch.randn(1, 4, 5, 5), torch.randn(4, 2, 3)), ValueError, r"weight must be 4-D"),
    (lambda: ct.conv_transpose2d(torch.randn(4, 5), torch.randn(4, 2, 3, 3)), ValueError, r"x must be 4-D"),
    (lambda: ct.conv_transpose2d(torch.randn(1, 4, 5, 5), torch.randn(3, 2, 3, 3)), ValueError, r"C_in = 3"),
    (lambda: ct.conv_transpose2d(torch.randn(1, 4, 5, 5), torch.randn(4, 2, 3, 3), stride=2, output_padding=2),
     ValueError, r"output_padding 2 must be smaller than the stride"),
    (lambda: ct.conv_transpose2d(torch.randn(1, 4, 5, 5), torch.randn(4, 2, 3, 3), torch.randn(3)), ValueError,
     r"bias must have shape \(2,\)"),
    (lambda: ct.conv_transpose2d(torch.randn(1, 4, 5, 5), torch.randn(4, 2, 3, 3).double()), TypeError,
     r"weight has dtype torch.float64 but x has dtype torch.float32"),
    (lambda: ct.conv_transpose2d(torch.randn(1, 4, 5, 5), torch.randn(4, 2, 3, 3), padding="same"), ValueError,
     r"conv_transpose2d takes no 'same'"),
    (lambda: ct.conv1d(torch.randn(1, 4, 5, 5), torch.randn(4, 4, 3)), ValueError, r"x must be 3-D \(N, C, L\)"),
    (lambda: ct.conv1d(torch.randn(1, 4, 9), torch.randn(4, 4, 3, 3)), ValueError, r"weight must be 3-D"),
    (lambda: ct.conv1d(torch.randn(1, 4, 9), torch.randn(4, 4, 3), stride=(1, 2)), TypeError,
     r"stride must be an int or a 1-tuple"),
    (lambda: ct.conv1d(torch.randn(1, 4, 9), torch.randn(4, 4, 3), padding="same", stride=2), ValueError,
     r"padding='same' needs stride 1"),
    (lambda: ct.conv1d(torch.randn(1, 4, 9).int(), torch.randn(4, 4, 3).int()), TypeError, r"x has dtype torch.int32"),
    (lambda: ct.conv1d(torch.randn(1, 4, 9), torch.randn(4, 2, 3)), ValueError, r"x has C=4 channels"),
])
def test_argument_errors(call, error, message):
    with pytest.raises(error, match=message):
        call()


# --- convert ------------------------------------------------------------------------------------

class ScaledConvTranspose2d(nn.ConvTranspose2d):
    """A subclass with its own forward, which convert() must leave alone."""

    def forward(self, x, output_size=None):
        return 2 * super().forward(x, output_size)


class Head(nn.Module):
    """Conv2d -> ReLU -> ConvTranspose2d, then a Conv1d over the flattened rows."""

    def __init__(self, transposed=nn.ConvTranspose2d, dtype=torch.float32):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, dtype=dtype)
        self.up = transposed(8, 4, 4, stride=2, padding=1, dtype=dtype)
        self.line = nn.Conv1d(4, 6, 3, padding=1, padding_mode="circular", dtype=dtype)

    def forward(self, x):
        y = self.up(torch.relu(self.conv(x)))
        return self.line(y.flatten(2))


def test_convert_switches_the_new_classes_in_place():
    torch.manual_seed(3)
    model = nn.Sequential(Head(), nn.Sequential(nn.ConvTranspose2d(6, 2, 1)), ScaledConvTranspose2d(2, 2, 1))
    params = dict(model.named_parameters())
    x = torch.randn(2, 3, 6, 6)
    expected = model[0](x)
    with pytest.warns(UserWarning, match=r"left 1 module\(s\) unchanged: 2 \(ScaledConvTranspose2d\)"):
        assert ct.convert(model) is model
    assert {name: type(m) for name, m in model.named_modules() if name} == {
        "0": Head, "0.conv": ct.Conv2d, "0.up": ct.ConvTranspose2d, "0.line": ct.Conv1d, "1": nn.Sequential,
        "1.0": ct.ConvTranspose2d, "2": ScaledConvTranspose2d}
    assert all(p is params[name] for name, p in model.named_parameters())
    torch.testing.assert_close(model[0](x), expected, rtol=0, atol=0)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the subclass was never converted: nothing to report
        ct.convert(model, inverse=True)
    assert {name: type(m) for name, m in model.named_modules() if name} == {
        "0": Head, "0.conv": nn.Conv2d, "0.up": nn.ConvTranspose2d, "0.line": nn.Conv1d, "1": nn.Sequential,
        "1.0": nn.ConvTranspose2d, "2": ScaledConvTranspose2d}
    assert all(p is params[name] for name, p in model.named_parameters())
    torch.testing.assert_close(model[0](x), expected, rtol=0, atol=0)


def test_convert_state_dicts_load_both_ways():
    torch.manual_seed(4)
    plain = Head()
    converted = ct.convert(Head())
    assert converted.state_dict().keys() == plain.state_dict().keys()
    converted.load_state_dict(plain.state_dict())
    x = torch.randn(2, 3, 5, 7)
    torch.testing.assert_close(converted(x), plain(x), rtol=0, atol=0)
    other = ct.convert(Head())
    plain.load_state_dict(other.state_dict())
    torch.testing.assert_close(plain(x), other(x), rtol=0, atol=0)


def test_convert_reports_unknown_subclasses_and_dtypes():
    class Custom1d(ct.Conv1d):
        pass

    model = nn.Sequential(Custom1d(2, 2, 1), ct.ConvTranspose2d(2, 2, 1), ct.Conv1d(2, 2, 1))
    with pytest.warns(UserWarning, match=r"0 \(.*Custom1d\)"):
        ct.convert(model, inverse=True)
    assert [type(m) for m in model] == [Custom1d, nn.ConvTranspose2d, nn.Conv1d]
    lazy = nn.Sequential(nn.LazyConvTranspose2d(4, 3), nn.Conv1d(2, 3, 3, dtype=torch.complex64))
    with pytest.warns(UserWarning, match=r"0 \(LazyConvTranspose2d\), 1 \(dtype torch.complex64\)"):
        ct.convert(lazy)
    assert type(lazy[0]) is nn.LazyConvTranspose2d and type(lazy[1]) is nn.Conv1d
    assert type(ct.convert(nn.ConvTranspose2d(2, 3, 3))) is ct.ConvTranspose2d
    assert type(ct.convert(nn.Conv1d(2, 3, 3))) is ct.Conv1d


def test_convert_fuse_keeps_the_new_modules_as_leaves():
    """torch.fx traces cupyconv's ConvTranspose2d and Conv1d as modules (not into them)."""
    torch.manual_seed(5)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.ConvTranspose2d(4, 2, 2, 2),
                          nn.Flatten(2), nn.Conv1d(2, 3, 3)).eval()
    model[1].running_mean.uniform_(-1, 1)
    x = torch.randn(2, 3, 6, 6)
    expected = model(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fused = ct.convert(model, fuse=True)
    assert isinstance(fused, torch.fx.GraphModule)
    called = {node.target for node in fused.graph.nodes if node.op == "call_module"}
    assert {"3", "5"} <= called
    assert type(fused.get_submodule("3")) is ct.ConvTranspose2d and type(fused.get_submodule("5")) is ct.Conv1d
    torch.testing.assert_close(fused(x), expected)


def test_converted_model_compiles_fullgraph():
    """Conv1d runs through conv2d's custom op under torch.compile, ConvTranspose2d through torch's
    op: no graph breaks, torch's results."""
    torch.manual_seed(6)
    model = ct.convert(Head())
    x = torch.randn(2, 3, 6, 6)
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(model)(x)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager", dynamic=True)
    for batch in (2, 3):
        xb = torch.randn(batch, 3, 6, 6)
        torch.testing.assert_close(compiled(xb), model(xb))


# --- set_backward ---------------------------------------------------------------------------------

def test_set_backward_returns_previous_and_validates():
    first = ct.set_backward("torch")
    try:
        assert first == "cupyconv"  # the default (the tests run without CUPYCONV_TORCH_BACKWARD)
        assert ct.set_backward("cupyconv") == "torch"
        assert ct.set_backward("cupyconv") == "cupyconv"
        for bad in ("cudnn", "", None, 1, "Torch"):
            with pytest.raises(ValueError, match=r"must be one of \('cupyconv', 'torch'\)"):
                ct.set_backward(bad)
        assert ct.set_backward("cupyconv") == "cupyconv"  # a refused kind changes nothing
    finally:
        ct.set_backward(first)


def _import_with_backward(value):
    env = {**os.environ, "CUPYCONV_TORCH_BACKWARD": value}
    code = "import cupyconv.torch as ct; print(ct.set_backward('cupyconv'))"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)


@pytest.mark.parametrize("value, expected", [("torch", "torch"), ("cupyconv", "cupyconv"), ("", "cupyconv")])
def test_backward_environment_variable(value, expected):
    result = _import_with_backward(value)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == expected


def test_backward_environment_variable_refuses_other_values():
    result = _import_with_backward("cudnn")
    assert result.returncode != 0
    assert "ValueError: the environment variable CUPYCONV_TORCH_BACKWARD must be one of ('cupyconv', 'torch'), " \
           "got 'cudnn'" in result.stderr


def test_kernel_backward_follows_switch_and_grad_mode():
    previous = ct.set_backward("cupyconv")
    try:
        with torch.no_grad():  # a backward without create_graph runs with grad mode off
            assert ct._kernel_backward(2) and not ct._kernel_backward(0)
        with torch.enable_grad():  # create_graph: torch's differentiable functions
            assert not ct._kernel_backward(2)
        ct.set_backward("torch")
        with torch.no_grad():
            assert not ct._kernel_backward(2)
    finally:
        ct.set_backward(previous)


# --- the backward formulas, on NumPy --------------------------------------------------------------

@pytest.mark.parametrize("case", TRANSPOSE_CASES)
def test_transposed_weight_gradient_identity_numpy(case):
    """For y = conv_transpose2d(x, w): grad w = conv2d_weight(grad y, w.shape, x) of the conv2d whose
    input has y's shape, x zero-padded at the bottom/right where output_padding >= stride makes
    that conv's output larger than x; grad x = conv2d(grad y, w) cropped to x."""
    x, w, b, args = _transpose_inputs(case, requires_grad=True)
    y = F.conv_transpose2d(x, w, b, **args)
    grad_y = torch.randn(y.shape, dtype=y.dtype, generator=_generator((case, "grad")))
    grad_x, grad_w = torch.autograd.grad(y, (x, w), grad_y)
    conv_args = dict(stride=args["stride"], padding=args["padding"], dilation=args["dilation"], groups=args["groups"])
    full = F.conv2d(grad_y, w.detach(), None, **conv_args)
    extra_h, extra_w = full.shape[2] - x.shape[2], full.shape[3] - x.shape[3]
    assert (extra_h, extra_w) == tuple(op // s for op, s in zip(*(np.broadcast_to(args[k], 2)
                                                                   for k in ("output_padding", "stride"))))
    torch.testing.assert_close(full[:, :, :x.shape[2], :x.shape[3]], grad_x, rtol=1e-12, atol=1e-12)
    x_read = np.pad(x.detach().numpy(), ((0, 0), (0, 0), (0, extra_h), (0, extra_w)))
    ours = cupyconv.grad.conv2d_weight(grad_y.numpy(), tuple(w.shape), x_read, **conv_args)
    np.testing.assert_allclose(ours, grad_w.numpy(), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("case", TRANSPOSE_CASES)
def test_transposed_function_gradcheck_numpy(case):
    """The autograd Function of CUDA calls, run on NumPy: first derivatives by cupyconv's formulas
    (no_grad backward), second derivatives through torch's (create_graph)."""
    x, w, b, args = _transpose_inputs(case, requires_grad=True)
    tp = ct._transpose_problem(x, w, b, **args)
    function = lambda x, w, b: ct._ConvTranspose2dFunction.apply(x, w, b, tp)
    torch.testing.assert_close(function(x, w, b), F.conv_transpose2d(x, w, b, **args))
    assert torch.autograd.gradcheck(function, (x, w, b))
    assert torch.autograd.gradgradcheck(function, (x, w, b))


@pytest.mark.parametrize("case", TRANSPOSE_CASES)
@pytest.mark.parametrize("backward", ["cupyconv", "torch"])
def test_transposed_function_layouts_numpy(case, backward):
    """float32 channels_last tensors as NHWC / KHWC arrays, both backward kinds, against torch's
    float64 autograd; only the needed gradients."""
    x, w, b, args = _transpose_inputs(case)
    x_cl = x.float().contiguous(memory_format=torch.channels_last).requires_grad_()
    w_cl = w.float().contiguous(memory_format=torch.channels_last).requires_grad_()
    tp = ct._transpose_problem(x_cl, w_cl, None, **args)
    assert tp.layout == "NHWC"
    previous = ct.set_backward(backward)
    try:
        y = ct._ConvTranspose2dFunction.apply(x_cl, w_cl, None, tp)
        assert y.is_contiguous(memory_format=torch.channels_last)
        grad_y = torch.randn(y.shape, dtype=torch.float64, generator=_generator((case, "grad")))
        grad_x, grad_w = torch.autograd.grad(y, (x_cl, w_cl), grad_y.float())
        only_w = torch.autograd.grad(ct._ConvTranspose2dFunction.apply(x_cl.detach(), w_cl, None, tp), w_cl,
                                     grad_y.float())[0]
    finally:
        ct.set_backward(previous)
    x64, w64 = x.clone().requires_grad_(), w.clone().requires_grad_()
    ref = F.conv_transpose2d(x64, w64, None, **args)
    ref_x, ref_w = torch.autograd.grad(ref, (x64, w64), grad_y)
    for got, expected in ((y, ref), (grad_x, ref_x), (grad_w, ref_w), (only_w, ref_w)):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.double(), expected.detach(), rtol=1e-5, atol=1e-5)


def _fake_ctx(x, w, needs=(True, True, True)):
    return types.SimpleNamespace(saved_tensors=(x, w), needs_input_grad=needs)


@pytest.mark.parametrize("case", CONV_CASES)
@pytest.mark.parametrize("channels_last", [False, True])
def test_conv2d_kernel_gradients_numpy(case, channels_last):
    """conv2d's backward by cupyconv.grad (input_gradient, weight_gradient of the call's problem),
    asymmetric 'same' included, through the bridge's NCHW and NHWC arrays, against torch's autograd."""
    x, w, b, args = _conv_inputs(case)
    dtype = torch.float32 if channels_last else torch.float64
    x, w, b = x.to(dtype), w.to(dtype), b.to(dtype)
    if channels_last:
        x, w = x.contiguous(memory_format=torch.channels_last), w.contiguous(memory_format=torch.channels_last)
    problem = ct._problem(x, w, b, **args)
    assert problem.layout == ("NHWC" if channels_last else "NCHW")
    x_ref, w_ref, b_ref = (t.detach().double().requires_grad_() for t in (x, w, b))
    y = F.conv2d(x_ref, w_ref, b_ref, **args)
    grad_y = torch.randn(y.shape, dtype=torch.float64, generator=_generator((case, "grad")))
    expected = torch.autograd.grad(y, (x_ref, w_ref, b_ref), grad_y)
    got = ct._kernel_gradients(_fake_ctx(x, w), grad_y.to(dtype), problem)
    tolerance = 1e-5 if channels_last else 1e-12
    for name, g, e, t in zip(("x", "weight", "bias"), got, expected, (x, w, b)):
        assert g.shape == t.shape and g.dtype == dtype, name
        torch.testing.assert_close(g.double(), e, rtol=tolerance, atol=tolerance, msg=name)
    assert got[0].is_contiguous(memory_format=torch.channels_last) == channels_last
    # Only what is needed; a grad_output of any strides (expanded, as a sum's backward gives).
    expanded = torch.ones((), dtype=dtype).expand(y.shape)
    only_x = ct._kernel_gradients(_fake_ctx(None, w, (True, False, False)), expanded, problem)
    assert only_x[1] is None and only_x[2] is None
    ref_x = torch.autograd.grad(F.conv2d(x_ref, w_ref, None, **args).sum(), x_ref)[0]
    torch.testing.assert_close(only_x[0].double(), ref_x, rtol=tolerance, atol=tolerance)


def test_kernel_gradients_leave_inputs_alone():
    x, w, b, args = _conv_inputs(CONV_CASES[1])
    problem = ct._problem(x, w, b, **args)
    before = x.clone(), w.clone()
    grad_y = torch.randn(problem.out_shape, dtype=torch.float64)
    ct._kernel_gradients(_fake_ctx(x, w), grad_y, problem)
    assert torch.equal(x, before[0]) and torch.equal(w, before[1])
