"""A ResNet fused with cupyconv.torch.convert(model, fuse=True): each conv -> BatchNorm -> (+ residual)
-> ReLU chain becomes one cupyconv call, checked against the original and timed as CUDA graphs.

    python examples/fuse_model.py [--model resnet50] [--batch 32]

The model has random weights (nothing is downloaded) and random BatchNorm statistics, so the fold
does real work. On a GPU it runs in float16 channels_last, torch's advice for tensor cores; the
fused model's logits are compared with the original's and a float64 copy's, and both models are
captured in CUDA graphs and timed with CUDA events. Without a GPU (or torchvision) it fuses a small
block on the CPU, where the fused model runs torch's conv2d with the folded weights.
"""
import argparse
import copy

import torch
from torch import nn

from cupyconv.torch import convert
from cupyconv.torch_fusion import FusedConv2d


def relative_error(out, ref) -> float:
    return float((out.double() - ref).norm() / ref.norm())


def randomise_batch_norms(model: nn.Module) -> None:
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0, 0.1)


def graph_ms(model: nn.Module, x: torch.Tensor, repeats: int = 50) -> float:
    """Median ms of a CUDA-graph replay of one forward (warm-up on a side stream, as torch advises)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            model(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        model(x)
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def small_block() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    try:
        import torchvision
    except ImportError:
        torchvision = None
    torch.manual_seed(0)
    on_gpu = torch.cuda.is_available() and torchvision is not None
    original = (getattr(torchvision.models, args.model)(weights=None) if on_gpu else small_block()).eval()
    randomise_batch_norms(original)
    if on_gpu:
        original = original.to("cuda", torch.float16, memory_format=torch.channels_last)
    fused = convert(copy.deepcopy(original), fuse=True)
    chains = sum(isinstance(m, FusedConv2d) for m in fused.modules())
    convs = sum(isinstance(m, nn.Conv2d) for m in original.modules())
    print(f"{chains} of {convs} convolutions fused; BatchNorms left in the graph: "
          f"{sum(n.op == 'call_module' and isinstance(fused.get_submodule(n.target), nn.BatchNorm2d) for n in fused.graph.nodes)}")

    shape = (args.batch, 3, 224, 224) if on_gpu else (2, 3, 32, 32)
    x = torch.randn(shape, device="cuda" if on_gpu else "cpu")
    if on_gpu:
        x = x.to(torch.float16).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        ours, theirs = fused(x), original(x)
        ref = copy.deepcopy(original).double()(x.double())
    print(f"relative error against float64: fused {relative_error(ours, ref):.2e}, torch "
          f"{relative_error(theirs, ref):.2e}")
    if not on_gpu:
        print("no GPU or no torchvision: fused a small block on the CPU (torch's conv2d with the folded weights)")
        return
    with torch.no_grad():
        torch_ms, fused_ms = graph_ms(original, x), graph_ms(fused, x)
    print(f"{args.model} batch {args.batch}, fp16 channels_last, CUDA graph: torch {torch_ms:.3f} ms, "
          f"fused cupyconv {fused_ms:.3f} ms ({torch_ms / fused_ms:.2f}x)")


if __name__ == "__main__":
    main()
