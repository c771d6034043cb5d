"""GPU time of the fused epilogue against the same work as separate passes, on a few layers:
    python benchmarks/profile/epilogue.py [--all] [--mode fp16-channels_last ...]
Per layer (fp16 NHWC and strict fp32 NCHW, or the modes named): the convolution alone; with relu
fused; conv + bias + residual + relu fused (cupyconv.conv2d(..., activation="relu", residual=r));
the convolution then torch's in-place add and relu (two more passes over the output). Each run 20
times in one captured CUDA graph (no host between launches), median of 30 replays per call. --all:
every layers-suite row (run it once per tree to A/B an epilogue change)."""
import argparse
import dataclasses
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from split_k import graph_ms  # noqa: E402
from cupyconv.bench import LAYERS  # noqa: E402
from cupyconv.executor import executable  # noqa: E402

ROWS = ("r50_l1_1x1_256", "r50_l3_3x3_256", "r50_l3_1x1_256to1024", "mbv2_pw_1x1_96to576")


MODES = {"fp16-channels_last": ("fp16", torch.float16, "channels_last"),
         "tf32-channels_last": ("tf32", torch.float32, "channels_last"),
         "fp32-nchw": ("fp32", torch.float32, "nchw")}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--all", action="store_true", help="every layers-suite row")
    parser.add_argument("--mode", action="append", choices=sorted(MODES))
    args = parser.parse_args()
    for mode, dtype, layout in (MODES[m] for m in args.mode or ("fp16-channels_last", "fp32-nchw")):
        for shape in LAYERS:
            if not args.all and shape.name not in ROWS:
                continue
            shape = dataclasses.replace(shape, bias=True)
            base = shape.problem("float16" if mode == "fp16" else "float32", layout)
            fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
            x = torch.randn(shape.n, shape.c, shape.h, shape.w, device="cuda", dtype=dtype).to(memory_format=fmt)
            w = torch.randn(shape.k, shape.c, shape.kh, shape.kw, device="cuda", dtype=dtype).to(memory_format=fmt)
            b = torch.randn(shape.k, device="cuda", dtype=dtype)
            out = torch.empty(base.out_shape, device="cuda", dtype=dtype).to(memory_format=fmt)
            residual = torch.randn_like(out)
            times = {}
            for name, problem in (("conv", base), ("relu", dataclasses.replace(base, activation="relu")),
                                  ("fused", dataclasses.replace(base, activation="relu", has_residual=True))):
                exe = executable(problem, mode == "tf32", 0)
                prepared = torch.empty(max(1, exe.weight.nbytes if exe.weight else 1), device="cuda", dtype=torch.uint8)
                workspace = torch.empty(max(1, exe.workspace_bytes), device="cuda", dtype=torch.uint8)
                if exe.weight:
                    exe.prepare_weight(w.data_ptr(), prepared.data_ptr(), torch.cuda.current_stream().cuda_stream)
                launch = lambda stream, exe=exe, fused=name == "fused": exe.launch(
                    x.data_ptr(), w.data_ptr(), prepared.data_ptr(), b.data_ptr(), out.data_ptr(), workspace.data_ptr(),
                    False, stream, residual.data_ptr() if fused else 0)
                kernel = exe.plan.config.name if exe.plan.config else exe.plan.kernel
                times[name] = graph_ms(launch)
                if name == "conv":
                    def separate(stream, launch=launch):
                        launch(stream)
                        torch.relu_(out.add_(residual))
                    times["separate"] = graph_ms(separate)
            print(f"{mode} {layout:13s} {shape.name:22s} conv {times['conv']:.4f} ms  relu {times['relu']:.4f}  "
                  f"fused (+ residual, relu) {times['fused']:.4f}  separate {times['separate']:.4f}  "
                  f"({times['separate'] / times['fused']:.2f}x)  {kernel}", flush=True)


if __name__ == "__main__":
    main()
