"""GPU time of the FMA GEMM's tiles and split-K runs on a model's strict-fp32 layers, each plan in its
own CUDA graph (graph_timing.py: no interleaving, 20 calls of one plan a graph, 30 replays):
    PYTHONPATH=$PWD python3 benchmarks/profile/simt_plans.py --model mobilenet_v2 --batch 8 [--splits 1,2,3,4]
        [--rule-only]
        [--sweep simt_m32n64t4]
Every distinct conv of the torchvision model (random weights, NCHW, fp32 strict) whose fixed-rules plan
is simt_gemm_conv2d: the rules' plan (marked *), its tile at each split count, and each other tile at
the rules' splits for it, beside torch's F.conv2d timed the same way. The planner's own operands: the
weight prepared once ahead of the graph, the bias where the module has one. Each plan is checked
against F.conv2d first (strict fp32 tolerance). --rule-only times the rules' plan alone (to compare two
trees' rules: run it once with each on PYTHONPATH)."""
import argparse

import torch
import torchvision

from cupyconv.arguments import make_problem
from cupyconv.bench_models import group_convs, record_convs
from cupyconv.executor import executable_for_plan
from cupyconv.families import simt_gemm_conv2d
from cupyconv.planner import make_plan
from graph_timing import graph_ms


def other_splits(problem, name, splits_done, split_counts):
    """(label, plan): tile ``name`` at each of ``split_counts`` but ``splits_done`` that it can run."""
    for splits in split_counts:
        if splits != splits_done:
            try:
                yield f"{name}/{splits}", simt_gemm_conv2d.make_plan(problem, name, splits=splits)
            except ValueError:
                pass


def plans(problem, rule, split_counts, rule_only, sweep=()):
    """(label, plan): the rules' plan ``rule``, its tile at each split count, every other tile at its own splits
    (and, for the tiles named in ``sweep``, at each split count too)."""
    yield f"*{rule.config.name}/{rule.splits}", rule
    if rule_only:
        return
    yield from other_splits(problem, rule.config.name, rule.splits, split_counts)
    for cfg in simt_gemm_conv2d.SIMT_CONFIGS:
        if cfg.name != rule.config.name:
            plan = simt_gemm_conv2d.make_plan(problem, cfg.name)
            yield f"{cfg.name}/{plan.splits}", plan
            if cfg.name in sweep:
                yield from other_splits(problem, cfg.name, plan.splits, split_counts)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", action="append", required=True)
    parser.add_argument("--batch", action="append", type=int, required=True)
    parser.add_argument("--splits", default="1,2,3,4,6")
    parser.add_argument("--rule-only", action="store_true")
    parser.add_argument("--sweep", action="append", default=[], help="a tile to time at every split count too")
    args = parser.parse_args()
    split_counts = [int(s) for s in args.splits.split(",")]
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    for name in args.model:
        model = getattr(torchvision.models, name)().cuda().eval()
        for batch in args.batch:
            x = torch.randn(batch, 3, 224, 224, device="cuda")
            with torch.inference_mode():
                groups = group_convs(record_convs(model, x))
            for call, names in groups:
                m, xin = call.module, call.x
                bias = None if m.bias is None else m.bias.detach()
                w = m.weight.detach()
                problem = make_problem(tuple(xin.shape), tuple(w.shape), None if bias is None else tuple(bias.shape),
                                       "float32", m.stride, m.padding, m.dilation, m.groups)
                rule = make_plan(problem)
                if rule.kernel != simt_gemm_conv2d.KERNEL:
                    continue
                ref = torch.nn.functional.conv2d(xin, w, bias, m.stride, m.padding, m.dilation, m.groups)
                out = torch.empty_like(ref)
                timings = [f"torch {1e3 * graph_ms(lambda _: torch.nn.functional.conv2d(xin, w, bias, m.stride, m.padding, m.dilation, m.groups)):.1f}"]
                for label, plan in plans(problem, rule, split_counts, args.rule_only, args.sweep):
                    exe = executable_for_plan(plan, problem, 0)
                    prepared = torch.empty(max(1, exe.weight.nbytes if exe.weight else 1), device="cuda", dtype=torch.uint8)
                    workspace = torch.empty(max(1, exe.workspace_bytes_for(False)), device="cuda", dtype=torch.uint8)
                    stream = torch.cuda.current_stream().cuda_stream
                    if exe.weight:
                        exe.prepare_weight(w.data_ptr(), prepared.data_ptr(), stream)

                    def enqueue(s, exe=exe, prepared=prepared, workspace=workspace):
                        exe.launch(xin.data_ptr(), w.data_ptr(), prepared.data_ptr(),
                                   0 if bias is None else bias.data_ptr(), out.data_ptr(), workspace.data_ptr(), False, s)

                    out.fill_(float("nan"))
                    enqueue(stream)
                    torch.cuda.synchronize()
                    error = ((out - ref).abs().max() / ref.abs().max()).item()
                    timings.append(f"{label} {1e3 * graph_ms(enqueue):.1f}" + ("" if error < 1e-4 else f" (ERROR {error:.1e})"))
                print(f"{name} N{batch} {call.config.label():34s} x{len(names)} grid {rule.grid} | "
                      + "  ".join(timings), flush=True)


if __name__ == "__main__":
    main()
