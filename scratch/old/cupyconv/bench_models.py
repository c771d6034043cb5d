"""Models benchmark: torchvision models converted by cupyconv.torch.convert, against the originals.

    python -m cupyconv.bench --suite models --model resnet50 --dtype fp16
    python -m cupyconv.bench --suite models --model resnet50 --per-layer
    python -m cupyconv.bench --suite models --timing train --dtype fp32 --dtype fp16

What a user who converts a model sees, as against the layer suites' GPU time of one convolution:
each model (random weights, eval mode, on the GPU in the mode's dtype and memory format) is copied
and converted, the converted copy's logits are checked against a float64 copy of the same model
beside torch's own, and then both are timed in the same process, alternating loop by loop, as a
user's loop runs them: eagerly, as CUDA-graph replays, or compiled by torch.compile. ``--fuse``
converts with ``convert(model, fuse=True)`` (BatchNorm folded, activations and residual adds in the
convolutions' epilogues), ``--static-weights`` with ``static_weights=True`` (prepared weights kept in
CUDA graphs, not made in every replay: what an inference user gets who does not change weights between
replays). ``--fuse``'s ``autotuned`` timing sets the fused model's CUDA graph against a graph of
torch.compile(mode="max-autotune-no-cudagraphs") of the original. The ``train`` timing times a training
step instead (zero_grad, forward, cross-entropy, backward, SGD step; training mode) of torch's model,
of the converted one and of the converted one with torch's backward
(``cupyconv.torch.set_backward("torch")``), after checking the gradients of the first step.
``--per-layer`` instead times every distinct convolution of each model on the input it gets in the
model, torch's F.conv2d against cupyconv.torch.conv2d. Rows are printed as they are measured and the
JSON and markdown are rewritten after every row, so a run stopped at a time limit keeps what it
measured. The command line is cupyconv.bench's; torch and torchvision are imported only when a run
starts.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import math
import statistics
import sys
import time

from . import bench

MODELS = ("resnet18", "resnet50", "mobilenet_v2", "efficientnet_b0", "convnext_tiny", "vgg16")
TIMINGS = ("eager", "graph", "compile", "autotuned", "train")
#: torch's side of the autotuned timing (captured in a CUDA graph as the graph timing's).
AUTOTUNE_MODE = "max-autotune-no-cudagraphs"
DEFAULT_TIMINGS = ("eager", "graph")
#: torch.compile takes tens of seconds a row (37 s for resnet50 on the H100), max-autotune minutes: compile
#: and autotuned run only on these unless --model names others.
COMPILE_DEFAULT_MODELS = ("resnet50",)
#: The training step (issue 16's row) runs on these models at these batches unless --model or --batch names others.
TRAIN_DEFAULT_MODELS, TRAIN_BATCHES = ("resnet50",), (32,)
#: The training step's sides: torch's model (None), the converted model with cupyconv's gradient kernels, and the
#: converted model with torch's (set_backward's kinds): the last isolates the gradient kernels.
TRAIN_SIDES = {"torch": None, "cupyconv": "cupyconv", "torch_backward": "torch"}
#: SGD of the training step. A small rate: each copy steps on the same batch 1 + WARMUP + LOOPS x CALLS times (54), in
#: float16 too.
TRAIN_LR, TRAIN_MOMENTUM = 1e-4, 0.9
BATCHES, LAYER_BATCHES = (1, 8, 32, 128), (1, 32)
IMAGE = (3, 224, 224)
#: Random images batch norm is scaled on (calibrate_batch_norm), once per model.
CALIBRATION_IMAGES = 4
#: Whole-model relative-error floors against float64. A model's logits carry the rounding of every
#: layer, amplified by the ones after it, so these are looser than bench.MODE_FLOOR's one-layer bounds
#: (strict fp32 runs some layers on Winograd, 2-4e-6 a layer); a row also passes within twice
#: torch's own error in the same mode.
MODEL_FLOOR = {"fp32": 1e-4, "tf32": 1e-2, "fp16": 5e-2, "bf16": 5e-2}
#: torch's own relative error from which its output is mostly rounding: a check against it passes anything.
VACUOUS_ERROR = 0.5
#: Whole-model and per-layer wall timings: loops of calls (forwards, replays, layer calls), median over
#: the loops; --quick's smoke-test counts.
LOOPS, CALLS, QUICK_LOOPS, QUICK_CALLS = 5, 10, 2, 3
LAYER_CALLS = 20
WARMUP = 3


def add_arguments(parser) -> None:
    """The models suite's options, on cupyconv.bench's parser."""
    parser.add_argument("--model", action="append", choices=MODELS, dest="models",
                        help="--suite models: a torchvision model (repeatable; default all)")
    parser.add_argument("--batch", action="append", type=int, dest="batches", metavar="N",
                        help=f"--suite models: batch size (repeatable; default {' '.join(map(str, BATCHES))}, "
                             f"with --per-layer {' '.join(map(str, LAYER_BATCHES))})")
    parser.add_argument("--timing", action="append", choices=TIMINGS, dest="timings",
                        help=f"--suite models: eager forwards, CUDA-graph replays, torch.compile, (with --fuse) "
                             f"the fused model's graph against torch.compile(mode={AUTOTUNE_MODE!r})'s in a graph, "
                             f"or an eager training step (forward, backward, SGD) "
                             f"(repeatable; default {' '.join(DEFAULT_TIMINGS)}; compile and autotuned: "
                             f"{' '.join(COMPILE_DEFAULT_MODELS)} unless --model is given; train: "
                             f"{' '.join(TRAIN_DEFAULT_MODELS)} at batch {' '.join(map(str, TRAIN_BATCHES))} "
                             f"unless --model or --batch is given)")
    parser.add_argument("--fuse", action="store_true",
                        help="--suite models: convert(model, fuse=True): BatchNorm folded, activations and residual "
                             "adds fused into the convolutions")
    parser.add_argument("--static-weights", action="store_true",
                        help="--suite models: convert(model, static_weights=True): prepared weights kept in CUDA graphs "
                             "instead of made in every replay (inference)")
    parser.add_argument("--per-layer", action="store_true",
                        help="--suite models: time each distinct convolution of the models instead of whole models")


def check_args(parser, args) -> None:
    """Refuse the models options on other suites; for --suite models, fill in their defaults.

    Sets ``args.layouts`` ({mode: layouts}: NCHW for fp32 and tf32, both for fp16 and bf16, which
    a 16-bit user runs channels_last), ``args.models``, ``args.batches``, ``args.timings``,
    ``args.compile_models``, ``args.train_models`` and ``args.train_batches``.
    """
    given = {"--model": args.models, "--batch": args.batches, "--timing": args.timings,
             "--per-layer": args.per_layer, "--fuse": args.fuse, "--static-weights": args.static_weights}
    if args.suite != "models":
        named = [option for option, value in given.items() if value]
        if named:
            parser.error(f"{', '.join(named)}: for --suite models only")
        return
    if args.per_layer and (args.timings or args.fuse or args.static_weights):
        parser.error("--timing, --fuse and --static-weights apply to whole models; --per-layer times each layer's "
                     "GPU and wall time")
    if "autotuned" in (args.timings or ()) and not args.fuse:
        parser.error("--timing autotuned times fused models: add --fuse")
    if "train" in (args.timings or ()) and (args.fuse or args.static_weights):
        parser.error("--timing train trains converted models; --fuse and --static-weights are for inference only")
    if any(batch < 1 for batch in args.batches or ()):
        parser.error(f"--batch must be at least 1, got {args.batches}")
    args.layouts = {mode: list(dict.fromkeys(args.layout)) if args.layout
                    else ["nchw", "channels_last"] if mode in ("fp16", "bf16") else ["nchw"]
                    for mode in args.modes}
    args.compile_models = list(dict.fromkeys(args.models)) if args.models else list(COMPILE_DEFAULT_MODELS)
    args.train_models = list(dict.fromkeys(args.models)) if args.models else list(TRAIN_DEFAULT_MODELS)
    args.train_batches = list(dict.fromkeys(args.batches or TRAIN_BATCHES))
    args.models = list(dict.fromkeys(args.models or MODELS))
    args.batches = list(dict.fromkeys(args.batches or (LAYER_BATCHES if args.per_layer else BATCHES)))
    args.timings = [] if args.per_layer else list(dict.fromkeys(args.timings or DEFAULT_TIMINGS))
    if not args.per_layer:  # --timing compile or train alone: only the models and batches they run on
        args.models = [model for model in args.models if timings_for(args, model)]
        args.batches = [batch for batch in args.batches if any(timings_for(args, model, batch) for model in args.models)]


def timings_for(args, model: str, batch: int | None = None) -> list[str]:
    """The timings run on ``model`` (at ``batch``, or at any batch): compile and autotuned only on
    args.compile_models, train only on args.train_models at args.train_batches."""
    return [t for t in args.timings
            if (t not in ("compile", "autotuned") or model in args.compile_models)
            and (t != "train" or model in args.train_models and (batch is None or batch in args.train_batches))]


def output_stem(args) -> str:
    """The file name (without suffix) of a run: what it selected, so that runs split by model, mode or
    batch into one folder do not overwrite each other."""
    parts = ["model_layers" if args.per_layer else "models",
             "all" if args.models == list(MODELS) else "-".join(args.models), "-".join(args.modes)]
    if args.batches != list(LAYER_BATCHES if args.per_layer else BATCHES):
        parts.append("b" + "-".join(map(str, args.batches)))
    if args.layout:
        parts.append("-".join(dict.fromkeys(args.layout)))
    if args.timings and args.timings != list(DEFAULT_TIMINGS):
        parts.append("-".join(args.timings))
    if args.fuse:
        parts.append("fused")
    if args.static_weights:
        parts.append("static")
    if args.quick:
        parts.append("quick")
    return "_".join(parts)


@dataclasses.dataclass(frozen=True)
class ConvConfig:
    """One convolution call as F.conv2d sees it: what makes two layers the same to time."""

    x_shape: tuple
    weight_shape: tuple
    bias: bool
    stride: tuple
    padding: tuple | str
    dilation: tuple
    groups: int
    dtype: str
    channels_last: bool

    def label(self) -> str:
        """E.g. ``64->64 56x56 k3x3 s1 p1``, plus ``d2``, ``g64``, ``+bias`` where they apply (N is the row's batch)."""
        pair = lambda v: v if isinstance(v, str) else str(v[0]) if v[0] == v[1] else f"{v[0]}x{v[1]}"
        _, c, h, w = self.x_shape
        k, _, kh, kw = self.weight_shape
        text = f"{c}->{k} {h}x{w} k{kh}x{kw} s{pair(self.stride)} p{pair(self.padding)}"
        if self.dilation != (1, 1):
            text += f" d{pair(self.dilation)}"
        if self.groups != 1:
            text += f" g{self.groups}"
        return text + (" +bias" if self.bias else "")


@dataclasses.dataclass
class ConvCall:
    """One nn.Conv2d call seen during a forward: the module's name, its config, its input and the module."""

    name: str
    config: ConvConfig
    x: object
    module: object


def record_convs(model, x) -> list[ConvCall]:
    """Run ``model(x)`` once with a pre-hook on every nn.Conv2d: each call, in call order.

    The hooks are removed again, also when the forward raises. Every input is kept, so call this
    under torch.inference_mode() (or no_grad) and group the calls (group_convs) before the next.
    """
    import torch

    calls = []

    def hook(name):
        def record(module, inputs):
            (x,) = inputs
            channels_last = x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
            padding = module.padding if isinstance(module.padding, str) else tuple(module.padding)
            config = ConvConfig(tuple(x.shape), tuple(module.weight.shape), module.bias is not None,
                                tuple(module.stride), padding, tuple(module.dilation), module.groups,
                                str(x.dtype).removeprefix("torch."), channels_last)
            calls.append(ConvCall(name, config, x, module))
        return record

    handles = [module.register_forward_pre_hook(hook(name)) for name, module in model.named_modules()
               if isinstance(module, torch.nn.Conv2d)]
    try:
        model(x)
    finally:
        for handle in handles:
            handle.remove()
    return calls


def group_convs(calls: list[ConvCall]) -> list[tuple[ConvCall, list[str]]]:
    """Calls with the same config as one group, in order of first appearance: (first call, names of all).

    Only the first call's input is kept: identical configs time the same.
    """
    groups: dict[ConvConfig, tuple[ConvCall, list[str]]] = {}
    for call in calls:
        groups.setdefault(call.config, (call, []))[1].append(call.name)
    return list(groups.values())


def calibrate_batch_norm(model, images) -> None:
    """Scale every batch norm of ``model`` so that its output has unit mean square on ``images``.

    With random weights, torchvision's initialisation leaves each batch norm as the identity (running
    mean 0, variance 1), and activations can drift by orders of magnitude through the layers (depthwise
    weights are drawn for a fan-out of 9 C): on the CPU with torch 2.13, MobileNetV2's logits came out
    near 1e-9 and EfficientNet-B0's near 1e-14 in float32, exact zeros in float16, where the check
    would compare zeros and the layers see numbers no trained model gives them. Here each
    running variance becomes the mean square of its layer's input (one number per layer; the running
    mean stays 0, so features keep their shape -- centring them per channel made ResNet-50's bfloat16
    logits 13 % wrong in torch itself). The pre-hooks run in layer order during one eval forward, so
    each layer is scaled on the already scaled output of the ones before it. The weights stay random.
    """
    import torch

    def rescale(module, inputs):
        module.running_var.fill_(float(inputs[0].pow(2).mean()))

    handles = [module.register_forward_pre_hook(rescale) for module in model.modules()
               if isinstance(module, torch.nn.modules.batchnorm._BatchNorm)]
    try:
        if handles:
            with torch.no_grad():
                model(images)
    finally:
        for handle in handles:
            handle.remove()


def training_step(model, optimizer, x, target):
    """One step of a training loop: zero the gradients, forward, cross-entropy against ``target`` (of the logits
    in float32 or float64, not in 16 bits, as mixed-precision training computes it), backward, optimizer step.
    Returns the loss, detached and not synchronised."""
    import torch

    optimizer.zero_grad(set_to_none=True)
    logits = model(x)
    loss = torch.nn.functional.cross_entropy(logits if logits.dtype == torch.float64 else logits.float(), target)
    loss.backward()
    optimizer.step()
    return loss.detach()


@contextlib.contextmanager
def backward_kind(kind: str | None):
    """While open, cupyconv.torch's convolutions take their gradients from ``kind`` ('cupyconv' or 'torch', as
    set_backward); None leaves the choice alone (torch's own model has no cupyconv convolution)."""
    if kind is None:
        yield
        return
    from . import torch as adapter

    previous = adapter.set_backward(kind)
    try:
        yield
    finally:
        adapter.set_backward(previous)


def checked_convs(model) -> list[str]:
    """The convolutions whose gradients a training row checks: the first, the middle and the last nn.Conv2d
    (converted ones included) in module order, by name."""
    import torch

    names = [name for name, module in model.named_modules() if isinstance(module, torch.nn.Conv2d)]
    return list(dict.fromkeys(names[i] for i in (0, len(names) // 2, -1))) if names else []


@contextlib.contextmanager
def recorded_gradients(model, names: list[str]):
    """While open, each forward and backward of ``model`` records, for each named convolution, what its
    gradients are computed from and what they came to: {name: {"x": input, "weight": a copy of the weight
    (an optimizer step changes it in place), "dy": the gradient of its output, "dx": its input gradient}}
    ("dx" only where the input requires a gradient). The output's gradient is caught on the output
    itself, and the module returns a copy of it, so that an in-place activation after the convolution
    (VGG's ReLU) changes the copy; the input gradient is caught on a copy of the input that only the
    convolution reads. The hooks are removed again on leaving, also when the step raises.
    """
    records = {name: {} for name in names}

    def before(record):
        def hook(module, inputs):
            (x,) = inputs
            record.update(x=x.detach(), weight=module.weight.detach().clone())
            if x.requires_grad:
                x = x.clone()
                x.register_hook(lambda grad: record.__setitem__("dx", grad))
                return (x,)
        return hook

    def after(record):
        def hook(module, inputs, output):
            output.register_hook(lambda grad: record.__setitem__("dy", grad))
            return output.clone()
        return hook

    handles = []
    try:
        for name in names:
            module = model.get_submodule(name)
            handles += [module.register_forward_pre_hook(before(records[name])),
                        module.register_forward_hook(after(records[name]))]
        yield records
    finally:
        for handle in handles:
            handle.remove()


def gradient_checks(model, records: dict) -> list[dict]:
    """The recorded convolutions' weight gradients (``.grad`` of the module in ``model``, as the step computed
    it) and input gradients, each against float64 torch.nn.grad of the same input, weight and output
    gradient: {"layer", "gradient" ('weight' or 'input'), "error", "torch_error"} (torch_error: torch.nn.grad
    in the model's dtype on the same tensors), relative errors as bench.relative_error."""
    import torch

    checks = []
    with torch.no_grad():
        for name, record in records.items():
            module = model.get_submodule(name)
            args = (module.stride, module.padding, module.dilation, module.groups)
            x, weight, dy = record["x"], record["weight"], record["dy"]
            up = lambda t: t.double().contiguous()
            formulas = {"weight": (module.weight.grad, lambda x, w, dy: torch.nn.grad.conv2d_weight(x, w.shape, dy, *args)),
                        "input": (record.get("dx"), lambda x, w, dy: torch.nn.grad.conv2d_input(x.shape, w, dy, *args))}
            for gradient, (got, formula) in formulas.items():
                if got is None:
                    continue
                ref = formula(up(x), up(weight), up(dy))
                checks.append({"layer": name, "gradient": gradient, "error": bench.relative_error(got, ref),
                               "torch_error": bench.relative_error(formula(x, weight, dy), ref)})
    return checks


def _worst(errors) -> float:
    """The largest of some errors, NaN if any is (0 for none)."""
    return max(errors, key=lambda e: math.inf if math.isnan(e) else e, default=0.0)


def _loss_status(losses: dict, when: str) -> str | None:
    """WRONG where a converted model's loss ({side: loss}) is not finite, SKIP where torch's own is not (the
    training diverged in torch too: nothing to compare against), or None."""
    bad = {side: loss for side, loss in losses.items() if not math.isfinite(loss)}
    if not bad:
        return None
    text = ", ".join(f"{side} {loss}" for side, loss in bad.items())
    return f"{'SKIP' if 'torch' in bad else 'WRONG'} (loss not finite {when}: {text})"


def _check_status(mode: str, check: dict) -> str | None:
    """A gradient check's WRONG (or SKIP) status, or None: the error may reach the mode's one-layer floor
    (bench.MODE_FLOOR) or twice torch's own, in strict fp32 too (a gradient of a real model's step can
    cancel more than the layer suites' random data does)."""
    return _status(check["error"], check["torch_error"], max(bench.MODE_FLOOR[mode], 2 * check["torch_error"]))


def _oom_errors() -> tuple:
    """The exceptions of a GPU out of memory, from torch's allocator or CuPy's pool."""
    import cupy
    import torch

    return torch.cuda.OutOfMemoryError, cupy.cuda.memory.OutOfMemoryError


def _status(error: float, torch_error: float, bound: float) -> str | None:
    """WRONG, or None when the result passes; SKIP where torch's own result has lost the signal (error
    NaN or at least VACUOUS_ERROR: an under- or overflowing activation), which leaves nothing to check."""
    if not torch_error < VACUOUS_ERROR:
        return f"SKIP (torch's own error is {torch_error:.2g}: nothing to check against)"
    return bench.error_status(error, bound)


def captured(torch, model, x):
    """A CUDA graph of ``model(x)`` and its static output, captured after WARMUP forwards on a side stream
    as torch's documentation says (which also compiles cupyconv's kernels outside the capture)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARMUP):
            model(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = model(x)
    return graph, out


class _Run:
    """One run of the models suite: its selections and loop counts, the rows measured and the files they go to."""

    #: Where models and inputs go (the tests run a training row on the CPU).
    device = "cuda"

    def __init__(self, args, torch, torchvision):
        self.args, self.torch, self.torchvision = args, torch, torchvision
        self.loops, self.calls = (QUICK_LOOPS, QUICK_CALLS) if args.quick else (LOOPS, CALLS)
        self.layer_calls = QUICK_CALLS if args.quick else LAYER_CALLS
        meta = {**bench._meta(args), "models": args.models, "batches": args.batches, "timings": args.timings,
                "fused": args.fuse, "static_weights": args.static_weights, "autotune_mode": AUTOTUNE_MODE,
                "compile_models": args.compile_models, "train_models": args.train_models,
                "train_batches": args.train_batches, "train_sides": list(TRAIN_SIDES),
                "train_optimizer": {"sgd_lr": TRAIN_LR, "momentum": TRAIN_MOMENTUM},
                "per_layer": args.per_layer, "layouts": args.layouts,
                "loops": self.loops, "calls_per_loop": self.layer_calls if args.per_layer else self.calls,
                "model_floor": MODEL_FLOOR, "image": IMAGE,
                "torchvision": torchvision.__version__}
        self.results = {"meta": meta, "rows": []}
        args.out.mkdir(parents=True, exist_ok=True)
        self.stem = args.out / output_stem(args)

    def each_variant(self, rows_of) -> None:
        """Call ``rows_of(model name, mode, layout, model)`` for every selection, with torch's model (random
        weights, seed 0, nothing downloaded; batch norm scaled by calibrate_batch_norm, on the CPU) in
        eval mode on the GPU in the mode's dtype and layout, and the precision flags of the mode set;
        each is freed before the next is made."""
        torch = self.torch
        for name in self.args.models:
            torch.manual_seed(0)
            master = self.torchvision.models.get_model(name, weights=None).eval()
            calibrate_batch_norm(master, torch.randn(CALIBRATION_IMAGES, *IMAGE,
                                                     generator=torch.Generator().manual_seed(0)))
            for mode in self.args.modes:
                for layout in self.args.layouts[mode]:
                    # strict fp32 is strict in the matmuls (classifiers, ConvNeXt's MLPs) as well
                    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
                    rows_of(name, mode, layout,
                            copy.deepcopy(master).to(self.device, self.dtype(mode), memory_format=self.memory(layout)))
                    torch.cuda.empty_cache()

    def dtype(self, mode: str):
        return getattr(self.torch, bench.MODE_DTYPE[mode])

    def memory(self, layout: str):
        return self.torch.channels_last if layout == "channels_last" else self.torch.contiguous_format

    def input(self, batch: int, mode: str, layout: str):
        """The same images for every mode and layout of a batch size (seeded), in that dtype and layout."""
        torch = self.torch
        images = torch.randn(batch, *IMAGE, generator=torch.Generator().manual_seed(batch))
        return images.to(self.device, self.dtype(mode)).contiguous(memory_format=self.memory(layout))

    def measured(self, row: dict, measure, inference: bool = True) -> None:
        """Complete ``row`` with ``measure()``, run under inference_mode unless ``inference`` is false (a
        training step); a row that runs out of GPU memory is skipped with the reason, not an error; the
        seconds it took either way."""
        began = time.perf_counter()
        try:
            with self.torch.inference_mode(inference):
                row.update(measure())
        except _oom_errors() as error:
            row["status"] = f"SKIP (out of GPU memory: {str(error).splitlines()[0][:120]})"
        row["seconds"] = time.perf_counter() - began
        self.torch.cuda.empty_cache()

    def add(self, row: dict, line: str) -> None:
        """Keep a row, print it, and rewrite the JSON and markdown."""
        self.results["rows"].append(row)
        print(f"{line}  ({row['seconds']:.1f} s)", flush=True)
        self.stem.with_suffix(".json").write_text(json.dumps(self.results, indent=1))
        self.stem.with_suffix(".md").write_text(to_markdown(self.results))

    # -- whole models --------------------------------------------------------------------------------

    def model_rows(self, name: str, mode: str, layout: str, model) -> None:
        """Every batch and timing of one model variant: convert a copy (fused with --fuse), check it, time both
        (a train row: training copies of both, see time_train)."""
        from .torch import Conv2d, convert
        from .torch_fusion import FusedConv2d

        ours = convert(copy.deepcopy(model), fuse=self.args.fuse, static_weights=self.args.static_weights)
        convs = sum(type(m) in (Conv2d, FusedConv2d) for m in ours.modules())
        reference = copy.deepcopy(model).double()
        for batch in self.args.batches:
            timings = timings_for(self.args, name, batch)
            if not timings:
                continue
            x = self.input(batch, mode, layout)
            sample = sorted({0, batch - 1})  # first and last images against float64: the whole batch would cost more
            if timings != ["train"]:
                with self.torch.inference_mode():
                    ref = reference(x[sample].double())
            for timing in timings:
                row = {"model": name, "mode": mode, "layout": layout, "batch": batch, "timing": timing,
                       "convs": convs, "fused": sum(type(m) is FusedConv2d for m in ours.modules()),
                       "static_weights": self.args.static_weights}
                if timing == "train":
                    self.measured(row, lambda: self.time_train(mode, model, ours, x), inference=False)
                else:
                    self.measured(row, lambda: self.time_model(timing, mode, model, ours, x, ref, sample))
                self.add(row, _model_line(row))

    def prepare(self, timing: str, model, x, side_name: str):
        """A callable running one forward of ``model`` on ``x`` the way ``timing`` measures it, returning the output.

        graph: captured once into a CUDA graph (static input and output) after warm-up forwards on a
        side stream, as torch's documentation says, which also compiles cupyconv's kernels outside the
        capture; compile: torch.compile(fullgraph=True, dynamic=False) (static shapes, as the eager model),
        compiled by its first call here; autotuned: torch's side compiled so with AUTOTUNE_MODE, then
        both sides captured as graph's.
        """
        torch = self.torch
        if timing == "eager":
            return lambda: model(x)
        if timing == "compile" or (timing == "autotuned" and side_name == "torch"):
            compiled = torch.compile(model, fullgraph=True, dynamic=False,
                                     mode=AUTOTUNE_MODE if timing == "autotuned" else None)
            compiled(x)
            torch.cuda.synchronize()
            if timing == "compile":
                return lambda: compiled(x)
            model = compiled
        graph, out = captured(torch, model, x)

        def replay():
            graph.replay()
            return out
        return replay

    def time_model(self, timing: str, mode: str, theirs, ours, x, ref, sample) -> dict:
        """Check the converted model's output of this timing against float64 beside torch's, then time both."""
        torch = self.torch
        if timing in ("compile", "autotuned"):
            torch._dynamo.reset()  # each row compiles afresh, for its batch: no recompile limits, no dynamic shapes
        runs, setup_s = {}, {}
        for side, model in (("torch", theirs), ("cupyconv", ours)):
            began = time.perf_counter()
            runs[side] = self.prepare(timing, model, x, side)
            setup_s[side] = time.perf_counter() - began
        error, torch_error = (bench.relative_error(runs[side]()[sample], ref) for side in ("cupyconv", "torch"))
        row = {"error": error, "torch_error": torch_error}
        if timing in ("compile", "autotuned"):
            row.update(torch_compile_s=setup_s["torch"], cupyconv_compile_s=setup_s["cupyconv"])
        status = _status(error, torch_error, max(MODEL_FLOOR[mode], 2 * torch_error))
        if status:
            return {**row, "status": status}
        ms = bench.alternating_loop_ms(runs, self.calls, self.loops, WARMUP)
        return {**row, "status": "ok", "torch_ms": ms["torch"], "cupyconv_ms": ms["cupyconv"],
                "speedup": ms["torch"] / ms["cupyconv"]}

    def time_train(self, mode: str, theirs, ours, x) -> dict:
        """A training step of torch's model and of the converted one, with cupyconv's gradient kernels and with
        torch's (TRAIN_SIDES): each a deep copy in training mode with its own SGD (TRAIN_LR, TRAIN_MOMENTUM),
        from the same weights, on ``x`` and seeded random labels.

        Check: the first step of each converted copy records the first, middle and last convolution's input,
        weight and output gradient (recorded_gradients); the weight and input gradients the step gave them
        must match float64 torch.nn.grad on the same tensors within the mode's one-layer floor or twice
        torch's own error there (a whole model's gradients against a float64 model are no check in training
        mode: batch statistics make them chaotic, see benchmarks/README.md), and every first loss must be
        finite. Then the three steps are timed as the eager timing times forwards (wall time per step,
        bench.alternating_loop_ms), and the losses after the last steps must be finite too.
        """
        torch = self.torch
        with torch.no_grad():
            classes = theirs(x[:1]).shape[-1]
        batch = x.shape[0]
        target = torch.randint(0, classes, (batch,), generator=torch.Generator().manual_seed(batch)).to(self.device)
        names = checked_convs(ours)
        steps, last, checks = {}, {}, {}
        for side, kind in TRAIN_SIDES.items():
            net = copy.deepcopy(theirs if kind is None else ours).train()
            optimizer = torch.optim.SGD(net.parameters(), lr=TRAIN_LR, momentum=TRAIN_MOMENTUM)

            def step(side=side, kind=kind, net=net, optimizer=optimizer):
                with backward_kind(kind):
                    last[side] = training_step(net, optimizer, x, target)
            steps[side] = step
            if kind is None:
                step()
                continue
            with recorded_gradients(net, names) as records:
                step()
            checks[side] = gradient_checks(net, records)
            del records
        first_loss = {side: float(loss) for side, loss in last.items()}
        row = {"checked": names, "checks": checks, "loss": first_loss,
               "error": _worst(c["error"] for c in checks["cupyconv"]),
               "torch_error": _worst(c["torch_error"] for c in checks["cupyconv"]),
               "torch_backward_error": _worst(c["error"] for c in checks["torch_backward"])}
        status = _loss_status(first_loss, "on the first step")
        for side, side_checks in checks.items():
            for check in side_checks:
                wrong = _check_status(mode, check)
                if wrong and not status:
                    status = f"{wrong} in {check['layer']}'s {check['gradient']} gradient, {side} side"
        if status:
            return {**row, "status": status}
        ms = bench.alternating_loop_ms(steps, self.calls, self.loops, WARMUP)
        final_loss = {side: float(loss) for side, loss in last.items()}
        row.update(status="ok", torch_ms=ms["torch"], cupyconv_ms=ms["cupyconv"], speedup=ms["torch"] / ms["cupyconv"],
                   torch_backward_ms=ms["torch_backward"], torch_backward_speedup=ms["torch"] / ms["torch_backward"],
                   final_loss=final_loss, steps=1 + WARMUP + self.calls * self.loops)
        return {**row, "status": _loss_status(final_loss, f"after {row['steps']} steps") or "ok"}

    # -- per layer -----------------------------------------------------------------------------------

    def layer_rows(self, name: str, mode: str, layout: str, model) -> None:
        """Every distinct convolution of one model variant at each batch, on the input the model gives it."""
        for batch in self.args.batches:
            x = self.input(batch, mode, layout)
            with self.torch.inference_mode():
                groups = group_convs(record_convs(model, x))
            for call, names in groups:
                row = {"model": name, "mode": mode, "layout": layout, "batch": batch,
                       "layer": call.config.label(), "count": len(names), "names": names}
                self.measured(row, lambda: self.time_layer(mode, call))
                self.add(row, _layer_line(row))
            del groups

    def time_layer(self, mode: str, call: ConvCall) -> dict:
        """Check cupyconv.torch.conv2d against float64 beside F.conv2d on the layer's input, then time
        both: GPU time (CUDA events; bench.alternating_ms) and wall time per call in a back-to-back loop."""
        from .torch import conv2d as adapter_conv2d

        F = self.torch.nn.functional
        x, m = call.x, call.module
        args = (m.weight, m.bias, m.stride, m.padding, m.dilation, m.groups)
        fns = {"torch": lambda: F.conv2d(x, *args), "cupyconv": lambda: adapter_conv2d(x, *args)}
        sample = sorted({0, x.shape[0] - 1})
        ref = F.conv2d(x[sample].double(), m.weight.double(), None if m.bias is None else m.bias.double(), *args[2:])
        error, torch_error = (bench.relative_error(fns[side]()[sample], ref) for side in ("cupyconv", "torch"))
        row = {"error": error, "torch_error": torch_error}
        status = _status(error, torch_error, bench.error_bound(mode, torch_error))
        if status:
            return {**row, "status": status}
        gpu = bench.alternating_ms(fns, self.args.repeats, WARMUP)
        wall = bench.alternating_loop_ms(fns, self.layer_calls, self.loops, WARMUP)
        return {**row, "status": "ok", "torch_ms": gpu["torch"][0], "cupyconv_ms": gpu["cupyconv"][0],
                "speedup": gpu["torch"][0] / gpu["cupyconv"][0], "torch_wall_us": 1e3 * wall["torch"],
                "cupyconv_wall_us": 1e3 * wall["cupyconv"], "wall_speedup": wall["torch"] / wall["cupyconv"]}


def _model_line(row: dict) -> str:
    head = (f"{row['model']:16s} {row['mode']:5s} {row['layout']:13s} N{row['batch']:<4d} {row['timing']:9s}"
            f"{' fused' if row.get('fused') else ''}{' static' if row.get('static_weights') else ''}")
    if row["status"] != "ok":
        return f"{head} {row['status']}  <<<<<<<<<<"
    line = f"{head} torch {row['torch_ms']:8.3f} ms  cupyconv {row['cupyconv_ms']:8.3f} ms  {row['speedup']:5.2f}x"
    if row["timing"] == "train":
        line += f"  with torch's backward {row['torch_backward_ms']:8.3f} ms  {row['torch_backward_speedup']:5.2f}x  gradient"
    return line + f"  error {row['error']:.1e} (torch {row['torch_error']:.1e})"


def _layer_line(row: dict) -> str:
    head = f"{row['model']:16s} {row['mode']:5s} {row['layout']:13s} N{row['batch']:<4d} {row['layer']:36s} x{row['count']:<3d}"
    if row["status"] != "ok":
        return f"{head} {row['status']}  <<<<<<<<<<"
    return (f"{head} GPU ms torch {row['torch_ms']:7.3f} cupyconv {row['cupyconv_ms']:7.3f} {row['speedup']:5.2f}x"
            f"  wall us torch {row['torch_wall_us']:7.0f} cupyconv {row['cupyconv_wall_us']:7.0f} "
            f"{row['wall_speedup']:5.2f}x")


def _speedup(value: float) -> str:
    return f"{value:.2f}x"


def model_cells(rows: list[dict]) -> list[list[str]]:
    """The models table as text cells, header first: a line per (model, mode, layout, batch, timing). A train
    row's times are per training step, its errors its gradients' (the worst checked), and its last cell the
    converted model's step with torch's backward."""
    cells = [["model", "mode", "layout", "batch", "timing", "cupyconv model", "torch ms", "cupyconv ms", "speed-up",
              "cupyconv error", "torch error", "compile s (torch / cupyconv)", "with torch's backward: ms (speed-up)"]]
    for r in rows:
        variant = f"fused ({r['fused']} of {r['convs']} convs)" if r.get("fused") else "converted"
        if r.get("static_weights"):
            variant += ", static weights"
        head = [r["model"], r["mode"], r["layout"], str(r["batch"]), r["timing"], variant]
        errors = [f"{r['error']:.1e}", f"{r['torch_error']:.1e}"] if "error" in r else ["", ""]
        compiled = f"{r['torch_compile_s']:.1f} / {r['cupyconv_compile_s']:.1f}" if "torch_compile_s" in r else ""
        backward = (f"{r['torch_backward_ms']:.3f} ({_speedup(r['torch_backward_speedup'])})"
                    if "torch_backward_ms" in r and r["status"] == "ok" else "")
        if r["status"] != "ok":
            cells.append(head + ["", "", r["status"], *errors, compiled, backward])
            continue
        cells.append(head + [f"{r['torch_ms']:.3f}", f"{r['cupyconv_ms']:.3f}", _speedup(r["speedup"]), *errors, compiled,
                             backward])
    return cells


def geomean_notes(rows: list[dict]) -> list[str]:
    """A line per timing: the geometric mean speed-up over its NCHW rows that were timed."""
    notes = []
    for timing in TIMINGS:
        speedups = [r["speedup"] for r in rows if r["timing"] == timing and r["layout"] == "nchw" and r["status"] == "ok"]
        if speedups:
            notes.append(f"geomean speed-up, {timing}, NCHW rows: {_speedup(statistics.geometric_mean(speedups))} "
                         f"over {len(speedups)} rows")
    return notes


def layer_cells(rows: list[dict]) -> list[list[str]]:
    """The per-layer table as text cells, header first: a line per distinct layer, ``loses`` naming the
    measures in which cupyconv is slower, and after each (model, mode, layout, batch) the count-weighted
    sum over its timed layers: all the model's convolution time, by either measure."""
    cells = [["model", "mode", "layout", "batch", "layer", "count", "torch GPU ms", "cupyconv GPU ms",
              "GPU speed-up", "torch wall µs", "cupyconv wall µs", "wall speed-up", "loses"]]
    keys = list(dict.fromkeys((r["model"], r["mode"], r["layout"], r["batch"]) for r in rows))
    for key in keys:
        group = [r for r in rows if (r["model"], r["mode"], r["layout"], r["batch"]) == key]
        head = [key[0], key[1], key[2], str(key[3])]
        for r in group:
            if r["status"] != "ok":
                cells.append(head + [r["layer"], str(r["count"]), "", "", r["status"], "", "", "", ""])
                continue
            loses = [name for name, speedup in (("GPU", r["speedup"]), ("wall", r["wall_speedup"])) if speedup < 1]
            cells.append(head + [r["layer"], str(r["count"]), f"{r['torch_ms']:.3f}", f"{r['cupyconv_ms']:.3f}",
                                 _speedup(r["speedup"]), f"{r['torch_wall_us']:.0f}", f"{r['cupyconv_wall_us']:.0f}",
                                 _speedup(r["wall_speedup"]), ", ".join(loses)])
        timed = [r for r in group if r["status"] == "ok"]
        if timed:
            total = {field: sum(r["count"] * r[field] for r in timed)
                     for field in ("torch_ms", "cupyconv_ms", "torch_wall_us", "cupyconv_wall_us")}
            cells.append(head + [f"sum of {len(timed)} timed layers", str(sum(r["count"] for r in timed)),
                                 f"{total['torch_ms']:.3f}", f"{total['cupyconv_ms']:.3f}",
                                 _speedup(total["torch_ms"] / total["cupyconv_ms"]), f"{total['torch_wall_us']:.0f}",
                                 f"{total['cupyconv_wall_us']:.0f}",
                                 _speedup(total["torch_wall_us"] / total["cupyconv_wall_us"]), ""])
    return cells


def per_image_notes(rows: list[dict]) -> list[str]:
    """A line per (model, mode, layout) timed at several batches: the convolutions' GPU time per image
    at each batch (count-weighted sums over the layers timed at every batch, / batch), cupyconv and
    torch, and cupyconv's small batches against its largest (split-K's aim: the same rate per image)."""
    notes = []
    for key in dict.fromkeys((r["model"], r["mode"], r["layout"]) for r in rows):
        group = [r for r in rows if (r["model"], r["mode"], r["layout"]) == key and r["status"] == "ok"]
        batches = sorted({r["batch"] for r in group})
        layers = set.intersection(*({r["layer"] for r in group if r["batch"] == b} for b in batches)) if batches else set()
        if len(batches) < 2 or not layers:
            continue
        per_image = {b: {side: sum(r["count"] * r[f"{side}_ms"] for r in group if r["batch"] == b and r["layer"] in layers)
                         / b for side in ("cupyconv", "torch")} for b in batches}
        largest = per_image[batches[-1]]["cupyconv"]
        notes.append(f"{' '.join(key)}: GPU ms per image over {len(layers)} layers, cupyconv / torch: " + ", ".join(
            f"N{b} {per_image[b]['cupyconv']:.4f} / {per_image[b]['torch']:.4f}"
            f" ({per_image[b]['cupyconv'] / largest:.2f}x N{batches[-1]}'s)" for b in batches))
    return notes


def to_markdown(results: dict) -> str:
    """The run's table (whole models with their geomean lines, or per layer with per-image lines) under
    bench's header lines."""
    rows = results["rows"]
    if results["meta"]["per_layer"]:
        return bench.markdown(results["meta"], layer_cells(rows), per_image_notes(rows))
    return bench.markdown(results["meta"], model_cells(rows), geomean_notes(rows))


def main(args) -> int:
    """Run --suite models as parsed by cupyconv.bench.parse_args. Exit status as bench's: 0 when every
    timed row was right (skipped rows included), 1 when any row is WRONG, 2 without torchvision or a GPU."""
    try:
        import torchvision
    except ImportError as error:
        print(f"--suite models needs torchvision (pip install torchvision, or the bench extra): {error}",
              file=sys.stderr)
        return 2
    missing = bench._gpu_missing()
    if missing:
        print(missing, file=sys.stderr)
        return 2
    import torch

    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    run = _Run(args, torch, torchvision)
    run.each_variant(run.layer_rows if args.per_layer else run.model_rows)
    print()
    print(to_markdown(run.results))
    print(f"wrote {run.stem}.json and .md", flush=True)
    return 1 if any(r["status"].startswith("WRONG") for r in run.results["rows"]) else 0
