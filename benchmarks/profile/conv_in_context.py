"""GPU time of one converted convolution and of torch's, each in CUDA graphs in three contexts, to find what a
model's order costs a kernel that a graph of identical calls does not show (inside MobileNetV2's graph the 1x1
layers ran 1-2 us slower than in graphs of 20 identical calls while cuDNN's did not: benchmarks/NOTES.md,
"Next (left by the 2026-12-01 session #30)"):
    python benchmarks/profile/conv_in_context.py [--dtype fp16|bf16] [--only N,C,K,H,KH,S[,G] ...]
Contexts, 20 iterations a graph (graph_timing.graph_ms), us per call:
- alone: the convolution back to back (its x, weight and output in L2; the same kernel before it);
- after BN: BatchNorm + ReLU6 writing x, then the convolution, less the same graph without the convolution (the
  model's order: x written by torch's elementwise kernel just before);
- cold: as after BN with a FLUSH_BYTES fill before the BatchNorm (the weight, the kernel's code and its parameters
  out of L2, as a forward's other layers leave them), less the same without the convolution;
- cold, weight warm: as cold with the weight read (summed) after the fill: what is left is the code and parameters;
- cold, code warm: as cold with a twin of the layer (the same kernel on another weight and input) run after the
  fill: what is left is the weight and the parameters.
The converted layer keeps its prepared weight (cupyconv.torch.convert), as a converted model's does."""
import argparse
import copy

import torch
from torch import nn

from cupyconv import planner
from cupyconv.arguments import make_problem
from cupyconv.compiler import compute_capability
from cupyconv.tuning import label
from graph_timing import graph_ms

#: (batch, in channels, out channels, plane, kernel, stride, groups): MobileNetV2's 1x1 layers that lost most inside
#: its graph at batch 32 (model_conv_spans), one of its depthwise layers, ResNet-50's 256 -> 64 at batch 8.
LAYERS = [(32, 64, 384, 14, 1, 1, 1), (32, 384, 96, 14, 1, 1, 1), (32, 24, 144, 56, 1, 1, 1),
          (32, 160, 960, 7, 1, 1, 1), (32, 192, 64, 14, 1, 1, 1), (32, 16, 96, 112, 1, 1, 1),
          (8, 192, 64, 14, 1, 1, 1), (8, 384, 384, 14, 3, 1, 384), (8, 256, 64, 56, 1, 1, 1)]
#: Bytes written before the BatchNorm in the cold context: past the H200's 60 MB L2.
FLUSH_BYTES = 256 << 20
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def contexts(conv: nn.Module, twin: nn.Module, bn: nn.Module, pre: torch.Tensor, flush: torch.Tensor) -> dict:
    """us per call of ``conv`` in each context of the module's docstring; ``twin`` is a copy of ``conv`` with a
    weight of its own."""
    x = torch.nn.functional.relu6(bn(pre))
    twin_x = torch.randn_like(x)

    def before(cold: bool, warm: str = ""):
        if cold:
            flush.fill_(1)
        if warm == "weight":
            conv.weight.sum()
        elif warm == "code":
            twin(twin_x)
        return torch.nn.functional.relu6(bn(pre))

    with torch.no_grad():
        times = {"alone": graph_ms(lambda _: conv(x))}
        for name, cold, warm in (("after BN", False, ""), ("cold", True, ""), ("cold, weight warm", True, "weight"),
                                 ("cold, code warm", True, "code")):
            with_conv = graph_ms(lambda _: conv(before(cold, warm)))
            without = graph_ms(lambda _: before(cold, warm))
            times[name] = with_conv - without
    return {k: 1e3 * v for k, v in times.items()}


def main(dtype: torch.dtype, layers) -> None:
    import cupyconv.torch as ct

    cl = torch.channels_last
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    print(f"{torch.cuda.get_device_name()}, {dtype}, channels_last; us per call: torch / cupyconv")
    print("| layer | alone | after BN | cold | cold, weight warm | cold, code warm | cupyconv's plan |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for n, c, k, h, kh, s, g in layers:
        torch.manual_seed(0)
        theirs = nn.Conv2d(c, k, kh, s, kh // 2, groups=g, bias=False).cuda().to(dtype).to(memory_format=cl).eval()
        ours = ct.convert(nn.Sequential(copy.deepcopy(theirs)))[0]
        their_twin = copy.deepcopy(theirs)
        our_twin = ct.convert(nn.Sequential(copy.deepcopy(theirs)))[0]
        bn = nn.BatchNorm2d(c).cuda().to(dtype).eval()
        pre = torch.randn(n, c, h, h, device="cuda", dtype=dtype).contiguous(memory_format=cl)
        with torch.no_grad():
            x = torch.nn.functional.relu6(bn(pre))
            reference = theirs(x).float()
            error = ((ours(x).float() - reference).norm() / reference.norm()).item()
        assert error < 1e-2, ((n, c, k, h, kh, s, g), error)
        t, o = contexts(theirs, their_twin, bn, pre, flush), contexts(ours, our_twin, bn, pre, flush)
        problem = make_problem((n, h, h, c), (k, kh, kh, c // g), None, str(dtype).removeprefix("torch."), s, kh // 2,
                               1, g, layout="NHWC", weight_layout="KHWC")
        plan = label(planner.make_plan(problem, compute_capability=compute_capability()))
        name = f"N{n} {c}->{k} {h}^2 k{kh} s{s}" + (f" g{g}" if g > 1 else "")
        print(f"| {name} | " + " | ".join(f"{t[key]:.1f} / {o[key]:.1f}" for key in t) + f" | {plan} |", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp16")
    parser.add_argument("--only", action="append", default=[], metavar="N,C,K,H,KH,S[,G]",
                        type=lambda text: (tuple(int(v) for v in text.split(",")) + (1,))[:7],
                        help="time this layer instead of LAYERS (repeatable)")
    args = parser.parse_args()
    main(DTYPES[args.dtype], args.only or LAYERS)
