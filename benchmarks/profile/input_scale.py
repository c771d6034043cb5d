"""GPU time of the input scale (conv(x * s), s per image and channel) on EfficientNet-B0's projections:
    python benchmarks/profile/input_scale.py
Per layer (batch 32, fp16 channels_last, pointwise_nhwc): the convolution alone, with the residual
add in its epilogue, with the input scale, with both, and torch's x * s then the convolution (what
the scale replaces). Each run 20 times in one captured CUDA graph, median of the replays per call."""
import dataclasses
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from split_k import graph_ms  # noqa: E402
from cupyconv.arguments import make_problem  # noqa: E402
from cupyconv.executor import executable  # noqa: E402

# (C, K, plane): MBConv projections after squeeze-excitation; ResNet-50's residual projections last.
LAYERS = ((32, 16, 112), (96, 24, 56), (144, 24, 56), (144, 40, 28), (240, 40, 28), (240, 80, 14), (480, 80, 14),
          (480, 112, 14), (672, 112, 14), (64, 256, 56), (128, 512, 28))


def main() -> None:
    n = 32
    for c, k, plane in LAYERS:
        base = make_problem((n, plane, plane, c), (k, 1, 1, c), (k,), "float16", layout="NHWC", weight_layout="KHWC")
        x = torch.randn(n, plane, plane, c, device="cuda", dtype=torch.float16)
        w = torch.randn(k, c, device="cuda", dtype=torch.float16) / c ** 0.5
        b = torch.randn(k, device="cuda", dtype=torch.float16)
        s = torch.rand(n, c, device="cuda", dtype=torch.float16)
        out = torch.empty(n, plane, plane, k, device="cuda", dtype=torch.float16)
        residual, scaled = torch.randn_like(out), torch.empty_like(x)
        times, kernel = {}, ""
        for name, residual_on, scale_on in (("conv", False, False), ("+residual", True, False),
                                            ("+scale", False, True), ("+both", True, True)):
            problem = dataclasses.replace(base, has_residual=residual_on, has_input_scale=scale_on)
            exe = executable(problem, False, 0)
            kernel = exe.plan.kernel
            workspace = torch.empty(max(1, exe.workspace_bytes), device="cuda", dtype=torch.uint8)
            launch = lambda stream, exe=exe, r=residual_on, sc=scale_on, source=x: exe.launch(
                source.data_ptr(), w.data_ptr(), 0, b.data_ptr(), out.data_ptr(), workspace.data_ptr(), False, stream,
                residual.data_ptr() if r else 0, 0, s.data_ptr() if sc else 0)
            times[name] = graph_ms(launch)
            if name == "conv":
                def separate(stream, plain=lambda st: exe.launch(scaled.data_ptr(), w.data_ptr(), 0, b.data_ptr(),
                                                                   out.data_ptr(), workspace.data_ptr(), False, st)):
                    torch.mul(x, s[:, None, None, :], out=scaled)
                    plain(stream)
                times["torch x*s, conv"] = graph_ms(separate)
        print(f"{c:4d} -> {k:3d} on {plane:3d}^2 ({kernel}): " +
              "  ".join(f"{name} {ms * 1e3:6.1f} us" for name, ms in times.items()), flush=True)


if __name__ == "__main__":
    main()
