"""A torchvision ResNet-18 converted to cupyconv with one call, checked against the original and timed.

    python examples/convert_model.py [--batch 32] [--repeats 30]

convert() switches every plain nn.Conv2d to cupyconv.torch.Conv2d in place, keeping the parameters;
the rest of the network (batch norm, pooling, the classifier) stays torch's. Logits of the converted
model are compared with the original's and with a float64 copy; forward passes are timed with CUDA
events (median after warm-up) in float32 strict (TF32 off on both sides) and float16. The weights are
random (nothing is downloaded). Without a GPU it says so and checks a converted model on the CPU,
where cupyconv.torch uses torch's conv2d.
"""
import argparse
import copy

import torch
from torch import nn

from cupyconv.bench import median_ms
from cupyconv.torch import Conv2d, convert

try:
    import torchvision
except ImportError:  # the example needs it; say so instead of a traceback
    torchvision = None


def relative_error(out, ref) -> float:
    return float((out.double() - ref).norm() / ref.norm())




def converted_copy(original: nn.Module) -> nn.Module:
    model = convert(copy.deepcopy(original))
    convs = sum(isinstance(m, nn.Conv2d) for m in original.modules())
    assert sum(type(m) is Conv2d for m in model.modules()) == convs
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    if torchvision is None:
        print("torchvision is not installed: this example needs it (pip install torchvision).")
        return
    torch.manual_seed(0)
    original = torchvision.models.resnet18(weights=None).eval()

    if not torch.cuda.is_available():
        model = converted_copy(original)
        x = torch.randn(2, 3, 224, 224)
        with torch.no_grad():
            error = relative_error(model(x), original(x).double())
        print(f"No CUDA GPU found: converted resnet18 checked on the CPU (torch's conv2d there), batch 2: "
              f"relative difference of the logits {error:.1e}")
        return

    original = original.cuda()
    x64 = torch.randn(args.batch, 3, 224, 224, device="cuda", dtype=torch.float64)
    with torch.no_grad():
        ref = copy.deepcopy(original).double()(x64)
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = False
    print(f"{torch.cuda.get_device_name()}; resnet18, {sum(isinstance(m, nn.Conv2d) for m in original.modules())} "
          f"convolutions, batch {args.batch}")
    print(f"{'precision':<16}{'cupyconv ms':>12}{'torch ms':>10}{'cupyconv err':>14}{'torch err':>11}"
          f"{'vs torch':>10}")
    try:
        for label, dtype in (("float32 strict", torch.float32), ("float16", torch.float16)):
            torch.backends.cudnn.allow_tf32 = False
            theirs = copy.deepcopy(original).to(dtype)
            ours = converted_copy(theirs)
            x = x64.to(dtype)
            with torch.no_grad():
                y, y_torch = ours(x), theirs(x)
                ours_ms = median_ms(lambda: ours(x), args.repeats)
                theirs_ms = median_ms(lambda: theirs(x), args.repeats)
            print(f"{label:<16}{ours_ms:>12.2f}{theirs_ms:>10.2f}{relative_error(y, ref):>14.1e}"
                  f"{relative_error(y_torch, ref):>11.1e}{relative_error(y, y_torch.double()):>10.1e}")
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = saved


if __name__ == "__main__":
    main()
