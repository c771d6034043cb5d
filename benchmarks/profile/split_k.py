"""GPU time of the tensor-core GEMM's split-K against its runs (--splits), on small-batch layers:
    python benchmarks/profile/split_k.py [--batch 1 --batch 8] [--mode fp16 --mode tf32] [--config TILE]
Each layer of bench.LAYERS (ResNet-50 and MobileNetV2's GEMM layers) at the given batches, fp16 on
NHWC arrays and TF32 on NCHW ones, run 20 times in one captured CUDA graph (as a converted model in
graph mode runs it: no host between launches); the median over 30 replays per call. The planner's
choice is marked with *, and torch's F.conv2d is timed the same way in the same layout. --config times
that tile at every split count, beside the planner's plan (rows it cannot run are left out).
--row names the layers to time and --shape (candidates.py's NAME=n,c,k,h,w,kh,kw[,..]) other ones, n replaced by
each --batch (default: every ungrouped layer of bench.LAYERS)."""
import argparse
import dataclasses

import torch

from cupyconv.bench import LAYERS, MODE_DTYPE
from cupyconv.executor import executable_for_plan
from cupyconv.families import implicit_gemm_nhwc
from cupyconv.program import FLAG_COUNT
from candidates import parse_shape
from graph_timing import graph_ms

LAYOUT = {"fp16": "channels_last", "bf16": "channels_last", "tf32": "nchw"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", action="append", type=int)
    parser.add_argument("--mode", action="append", choices=sorted(LAYOUT))
    parser.add_argument("--splits", default="1,2,3,4,6,8,12,16")
    parser.add_argument("--config", help="a channels-last tile to time instead of the planner's")
    parser.add_argument("--row", action="append", default=[], help="layers to time")
    parser.add_argument("--shape", action="append", type=parse_shape, default=[], help="other layers to time")
    args = parser.parse_args()
    candidates = [int(s) for s in args.splits.split(",")]
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    for mode in args.mode or ["fp16", "tf32"]:
        for batch in args.batch or [1, 8]:
            rows = [s for s in LAYERS if s.name in args.row] if args.row else [] if args.shape else list(LAYERS)
            for shape in args.shape + rows:
                if shape.groups != 1:
                    continue
                shape = dataclasses.replace(shape, n=batch)
                problem = shape.problem(MODE_DTYPE[mode], LAYOUT[mode])
                auto = implicit_gemm_nhwc.make_plan(problem, compute_capability=90)
                tdtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "tf32": torch.float32}[mode]
                fmt = torch.channels_last if LAYOUT[mode] == "channels_last" else torch.contiguous_format
                x = torch.randn(shape.n, shape.c, shape.h, shape.w, device="cuda", dtype=tdtype).to(memory_format=fmt)
                w = torch.randn(shape.k, shape.c, shape.kh, shape.kw, device="cuda", dtype=tdtype).to(memory_format=fmt)
                out = torch.empty(problem.out_array_shape, device="cuda", dtype=tdtype)
                torch_ms = graph_ms(lambda _: torch.nn.functional.conv2d(x, w, None, shape.stride, shape.padding))
                timings = [f"torch {torch_ms:.4f}"]
                for splits in ([None] if args.config else []) + candidates:
                    try:
                        plan = auto if splits is None else implicit_gemm_nhwc.make_plan(
                            problem, args.config, compute_capability=90, splits=splits)
                    except ValueError:
                        continue
                    plan = dataclasses.replace(plan, layout=problem.layout, weight_layout=problem.weight_layout)
                    exe = executable_for_plan(plan, problem, 0)
                    # The weight's form prepared once and a workspace allocated before capture, as in a model.
                    prepared = torch.empty(exe.weight.nbytes if exe.weight else 1, device="cuda", dtype=torch.uint8)
                    workspace = torch.empty(max(1, exe.workspace_bytes_for(False)), device="cuda", dtype=torch.uint8)
                    if exe.weight:
                        exe.prepare_weight(w.data_ptr(), prepared.data_ptr(), torch.cuda.current_stream().cuda_stream)
                    # Stream-K's flags (the planner's plan may take it), zero as its launches leave them.
                    flags = torch.zeros(FLAG_COUNT if exe.uses_flags else 1, device="cuda", dtype=torch.int32)
                    ms = graph_ms(lambda stream: exe.launch(x.data_ptr(), w.data_ptr(), prepared.data_ptr(), 0,
                                                            out.data_ptr(), workspace.data_ptr(), False, stream,
                                                            flags=flags.data_ptr() if exe.uses_flags else 0))
                    timings.append(f"planner {ms:.4f}" if splits is None else
                                   f"{splits}{'*' if splits == auto.splits and not args.config else ''} {ms:.4f}")
                print(f"{mode} N{batch:<3d} {shape.name:22s} {auto.config.name:22s} grid {auto.grid} | "
                      + "  ".join(timings), flush=True)


if __name__ == "__main__":
    main()
