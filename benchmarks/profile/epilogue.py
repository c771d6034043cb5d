"""GPU time of the fused epilogue against the same work as separate passes, on a few layers:
    python benchmarks/profile/epilogue.py
Per layer (fp16 NHWC and strict fp32 NCHW): the convolution alone; conv + bias + residual + relu
fused (cupyconv.conv2d(..., activation="relu", residual=r)); the convolution then torch's in-place
add and relu (two more passes over the output). Each run 20 times in one captured CUDA graph (no
host between launches), median of 30 replays per call."""
import dataclasses
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from split_k import graph_ms  # noqa: E402
from cupyconv.bench import LAYERS  # noqa: E402
from cupyconv.executor import executable  # noqa: E402

ROWS = ("r50_l1_1x1_256", "r50_l3_3x3_256", "r50_l3_1x1_256to1024", "mbv2_pw_1x1_96to576")


def main() -> None:
    for mode, dtype, layout in (("fp16", torch.float16, "channels_last"), ("fp32", torch.float32, "nchw")):
        for shape in LAYERS:
            if shape.name not in ROWS:
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
            for name, problem in (("conv", base),
                                  ("fused", dataclasses.replace(base, activation="relu", has_residual=True))):
                exe = executable(problem, False, 0)
                prepared = torch.empty(max(1, exe.weight.nbytes if exe.weight else 1), device="cuda", dtype=torch.uint8)
                workspace = torch.empty(max(1, exe.workspace_bytes), device="cuda", dtype=torch.uint8)
                if exe.weight:
                    exe.prepare_weight(w.data_ptr(), prepared.data_ptr(), torch.cuda.current_stream().cuda_stream)
                launch = lambda stream, exe=exe, fused=name == "fused": exe.launch(
                    x.data_ptr(), w.data_ptr(), prepared.data_ptr(), b.data_ptr(), out.data_ptr(), workspace.data_ptr(),
                    False, stream, residual.data_ptr() if fused else 0)
                times[name] = graph_ms(launch)
                if name == "conv":
                    def separate(stream, launch=launch):
                        launch(stream)
                        torch.relu_(out.add_(residual))
                    times["separate"] = graph_ms(separate)
            print(f"{mode} {layout:13s} {shape.name:22s} conv {times['conv']:.4f} ms  fused (+ residual, relu) "
                  f"{times['fused']:.4f}  separate {times['separate']:.4f}  ({times['separate'] / times['fused']:.2f}x)",
                  flush=True)


if __name__ == "__main__":
    main()
