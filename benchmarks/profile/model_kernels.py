"""GPU time per kernel of one torchvision model's forward, torch's and converted (torch.profiler):
    python benchmarks/profile/model_kernels.py resnet50 --batch 1 --dtype fp16 --layout channels_last [--graph]
Ten forwards after warm-up (--graph: ten replays of a CUDA graph of one forward); kernels summed by
name, the largest first, each side's total (--fuse: the converted model fused), and the idle time between kernels summed by the kernel
that waited (the gap before it). --train times a training step instead (bench_models.training_step:
forward, backward, SGD), the converted model with cupyconv's gradient kernels and with torch's, and
--host adds the converted steps' host time by function (cProfile)."""
import argparse
import copy
import cProfile
import pstats
import time

import torch
import torchvision

import cupyconv.torch as cc
from cupyconv.bench_models import backward_kind, training_step

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32, "tf32": torch.float32}
FORWARDS = 10


def wall_ms(run, times: int = 20) -> float:
    """Wall time per call of ``run`` in a back-to-back loop, synchronised at its ends."""
    torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(times):
        run()
    torch.cuda.synchronize()
    return 1e3 * (time.perf_counter() - began) / times


def profiled_kernels(run, times: int) -> list:
    """The GPU kernels (torch.profiler events) of ``times`` calls of ``run``, each followed by a synchronize,
    in the order they started."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(times):
            run()
            torch.cuda.synchronize()
    return sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                  key=lambda e: e.time_range.start)


def kernel_times(model, x, graph: bool, run=None) -> tuple[list, list]:
    """[(kernel name, total µs per forward, launches per forward)] and [(kernel name, µs idle before
    it per forward, count)], largest first; ``run`` (a training step) in place of a forward."""
    with torch.set_grad_enabled(run is not None):
        run = run or (lambda: model(x))
        for _ in range(3):
            run()
        torch.cuda.synchronize()
        if graph:
            captured = torch.cuda.CUDAGraph()
            with torch.cuda.graph(captured):
                model(x)
            run = captured.replay
            run()
            torch.cuda.synchronize()
            began = time.perf_counter()
            host = []
            for _ in range(50):
                start = time.perf_counter()
                run()
                host.append(time.perf_counter() - start)
            torch.cuda.synchronize()
            print(f"graph replay: {1e3 * (time.perf_counter() - began) / 50:.3f} ms per replay back to back, "
                  f"host {1e6 * sorted(host)[25]:.0f} us per replay() call (median)")
        kernels = profiled_kernels(run, FORWARDS)
    totals: dict[str, list] = {}
    gaps: dict[str, list] = {}
    for before, event in zip([None] + kernels[:-1], kernels):
        entry = totals.setdefault(event.name, [0.0, 0])
        entry[0] += event.time_range.elapsed_us() / FORWARDS
        entry[1] += 1 / FORWARDS
        idle = 0 if before is None else event.time_range.start - before.time_range.end
        if 0 < idle < 1000:  # not the host's wait between forwards
            gap = gaps.setdefault(event.name, [0.0, 0])
            gap[0] += idle / FORWARDS
            gap[1] += 1 / FORWARDS
    order = lambda table: sorted(((name, us, round(n)) for name, (us, n) in table.items()), key=lambda t: -t[1])
    return order(totals), order(gaps)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp16")
    parser.add_argument("--layout", choices=("nchw", "channels_last"), default="channels_last")
    parser.add_argument("--rows", type=int, default=15)
    parser.add_argument("--graph", action="store_true", help="replay a CUDA graph of the forward")
    parser.add_argument("--inference-mode", action="store_true", help="under torch.inference_mode (as the models suite)")
    parser.add_argument("--fuse", action="store_true", help="convert(model, fuse=True): BatchNorm folded, epilogues fused")
    parser.add_argument("--train", action="store_true", help="a training step (forward, backward, SGD) per run")
    parser.add_argument("--host", action="store_true", help="with --train: the converted steps' host time by function")
    args = parser.parse_args()
    if args.train:
        return train(args)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = args.dtype == "tf32"
    fmt = torch.channels_last if args.layout == "channels_last" else torch.contiguous_format
    model = getattr(torchvision.models, args.model)().cuda().to(DTYPES[args.dtype]).to(memory_format=fmt).eval()
    x = torch.randn(args.batch, 3, 224, 224, device="cuda", dtype=DTYPES[args.dtype]).to(memory_format=fmt)
    for label, m in (("torch", model), ("cupyconv", cc.convert(copy.deepcopy(model), fuse=args.fuse))):
        with torch.inference_mode(args.inference_mode):
            times, gaps = kernel_times(m, x, args.graph)
        show(f"--- {label}: {sum(t[1] for t in times):.1f} us of kernels per forward, "
             f"{sum(t[2] for t in times)} launches; {sum(t[1] for t in gaps):.1f} us idle between them", times, gaps,
             args.rows)


def show(heading: str, times: list, gaps: list, rows: int) -> None:
    """The heading, the ``rows`` largest kernels and the eight longest waits."""
    print(heading)
    for name, us, n in times[:rows]:
        print(f"{us:9.1f} us  x{n:<4d} {name[:150]}")
    print("  idle before:")
    for name, us, n in gaps[:8]:
        print(f"{us:9.1f} us  x{n:<4d} {name[:150]}")


def train(args) -> None:
    fmt = torch.channels_last if args.layout == "channels_last" else torch.contiguous_format
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = args.dtype == "tf32"
    model = getattr(torchvision.models, args.model)().cuda().to(DTYPES[args.dtype]).to(memory_format=fmt).train()
    x = torch.randn(args.batch, 3, 224, 224, device="cuda", dtype=DTYPES[args.dtype]).to(memory_format=fmt)
    target = torch.randint(0, 1000, (args.batch,), device="cuda")
    for label, kind in (("torch", None), ("cupyconv", "cupyconv"), ("cupyconv, torch backward", "torch")):
        net = copy.deepcopy(model) if kind is None else cc.convert(copy.deepcopy(model))
        optimizer = torch.optim.SGD(net.parameters(), lr=1e-4, momentum=0.9)

        def step(net=net, optimizer=optimizer, kind=kind):
            with backward_kind(kind):
                training_step(net, optimizer, x, target)
        times, gaps = kernel_times(net, x, False, step)
        show(f"--- {label}: {wall_ms(step):.2f} ms per step (wall), {sum(t[1] for t in times) / 1e3:.2f} ms of kernels, "
             f"{sum(t[2] for t in times)} launches; {sum(t[1] for t in gaps) / 1e3:.2f} ms idle between them", times,
             gaps, args.rows)
        if args.host and kind is not None:
            profile = cProfile.Profile()
            profile.runcall(lambda: [step() for _ in range(5)])
            pstats.Stats(profile).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
