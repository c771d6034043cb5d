"""GPU time per kernel of one torchvision model's forward, torch's and converted (torch.profiler):
    python benchmarks/profile/model_kernels.py resnet50 --batch 1 --dtype fp16 --layout channels_last
Ten forwards after warm-up; kernels summed by name, the largest first, and each side's total."""
import argparse
import copy

import torch
import torchvision

import cupyconv.torch as cc

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32, "tf32": torch.float32}
FORWARDS = 10


def kernel_times(model, x) -> list[tuple[str, float, int]]:
    """(kernel name, total µs per forward, launches per forward), largest first."""
    with torch.no_grad():
        for _ in range(3):
            model(x)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(FORWARDS):
                model(x)
            torch.cuda.synchronize()
    totals: dict[str, list] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            entry = totals.setdefault(event.name, [0.0, 0])
            entry[0] += event.device_time_total / FORWARDS
            entry[1] += 1 / FORWARDS
    return sorted(((name, us, round(n)) for name, (us, n) in totals.items()), key=lambda t: -t[1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp16")
    parser.add_argument("--layout", choices=("nchw", "channels_last"), default="channels_last")
    parser.add_argument("--rows", type=int, default=15)
    args = parser.parse_args()
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = args.dtype == "tf32"
    fmt = torch.channels_last if args.layout == "channels_last" else torch.contiguous_format
    model = getattr(torchvision.models, args.model)().cuda().to(DTYPES[args.dtype]).to(memory_format=fmt).eval()
    x = torch.randn(args.batch, 3, 224, 224, device="cuda", dtype=DTYPES[args.dtype]).to(memory_format=fmt)
    for label, m in (("torch", model), ("cupyconv", cc.convert(copy.deepcopy(model)))):
        times = kernel_times(m, x)
        print(f"--- {label}: {sum(t[1] for t in times):.1f} us of kernels per forward, "
              f"{sum(t[2] for t in times)} launches")
        for name, us, n in times[:args.rows]:
            print(f"{us:9.1f} us  x{n:<4d} {name[:150]}")


if __name__ == "__main__":
    main()
