"""GPU time of the rules' plan on each of ResNet-50's convolutions (the stem aside), fp16 (or --dtype bf16)
channels_last, as a converted model in graph mode runs them (graph_timing.graph_ms: 20 calls a CUDA graph), torch's
F.conv2d timed the same way, and each output checked against torch's. For A/B, run it once per tree,
each from outside the trees (the script's directory first on sys.path, then PYTHONPATH):
    PYTHONPATH=TREE:benchmarks/profile python benchmarks/profile/r50_layers_graph.py LABEL [BATCH ...]
(default batches 1 and 8). With --candidates TOP, every plan the tuner would try is timed so too, and the
TOP fastest are listed under the rules' plan (--match TEXT: only those whose label holds TEXT); --im2col keeps
the layers with taps or strides alone, --only C,K,H,KH,S (repeatable) the layers named instead of ResNet-50's
(any layer: MobileNetV2's 960 -> 320 on 7^2 is 960,320,7,1,1)."""
import argparse
import dataclasses

import torch

from cupyconv.arguments import make_problem
from cupyconv.executor import executable_for_plan
from cupyconv.program import FLAG_COUNT
from cupyconv.tuning import candidates, label
from graph_timing import graph_ms

#: (input channels, output channels, input plane, kernel, stride) of ResNet-50's convolutions after the stem.
LAYERS = [(64, 64, 56, 1, 1), (64, 64, 56, 3, 1), (64, 256, 56, 1, 1), (256, 64, 56, 1, 1), (256, 128, 56, 1, 1),
          (128, 128, 56, 3, 2), (128, 512, 28, 1, 1), (256, 512, 56, 1, 2), (512, 128, 28, 1, 1), (128, 128, 28, 3, 1),
          (512, 256, 28, 1, 1), (256, 256, 28, 3, 2), (256, 1024, 14, 1, 1), (512, 1024, 28, 1, 2),
          (1024, 256, 14, 1, 1), (256, 256, 14, 3, 1), (1024, 512, 14, 1, 1), (512, 512, 14, 3, 2),
          (512, 2048, 7, 1, 1), (1024, 2048, 14, 1, 2), (2048, 512, 7, 1, 1), (512, 512, 7, 3, 1)]


def time_plan(plan, problem, x, w, reference) -> float:
    """Graph-timed ms per call of ``plan`` on ``x`` and ``w`` (torch tensors), its output checked against
    ``reference``."""
    out = torch.empty(problem.out_array_shape, device="cuda", dtype=x.dtype)
    exe = executable_for_plan(plan, problem, 0)
    workspace = torch.empty(max(1, exe.workspace_bytes_for(False)), device="cuda", dtype=torch.uint8)
    flags = torch.zeros(FLAG_COUNT, device="cuda", dtype=torch.int32)  # zero, as launches leave them
    # Prepared once, as the torch adapter keeps a Parameter's (Winograd, phases, NCHW tiles).
    prepared = torch.empty(max(1, exe.weight.nbytes if exe.weight else 0), device="cuda", dtype=torch.uint8)
    if exe.weight:
        exe.prepare_weight(w.data_ptr(), prepared.data_ptr(), torch.cuda.current_stream().cuda_stream)
    ms = graph_ms(lambda stream: exe.launch(x.data_ptr(), w.data_ptr(), prepared.data_ptr(), 0, out.data_ptr(),
                                            workspace.data_ptr(), False, stream,
                                            flags=flags.data_ptr() if exe.uses_flags else 0))
    error = float((out.permute(0, 3, 1, 2).float() - reference.float()).norm() / reference.float().norm())
    assert error < 1e-2, (label(plan), problem.x_shape, problem.w_shape, error)
    return ms


def main(tag: str, batches: list[int], top: int, im2col: bool, only: list[tuple[int, ...]], match: list[str],
         dtype: str = "float16") -> None:
    torch_dtype = getattr(torch, dtype)
    for n in batches:
        for c, k, h, kh, s in only or LAYERS:
            if im2col and (kh, s) == (1, 1):
                continue
            problem = make_problem((n, h, h, c), (k, kh, kh, c), None, dtype, stride=s, padding=kh // 2,
                                   layout="NHWC", weight_layout="KHWC")
            plans = [plan for _, plan in candidates(problem, compute_capability=90)][:None if top else 1]
            plans = plans[:1] + [plan for plan in plans[1:] if not match or any(m in label(plan) for m in match)]
            x = torch.randn(n, c, h, h, device="cuda", dtype=torch_dtype).to(memory_format=torch.channels_last)
            w = torch.randn(k, c, kh, kh, device="cuda", dtype=torch_dtype).to(memory_format=torch.channels_last)
            reference = torch.nn.functional.conv2d(x, w, None, s, kh // 2)
            times = {}
            for plan in plans:
                plan = dataclasses.replace(plan, layout="NHWC", weight_layout="KHWC")
                times.setdefault(label(plan), time_plan(plan, problem, x, w, reference))
            theirs = graph_ms(lambda _: torch.nn.functional.conv2d(x, w, None, s, kh // 2))
            rule = next(iter(times))
            print(f"{tag} N{n} {c}->{k} {h}^2 k{kh} s{s}: {times[rule] * 1e3:6.1f} us  torch {theirs * 1e3:6.1f} us  "
                  f"{theirs / times[rule]:4.2f}x  {rule}", flush=True)
            ranked = sorted(times.items(), key=lambda kv: kv[1])
            for place, (name, ms) in enumerate(ranked):
                if place < top or (top and "pingpong" in name):  # the ping-pong tile's place, wherever it is
                    print(f"    {ms * 1e3:6.1f} us  {theirs / ms:4.2f}x  {name}  (#{place + 1} of {len(ranked)})",
                          flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("tag")
    parser.add_argument("batches", nargs="*", type=int, default=[1, 8])
    parser.add_argument("--candidates", type=int, default=0, metavar="TOP",
                        help="time every plan the tuner would try, and show the TOP fastest")
    parser.add_argument("--im2col", action="store_true",
                        help="only the layers with taps or strides (x read through an im2col copy or map)")
    parser.add_argument("--only", action="append", default=[], metavar="C,K,H,KH,S",
                        type=lambda text: tuple(int(v) for v in text.split(",")),
                        help="time this layer instead of ResNet-50's (repeatable), e.g. 512,512,7,3,1")
    parser.add_argument("--match", action="append", default=[], metavar="TEXT",
                        help="with --candidates, time only the rules' plan and the candidates whose label holds TEXT "
                             "(repeatable), e.g. pingpong_m64n128")
    parser.add_argument("--dtype", choices=("fp16", "bf16"), default="fp16")
    args = parser.parse_args()
    main(args.tag, args.batches, args.candidates, args.im2col, args.only, args.match,
         {"fp16": "float16", "bf16": "bfloat16"}[args.dtype])
