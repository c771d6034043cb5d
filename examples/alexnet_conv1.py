"""AlexNet's first layer (batch 256, 3->96, 224x224, kernel 11, stride 4, padding 2, bias) as a model
built with cupyconv.torch.Conv2d: checked against nn.Conv2d and float64, then timed against it.

    python examples/alexnet_conv1.py [--batch 256] [--repeats 50]

Times are medians of CUDA-event intervals after warm-up, each dtype compared with torch in the same
precision: float32 strict (TF32 off on both sides), float32 TF32 (torch's default), float16, bfloat16.
Without a GPU it says so and checks a small batch on the CPU, where cupyconv.torch uses torch's conv2d.
"""
import argparse
import copy

import torch
from torch import nn

from cupyconv.bench import median_ms
from cupyconv.torch import Conv2d

LAYER = dict(in_channels=3, out_channels=96, kernel_size=11, stride=4, padding=2, bias=True)
# (label, dtype, TF32 allowed)
PRECISIONS = [("float32 strict", torch.float32, False), ("float32 TF32", torch.float32, True),
              ("float16", torch.float16, False), ("bfloat16", torch.bfloat16, False)]


def relative_error(out, ref) -> float:
    return float((out.double() - ref).norm() / ref.norm())




def cpu_check() -> None:
    torch.manual_seed(0)
    ours = nn.Sequential(Conv2d(**LAYER))
    theirs = nn.Sequential(nn.Conv2d(**LAYER))
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        error = relative_error(ours(x), theirs(x).double())
    print(f"No CUDA GPU found: checked {ours[0]} on the CPU (torch's conv2d there), batch 2: "
          f"relative difference from nn.Conv2d {error:.1e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        cpu_check()
        return

    torch.manual_seed(0)
    model = nn.Sequential(Conv2d(**LAYER, device="cuda"), nn.ReLU())  # a model built with cupyconv
    reference = nn.Sequential(nn.Conv2d(**LAYER, device="cuda"), nn.ReLU())
    reference.load_state_dict(model.state_dict())
    x64 = torch.randn(args.batch, 3, 224, 224, device="cuda", dtype=torch.float64)
    with torch.no_grad():
        ref = copy.deepcopy(reference).double()(x64)
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = False

    print(f"{torch.cuda.get_device_name()}; {model[0]}, input {tuple(x64.shape)}")
    print(f"{'precision':<16}{'cupyconv ms':>12}{'torch ms':>10}{'speed-up':>10}{'cupyconv err':>14}{'torch err':>11}")
    try:
        for label, dtype, tf32 in PRECISIONS:
            torch.backends.cudnn.allow_tf32 = tf32  # both cupyconv.torch and nn.Conv2d follow it
            ours, theirs = copy.deepcopy(model).to(dtype), copy.deepcopy(reference).to(dtype)
            x = x64.to(dtype)
            with torch.no_grad():
                error, torch_error = relative_error(ours(x), ref), relative_error(theirs(x), ref)
                ours_ms = median_ms(lambda: ours(x), args.repeats)
                theirs_ms = median_ms(lambda: theirs(x), args.repeats)
            print(f"{label:<16}{ours_ms:>12.3f}{theirs_ms:>10.3f}{theirs_ms / ours_ms:>9.2f}x"
                  f"{error:>14.1e}{torch_error:>11.1e}")
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = saved


if __name__ == "__main__":
    main()
