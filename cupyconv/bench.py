"""Benchmark: cupyconv against torch.nn.functional.conv2d on the same inputs, in the same process.

    python -m cupyconv.bench --suite seeds --dtype fp32 --dtype tf32 --dtype fp16 --dtype bf16

Each shape and precision is first checked against a float64 torch reference (a wrong result is
reported as WRONG and not timed), then timed with CUDA events: warm-up, then cupyconv and torch
alternating, median of --repeats runs each, several input sets in rotation when one fits in L2.
The GPU's ceilings (fp32 FMA rate, TF32/fp16/bf16 matrix rate, copy bandwidth) are measured at
start. Results go to benchmarks/results/ as JSON, a markdown table and a PNG chart of speed-ups.
torch is imported here only, never by ``import cupyconv``.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import pathlib
import statistics
import subprocess
import sys

from .arguments import ConvProblem, make_problem

L2_BYTES = 50 * 2**20
MODES = ("fp32", "tf32", "fp16", "bf16")
MODE_DTYPE = {"fp32": "float32", "tf32": "float32", "fp16": "float16", "bf16": "bfloat16"}
# Relative-error bounds against float64: strict fp32 absolutely; the others may also reach twice
# torch's own error in the same precision.
MODE_FLOOR = {"fp32": 1e-5, "tf32": 2e-3, "fp16": 1e-2, "bf16": 1e-2}


@dataclasses.dataclass(frozen=True)
class Shape:
    name: str
    n: int
    c: int
    k: int
    h: int
    w: int
    kh: int
    kw: int
    stride: int = 1
    padding: int = 0
    dilation: int = 1
    groups: int = 1
    bias: bool = False

    def problem(self, dtype: str) -> ConvProblem:
        return make_problem((self.n, self.c, self.h, self.w), (self.k, self.c // self.groups, self.kh, self.kw),
                            (self.k,) if self.bias else None, dtype, self.stride, self.padding, self.dilation,
                            self.groups)


SEEDS = (
    Shape("alexnet_conv1", 256, 3, 96, 224, 224, 11, 11, stride=4, padding=2, bias=True),
    Shape("wide_5x9", 8, 32, 64, 512, 512, 5, 9),
)
# Distinct conv layers of ResNet-50, VGG-16 and MobileNetV2 at batch 32, plus a dilated and a
# stride-2 downsampling conv. (ResNet-50's stride-2 3x3 and 1x1 projection layers are included once.)
LAYERS = (
    Shape("r50_conv1_7x7s2", 32, 3, 64, 224, 224, 7, 7, stride=2, padding=3),
    Shape("r50_l1_1x1_64", 32, 64, 64, 56, 56, 1, 1),
    Shape("r50_l1_3x3_64", 32, 64, 64, 56, 56, 3, 3, padding=1),
    Shape("r50_l1_1x1_256", 32, 64, 256, 56, 56, 1, 1),
    Shape("r50_l2_1x1_512to128", 32, 512, 128, 28, 28, 1, 1),
    Shape("r50_l2_3x3_128", 32, 128, 128, 28, 28, 3, 3, padding=1),
    Shape("r50_l3_3x3_256", 32, 256, 256, 14, 14, 3, 3, padding=1),
    Shape("r50_l3_1x1_256to1024", 32, 256, 1024, 14, 14, 1, 1),
    Shape("r50_l4_3x3_512", 32, 512, 512, 7, 7, 3, 3, padding=1),
    Shape("r50_down_3x3s2", 32, 128, 128, 56, 56, 3, 3, stride=2, padding=1),
    Shape("vgg_conv1_2", 32, 64, 64, 224, 224, 3, 3, padding=1, bias=True),
    Shape("vgg_conv3_2", 32, 256, 256, 56, 56, 3, 3, padding=1, bias=True),
    Shape("vgg_conv5_2", 32, 512, 512, 14, 14, 3, 3, padding=1, bias=True),
    Shape("mbv2_dw_3x3_96s2", 32, 96, 96, 112, 112, 3, 3, stride=2, padding=1, groups=96),
    Shape("mbv2_dw_3x3_144", 32, 144, 144, 56, 56, 3, 3, padding=1, groups=144),
    Shape("mbv2_dw_3x3_384", 32, 384, 384, 14, 14, 3, 3, padding=1, groups=384),
    Shape("mbv2_pw_1x1_144to24", 32, 144, 24, 56, 56, 1, 1),
    Shape("mbv2_pw_1x1_96to576", 32, 96, 576, 14, 14, 1, 1),
    Shape("dilated_3x3_d2", 32, 256, 256, 28, 28, 3, 3, padding=2, dilation=2),
)
SUITES = {"seeds": SEEDS, "layers": LAYERS, "all": SEEDS + LAYERS}


def median_ms(fn, repeats: int = 20, warmup: int = 3) -> float:
    """Median time of ``fn`` in ms, each run between CUDA events on torch's current stream, after warm-up."""
    import torch

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def bytes_moved(problem: ConvProblem) -> int:
    """Each input read once and the output written once: the memory floor's numerator."""
    item = 8 if problem.dtype == "float64" else 4 if problem.dtype == "float32" else 2
    elements = (math.prod(problem.x_shape) + math.prod(problem.weight_shape) + math.prod(problem.out_shape)
                + (problem.k if problem.has_bias else 0))
    return elements * item


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m cupyconv.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", choices=sorted(SUITES), default="seeds")
    parser.add_argument("--dtype", action="append", choices=MODES + ("all",),
                        help="precision mode (repeatable; default fp32)")
    parser.add_argument("--layout", choices=("nchw",), default="nchw")
    parser.add_argument("--repeats", type=int, default=30, help="timed runs per implementation (>= 20)")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("benchmarks/results"))
    parser.add_argument("--cudnn-benchmark", action="store_true", help="let cuDNN autotune (off by default)")
    parser.add_argument("--commit", default=None,
                        help="the commit measured, where the tree has no git (default: git rev-parse HEAD)")
    args = parser.parse_args(argv)
    modes = args.dtype or ["fp32"]
    args.modes = list(MODES) if "all" in modes else list(dict.fromkeys(modes))
    if args.repeats < 20:
        parser.error("--repeats must be at least 20")
    return args


def to_markdown(results: dict) -> str:
    """The table of one run, with the GPU and the commit it measured, for benchmarks/RESULTS.md."""
    meta = results["meta"]
    lines = [f"GPU: {meta['gpu']}; torch {meta['torch']}, cuDNN {meta['cudnn']}, CuPy {meta['cupy']}; "
             f"layout {meta['layout']}; cudnn.benchmark {meta['cudnn_benchmark']}; {meta['date']}",
             f"commit: {meta['commit']}{' (dirty tree)' if meta['dirty'] else ''}", "",
             "| shape | mode | kernel | torch ms | cupyconv ms | speed-up | TFLOP/s | % of ceiling | GB/s | % of bandwidth |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results["rows"]:
        if r["status"] != "ok":
            lines.append(f"| {r['shape']} | {r['mode']} | {r.get('kernel', '')} | | | {r['status']} | | | | |")
            continue
        lines.append(f"| {r['shape']} | {r['mode']} | {r['kernel']} | {r['torch_ms']:.3f} | {r['cupyconv_ms']:.3f} | "
                     f"{r['speedup']:.2f}x | {r['tflops']:.1f} | {100 * r['compute_fraction']:.0f}% | "
                     f"{r['gbps']:.0f} | {100 * r['bandwidth_fraction']:.0f}% |")
    return "\n".join(lines) + "\n"


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


class _Runner:
    """Holds torch and cupy, the measured ceilings, and runs one (shape, mode) row."""

    def __init__(self, repeats: int):
        import cupy
        import torch

        self.torch, self.cupy, self.repeats = torch, cupy, repeats
        self.ceilings = self._measure_ceilings()

    def _measure_ceilings(self) -> dict:
        torch = self.torch
        n = 8192
        rates = {}
        for mode, dtype, tf32 in (("fp32", torch.float32, False), ("tf32", torch.float32, True),
                                  ("fp16", torch.float16, False), ("bf16", torch.bfloat16, False)):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            a, b = (torch.randn(n, n, device="cuda").to(dtype) for _ in range(2))
            ms = median_ms(lambda: a @ b, repeats=10)
            rates[mode] = 2 * n**3 / ms / 1e9  # TFLOP/s
        torch.backends.cuda.matmul.allow_tf32 = False
        src = torch.empty(2**28, device="cuda", dtype=torch.float32)  # 1 GiB
        dst = torch.empty_like(src)
        ms = median_ms(lambda: dst.copy_(src), repeats=10)
        rates["bandwidth_gbps"] = 2 * src.numel() * 4 / ms / 1e6
        return rates

    def _inputs(self, shape: Shape, torch_dtype, sets: int):
        torch = self.torch
        make = lambda *s: torch.randn(*s, device="cuda", dtype=torch.float32).to(torch_dtype)
        return [(make(shape.n, shape.c, shape.h, shape.w), make(shape.k, shape.c // shape.groups, shape.kh, shape.kw),
                 make(shape.k) if shape.bias else None) for _ in range(sets)]

    def row(self, shape: Shape, mode: str) -> dict:
        from .launch import conv2d_cupy
        from .planner import make_plan

        torch, cupy = self.torch, self.cupy
        F = torch.nn.functional
        torch_dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[MODE_DTYPE[mode]]
        allow_tf32 = mode == "tf32"  # the one place cupyconv's precision mode is chosen
        torch.backends.cudnn.allow_tf32 = allow_tf32
        problem = shape.problem(MODE_DTYPE[mode])
        plan = make_plan(problem, allow_tf32=allow_tf32)
        row = {"shape": shape.name, "mode": mode, "kernel": plan.kernel, "plan": str(plan)}
        sets = max(1, min(4, math.ceil(2 * L2_BYTES / bytes_moved(problem))))
        inputs = self._inputs(shape, torch_dtype, sets)
        outs = [torch.empty(problem.out_shape, device="cuda", dtype=torch_dtype) for _ in range(sets)]
        view = lambda t: None if t is None else cupy.from_dlpack(t.view(torch.int16) if t.dtype == torch.bfloat16 else t)
        stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
        args = (shape.stride, shape.padding, shape.dilation, shape.groups)

        def ours(i):
            x, w, b = inputs[i]
            with stream:
                conv2d_cupy(view(x), view(w), view(b), problem, view(outs[i]), plan=plan)

        # Correctness first, on a NaN-poisoned output: every element written, and the first and last
        # images against float64 (the whole batch in float64 would cost more than the timing).
        x, w, b = inputs[0]
        outs[0].fill_(float("nan"))
        ours(0)
        if outs[0].isnan().any():
            row["status"] = "WRONG (unwritten or NaN output)"
            return row
        sample = [0, shape.n - 1]
        up = lambda t: None if t is None else t.double()
        ref = F.conv2d(up(x[sample]), up(w), up(b), *args)
        err = float((outs[0][sample].double() - ref).norm() / ref.norm())
        torch_err = float((F.conv2d(x[sample], w, b, *args).double() - ref).norm() / ref.norm())
        allowed = MODE_FLOOR[mode] if mode == "fp32" else max(MODE_FLOOR[mode], 2 * torch_err)
        row.update(error=err, torch_error=torch_err)
        if not math.isfinite(err) or err > allowed:
            row["status"] = f"WRONG (error {err:.2e} > {allowed:.1e})"
            return row
        del ref

        counter = {"ours": 0, "torch": 0}

        def timed_ours():
            ours(counter["ours"] % sets)
            counter["ours"] += 1

        def timed_torch():
            x, w, b = inputs[counter["torch"] % sets]
            F.conv2d(x, w, b, *args)
            counter["torch"] += 1

        ours_ms, torch_ms = [], []
        for _ in range(3):  # alternate implementations in rounds so drift hits both alike
            ours_ms.append(median_ms(timed_ours, self.repeats // 3 + 1))
            torch_ms.append(median_ms(timed_torch, self.repeats // 3 + 1))
        ours_t, torch_t = statistics.median(ours_ms), statistics.median(torch_ms)
        compute_ceiling = self.ceilings["fp32" if mode == "fp32" else mode]
        row.update(status="ok", torch_ms=torch_t, cupyconv_ms=ours_t, speedup=torch_t / ours_t,
                   tflops=problem.flops / ours_t / 1e9, gbps=bytes_moved(problem) / ours_t / 1e6)
        row.update(compute_fraction=row["tflops"] / compute_ceiling,
                   bandwidth_fraction=row["gbps"] / self.ceilings["bandwidth_gbps"])
        return row


def _meta(args, runner: _Runner) -> dict:
    import cupy
    import torch

    import cupyconv

    return {"gpu": torch.cuda.get_device_name(), "driver": cupy.cuda.runtime.driverGetVersion(),
            "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "cupy": cupy.__version__,
            "cupyconv": cupyconv.__version__, "commit": args.commit or _git("rev-parse", "HEAD") or "unknown",
            "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")), "layout": args.layout,
            "cudnn_benchmark": args.cudnn_benchmark, "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "ceilings": runner.ceilings}


def _chart(results: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in results["rows"] if r["status"] == "ok"]
    fig, ax = plt.subplots(figsize=(10, max(3, 0.3 * len(rows))))
    labels = [f"{r['shape']} {r['mode']}" for r in rows]
    ax.barh(labels, [r["speedup"] for r in rows], color=["tab:green" if r["speedup"] >= 1 else "tab:red" for r in rows])
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("speed-up over torch (torch ms / cupyconv ms)")
    ax.set_title(f"cupyconv vs torch, {results['meta']['gpu']}, commit {results['meta']['commit'][:10]}")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        import cupy
        import torch
    except ImportError as error:
        print(f"cupyconv.bench needs torch and CuPy: {error}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available() or cupy.cuda.runtime.getDeviceCount() == 0:
        print("cupyconv.bench needs a CUDA GPU; none found", file=sys.stderr)
        return 2
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    runner = _Runner(args.repeats)
    results = {"meta": _meta(args, runner), "rows": []}
    print("ceilings: " + ", ".join(f"{k} {v:.1f}" for k, v in runner.ceilings.items()), flush=True)
    for shape in SUITES[args.suite]:
        for mode in args.modes:
            row = runner.row(shape, mode)
            results["rows"].append(row)
            if row["status"] == "ok":
                print(f"{shape.name:24s} {mode:5s} torch {row['torch_ms']:8.3f} ms  cupyconv {row['cupyconv_ms']:8.3f} ms"
                      f"  {row['speedup']:5.2f}x  {row['tflops']:6.1f} TFLOP/s  {row['kernel']}", flush=True)
            else:
                print(f"{shape.name:24s} {mode:5s} {row['status']}  <<<<<<<<<<", flush=True)
            torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"{args.suite}_{'-'.join(args.modes)}"
    (args.out / f"{stem}.json").write_text(json.dumps(results, indent=1))
    (args.out / f"{stem}.md").write_text(to_markdown(results))
    _chart(results, args.out / f"{stem}.png")
    print()
    print(to_markdown(results))
    return 1 if any(r["status"] != "ok" for r in results["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
