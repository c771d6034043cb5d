"""What preparing the weights inside a CUDA graph costs a converted model: its graph replayed as convert()
makes it (each module's weight prepared in the graph, so that a replay reads the weight as it is then)
against the same model converted with static_weights=True (forms made before the capture and read by it,
as fused modules' are):
    python benchmarks/profile/graph_weights.py [--model resnet50 ...] [--mode tf32 ...] [--batch 1 ...]
NCHW, eval mode, random weights; GPU time of a replay (bench.alternating_ms: the three graphs interleaved,
medians of 50 replays each), torch's model captured the same way beside them. The outputs of the two
converted graphs are checked equal bit for bit."""
import argparse

import torch
import torchvision

import cupyconv.torch as cct
from cupyconv.bench import alternating_ms
from cupyconv.bench_models import captured


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", action="append")
    parser.add_argument("--mode", action="append", choices=("fp32", "tf32"))
    parser.add_argument("--batch", action="append", type=int)
    args = parser.parse_args()
    print("| model | mode | batch | torch ms | weights prepared in the graph ms | prepared before it ms | saved |")
    print("| --- " * 7 + "|")
    for name in args.model or ["resnet50"]:
        for mode in args.mode or ["tf32"]:
            torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
            for batch in args.batch or [1, 8]:
                torch.manual_seed(0)
                theirs = getattr(torchvision.models, name)().cuda().eval()
                x = torch.randn(batch, 3, 224, 224, device="cuda")
                with torch.no_grad():
                    torch_graph = captured(torch, theirs, x)[0]
                    ours = cct.convert(theirs)
                    in_graph, out_in = captured(torch, ours, x)
                    before, out_before = captured(torch, cct.convert(ours, static_weights=True), x)
                    ms = alternating_ms({"torch": torch_graph.replay, "in": in_graph.replay,
                                         "before": before.replay}, repeats=50)
                    torch_ms, in_ms, before_ms = (ms[k][0] for k in ("torch", "in", "before"))
                    in_graph.replay()
                    before.replay()
                    torch.cuda.synchronize()
                    assert torch.equal(out_in, out_before), (name, mode, batch)
                print(f"| {name} | {mode} | {batch} | {torch_ms:.3f} | {in_ms:.3f} | {before_ms:.3f} "
                      f"| {in_ms - before_ms:.3f} ms ({in_ms / before_ms:.2f}x) |", flush=True)


if __name__ == "__main__":
    main()
