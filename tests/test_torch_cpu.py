"""The PyTorch adapter without a GPU: module compatibility with nn.Conv2d, convert(), the CPU path,
the custom op's registration (schema, fake kernel, autograd, torch.compile) and argument errors.

The custom op's CPU kernel stands in for the CUDA one here, so the autograd formula and the
torch.compile path (everything but the launch) are checked in CI.
"""
import copy
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cupyconv.torch as ct

CONSTRUCTOR_CASES = [
    dict(in_channels=3, out_channels=8, kernel_size=3),
    dict(in_channels=3, out_channels=96, kernel_size=11, stride=4, padding=2),
    dict(in_channels=4, out_channels=6, kernel_size=(3, 5), stride=(2, 1), padding=(1, 2), dilation=(1, 2),
         groups=2, bias=False),
    dict(in_channels=8, out_channels=8, kernel_size=3, padding="same", groups=8, padding_mode="reflect"),
    dict(in_channels=4, out_channels=4, kernel_size=4, padding="same", padding_mode="circular"),
    dict(in_channels=2, out_channels=5, kernel_size=2, padding="valid", padding_mode="replicate",
         dtype=torch.float64),
]

# (x shape, weight shape, stride, padding, dilation, groups)
CONV_CASES = [
    ((2, 3, 11, 13), (5, 3, 3, 3), 1, 0, 1, 1),
    ((2, 4, 16, 15), (6, 2, 4, 2), 1, "same", 1, 2),
    ((1, 6, 17, 9), (6, 1, 3, 3), (2, 1), (1, 2), (1, 2), 6),
    ((3, 3, 23, 23), (4, 3, 11, 11), 4, 2, 1, 1),
    ((2, 4, 9, 10), (8, 4, 3, 4), 1, "same", (2, 1), 1),
    ((1, 4, 7, 8), (4, 4, 2, 2), (3, 2), "valid", 1, 1),
]

# Small enough for gradcheck's finite differences; asymmetric 'same', strides that skip input rows.
GRAD_CASES = [
    ((1, 4, 6, 7), (6, 2, 4, 2), 1, "same", 1, 2),
    ((2, 3, 7, 7), (4, 3, 3, 3), 2, 1, 1, 1),
    ((1, 4, 7, 6), (4, 1, 3, 3), (2, 1), (1, 2), (1, 2), 4),
    ((1, 2, 9, 9), (3, 2, 4, 4), 3, 2, 1, 1),
]


def _random_conv(case, dtype=torch.float64, bias=True, requires_grad=False):
    x_shape, w_shape, stride, padding, dilation, groups = case
    g = torch.Generator().manual_seed(hash(case) % 2**31)
    x = torch.randn(x_shape, dtype=dtype, generator=g).requires_grad_(requires_grad)
    w = torch.randn(w_shape, dtype=dtype, generator=g).requires_grad_(requires_grad)
    b = torch.randn(w_shape[0], dtype=dtype, generator=g).requires_grad_(requires_grad) if bias else None
    return x, w, b, dict(stride=stride, padding=padding, dilation=dilation, groups=groups)


def _op_call(x, w, b, args):
    """The compiled route of conv2d() (checks, then the custom op) taken with CPU tensors."""
    if x.dim() == 3:
        return _op_call(x.unsqueeze(0), w, b, args).squeeze(0)
    return ct._op_conv2d(x, w, b, ct._problem(x, w, b, **args))


# --- the module ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs", CONSTRUCTOR_CASES)
def test_constructor_matches_nn_conv2d(kwargs):
    torch.manual_seed(7)
    ours = ct.Conv2d(**kwargs)
    torch.manual_seed(7)
    theirs = nn.Conv2d(**kwargs)
    assert isinstance(ours, nn.Conv2d)
    for name in ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "groups",
                 "padding_mode", "_reversed_padding_repeated_twice"):
        assert getattr(ours, name) == getattr(theirs, name), name
    ours_params, theirs_params = dict(ours.named_parameters()), dict(theirs.named_parameters())
    assert ours_params.keys() == theirs_params.keys()
    for name, p in ours_params.items():
        assert p.shape == theirs_params[name].shape and p.dtype == theirs_params[name].dtype
        assert torch.equal(p, theirs_params[name]), f"{name} initialised differently"
    assert ours.weight.std() > 0


@pytest.mark.parametrize("kwargs", CONSTRUCTOR_CASES)
def test_state_dict_loads_both_ways(kwargs):
    ours, theirs = ct.Conv2d(**kwargs), nn.Conv2d(**kwargs)
    ours.load_state_dict(theirs.state_dict())
    assert all(torch.equal(v, theirs.state_dict()[k]) for k, v in ours.state_dict().items())
    fresh = nn.Conv2d(**kwargs)
    fresh.load_state_dict(ct.Conv2d(**kwargs).state_dict())
    ours = ct.Conv2d(**kwargs)
    ours.load_state_dict(fresh.state_dict())
    x = torch.randn(2, kwargs["in_channels"], 12, 12, dtype=kwargs.get("dtype", torch.float32))
    torch.testing.assert_close(ours(x), fresh(x), rtol=0, atol=0)


def test_repr_says_cupyconv():
    kwargs = dict(in_channels=3, out_channels=96, kernel_size=11, stride=4, padding=2, padding_mode="reflect")
    ours = repr(ct.Conv2d(**kwargs))
    assert ours.startswith("cupyconv.Conv2d(")
    assert ours == repr(nn.Conv2d(**kwargs)).replace("Conv2d(", "cupyconv.Conv2d(", 1)
    assert "cupyconv.Conv2d(3, 8" in repr(nn.Sequential(ct.Conv2d(3, 8, 3), nn.ReLU()))


@pytest.mark.parametrize("kwargs", CONSTRUCTOR_CASES)
def test_module_on_cpu_equals_nn_conv2d(kwargs):
    theirs = nn.Conv2d(**kwargs)
    ours = ct.Conv2d(**kwargs)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(3, kwargs["in_channels"], 14, 13, dtype=kwargs.get("dtype", torch.float32))
    torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=0)
    torch.testing.assert_close(ours(x[0]), theirs(x[0]), rtol=0, atol=0)


# --- convert ------------------------------------------------------------------------------------

class ScaledConv2d(nn.Conv2d):
    """A subclass with its own forward, which convert() must leave alone."""

    def forward(self, x):
        return 2 * super().forward(x)


def _nested_model():
    torch.manual_seed(3)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.Sequential(nn.ReLU(), nn.Conv2d(8, 8, 3, padding="same", padding_mode="reflect", groups=4)),
        ScaledConv2d(8, 4, 1),
        nn.Sequential(nn.Sequential(nn.Conv2d(4, 6, 2, stride=2, bias=False))),
    )


def test_convert_switches_plain_conv2d_in_place_and_reports_subclasses():
    model = _nested_model()
    model[1].eval()
    hook_calls = []
    model[0].register_forward_hook(lambda *args: hook_calls.append(1))
    params = {name: p for name, p in model.named_parameters()}
    modules = dict(model.named_modules())
    x = torch.randn(2, 3, 10, 10)
    expected = model(x)

    with pytest.warns(UserWarning, match=r"left 1 module\(s\) unchanged: 2 \(ScaledConv2d\)"):
        assert ct.convert(model) is model

    assert dict(model.named_modules()).keys() == modules.keys()
    assert all(m is modules[name] for name, m in model.named_modules())
    assert {name: type(m) for name, m in model.named_modules() if isinstance(m, nn.Conv2d)} == {
        "0": ct.Conv2d, "1.1": ct.Conv2d, "2": ScaledConv2d, "3.0.0": ct.Conv2d}
    assert all(p is params[name] for name, p in model.named_parameters())
    assert model.training and model[0].training and not model[1].training and not model[1][1].training
    assert all(p.dtype == torch.float32 and p.device.type == "cpu" for p in model.parameters())
    torch.testing.assert_close(model(x), expected, rtol=0, atol=0)
    assert len(hook_calls) == 2


def test_convert_inverse_gives_plain_nn_conv2d_back():
    model = _nested_model()
    x = torch.randn(2, 3, 10, 10)
    expected = model(x)
    params = list(model.parameters())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ct.convert(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to report: the subclass was never converted
        ct.convert(model, inverse=True)
    assert not any(isinstance(m, ct.Conv2d) for m in model.modules())
    assert [type(m) for m in model.modules() if isinstance(m, nn.Conv2d)] == [nn.Conv2d, nn.Conv2d, ScaledConv2d,
                                                                              nn.Conv2d]
    assert all(a is b for a, b in zip(model.parameters(), params))
    torch.testing.assert_close(model(x), expected, rtol=0, atol=0)


def test_convert_root_module_and_dtype_it_cannot_compute():
    root = nn.Conv2d(2, 3, 3, dtype=torch.float64)
    assert type(ct.convert(root)) is ct.Conv2d
    complex_conv = nn.Sequential(nn.Conv2d(2, 3, 3, dtype=torch.complex64))
    with pytest.warns(UserWarning, match=r"0 \(dtype torch.complex64\)"):
        ct.convert(complex_conv)
    assert type(complex_conv[0]) is nn.Conv2d


def test_convert_reports_subclass_of_cupyconv_conv2d_on_inverse():
    class Custom(ct.Conv2d):
        pass

    model = nn.Sequential(Custom(2, 2, 1), ct.Conv2d(2, 2, 1))
    with pytest.warns(UserWarning, match=r"0 \(.*Custom\)"):
        ct.convert(model, inverse=True)
    assert type(model[0]) is Custom and type(model[1]) is nn.Conv2d


def test_convert_rejects_non_module():
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        ct.convert([nn.Conv2d(1, 1, 1)])


def test_convert_static_weights_keeps_every_modules_forms_in_graphs():
    """static_weights=True: every cupyconv convolution of the model (switched now or by an earlier
    convert) gets a weight cache kept in CUDA graphs, deep copies too; load_state_dict refreshes them
    through one post-hook however often convert runs; the model computes as before; a non-bool and
    inverse=True are refused before anything changes."""
    model = _nested_model()
    x = torch.randn(2, 3, 10, 10)
    expected = model(x)
    ct.convert(model[1])  # converted before, without static weights
    with pytest.raises(TypeError, match="static_weights must be True or False, got 'yes'"):
        ct.convert(model, static_weights="yes")
    with pytest.raises(ValueError, match="static_weights=True and inverse=True"):
        ct.convert(model, inverse=True, static_weights=True)
    assert type(model[0]) is nn.Conv2d  # refused before any change
    for _ in range(2):
        with pytest.warns(UserWarning, match="ScaledConv2d"):
            ct.convert(model, static_weights=True)
    ours = [m for m in model.modules() if type(m) is ct.Conv2d]
    assert len(ours) == 3 and all(m.__dict__["_cupyconv_weights"].kept_in_graphs for m in ours)
    assert len(model._load_state_dict_post_hooks) == 1
    torch.testing.assert_close(model(x), expected, rtol=0, atol=0)
    copied = copy.deepcopy(model)
    assert all(m.__dict__["_cupyconv_weights"].kept_in_graphs for m in copied.modules() if type(m) is ct.Conv2d)
    model.load_state_dict(copied.state_dict())  # the hook runs (nothing to refresh on the CPU)
    ct.refresh_weight_caches(model)
    torch.testing.assert_close(model(x), expected, rtol=0, atol=0)


# --- the functional path ------------------------------------------------------------------------

@pytest.mark.parametrize("case", CONV_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cpu_fallback_equals_torch(case, dtype):
    x, w, b, args = _random_conv(case, dtype)
    torch.testing.assert_close(ct.conv2d(x, w, b, **args), F.conv2d(x, w, b, **args), rtol=0, atol=0)
    torch.testing.assert_close(ct.conv2d(x, w, None, **args), F.conv2d(x, w, None, **args), rtol=0, atol=0)


@pytest.mark.parametrize("case", CONV_CASES)
def test_op_route_equals_torch(case):
    x, w, b, args = _random_conv(case)
    torch.testing.assert_close(_op_call(x, w, b, args), F.conv2d(x, w, b, **args))
    torch.testing.assert_close(_op_call(x[0], w, b, args), F.conv2d(x[0], w, b, **args))


def test_op_route_keeps_channels_last():
    x, w, b, args = _random_conv(CONV_CASES[1])
    x, w, b = (None if t is None else t.float() for t in (x, w, b))  # float64 stays contiguous (below)
    x = x.contiguous(memory_format=torch.channels_last)
    y = _op_call(x, w, b, args)
    assert y.is_contiguous(memory_format=torch.channels_last) and not y.is_contiguous()
    torch.testing.assert_close(y, F.conv2d(x, w, b, **args))
    assert _op_call(x.contiguous(), w, b, args).is_contiguous()
    # A channels_last weight makes the output channels_last (torch's CUDA rule), float64 never.
    w_cl = w.contiguous(memory_format=torch.channels_last)
    assert _op_call(x.contiguous(), w_cl, b, args).is_contiguous(memory_format=torch.channels_last)
    x64, w64 = x.double(), w_cl.double()
    assert _op_call(x64, w64, b.double() if b is not None else None, args).is_contiguous()


@pytest.mark.parametrize("channels_last", [False, True])
def test_opcheck_channels_last(channels_last):
    """The fake kernel's output strides are the real kernel's in both memory formats."""
    x, w, b, args = _random_conv(CONV_CASES[1])
    if channels_last:
        x, w = x.contiguous(memory_format=torch.channels_last), w.contiguous(memory_format=torch.channels_last)
    problem = ct._problem(x, w, b, **args)
    torch.library.opcheck(torch.ops.cupyconv.conv2d.default,
                          (x, w, b, list(problem.stride),
                           [problem.pad_top, problem.pad_left, problem.pad_bottom, problem.pad_right],
                           list(problem.dilation), problem.groups))


@pytest.mark.parametrize("case", GRAD_CASES)
def test_op_gradients_gradcheck(case):
    x, w, b, args = _random_conv(case, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w, b: _op_call(x, w, b, args), (x, w, b))


def test_op_gradients_only_where_needed():
    x, w, b, args = _random_conv(CONV_CASES[4])
    w.requires_grad_()
    _op_call(x, w, b, args).square().sum().backward()
    expected = torch.autograd.grad(F.conv2d(x, w, b, **args).square().sum(), w)[0]
    torch.testing.assert_close(w.grad, expected)
    assert x.grad is None and b.grad is None


def test_op_second_derivatives():
    x, w, b, args = _random_conv(GRAD_CASES[0], requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda x, w, b: _op_call(x, w, b, args), (x, w, b))


def test_op_inference_mode():
    x, w, b, args = _random_conv(CONV_CASES[0], requires_grad=True)
    with torch.inference_mode():
        y = _op_call(x, w, b, args)
    assert y.is_inference() and not y.requires_grad
    torch.testing.assert_close(y, F.conv2d(x, w, b, **args).detach())


@pytest.mark.parametrize("case", CONV_CASES)
def test_opcheck(case):
    x, w, b, args = _random_conv(case, requires_grad=True)
    p = ct._problem(x, w, b, **args)
    padding = [p.pad_top, p.pad_left, p.pad_bottom, p.pad_right]
    for bias in (b, None):
        torch.library.opcheck(torch.ops.cupyconv.conv2d.default,
                              (x, w, bias, list(p.stride), padding, list(p.dilation), p.groups))


@pytest.mark.parametrize("case", CONV_CASES)
def test_fake_kernel_shapes_on_meta(case):
    x_shape, w_shape, stride, padding, dilation, groups = case
    x, w = torch.empty(x_shape, device="meta"), torch.empty(w_shape, device="meta")
    p = ct._problem(x, w, None, stride, padding, dilation, groups)
    y = torch.ops.cupyconv.conv2d(x, w, None, list(p.stride), [p.pad_top, p.pad_left, p.pad_bottom, p.pad_right],
                                  list(p.dilation), p.groups)
    assert y.device.type == "meta"
    assert y.shape == F.conv2d(x, w, None, stride, padding, dilation, groups).shape


def test_compile_fullgraph_no_graph_break():
    x, w, b, args = _random_conv(CONV_CASES[1])

    def two_layers(x, w, b):
        y = torch.relu(_op_call(x, w, b, args))
        return _op_call(y[:, :4], w, b, args)

    torch._dynamo.reset()
    compiled = torch.compile(two_layers, fullgraph=True, backend="aot_eager", dynamic=True)
    for batch in (2, 3):
        xb = torch.randn(batch, *x.shape[1:], dtype=x.dtype)
        torch.testing.assert_close(compiled(xb, w, b), two_layers(xb, w, b))
    explanation = torch._dynamo.explain(two_layers)(x, w, b)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1


def test_compile_module_fullgraph_cpu():
    torch.manual_seed(0)
    model = ct.convert(nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
                                     nn.Conv2d(8, 4, 4, padding="same", padding_mode="circular")))
    x = torch.randn(2, 3, 12, 12)
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(model, fullgraph=True, backend="aot_eager")(x), model(x))


# --- precision switches -------------------------------------------------------------------------

def test_tf32_follows_cudnn_switch_for_float32_only(monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    assert not ct._allow_tf32(torch.float32)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    assert ct._allow_tf32(torch.float32)
    assert not any(ct._allow_tf32(dtype) for dtype in (torch.float16, torch.bfloat16, torch.float64))


def _t(*shape, dtype=torch.float32, device="cpu"):
    return torch.randn(shape, dtype=dtype, device=device)


# --- the epilogue -------------------------------------------------------------------------------

def _torch_epilogue(y, residual, activation):
    """What conv2d's epilogue means, in torch's own functions."""
    y = y if residual is None else y + residual
    return {None: y, "relu": F.relu(y), "relu6": F.relu6(y), "silu": F.silu(y), "gelu": F.gelu(y),
            "sigmoid": torch.sigmoid(y), "tanh": torch.tanh(y)}[activation]


@pytest.mark.parametrize("activation", [None, "relu", "relu6", "silu", "gelu", "sigmoid", "tanh"])
@pytest.mark.parametrize("with_residual", [False, True])
def test_epilogue_cpu_and_op_route_equal_torch(activation, with_residual):
    x, w, b, args = _random_conv(CONV_CASES[1])
    y = F.conv2d(x, w, b, **args)
    residual = 4 * torch.randn_like(y) if with_residual else None  # both sides of relu6's range
    expected = _torch_epilogue(y, residual, activation)
    torch.testing.assert_close(ct.conv2d(x, w, b, **args, activation=activation, residual=residual), expected)
    problem = ct._problem(x, w, b, **args, activation=activation, residual=residual)
    torch.testing.assert_close(ct._op_conv2d(x, w, b, problem, residual), expected)
    # Unbatched: a 3-D residual.
    torch.testing.assert_close(
        ct.conv2d(x[0], w, b, **args, activation=activation, residual=None if residual is None else residual[0]),
        expected[0])


@pytest.mark.parametrize("activation", ["relu6", "gelu"])
def test_epilogue_op_opcheck(activation):
    x, w, b, args = _random_conv(CONV_CASES[0])
    p = ct._problem(x, w, b, **args)
    residual = torch.randn(p.out_shape, dtype=x.dtype)
    torch.library.opcheck(torch.ops.cupyconv.conv2d.default,
                          (x, w, b, list(p.stride), [p.pad_top, p.pad_left, p.pad_bottom, p.pad_right],
                           list(p.dilation), p.groups, residual, activation), test_utils=("test_schema",
                                                                                          "test_faketensor"))


def test_epilogue_gradients_through_torch_operations():
    """A call that needs gradients computes the epilogue with torch's operations: the gradients of
    every input, the residual's included, are torch's."""
    x, w, b, args = _random_conv(GRAD_CASES[1], requires_grad=True)
    residual = torch.randn(F.conv2d(x, w, b, **args).shape, dtype=x.dtype, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda x, w, b, r: ct.conv2d(x, w, b, **args, activation="silu", residual=r), (x, w, b, residual))


def test_op_refuses_gradients_through_its_epilogue():
    x, w, b, args = _random_conv(CONV_CASES[0], requires_grad=True)
    problem = ct._problem(x, w, b, **args, activation="relu")
    with pytest.raises(RuntimeError, match="no gradient through its epilogue"):
        ct._op_conv2d(x, w, b, problem).sum().backward()


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(activation="swish"), ValueError, r"activation must be None or one of"),
    (dict(activation=3), TypeError, r"activation must be None or one of"),
    (dict(residual=_t(2, 6, 6, 5)), ValueError, r"residual must have the output's shape \(2, 6, 6, 6\)"),
    (dict(residual=_t(6, 1, 1)), ValueError, r"residual must have the output's shape \(4-D like x\)"),
    (dict(residual=_t(2, 6, 6, 6, dtype=torch.float64)), TypeError, r"residual has dtype torch.float64"),
    (dict(residual=_t(2, 6, 6, 6).numpy()), TypeError, r"residual must be a torch.Tensor"),
])
def test_epilogue_errors(kwargs, error, message):
    with pytest.raises(error, match=message):
        ct.conv2d(_t(2, 3, 8, 8), _t(6, 3, 3, 3), _t(6), **kwargs)
    x = _t(2, 3, 8, 8).requires_grad_()  # the gradient route checks the same
    with pytest.raises(error, match=message):
        ct.conv2d(x, _t(6, 3, 3, 3), _t(6), **kwargs)


# --- errors -------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, error, message", [
    ((_t(1, 3, 8, 8).int(), _t(4, 3, 3, 3).int()), TypeError, r"x has dtype torch.int32; cupyconv computes in"),
    ((_t(1, 3, 8, 8), _t(4, 3, 3, 3, dtype=torch.float64)), TypeError,
     r"weight has dtype torch.float64 but x has dtype torch.float32"),
    ((_t(1, 3, 8, 8), _t(4, 3, 3, 3), _t(4, dtype=torch.float16)), TypeError, r"bias has dtype torch.float16"),
    ((_t(1, 3, 8, 8).numpy(), _t(4, 3, 3, 3)), TypeError, r"x must be a torch.Tensor, got ndarray"),
    ((_t(1, 3, 8, 8), _t(4, 3, 3, 3, device="meta")), ValueError, r"weight is on meta but x is on cpu"),
    ((_t(3, 8), _t(4, 3, 3, 3)), ValueError, r"x must be 4-D \(N, C, H, W\) or 3-D \(C, H, W\), got shape \(3, 8\)"),
    ((_t(1, 3, 8, 8), _t(4, 3, 3)), ValueError, r"weight must be 4-D"),
    ((_t(1, 3, 8, 8), _t(4, 2, 3, 3)), ValueError, r"x has C=3 channels but weight shape \(4, 2, 3, 3\)"),
    ((_t(1, 3, 8, 8), _t(4, 3, 3, 3), _t(5)), ValueError, r"bias must have shape \(4,\)"),
    ((_t(1, 3, 8, 8), _t(4, 3, 3, 3), _t(4, 1)), ValueError, r"bias must be 1-D \(K,\), got shape \(4, 1\)"),
    ((_t(1, 3, 8, 8), _t(4, 3, 9, 3)), ValueError, r"kernel 9x3 .* larger than the padded input 8x8"),
])
def test_argument_errors(args, error, message):
    with pytest.raises(error, match=message):
        ct.conv2d(*args)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(stride=0), ValueError, r"stride must be >= 1, got 0"),
    (dict(stride=(1, 2, 3)), TypeError, r"stride must be an int or a pair of ints"),
    (dict(padding=-1), ValueError, r"padding must be >= 0"),
    (dict(padding="full"), ValueError, r"padding must be an int, a pair, 'valid' or 'same'; got 'full'"),
    (dict(padding="same", stride=2), ValueError, r"padding='same' needs stride 1"),
    (dict(dilation=(1, 0)), ValueError, r"dilation must be >= 1"),
    (dict(groups=2), ValueError, r"groups=2 must divide the input channels C=3"),
    (dict(groups=1.0), TypeError, r"groups must be an int"),
])
def test_hyperparameter_errors(kwargs, error, message):
    with pytest.raises(error, match=message):
        ct.conv2d(_t(2, 3, 8, 8), _t(6, 3, 3, 3), _t(6), **kwargs)


def test_module_rejects_integer_input():
    with pytest.raises(TypeError, match="x has dtype torch.int64"):
        ct.Conv2d(3, 4, 3)(torch.ones(1, 3, 8, 8, dtype=torch.int64))


# --- imports ------------------------------------------------------------------------------------

def test_import_cupyconv_does_not_import_torch():
    code = "import sys, cupyconv; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_adapter_uses_the_real_torch():
    assert ct.torch is torch and ct.nn is nn and ct.F is F
