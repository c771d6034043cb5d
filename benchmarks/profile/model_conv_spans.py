"""Each convolution's GPU time inside a model's CUDA graph, torch's and converted, side by side:
    python benchmarks/profile/model_conv_spans.py mobilenet_v2:8 resnet50:32 [--dtype fp16] [--layout channels_last]
The per-layer rows of the models suite time each layer alone through cupyconv.torch.conv2d, which
prepares the weight on every call (no module keeps it) and runs on an input alone in the caches. Here
both forwards are replayed as CUDA graphs (under inference_mode, as the models suite) and profiled
(torch.profiler). Every kernel the two forwards share by name (BatchNorm, activations, pooling) anchors
the alignment (difflib); what lies between two anchors on either side is one convolution's work. Its
"span" runs from the previous anchor's end to the next one's start: the convolution's kernels, the idle
time around them, and nothing else; the profiler stretches that idle time unevenly (a replay's span
exceeds the models suite's time by up to 0.1 ms), so read the kernel times. Each row's label comes from
forward hooks on torch's Conv2d modules, in call order ("?" where the stretches are fewer than the
convolutions: two convolutions with no shared kernel between them, or a shared name inside one)."""
import argparse
import copy
import difflib
import statistics

import torch
import torchvision

import cupyconv.torch as cc
from model_kernels import profiled_kernels  # benchmarks/profile, the script's own directory

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32, "tf32": torch.float32}
REPLAYS = 20
#: Idle time that separates two replays (each is followed by a synchronize); a replay's own gaps are shorter.
REPLAY_GAP_US = 30


def conv_labels(model, x) -> list[str]:
    """Labels of the Conv2d calls of one forward, in call order."""
    labels = []

    def hook(m, inputs, out):
        h, w = inputs[0].shape[-2:]
        labels.append(f"{m.in_channels}->{m.out_channels} {h}x{w} k{m.kernel_size[0]}x{m.kernel_size[1]} "
                      f"s{m.stride[0]}" + (f" g{m.groups}" if m.groups > 1 else ""))
    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    model(x)
    for handle in handles:
        handle.remove()
    return labels


def replay_kernels(model, x) -> list[tuple[str, float, float]]:
    """[(name, median start offset us, median duration us)] of one graph replay's kernels, in order, with
    each kernel's start taken relative to the replay's first kernel."""
    for _ in range(3):
        model(x)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        model(x)
    for _ in range(5):
        graph.replay()
    events = profiled_kernels(graph.replay, REPLAYS)
    replays = [[events[0]]]
    for before, event in zip(events, events[1:]):  # replays apart by the host's synchronize
        if event.time_range.start - before.time_range.end > REPLAY_GAP_US:
            replays.append([])
        replays[-1].append(event)
    sequences = [tuple(e.name for e in r) for r in replays]
    names = max(set(sequences), key=sequences.count)  # a replay the profiler recorded in part is left out
    replays = [r for r, seq in zip(replays, sequences) if seq == names]
    return [(names[k], statistics.median(r[k].time_range.start - r[0].time_range.start for r in replays),
             statistics.median(r[k].time_range.elapsed_us() for r in replays)) for k in range(len(names))]


def spans(kernels: list, lo: int, hi: int) -> tuple[float, float, list[str]]:
    """(kernel us, span us, [name: us]) of kernels[lo:hi], the span from kernel lo-1's end to kernel hi's start."""
    start = kernels[lo - 1][1] + kernels[lo - 1][2] if lo > 0 else kernels[0][1]
    end = kernels[hi][1] if hi < len(kernels) else kernels[-1][1] + kernels[-1][2]
    return (sum(k[2] for k in kernels[lo:hi]), end - start,
            [f"{short(k[0])}: {k[2]:.1f}" for k in kernels[lo:hi]])


def short(name: str) -> str:
    return name.split("(")[0].replace("void ", "").replace("cupyconv::", "")[:70]


def compare(name: str, batch: int, dtype: str, layout: str) -> None:
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    model = getattr(torchvision.models, name)().cuda().to(DTYPES[dtype]).to(memory_format=fmt).eval()
    x = torch.randn(batch, 3, 224, 224, device="cuda", dtype=DTYPES[dtype]).to(memory_format=fmt)
    with torch.inference_mode():
        labels = conv_labels(model, x)
        ours = cc.convert(copy.deepcopy(model))
        theirs_k, ours_k = replay_kernels(model, x), replay_kernels(ours, x)
    ops = difflib.SequenceMatcher(None, [k[0] for k in theirs_k], [k[0] for k in ours_k], autojunk=False).get_opcodes()
    groups = [(i1, i2, j1, j2) for tag, i1, i2, j1, j2 in ops if tag != "equal"]
    shared = [(i1, i2, j1, j2) for tag, i1, i2, j1, j2 in ops if tag == "equal"]
    whole = lambda ks: ks[-1][1] + ks[-1][2] - ks[0][1]
    print(f"## {name} batch {batch} {dtype} {layout}: replay's kernels span torch {whole(theirs_k):.1f} us, "
          f"cupyconv {whole(ours_k):.1f} us; {len(labels)} convolutions, {len(groups)} unshared stretches")
    shared_t = sum(theirs_k[i][2] for i1, i2, _, _ in shared for i in range(i1, i2))
    shared_o = sum(ours_k[j][2] for _, _, j1, j2 in shared for j in range(j1, j2))
    print(f"shared kernels: torch {shared_t:.1f} us, in the converted model {shared_o:.1f} us")
    rows = []
    for n, (i1, i2, j1, j2) in enumerate(groups):
        tk, ts, tn = spans(theirs_k, i1, i2)
        ok, os_, on = spans(ours_k, j1, j2)
        label = labels[n] if len(groups) == len(labels) else "?"
        rows.append((label, tk, ts, ok, os_, tn, on))
    print("| conv | torch kernels us | torch span us | cupyconv kernels us | cupyconv span us | span diff us | "
          "cupyconv kernels |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for label, tk, ts, ok, os_, tn, on in rows:
        print(f"| {label} | {tk:.1f} | {ts:.1f} | {ok:.1f} | {os_:.1f} | {os_ - ts:+.1f} | "
              f"{'; '.join(on)} |")
    print(f"| sum | {sum(r[1] for r in rows):.1f} | {sum(r[2] for r in rows):.1f} | {sum(r[3] for r in rows):.1f} | "
          f"{sum(r[4] for r in rows):.1f} | {sum(r[4] - r[2] for r in rows):+.1f} | |")
    worst = sorted(rows, key=lambda r: r[2] - r[4])[:12]
    print("largest losses: " + "; ".join(f"{r[0]} {r[4] - r[2]:+.1f}" for r in worst))
    print()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("models", nargs="+", metavar="MODEL:BATCH")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp16")
    parser.add_argument("--layout", choices=("nchw", "channels_last"), default="channels_last")
    args = parser.parse_args()
    print(f"GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    for spec in args.models:
        name, batch = spec.split(":")
        compare(name, int(batch), args.dtype, args.layout)


if __name__ == "__main__":
    main()
