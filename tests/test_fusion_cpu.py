"""convert(model, fuse=True) without a GPU: which chains torch.fx finds and fuses, the fused model's
output against the unfused original in float64 (through the CPU path), its state_dict, the inverse,
refolding after weight and statistics changes, gradients, torch.compile and the refusals.

The blocks are torchvision's (BasicBlock, Bottleneck, MobileNetV2's InvertedResidual, EfficientNet's
MBConv with squeeze-excitation and stochastic depth) written out, so that CI needs no torchvision;
the GPU suite fuses the torchvision models themselves (test_fusion_gpu.py).
"""
import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cupyconv.torch as ct
from cupyconv.torch_fusion import FusedConv2d


class BasicBlock(nn.Module):
    def __init__(self, c, out, stride=1):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, out, 3, stride, 1, bias=False), nn.BatchNorm2d(out)
        self.relu = nn.ReLU(inplace=True)  # one module called twice, as torchvision's
        self.conv2, self.bn2 = nn.Conv2d(out, out, 3, 1, 1, bias=False), nn.BatchNorm2d(out)
        self.downsample = (nn.Sequential(nn.Conv2d(c, out, 1, stride, bias=False), nn.BatchNorm2d(out))
                           if stride != 1 or c != out else None)

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class Bottleneck(nn.Module):
    def __init__(self, c, mid, stride=1):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, mid, 1, bias=False), nn.BatchNorm2d(mid)
        self.conv2, self.bn2 = nn.Conv2d(mid, mid, 3, stride, 1, bias=False), nn.BatchNorm2d(mid)
        self.conv3, self.bn3 = nn.Conv2d(mid, 4 * mid, 1, bias=False), nn.BatchNorm2d(4 * mid)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = (nn.Sequential(nn.Conv2d(c, 4 * mid, 1, stride, bias=False), nn.BatchNorm2d(4 * mid))
                           if stride != 1 or c != 4 * mid else None)

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


def conv_bn_act(c, out, k=3, stride=1, groups=1, act=nn.ReLU6):
    layers = [nn.Conv2d(c, out, k, stride, (k - 1) // 2, groups=groups, bias=False), nn.BatchNorm2d(out)]
    return nn.Sequential(*layers, act(inplace=True)) if act else nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    def __init__(self, c, expand):
        super().__init__()
        hidden = c * expand
        self.conv = nn.Sequential(conv_bn_act(c, hidden, 1), conv_bn_act(hidden, hidden, groups=hidden),
                                  nn.Conv2d(hidden, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        return x + self.conv(x)


class SqueezeExcitation(nn.Module):
    def __init__(self, c, squeezed):
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1, self.fc2 = nn.Conv2d(c, squeezed, 1), nn.Conv2d(squeezed, c, 1)
        self.activation, self.scale_activation = nn.SiLU(), nn.Sigmoid()

    def forward(self, x):
        scale = self.scale_activation(self.fc2(self.activation(self.fc1(self.avgpool(x)))))
        return scale * x


class MBConv(nn.Module):
    def __init__(self, c, expand):
        super().__init__()
        hidden = c * expand
        self.block = nn.Sequential(conv_bn_act(c, hidden, 1, act=nn.SiLU),
                                   conv_bn_act(hidden, hidden, 5, groups=hidden, act=nn.SiLU),
                                   SqueezeExcitation(hidden, c // 2), conv_bn_act(hidden, c, 1, act=None))
        self.p = 0.2

    def forward(self, x):
        result = self.block(x)
        if self.training:  # stochastic depth: the identity in eval mode
            result = result * (torch.rand(result.shape[0], 1, 1, 1) > self.p)
        result += x
        return result


class Functional(nn.Module):
    """Activations as functions and methods, a conv with its bias and a BatchNorm without affine."""

    def __init__(self):
        super().__init__()
        self.a, self.bn = nn.Conv2d(4, 6, 3, padding=1), nn.BatchNorm2d(6, affine=False)
        self.b = nn.Conv2d(6, 6, 3, padding=1, padding_mode="reflect")
        self.c = nn.Conv2d(6, 6, 1)
        self.d = nn.Conv2d(6, 6, 1)

    def forward(self, x):
        y = F.relu(self.bn(self.a(x)))
        y = self.b(y).sigmoid()
        z = F.gelu(self.c(y) + y)
        return torch.tanh(self.d(z))


class Unfusable(nn.Module):
    """Chains that must not fuse: a conv output used twice, a broadcast add, gelu's tanh form and a
    BatchNorm applied to an add."""

    def __init__(self):
        super().__init__()
        self.a, self.bn_a = nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.b = nn.Conv2d(4, 4, 1)
        self.shift = nn.Parameter(torch.randn(4, 1, 1))
        self.c = nn.Conv2d(4, 4, 1)
        self.gelu = nn.GELU(approximate="tanh")
        self.bn_sum = nn.BatchNorm2d(4)

    def forward(self, x):
        a = self.a(x)
        y = self.bn_a(a) + a
        y = self.b(y) + self.shift
        return self.bn_sum(self.gelu(self.c(y)) + y)


MODELS = {
    "basic": (lambda: nn.Sequential(BasicBlock(4, 8, 2), BasicBlock(8, 8)), (2, 4, 12, 12),
              [("bn", None, "relu"), ("bn", "residual", "relu"), ("bn", None, None)] + [("bn", None, "relu"),
                                                                                         ("bn", "residual", "relu")]),
    "bottleneck": (lambda: nn.Sequential(Bottleneck(8, 4, 2), Bottleneck(16, 4)), (2, 8, 10, 10),
                   [("bn", None, "relu")] * 2 + [("bn", "residual", "relu"), ("bn", None, None)]
                   + [("bn", None, "relu")] * 2 + [("bn", "residual", "relu")]),
    "inverted_residual": (lambda: nn.Sequential(conv_bn_act(3, 8, stride=2), InvertedResidual(8, 4)), (2, 3, 13, 13),
                          [("bn", None, "relu6")] * 3 + [("bn", "residual", None)]),
    "mbconv": (lambda: nn.Sequential(conv_bn_act(3, 8, act=nn.SiLU), MBConv(8, 4)), (2, 3, 11, 11),
               [("bn", None, "silu")] * 3 + [(None, None, "silu"), (None, None, "sigmoid"), ("bn", "residual", None)]),
    "functional": (Functional, (2, 4, 9, 9),
                   [("bn", None, "relu"), (None, None, "sigmoid"), (None, "residual", "gelu"), (None, None, "tanh")]),
}


def _randomise(model: nn.Module, seed: int = 0) -> nn.Module:
    """Random BatchNorm statistics and affines (a fresh BatchNorm is the identity)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.num_features, generator=g))
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                if m.affine:
                    m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                    m.bias.copy_(torch.randn(m.num_features, generator=g))
    return model


def _pair(name, dtype=torch.float64):
    """(original eval model, fused copy, input)."""
    build, x_shape, _ = MODELS[name]
    torch.manual_seed(3)
    original = _randomise(build()).to(dtype).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every chain here fuses: no warning
        fused = ct.convert(copy.deepcopy(original), fuse=True)
    return original, fused, torch.randn(x_shape, dtype=dtype)


def _chains(model):
    return [("bn" if m.batch_norm is not None else None, "residual" if m.residual else None, m.activation)
            for m in model.modules() if isinstance(m, FusedConv2d)]


@pytest.mark.parametrize("name", MODELS)
def test_fused_model_equals_original_in_float64(name):
    original, fused, x = _pair(name)
    assert isinstance(fused, torch.fx.GraphModule)
    assert _chains(fused) == MODELS[name][2]
    with torch.no_grad():
        ours, theirs = fused(x), original(x)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    # No BatchNorm, activation or add is left in the graph of a model that fuses completely.
    targets = [n.target for n in fused.graph.nodes if n.op == "call_module"]
    assert not any(isinstance(fused.get_submodule(t), (nn.BatchNorm2d, nn.ReLU, nn.ReLU6, nn.SiLU)) for t in targets)


def test_channels_last_model_keeps_its_memory_format():
    original, fused, x = _pair("bottleneck", torch.float32)
    original, fused = (m.to(memory_format=torch.channels_last) for m in (original, fused))
    x = x.contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        ours, theirs = fused(x), original(x)
    assert ours.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_state_dict_keys_and_checkpoints_both_ways():
    original, fused, x = _pair("bottleneck")
    assert list(fused.state_dict()) == list(original.state_dict())
    other = _randomise(copy.deepcopy(original), seed=5)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.1 * torch.randn_like(p))
        fused.load_state_dict(other.state_dict())  # the fold follows the loaded weights and statistics
        torch.testing.assert_close(fused(x), other(x), rtol=1e-12, atol=1e-12)
        original.load_state_dict(fused.state_dict())
        torch.testing.assert_close(original(x), other(x), rtol=1e-12, atol=1e-12)


def test_refold_after_in_place_updates_and_data_changes():
    original, fused, x = _pair("inverted_residual")
    shared = ct.convert(fused, inverse=True)  # the model fused shares its tensors
    with torch.no_grad():
        fused(x)
        for m in shared.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_var.mul_(2)  # versioned: noticed at the next call
        torch.testing.assert_close(fused(x), shared(x), rtol=1e-12, atol=1e-12)
        for m in shared.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.data += 1  # .data: not versioned, so clear_weight_caches
        ct.clear_weight_caches(fused)
        torch.testing.assert_close(fused(x), shared(x), rtol=1e-12, atol=1e-12)


def test_folded_weights_prepared_forms_are_kept_for_cuda_graphs():
    """A module with a folded BatchNorm owns its folded weight, so its prepared forms are kept for CUDA
    graphs (refreshed in place, never dropped by clear); one without follows Conv2d's rule. Copies and
    pickles start empty and keep the kind."""
    import pickle

    _, fused, _ = _pair("functional")
    modules = [m for m in fused.modules() if isinstance(m, FusedConv2d)]
    assert [m._cupyconv_weights.kept_in_graphs for m in modules] == [m.batch_norm is not None for m in modules]
    assert {True, False} <= {m.batch_norm is not None for m in modules}
    kept = ct.WeightCache(kept_in_graphs=True)
    kept._stamp, kept._forms = (1024, 3, (27, 9, 3, 1)), {"key": "form"}
    kept.clear()
    assert kept._forms == {"key": "form"}, "a graph may still read the buffers"
    assert kept._stamp == (1024, None, (27, 9, 3, 1)), "stale: rewritten in place by the next call"
    for clone in (copy.deepcopy(kept), pickle.loads(pickle.dumps(kept))):
        assert clone.kept_in_graphs and clone._forms == {}
    plain = ct.WeightCache()
    plain._stamp, plain._forms = (1024, 3, (27, 9, 3, 1)), {"key": "form"}
    plain.clear()
    assert plain._stamp is None and plain._forms == {}


def test_static_weights_keep_every_fused_modules_forms_in_graphs():
    """fuse=True with static_weights=True: the modules without a folded BatchNorm keep their forms in
    CUDA graphs too; the fused model equals the one fused without it; a kept cache that is given another
    weight tensor keeps the old forms alive for the graphs captured before."""
    build, x_shape, _ = MODELS["functional"]
    original = _randomise(build()).eval()
    fused = ct.convert(copy.deepcopy(original), fuse=True, static_weights=True)
    modules = [m for m in fused.modules() if isinstance(m, FusedConv2d)]
    assert {True, False} <= {m.batch_norm is not None for m in modules}
    assert all(m._cupyconv_weights.kept_in_graphs for m in modules)
    x = torch.randn(x_shape)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), ct.convert(copy.deepcopy(original), fuse=True)(x), rtol=0, atol=0)
    fused.load_state_dict(original.state_dict())  # the post-hook refreshes (nothing kept on the CPU)

    class Preparation:  # what address() reads of an executable: its weight form's key and size
        key, nbytes = "key", 4

    class Executable:
        weight = Preparation()

        def prepare_weight(self, weight, buffer, stream):
            pass

    kept = ct.WeightCache(kept_in_graphs=True)
    kept._stamp, kept._forms = (1024, 3, (27, 9, 3, 1)), {"key": ("old form", 0, None)}
    other = torch.zeros(3)
    assert kept.address(other, Executable(), 0) != 0  # another tensor: a new form ...
    assert kept._retired == ["old form"], "... and the old one kept for the graphs that read it"


def test_inverse_returns_the_original_modules():
    original, fused, x = _pair("basic")
    restored = ct.convert(fused, inverse=True)
    assert isinstance(restored, nn.Sequential) and not isinstance(restored, torch.fx.GraphModule)
    assert not any(isinstance(m, (ct.Conv2d, FusedConv2d)) for m in restored.modules())
    assert sum(type(m) is nn.Conv2d for m in restored.modules()) == 5
    with torch.no_grad():
        torch.testing.assert_close(restored(x), original(x), rtol=0, atol=0)


def test_gradients_reach_the_convolution_and_batchnorm_parameters():
    original, fused, x = _pair("basic")
    x.requires_grad_()
    torch.autograd.backward(fused(x).square().sum())
    ours = {name: p.grad for name, p in fused.named_parameters()}
    ours_x, x.grad = x.grad, None
    original(x).square().sum().backward()
    torch.testing.assert_close(ours_x, x.grad, rtol=1e-10, atol=1e-10)
    for name, p in original.named_parameters():
        torch.testing.assert_close(ours[name], p.grad, rtol=1e-10, atol=1e-10, msg=name)


def test_training_mode_is_refused_before_anything_changes():
    model = MODELS["basic"][0]()
    with pytest.raises(ValueError, match=r"freezes them: call model.eval\(\) first \(in training mode: \(model\)"):
        ct.convert(model, fuse=True)
    assert not any(isinstance(m, ct.Conv2d) for m in model.modules())
    model.eval()
    model[1].bn1.train()
    with pytest.raises(ValueError, match=r"in training mode: 1.bn1"):
        ct.convert(model, fuse=True)
    with pytest.raises(ValueError, match="fuse=True and inverse=True exclude each other"):
        ct.convert(model.eval(), fuse=True, inverse=True)


def test_unfusable_chains_are_left_alone_and_listed():
    torch.manual_seed(0)
    original = _randomise(Unfusable()).double().eval()
    with pytest.warns(UserWarning, match=r"1 BatchNorm\(s\) left unfused: bn_a \(.*\)") as record:
        fused = ct.convert(copy.deepcopy(original), fuse=True)
    assert len(record) == 1
    # b takes the broadcast add: fused, but added by torch at run time; c's gelu is the tanh form.
    assert _chains(fused) == [(None, "residual", None)]
    x = torch.randn(2, 4, 7, 7, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), original(x), rtol=1e-12, atol=1e-12)


def test_untraceable_model_is_converted_unfused_with_a_warning():
    class DataDependent(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)

        def forward(self, x):
            y = self.bn(self.conv(x))
            return y if y.sum() > 0 else -y

    model = DataDependent().eval()
    with pytest.warns(UserWarning, match="torch.fx could not trace the model, so nothing was fused"):
        result = ct.convert(model, fuse=True)
    assert result is model and type(model.conv) is ct.Conv2d


def test_compile_fullgraph_of_a_fused_model():
    original, fused, x = _pair("mbconv", torch.float32)
    compiled = torch.compile(fused, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), original(x), rtol=1e-5, atol=1e-5)


def test_squeeze_excitation_gate_becomes_the_projection_input_scale():
    """MBConv's x * gate is no longer in the graph: the projection convolution takes it as its input
    scale (with its BatchNorm and the residual add), and the model's output is unchanged."""
    original, fused, x = _pair("mbconv")
    scaled = [m for m in fused.modules() if isinstance(m, FusedConv2d) and m.scaled]
    assert len(scaled) == 1 and scaled[0].out_channels == 8 and scaled[0].residual
    assert "input scaled" in repr(scaled[0])
    assert not any(n.op in ("call_function", "call_method") and "mul" in str(n.target) for n in fused.graph.nodes)
    # ... and the squeeze convolution takes the pooling in.
    pooled = [m for m in fused.modules() if isinstance(m, FusedConv2d) and m.pooled]
    assert len(pooled) == 1 and pooled[0].out_channels == 4 and "input pooled" in repr(pooled[0])
    assert not any(n.op == "call_module" and isinstance(fused.get_submodule(n.target), nn.AdaptiveAvgPool2d)
                   for n in fused.graph.nodes)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), original(x), rtol=1e-12, atol=1e-12)


class Products(nn.Module):
    """Convolutions of products that are not one per-(image, channel) gate: two full tensors, and a
    (1, C, 1, 1) parameter, each taken into the fused module and multiplied by torch at run time."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(4, 4, 3, padding=1), nn.Conv2d(4, 4, 1)
        self.c = nn.Conv2d(4, 4, 1)
        self.gain = nn.Parameter(torch.rand(1, 4, 1, 1) + 0.5)

    def forward(self, x):
        y = self.a(x * x.flip(-1))
        return self.c(self.gain * torch.relu(self.b(y)))


def test_multiplies_that_are_not_gates_are_computed_by_torch():
    torch.manual_seed(2)
    original = Products().double().eval()
    fused = ct.convert(copy.deepcopy(original), fuse=True)
    assert sum(m.scaled for m in fused.modules() if isinstance(m, FusedConv2d)) == 2
    for batch in (1, 3):  # a batch of one: the (1, C, 1, 1) gain has the gate's shape there
        x = torch.randn(batch, 4, 6, 6, dtype=torch.float64)
        with torch.no_grad():
            torch.testing.assert_close(fused(x), original(x), rtol=1e-12, atol=1e-12)


class Poolings(nn.Module):
    """Global poolings before convolutions: a function call (fused), a 2 x 2 adaptive pooling and a
    pooling also used elsewhere (both left to torch)."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Conv2d(4, 6, 1), nn.Conv2d(4, 6, 1), nn.Conv2d(4, 6, 1)
        self.quarters = nn.AdaptiveAvgPool2d(2)

    def forward(self, x):
        shared = F.adaptive_avg_pool2d(x, (1, 1))
        return self.a(F.adaptive_avg_pool2d(x, 1)) + self.b(self.quarters(x)).mean((2, 3), keepdim=True) + \
            self.c(shared) + shared.sum(1, keepdim=True)


def test_global_poolings_fuse_into_the_convolution_that_alone_reads_them():
    torch.manual_seed(4)
    original = Poolings().double().eval()
    fused = ct.convert(copy.deepcopy(original), fuse=True)
    assert [name for name, m in fused.named_modules() if isinstance(m, FusedConv2d) and m.pooled] == ["a"]
    x = torch.randn(3, 4, 8, 6, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), original(x), rtol=1e-12, atol=1e-12)
