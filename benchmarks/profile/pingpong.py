"""GPU time of the ping-pong tile (implicit_gemm_nhwc.PINGPONG_CONFIG) against the rules' plan and torch on
1x1 channels-last layers, fp16, as a converted model in graph mode runs them (r50_layers_graph.time_plan:
20 calls a CUDA graph, the output checked against torch's):
    PYTHONPATH=TREE:benchmarks/profile python benchmarks/profile/pingpong.py [--batch 8 --batch 32]
Layers: ResNet-50's stride-1 1x1 ones, MobileNetV2's expansions and projections, conformer's pointwise
conv1d (16 x 1000 pixels, 512 -> 1024)."""
import argparse
import dataclasses

import torch

from cupyconv.arguments import make_problem
from cupyconv.families import implicit_gemm_nhwc
from cupyconv.planner import NHWC_KERNEL, make_plan
from cupyconv.tuning import label
from graph_timing import graph_ms
from r50_layers_graph import time_plan

#: (input channels, output channels, plane height, plane width) of the layers, per image.
LAYERS = [(64, 64, 56, 56), (64, 256, 56, 56), (256, 64, 56, 56), (256, 128, 56, 56), (128, 512, 28, 28),
          (512, 128, 28, 28), (512, 256, 28, 28), (256, 1024, 14, 14), (1024, 256, 14, 14), (1024, 512, 14, 14),
          (512, 2048, 7, 7), (2048, 512, 7, 7),
          (24, 144, 56, 56), (144, 24, 56, 56), (32, 192, 28, 28), (192, 32, 28, 28), (96, 576, 14, 14),
          (576, 96, 14, 14), (160, 960, 7, 7), (960, 160, 7, 7)]
CONFORMER = (512, 1024, 1, 1000)


def main(batches: list[int]) -> None:
    shapes = [(n, *layer) for n in batches for layer in LAYERS] + [(16, *CONFORMER)]
    for n, c, k, h, w in shapes:
        problem = make_problem((n, h, w, c), (k, 1, 1, c), None, "float16", layout="NHWC", weight_layout="KHWC")
        x = torch.randn(n, c, h, w, device="cuda", dtype=torch.half).to(memory_format=torch.channels_last)
        weight = torch.randn(k, c, 1, 1, device="cuda", dtype=torch.half).to(memory_format=torch.channels_last)
        reference = torch.nn.functional.conv2d(x, weight)
        rule = dataclasses.replace(make_plan(problem, compute_capability=90), layout="NHWC", weight_layout="KHWC")
        times = {label(rule): time_plan(rule, problem, x, weight, reference)}
        try:
            pingpong = make_plan(problem, config=implicit_gemm_nhwc.PINGPONG_CONFIG, kernel=NHWC_KERNEL,
                                 compute_capability=90)
            times["ping-pong"] = time_plan(pingpong, problem, x, weight, reference)
        except ValueError as error:
            times["ping-pong"] = float("nan")
            print(f"  ping-pong refused: {error}")
        theirs = graph_ms(lambda _: torch.nn.functional.conv2d(x, weight))
        rule_ms, ping_ms = times[label(rule)], times["ping-pong"]
        print(f"N{n} {c}->{k} {h}x{w}: rules {rule_ms * 1e3:6.1f} us  ping-pong {ping_ms * 1e3:6.1f} us "
              f"({rule_ms / ping_ms:4.2f}x)  torch {theirs * 1e3:6.1f} us (rules {theirs / rule_ms:4.2f}x, "
              f"ping-pong {theirs / ping_ms:4.2f}x)  [{label(rule)}]", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, action="append", help="batches (default 8 and 32)")
    main(parser.parse_args().batch or [8, 32])
