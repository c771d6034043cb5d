"""Inference in CUDA graphs with convert(model, static_weights=True): the prepared weights made once,
before the capture, instead of in every replay.

    python examples/static_weights_graph.py [--batch 1] [--model resnet50]

Some kernels read a weight in another form (transposed, channels-last, rounded to TF32, Winograd-
transformed). By default a converted model's CUDA graph prepares those forms in every replay, so that a
replay computes with the weights as they are then, as torch's own convolution would. For inference
with fixed weights, static_weights=True makes them before the capture and lets the graph read them; a
weight changed in place then reaches the graph after refresh_weight_caches(model), load_state_dict or a
call outside a capture -- as this example shows. Timed as the GPU time of a CUDA-graph replay (median of
50, cupyconv.bench.median_ms), TF32, NCHW, random weights. Without a GPU (or torchvision) it converts a small model on the CPU and checks it.
"""
import argparse
import copy

import torch
from torch import nn

from cupyconv.bench import median_ms
from cupyconv.torch import convert, refresh_weight_caches

try:
    import torchvision
except ImportError:
    torchvision = None


def captured(model: nn.Module, x: torch.Tensor):
    """A CUDA graph of model(x) after a warm-up on a side stream (torch's recipe), and its output."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            model(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = model(x)
    return graph, y


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--model", default="resnet50")
    args = parser.parse_args()
    if not torch.cuda.is_available() or torchvision is None:
        torch.manual_seed(0)
        original = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 3)).eval()
        model = convert(copy.deepcopy(original), static_weights=True)
        x = torch.randn(2, 3, 16, 16)
        with torch.no_grad():
            assert torch.equal(model(x), original(x))  # the CPU runs torch's conv2d
        print("No CUDA GPU (or no torchvision): a small model converted with static_weights=True, checked on "
              "the CPU; CUDA graphs need a GPU.")
        return
    torch.backends.cudnn.allow_tf32 = True  # TF32, as torch's default for convolutions
    torch.manual_seed(0)
    x = torch.randn(args.batch, 3, 224, 224, device="cuda")
    with torch.no_grad():
        default = convert(getattr(torchvision.models, args.model)().cuda().eval())
        static = convert(copy.deepcopy(default), static_weights=True)
        graph_default, _ = captured(default, x)
        graph_static, y = captured(static, x)
        print(f"{torch.cuda.get_device_name()}; {args.model}, batch {args.batch}, TF32, CUDA-graph replay: "
              f"weights prepared in the graph {median_ms(graph_default.replay, 50):.3f} ms, "
              f"before it (static_weights=True) {median_ms(graph_static.replay, 50):.3f} ms")

        conv = next(m for m in static.modules() if isinstance(m, nn.Conv2d))
        conv.weight.mul_(0.5)  # an in-place change: the static graph still reads the forms made before
        refresh_weight_caches(static)  # ... until they are remade
        graph_static.replay()
        torch.cuda.synchronize()
        expected = copy.deepcopy(static)(x)
        print(f"after an in-place change and refresh_weight_caches: replay equals a fresh model's output: "
              f"{torch.equal(y, expected)}")


if __name__ == "__main__":
    main()
