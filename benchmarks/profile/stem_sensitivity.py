"""How much a torchvision model in fp16 amplifies last-bit changes of its first convolution's output: the model
error against float64 with every conv, BatchNorm and activation output rounded to fp16 (float32 arithmetic
between: torch's fp16 storage), then again with the stem's output moved by one ulp at a random tenth of its
elements, for several seeds. Runs on the CPU (no cupyconv kernel involved); the model is built as
tests/test_fusion_gpu.py builds it (seeded weights, BatchNorm statistics of a trained model's kind).
    python benchmarks/profile/stem_sensitivity.py efficientnet_b0 mobilenet_v2 [--flips 6]
A spread of errors as wide as the gap between two convolution kernels' model errors says that gap is
amplified rounding, not a wrong stem (benchmarks/NOTES.md, "RGB stems in channels_last")."""
import argparse
import copy

import torch
import torchvision

from cupyconv.bench_models import calibrate_batch_norm

ROUNDED = (torch.nn.Conv2d, torch.nn.Linear, torch.nn.BatchNorm2d, torch.nn.SiLU, torch.nn.ReLU, torch.nn.ReLU6)


def model(name: str) -> torch.nn.Module:
    torch.manual_seed(13)
    m = getattr(torchvision.models, name)(weights=None).eval()
    calibrate_batch_norm(m, torch.randn(4, 3, 224, 224, generator=torch.Generator().manual_seed(0)))
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.running_mean.copy_(0.2 * mod.running_var.sqrt() * torch.randn_like(mod.running_mean))
                mod.weight.mul_(0.5 + torch.rand_like(mod.weight))
                mod.bias.copy_(0.1 * torch.randn_like(mod.bias))
    return m


def one_ulp_off(out: torch.Tensor, seed: int) -> torch.Tensor:
    """``out`` rounded to fp16, a random tenth of its finite nonzero elements one ulp up or down in magnitude."""
    half = out.to(torch.float16)
    g = torch.Generator().manual_seed(seed)
    pick = (torch.rand(half.shape, generator=g) < 0.1) & torch.isfinite(half) & (half != 0)
    step = torch.where(torch.rand(half.shape, generator=g) < 0.5, 1, -1).to(torch.int16)
    moved = (half.view(torch.int16) + step).view(torch.float16)
    return torch.where(pick & torch.isfinite(moved), moved, half).float()


def error(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return float((ours.double() - ref).norm() / ref.norm())


def main(names: list[str], flips: int) -> None:
    for name in names:
        exact = model(name).double()
        emulated = copy.deepcopy(exact).float()
        x = torch.randn(2, 3, 224, 224).to(torch.float16)
        with torch.no_grad():
            ref = exact(x.double())
        stem = next(m for m in emulated.modules() if isinstance(m, torch.nn.Conv2d))

        def run(seed):
            hooks = [mod.register_forward_hook(
                (lambda mod, inp, out: one_ulp_off(out, seed)) if mod is stem and seed is not None else
                (lambda mod, inp, out: out.to(torch.float16).float())) for mod in emulated.modules()
                if isinstance(mod, ROUNDED)]
            with torch.no_grad():
                out = emulated(x.float())
            for hook in hooks:
                hook.remove()
            return error(out, ref)

        spread = [run(seed) for seed in range(flips)]
        print(f"{name}: fp16-rounded {run(None):.5f}; the stem one ulp off at a tenth of its outputs: "
              f"{min(spread):.5f} .. {max(spread):.5f} ({', '.join(f'{e:.5f}' for e in spread)})", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("names", nargs="+")
    parser.add_argument("--flips", type=int, default=6)
    args = parser.parse_args()
    main(args.names, args.flips)
