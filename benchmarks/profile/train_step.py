"""A training step of a converted torchvision model against torch's, in the same process:
    python benchmarks/profile/train_step.py [--model resnet50] [--batch 32] [--mode fp32 --mode fp16]
forward + backward + SGD step (momentum 0.9), eager, wall time per step (torch.cuda.synchronize
inside the clock), median of 20 steps after 5 of warm-up; fp32 strict (cuDNN's and cupyconv's TF32
off) on NCHW, fp16 on channels_last. cupyconv runs every convolution forward and, through
cupyconv.torch's backward, its input and weight gradients (set_backward("cupyconv")); the same model
with set_backward("torch") is timed too. The losses of the first step are compared."""
import argparse
import copy
import statistics
import time

import torch
import torchvision

import cupyconv.torch as ct

STEPS, WARMUP = 20, 5


def step_ms(model, x, target) -> tuple[float, float]:
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    times, first = [], None
    for i in range(WARMUP + STEPS):
        torch.cuda.synchronize()
        began = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x).float(), target)
        loss.backward()
        optimizer.step()
        torch.cuda.synchronize()
        if first is None:
            first = float(loss)
        if i >= WARMUP:
            times.append(1e3 * (time.perf_counter() - began))
    return statistics.median(times), first


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--mode", action="append", choices=["fp32", "fp16"])
    args = parser.parse_args()
    for mode in args.mode or ["fp32", "fp16"]:
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
        dtype = torch.float16 if mode == "fp16" else torch.float32
        fmt = torch.channels_last if mode == "fp16" else torch.contiguous_format
        torch.manual_seed(0)
        original = getattr(torchvision.models, args.model)(weights=None).to("cuda", dtype).to(memory_format=fmt).train()
        converted = ct.convert(copy.deepcopy(original))
        x = torch.randn(args.batch, 3, 224, 224, device="cuda", dtype=dtype).contiguous(memory_format=fmt)
        target = torch.randint(0, 1000, (args.batch,), device="cuda")
        results = {"torch": step_ms(copy.deepcopy(original), x, target)}
        for kind in ("cupyconv", "torch"):
            previous = ct.set_backward(kind)
            results[f"converted, {kind} backward"] = step_ms(copy.deepcopy(converted), x, target)
            ct.set_backward(previous)
        base = results["torch"][0]
        print(f"{args.model} batch {args.batch} {mode} {'channels_last' if mode == 'fp16' else 'NCHW'}: " + "; ".join(
            f"{name} {ms:.2f} ms/step ({base / ms:.2f}x, first loss {loss:.4f})" for name, (ms, loss) in results.items()),
            flush=True)


if __name__ == "__main__":
    main()
