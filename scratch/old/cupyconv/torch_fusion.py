"""``cupyconv.torch.convert(model, fuse=True)``: (multiply ->) conv -> BatchNorm2d -> (+ residual) ->
activation chains of an eval-mode model, each run as one fused cupyconv call.

The chains are found in the model's torch.fx graph: a convolution whose output goes only to a
BatchNorm2d, whose output goes only to an add with another tensor (a residual connection), whose
output goes only to an activation; any link may be missing. A convolution whose input is a multiply
of two tensors used by nothing else takes the multiply in too: squeeze-and-excitation's
``x * gate`` before EfficientNet's projections, which then runs as the convolution's input scale
(gate (N, C, 1, 1); any other shapes are multiplied by torch first), and one whose input is a global
average pooling (adaptive to 1 x 1) used nowhere else takes the pooling in (cupyconv.pooling's kernel
on channels_last CUDA tensors: squeeze-excitation's squeeze). torchvision's BasicBlock and
Bottleneck, MobileNetV2's inverted residuals, EfficientNet's MBConv (its squeeze-excitation
convolutions and gate included) and plain Sequentials make such chains. torchvision's stochastic depth
with training=False (its input unchanged) is taken out of the graph first, so that MBConv's residual
add fuses too.

Each chain becomes a :class:`FusedConv2d` at the convolution's path. It holds the convolution's own
weight and bias Parameters and reads the BatchNorm module, which stays at its own path unused by
the graph, so the fused model's state_dict has the original's keys and loads its checkpoints. The
BatchNorm is folded into the weight and bias (float64, rounded once) when first needed and again
when any of the tensors it is folded from changes (their version counters); the folded tensors are
updated in place, so a CUDA graph captured before a ``load_state_dict`` replays with the new
values.
"""
from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch import fx, nn

from . import pooling
from .program import OPERAND_ALIGNMENT
from .torch import (Conv1d, Conv2d, ConvTranspose2d, WeightCache, _channels_last, _conv2d, _epilogue, _launch,
                    _problem, _raw_stream)

__all__ = ["FusedConv2d", "fuse"]

#: Activation modules (exact types) -> the epilogue's activation.
_ACTIVATION_MODULES = {nn.ReLU: "relu", nn.ReLU6: "relu6", nn.SiLU: "silu", nn.GELU: "gelu", nn.Sigmoid: "sigmoid",
                       nn.Tanh: "tanh"}
#: Activation functions and tensor methods -> the epilogue's activation.
_ACTIVATION_CALLS = {F.relu: "relu", torch.relu: "relu", torch.relu_: "relu", F.relu6: "relu6", F.silu: "silu",
                     F.gelu: "gelu", torch.sigmoid: "sigmoid", F.sigmoid: "sigmoid", torch.tanh: "tanh",
                     F.tanh: "tanh"}
_ACTIVATION_METHODS = {"relu": "relu", "relu_": "relu", "sigmoid": "sigmoid", "sigmoid_": "sigmoid", "tanh": "tanh",
                       "tanh_": "tanh"}
#: Arguments an activation call may take without changing what it computes.
_HARMLESS_KWARGS = {"inplace": (True, False), "approximate": ("none",)}
_ADDS = (operator.add, operator.iadd, torch.add)
_MULTIPLIES = (operator.mul, operator.imul, torch.mul)


def _fold(weight, bias, batch_norm):
    """(weight, bias) of the convolution followed by ``batch_norm`` with its running statistics:
    cupyconv.fold_batchnorm's formula in torch operations (differentiable, traceable), in float64
    and rounded once to the weight's dtype; the weight keeps its memory format."""
    scale = torch.rsqrt(batch_norm.running_var.double() + batch_norm.eps)
    if batch_norm.weight is not None:
        scale = scale * batch_norm.weight.double()
    shift = -batch_norm.running_mean.double() if bias is None else bias.double() - batch_norm.running_mean.double()
    folded_bias = shift * scale
    if batch_norm.bias is not None:
        folded_bias = folded_bias + batch_norm.bias.double()
    return (weight.double() * scale.view(-1, 1, 1, 1)).to(weight.dtype), folded_bias.to(weight.dtype)


class FusedConv2d(nn.Module):
    """One cupyconv call for ``activation(bn(conv(x [* factor])) + residual)``: a convolution with its
    eval-mode BatchNorm folded in, its epilogue fused and, where ``scaled``, the multiply before it
    as its input scale or, where ``pooled``, the global average pooling before it. Made by
    ``convert(model, fuse=True)``.

    ``weight`` and ``bias`` are the convolution's own Parameters; ``batch_norm`` (read, not owned)
    is the BatchNorm module at its own path in the model. Under torch.no_grad() or
    torch.inference_mode() the folded weight is kept and the epilogue runs in the kernel; where a
    gradient is needed the fold and the epilogue are torch operations, so gradients reach the
    convolution's and the BatchNorm's parameters. A residual whose shape is not the output's
    (a broadcast add) is added by torch after the fused convolution and activation-free kernel. A
    factor that is not one operand's per-(image, channel) gate is multiplied by torch first.
    """

    def __init__(self, conv: nn.Conv2d, batch_norm: nn.BatchNorm2d | None, activation: str | None,
                 residual: bool, scaled: bool = False, pooled: bool = False):
        super().__init__()
        self.weight = conv.weight
        self.register_parameter("bias", conv.bias)
        for name in ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "groups",
                     "padding_mode", "_reversed_padding_repeated_twice"):
            setattr(self, name, getattr(conv, name))
        self.activation, self.residual, self.scaled, self.pooled = activation, residual, scaled, pooled
        # Not submodules: the BatchNorm stays at its own path, so the state_dict keeps its keys.
        self.__dict__["batch_norm"] = batch_norm
        self.__dict__["_folded"] = None  # (stamp, weight, bias), updated in place
        # The folded weight is the module's own, refolded in place: its prepared forms are refreshed
        # with it and read by CUDA graphs as it is. The convolution's own weight follows Conv2d's rule.
        self.__dict__["_cupyconv_weights"] = WeightCache(kept_in_graphs=batch_norm is not None)
        self.__dict__["_out_shapes"] = {}

    def extra_repr(self) -> str:
        parts = [f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"]
        if self.scaled:
            parts.append("input scaled")
        if self.pooled:
            parts.append("input pooled")
        if self.batch_norm is not None:
            parts.append("batch_norm folded")
        if self.residual:
            parts.append("+ residual")
        if self.activation:
            parts.append(f"activation={self.activation!r}")
        return ", ".join(parts)

    def _stamp(self) -> tuple:
        bn = self.batch_norm
        tensors = (self.weight, self.bias, bn.running_mean, bn.running_var, bn.weight, bn.bias)
        return (bn.eps, *((t.data_ptr(), t._version, t.dtype, t.stride()) for t in tensors if t is not None))

    def refold(self) -> None:
        """Fold the BatchNorm again now, in place where the folded tensors' shape and dtype allow (a
        CUDA graph captured earlier then reads the new values)."""
        if self.batch_norm is None:
            return
        with torch.inference_mode(False), torch.no_grad():
            weight, bias = _fold(self.weight, self.bias, self.batch_norm)
            kept = self._folded
            if kept is not None and all(a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and
                                        a.stride() == b.stride() for a, b in zip(kept[1:], (weight, bias))):
                kept[1].copy_(weight)
                kept[2].copy_(bias)
                weight, bias = kept[1:]
                if weight.is_cuda:
                    self._cupyconv_weights.refresh(weight, _raw_stream(weight.device.index))
            else:
                self._cupyconv_weights.clear()
            self.__dict__["_folded"] = (self._stamp(), weight, bias)

    def _weights(self, needs_grad: bool):
        """The (weight, bias) the kernel reads, and the weight cache that may keep its prepared forms."""
        if self.batch_norm is None:
            return self.weight, self.bias, self._cupyconv_weights
        if needs_grad or torch.compiler.is_compiling():
            return (*_fold(self.weight, self.bias, self.batch_norm), None)
        if self._folded is None or self._folded[0] != self._stamp():
            self.refold()
            if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                # Folded inside the capture: the values exist once the graph runs; fold again at the next
                # eager call.
                self.__dict__["_folded"] = (None, *self._folded[1:])
        return self._folded[1], self._folded[2], self._cupyconv_weights

    def _out_shape(self, x: torch.Tensor, weight, bias, padding) -> torch.Size:
        shape = self._out_shapes.get(x.shape)
        if shape is None:
            problem = _problem(x, weight, bias, self.stride, padding, self.dilation, self.groups)
            shape = self._out_shapes[x.shape] = torch.Size(problem.out_shape[x.dim() == 3:])
        return shape

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None,
                factor: torch.Tensor | None = None) -> torch.Tensor:
        input_scale = None
        if factor is not None:
            x, input_scale = _gated(x, factor)
        if self.pooled:
            x = _mean_pixels(x)
        needs_grad = torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (x, residual, input_scale, *self.parameters(),
                                                        *(() if self.batch_norm is None else
                                                          self.batch_norm.parameters())))
        weight, bias, cache = self._weights(needs_grad)
        padding = self.padding
        if self.padding_mode != "zeros":
            if input_scale is not None:
                x, input_scale = x * input_scale, None
            x, padding = F.pad(x, self._reversed_padding_repeated_twice, mode=self.padding_mode), 0
        if residual is not None and (not isinstance(residual, torch.Tensor) or
                                     residual.shape != self._out_shape(x, weight, bias, padding)):
            return _epilogue(_conv2d(x, weight, bias, self.stride, padding, self.dilation, self.groups, cache, None,
                                     None, input_scale) + residual, None, self.activation or "none")
        return _conv2d(x, weight, bias, self.stride, padding, self.dilation, self.groups, cache, self.activation,
                       residual, input_scale)


def _mean_pixels(x: torch.Tensor) -> torch.Tensor:
    """adaptive_avg_pool2d(x, 1): cupyconv's deterministic kernel (cupyconv.pooling) for a channels_last
    CUDA tensor outside autograd and torch.compile, torch's elsewhere (an NCHW x's planes are
    contiguous: torch reads them at full speed)."""
    if not (x.is_cuda and _channels_last(x) and not (torch.is_grad_enabled() and x.requires_grad) and
            not torch.compiler.is_compiling() and not x.data_ptr() % OPERAND_ALIGNMENT):
        return F.adaptive_avg_pool2d(x, 1)
    n, c, h, w = x.shape
    dtype = str(x.dtype).removeprefix("torch.")
    if pooling.refusal(n, c, h * w, dtype):  # float64, and shapes past its grid: torch's
        return F.adaptive_avg_pool2d(x, 1)
    index = x.device.index
    out = torch.empty((n, c, 1, 1), dtype=x.dtype, device=x.device)
    with torch.cuda.device(index):
        _launch(pooling.executable(n, c, h * w, dtype, index), index, x=x, out=out)
    return out


def _gated(a, b) -> tuple:
    """(x, input scale) of the product ``a * b``: the operand of shape (N, C, 1, 1) scales the other, a
    4-D (N, C, H, W) of its dtype and device; else (a * b by torch, None)."""
    for x, gate in ((a, b), (b, a)):
        if isinstance(x, torch.Tensor) and isinstance(gate, torch.Tensor) and x.dim() == 4 and \
                gate.shape == (*x.shape[:2], 1, 1) and gate.dtype == x.dtype and gate.device == x.device:
            return x, gate
    return a * b, None


class _Tracer(fx.Tracer):
    """torch.fx's tracer with cupyconv's modules as leaves (they are not in torch.nn's namespace)."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return isinstance(m, (Conv2d, ConvTranspose2d, Conv1d, FusedConv2d)) or \
            super().is_leaf_module(m, module_qualified_name)


def _only_user(node: fx.Node) -> fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _activation(node: fx.Node | None, source: fx.Node, modules: dict) -> str | None:
    """The epilogue activation ``node`` applies to ``source`` alone, or None."""
    if node is None or not node.args or node.args[0] is not source or len(node.args) > 1:
        return None
    if any(_HARMLESS_KWARGS.get(k) is None or v not in _HARMLESS_KWARGS[k] for k, v in node.kwargs.items()):
        return None
    if node.op == "call_module":
        module = modules[node.target]
        if type(module) is nn.GELU and module.approximate != "none":
            return None
        return _ACTIVATION_MODULES.get(type(module))
    if node.op == "call_function":
        return _ACTIVATION_CALLS.get(node.target)
    if node.op == "call_method":
        return _ACTIVATION_METHODS.get(node.target)
    return None


def _factors(node, conv: fx.Node) -> tuple | None:
    """The two graph values ``node`` (a convolution's input) multiplies, where ``conv`` is its only user."""
    if not isinstance(node, fx.Node) or node.kwargs or len(node.args) != 2 or _only_user(node) is not conv:
        return None
    if not ((node.op == "call_function" and node.target in _MULTIPLIES) or
            (node.op == "call_method" and node.target in ("mul", "mul_"))):
        return None
    a, b = node.args
    return (a, b) if isinstance(a, fx.Node) and isinstance(b, fx.Node) else None


def _pooled(node, conv: fx.Node, modules: dict) -> fx.Node | None:
    """The input of a global average pooling ``node`` (adaptive to 1 x 1) whose only user is ``conv``."""
    if not isinstance(node, fx.Node) or _only_user(node) is not conv or not node.args or \
            not isinstance(node.args[0], fx.Node):
        return None
    if node.op == "call_module" and type(modules[node.target]) is nn.AdaptiveAvgPool2d and len(node.args) == 1 \
            and not node.kwargs and modules[node.target].output_size in (1, (1, 1)):
        return node.args[0]
    if node.op == "call_function" and node.target is F.adaptive_avg_pool2d and not node.kwargs and \
            node.args[1:] in ((1,), ((1, 1),)):
        return node.args[0]
    return None


def _residual(node: fx.Node | None, source: fx.Node) -> fx.Node | None:
    """The other tensor of an add of ``source`` and one more graph value, or None."""
    if node is None or node.kwargs or len(node.args) != 2:
        return None
    if not ((node.op == "call_function" and node.target in _ADDS) or
            (node.op == "call_method" and node.target in ("add", "add_") and node.args[0] is source)):
        return None
    a, b = node.args
    other = b if a is source else a if b is source else None
    return other if isinstance(other, fx.Node) and other is not source else None


def _batch_norm(source: fx.Node, conv: nn.Conv2d, modules: dict, skipped: list):
    """The eval-mode BatchNorm2d applied to ``source`` (a convolution's output) alone, or None; a
    BatchNorm among its users that cannot be folded is listed in ``skipped`` with the reason."""
    norms = [n for n in source.users
             if n.op == "call_module" and isinstance(modules[n.target], nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return None
    node, bn, reason = norms[0], modules[norms[0].target], None
    if len(source.users) > 1:
        reason = f"the output of {source.target} is also used elsewhere"
    elif type(bn) is not nn.BatchNorm2d:
        reason = f"{type(bn).__qualname__} is not nn.BatchNorm2d"
    elif bn.running_mean is None:
        reason = "it keeps no running statistics"
    elif bn.num_features != conv.out_channels:
        reason = f"{bn.num_features} features for {conv.out_channels} channels"
    elif node.args != (source,) or node.kwargs:
        reason = "it is called with other arguments"
    if reason:
        skipped.append(f"{node.target} ({reason})")
        return None
    return bn


def _eval_identity(node: fx.Node) -> bool:
    """Whether ``node`` calls torchvision's stochastic_depth with training=False and valid p and mode:
    its input unchanged (EfficientNet's MBConv before its residual add, which can then fuse)."""
    target = node.target if node.op == "call_function" else None
    if getattr(target, "__name__", "") != "stochastic_depth" or \
            not getattr(target, "__module__", "").startswith("torchvision.") or len(node.args) < 3:
        return False
    named = dict(zip(("input", "p", "mode", "training"), node.args), **node.kwargs)
    p, mode = named.get("p"), named.get("mode")
    return named.get("training", True) is False and isinstance(p, (int, float)) and 0 <= p <= 1 and \
        mode in ("batch", "row") and isinstance(named["input"], fx.Node)


def _fuse_graph(gm: fx.GraphModule, skipped: list) -> int:
    """Replace every chain in ``gm``'s graph by a call of a FusedConv2d at the convolution's path; the
    number of chains."""
    modules = dict(gm.named_modules())
    graph, chains = gm.graph, 0
    for node in list(graph.nodes):
        if _eval_identity(node):
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
    for node in list(graph.nodes):
        if node.op != "call_module" or type(modules.get(node.target)) is not Conv2d or len(node.args) != 1 \
                or node.kwargs:
            continue
        conv, chain, end = modules[node.target], [node], node
        factors = _factors(node.args[0], node)
        pooled = _pooled(node.args[0], node, modules)
        bn = _batch_norm(end, conv, modules, skipped)
        if bn is not None:
            end = _only_user(end)
            chain.append(end)
        residual = _residual(_only_user(end), end)
        if residual is not None:
            end = _only_user(end)
            chain.append(end)
        activation = _activation(_only_user(end), end, modules)
        if activation is not None:
            end = _only_user(end)
            chain.append(end)
        if len(chain) == 1 and factors is None and pooled is None:
            continue
        gm.add_submodule(node.target, FusedConv2d(conv, bn, activation, residual is not None, factors is not None,
                                                  pooled is not None))
        # The multiply or the pooling the fused call takes in, and what it reads instead.
        taken = node.args[0] if factors or pooled else None
        source = factors[0] if factors else pooled if pooled else node.args[0]
        with graph.inserting_before(end):
            fused = graph.call_module(node.target, (source,) if residual is None else (source, residual),
                                      {} if factors is None else {"factor": factors[1]})
        end.replace_all_uses_with(fused)
        for absorbed in reversed(chain):
            graph.erase_node(absorbed)
        if taken is not None:
            graph.erase_node(taken)
        chains += 1
    graph.lint()
    gm.recompile()
    return chains


def _refold_after_load(module: nn.Module, incompatible_keys) -> None:
    """load_state_dict's post-hook on a fused model: fold again in place, for CUDA graphs captured before."""
    for m in module.modules():
        if isinstance(m, FusedConv2d):
            m.refold()


def check_eval(model: nn.Module) -> None:
    """ValueError where the model or one of its BatchNorms is in training mode."""
    training = [name or "(model)" for name, m in model.named_modules()
                if m.training and (m is model or isinstance(m, nn.modules.batchnorm._BatchNorm))]
    if training:
        raise ValueError("convert(model, fuse=True) folds BatchNorm's running statistics into the convolutions, "
                         "which freezes them: call model.eval() first (in training mode: "
                         f"{', '.join(training[:5])}{' ...' if len(training) > 5 else ''})")


def fuse(model: nn.Module) -> tuple[nn.Module, list[str]]:
    """``convert(model, fuse=True)``'s fusion step on an eval-mode model whose plain convolutions are
    cupyconv's already: (a torch.fx.GraphModule with every chain fused, or ``model`` itself where it
    cannot be traced; what was left unfused and why)."""
    try:
        graph = _Tracer().trace(model)
    except Exception as error:  # noqa: BLE001 (fx raises many kinds for untraceable Python)
        return model, [f"torch.fx could not trace the model, so nothing was fused ({type(error).__name__}: {error})"]
    gm = fx.GraphModule(model, graph, class_name=type(model).__name__)
    # Modules the forward never calls (and the BatchNorms once fused) keep their places: same state_dict.
    for name, module in model.named_modules():
        if name and (next(module.parameters(recurse=False), None) is not None or
                     next(module.buffers(recurse=False), None) is not None):
            try:
                gm.get_submodule(name)
            except AttributeError:
                gm.add_submodule(name, module)
    skipped: list = []
    _fuse_graph(gm, skipped)
    gm.train(False)
    gm.register_load_state_dict_post_hook(_refold_after_load)
    gm.__dict__["_cupyconv_unfused"] = model  # not a submodule: convert(gm, inverse=True) gives it back
    if skipped:
        skipped = [f"{len(skipped)} BatchNorm(s) left unfused: {', '.join(skipped)}"]
    return gm, skipped
