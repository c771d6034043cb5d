"""Benchmark: cupyconv against torch.nn.functional.conv2d on the same inputs, in the same process.

    python -m cupyconv.bench --suite seeds --dtype fp32 --dtype tf32 --dtype fp16 --dtype bf16

Each shape and precision is first checked against a float64 torch reference (a wrong result is
reported as WRONG and not timed), then timed with CUDA events: warm-up, then cupyconv and torch
alternating run by run, median of --repeats runs each, several input sets in rotation when one fits
in L2. The events time GPU work only (a spin kernel keeps the GPU busy while the host enqueues each
run). The host's cost per call is measured apart, in loops of back-to-back calls behind a longer spin,
for cupyconv.conv2d on CuPy arrays, cupyconv.torch.conv2d and torch's F.conv2d: it says where a
layer is host-bound when called eagerly.
``--suite large`` holds layers near the hardware's limits (1x1 and depthwise layers on large planes,
big 3x3/5x5/7x7 layers); every row reports its roofline efficiency: the time at its binding limit
(the mode's FMA or matrix rate, or the copy bandwidth, both measured at start) over the time measured.
``--suite conv1d`` holds 1-D layers of audio and sequence models as cupyconv.conv1d runs them (height 1).
``--suite models`` times whole torchvision models instead (cupyconv/bench_models.py); ``--pass dgrad``
and ``--pass wgrad`` the gradients of the layers, and ``--suite transposed`` transposed convolutions
(cupyconv/bench_grad.py).
``--layout channels_last`` runs the rows on NHWC arrays and KHWC weights (torch's channels_last).
``--autotune`` tunes each row of the layer suites (cupyconv/tuning.py, with a cache of its own, so every
row is tuned in this run) and times the tuned plan next to the fixed rules' ("untuned"), with the
wall time the tuning took.
torch is timed in both of its layouts in every row, and the speed-up is over the faster of the two.
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
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time

from .arguments import ConvProblem, make_problem
from .tuning_cache import DIRECTORY_VARIABLE

L2_BYTES = 50 * 2**20
#: Spin before each timed run, in GPU clock cycles (about 1 ms on an H100): longer than the host
#: needs to enqueue one cupyconv or torch call, so the GPU never waits for the host inside the events.
QUEUE_AHEAD_CYCLES = 2_000_000
#: Timed runs per implementation: the default, and the least a median is reported from (unless --quick).
REPEATS, MIN_REPEATS, QUICK_REPEATS = 30, 20, 5
#: Host cost: loops of this many back-to-back calls, median over HOST_LOOPS loops.
HOST_CALLS, HOST_LOOPS = 10, 5
#: The ways in whose host cost is measured: torch's F.conv2d, cupyconv.conv2d (CuPy), cupyconv.torch.conv2d.
HOST_APIS = ("torch", "cupyconv", "cupyconv_torch")
MODES = ("fp32", "tf32", "fp16", "bf16")
MODE_DTYPE = {"fp32": "float32", "tf32": "float32", "fp16": "float16", "bf16": "bfloat16"}
# Relative-error bounds against float64: strict fp32 absolutely; the others may also reach twice
# torch's own error in the same precision.
MODE_FLOOR = {"fp32": 1e-5, "tf32": 2e-3, "fp16": 1e-2, "bf16": 1e-2}
LAYOUTS = ("nchw", "channels_last")


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
    stride: int | tuple[int, int] = 1
    padding: int | tuple[int, int] = 0
    dilation: int | tuple[int, int] = 1
    groups: int = 1
    bias: bool = False

    def problem(self, dtype: str, layout: str = "nchw") -> ConvProblem:
        """The problem in ``layout`` (channels_last: NHWC arrays and a KHWC weight)."""
        problem = make_problem((self.n, self.c, self.h, self.w), (self.k, self.c // self.groups, self.kh, self.kw),
                               (self.k,) if self.bias else None, dtype, self.stride, self.padding, self.dilation,
                               self.groups)
        if layout == "channels_last":
            problem = dataclasses.replace(problem, layout="NHWC", weight_layout="KHWC")
        return problem


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
# Issue 15's layers near the hardware's limits. Memory-bound: 1x1 and depthwise layers on large planes,
# each moving 64 MB or more in 16-bit. Compute-bound: 3x3/5x5/7x7 layers with 64-512 channels and
# over 100 GFLOP, where the matrix rate binds.
LARGE = (
    Shape("large_1x1_64to64_256sq", 16, 64, 64, 256, 256, 1, 1),
    Shape("large_1x1_32to128_512sq", 4, 32, 128, 512, 512, 1, 1),
    Shape("large_1x1_256to64_128sq", 16, 256, 64, 128, 128, 1, 1),
    Shape("large_dw_3x3_64_256sq", 16, 64, 64, 256, 256, 3, 3, padding=1, groups=64),
    Shape("large_dw_3x3_32_512sq", 4, 32, 32, 512, 512, 3, 3, padding=1, groups=32),
    Shape("large_dw_5x5_96s2_512sq", 4, 96, 96, 512, 512, 5, 5, stride=2, padding=2, groups=96),
    Shape("large_3x3_256_56sq", 32, 256, 256, 56, 56, 3, 3, padding=1),
    Shape("large_3x3_512_28sq", 64, 512, 512, 28, 28, 3, 3, padding=1),
    Shape("large_5x5_128_112sq", 16, 128, 128, 112, 112, 5, 5, padding=2),
    Shape("large_7x7_64_224sq", 8, 64, 64, 224, 224, 7, 7, padding=3),
)
# Issue 16's 1-D layers (audio and sequence models), as cupyconv.conv1d runs them: conv2d of height 1
# (stride, padding and dilation 1, 0 and 1 along the height), timed against torch's conv2d on the same
# height-1 views, which is what F.conv1d runs on CUDA. wav2vec 2.0's feature encoder (its first layer on
# raw audio, then 512 channels at stride 2), a dilated TCN layer, a Conformer block's depthwise and
# pointwise layers, and a WaveNet layer of few channels on a long signal.
CONV1D = (
    Shape("w2v_conv0_1to512_k10s5", 8, 1, 512, 1, 16000, 1, 10, stride=(1, 5)),
    Shape("w2v_conv1_512_k3s2", 8, 512, 512, 1, 3199, 1, 3, stride=(1, 2)),
    Shape("tcn_256_k3_d4", 16, 256, 256, 1, 4096, 1, 3, padding=(0, 4), dilation=(1, 4)),
    Shape("conformer_dw_512_k31", 16, 512, 512, 1, 1000, 1, 31, padding=(0, 15), groups=512),
    Shape("conformer_pw_512to1024", 16, 512, 1024, 1, 1000, 1, 1),
    Shape("wavenet_64_k2_d8", 4, 64, 64, 1, 16000, 1, 2, dilation=(1, 8)),
)
SUITES = {"seeds": SEEDS, "layers": LAYERS, "all": SEEDS + LAYERS, "large": LARGE, "conv1d": CONV1D}


def _warm_up(fns: dict, warmup: int) -> None:
    """Call each callable ``warmup`` times (kernels compiled, allocator and caches settled), then wait for the GPU."""
    import torch

    for _ in range(warmup):
        for fn in fns.values():
            fn()
    torch.cuda.synchronize()


def _turns(names: list, runs: int):
    """(run, name) for every run of every name, the order flipping every run so that neither always
    follows the other (warm caches, clocks)."""
    for run in range(runs):
        for name in names if run % 2 == 0 else reversed(names):
            yield run, name


def alternating_ms(fns: dict, repeats: int = 20, warmup: int = 3) -> dict:
    """GPU time of each callable, interleaved run by run: {name: (median ms, median host us)}.

    Each timed run sits between CUDA events on torch's current stream, behind a spin kernel that keeps
    the GPU busy while the host enqueues the run: the events then time the GPU's work alone, not
    Python's launch path. That path is measured separately, on the host (perf_counter around the
    call), as the second number. The order of the callables flips every run (see _turns).
    """
    import torch

    _warm_up(fns, warmup)
    names = list(fns)
    events = {name: [] for name in names}
    host_s = {name: [] for name in names}
    for _, name in _turns(names, repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(QUEUE_AHEAD_CYCLES)
        start.record()
        began = time.perf_counter()
        fns[name]()
        host_s[name].append(time.perf_counter() - began)
        end.record()
        events[name].append((start, end))
    torch.cuda.synchronize()
    return {name: (statistics.median([start.elapsed_time(end) for start, end in events[name]]),
                   1e6 * statistics.median(host_s[name])) for name in names}


def alternating_loop_ms(fns: dict, calls: int, loops: int = 5, warmup: int = 3, *, gpu_busy: bool = False) -> dict:
    """Wall time per call of each callable, in ms: {name: median over ``loops`` loops of ``calls`` calls}.

    The calls of a loop run back to back, timed with perf_counter around the loop; the callables
    alternate loop by loop (see _turns).

    gpu_busy=False: the loop ends with torch.cuda.synchronize() inside the clock -- what a user's loop
    sees per call (a forward, a replay), whichever of the host and the GPU is the slower.
    gpu_busy=True: a spin kernel of QUEUE_AHEAD_CYCLES per call (about 1 ms each; a Python call takes
    well under that) is queued before the loop and the clock stops before the synchronize: the GPU is
    never waiting for work, the host never waits for the GPU, and the time is the host's own cost per
    call. A call that synchronises would wait out the spin and show up as about 1 ms.
    """
    import torch

    _warm_up(fns, warmup)
    per_call = {name: [] for name in fns}
    for _, name in _turns(list(fns), loops):
        fn = fns[name]
        if gpu_busy:
            torch.cuda._sleep(calls * QUEUE_AHEAD_CYCLES)
        began = time.perf_counter()
        for _ in range(calls):
            fn()
        if not gpu_busy:
            torch.cuda.synchronize()
        per_call[name].append((time.perf_counter() - began) / calls)
        torch.cuda.synchronize()  # the next loop starts on an idle GPU
    return {name: 1e3 * statistics.median(seconds) for name, seconds in per_call.items()}


def median_ms(fn, repeats: int = 20, warmup: int = 3) -> float:
    """Median GPU time of ``fn`` in ms (CUDA events on torch's current stream, after warm-up; see alternating_ms)."""
    return alternating_ms({"fn": fn}, repeats, warmup)["fn"][0]


def relative_error(out, ref) -> float:
    """||out - ref|| / ||ref||, with ``ref`` a float64 torch tensor: the check before every timing."""
    return float((out.double() - ref).norm() / ref.norm())


def error_bound(mode: str, torch_error: float) -> float:
    """The error one convolution may have: strict fp32 absolutely MODE_FLOOR; the other modes also up to
    twice torch's own error in that precision."""
    return MODE_FLOOR[mode] if mode == "fp32" else max(MODE_FLOOR[mode], 2 * torch_error)


def error_status(error: float, bound: float) -> str | None:
    """The WRONG status of a result whose error is NaN or above ``bound``, or None when it passes."""
    if not math.isfinite(error) or error > bound:
        return f"WRONG (error {error:.2e} > {bound:.1e})"
    return None


def bytes_moved(problem: ConvProblem) -> int:
    """Each input read once and the output written once: the memory floor's numerator."""
    item = 8 if problem.dtype == "float64" else 4 if problem.dtype == "float32" else 2
    elements = (math.prod(problem.x_shape) + math.prod(problem.weight_shape) + math.prod(problem.out_shape)
                + (problem.k if problem.has_bias else 0))
    return elements * item


def roofline(problem: ConvProblem, mode: str, ms: float, ceilings: dict) -> dict:
    """A run of ``ms`` against the GPU's limits: ``compute_fraction`` (its rate over the mode's FMA or
    matrix rate), ``bandwidth_fraction`` (its bytes per second over the copy bandwidth), the ``bound``
    that binds ("compute" or "memory": the larger fraction) and its ``roofline`` efficiency, the time
    at that limit over ``ms`` (the larger fraction itself)."""
    compute = problem.flops / ms / 1e9 / ceilings[mode]
    memory = bytes_moved(problem) / ms / 1e6 / ceilings["bandwidth_gbps"]
    bound, efficiency = ("compute", compute) if compute >= memory else ("memory", memory)
    return {"compute_fraction": compute, "bandwidth_fraction": memory, "bound": bound, "roofline": efficiency}


def parse_args(argv=None) -> argparse.Namespace:
    """The command line of both benchmarks: the layer suites here, ``--suite models`` in bench_models.

    Resolves ``args.modes`` (the precision modes in order) and ``args.layouts`` ({mode: [layout, ...]});
    the models suite's own options are added and resolved by bench_models.
    """
    from . import bench_grad, bench_models

    parser = argparse.ArgumentParser(prog="python -m cupyconv.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", choices=sorted(SUITES) + ["models", "transposed"], default="seeds",
                        help="layer suites, whole torchvision models (see --model), or transposed convolutions")
    parser.add_argument("--dtype", action="append", choices=MODES + ("all",),
                        help="precision mode (repeatable; default fp32)")
    parser.add_argument("--layout", action="append", choices=LAYOUTS,
                        help="memory format (repeatable). Default nchw, and for models in fp16/bf16 both")
    parser.add_argument("--repeats", type=int, default=None,
                        help=f"timed runs per implementation (default {REPEATS}, at least {MIN_REPEATS})")
    parser.add_argument("--quick", action="store_true",
                        help=f"smoke test: {QUICK_REPEATS} runs unless --repeats, smaller ceiling measurements")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("benchmarks/results"))
    parser.add_argument("--cudnn-benchmark", action="store_true", help="let cuDNN autotune (off by default)")
    parser.add_argument("--autotune", action="store_true",
                        help="layer suites, forward: tune each row (a fresh cache) and time the tuned plan next to "
                             "the fixed rules' one, with the tuning's cost")
    parser.add_argument("--commit", default=None,
                        help="the commit measured, where the tree has no git (default: git rev-parse HEAD)")
    bench_models.add_arguments(parser)
    bench_grad.add_arguments(parser)
    args = parser.parse_args(argv)
    modes = args.dtype or ["fp32"]
    args.modes = list(MODES) if "all" in modes else list(dict.fromkeys(modes))
    if args.repeats is None:
        args.repeats = QUICK_REPEATS if args.quick else REPEATS
    if args.repeats < (1 if args.quick else MIN_REPEATS):
        parser.error(f"--repeats must be at least {MIN_REPEATS} (a median of fewer is noise; --quick for smoke tests), "
                     f"got {args.repeats}")
    args.layouts = {mode: list(dict.fromkeys(args.layout or ["nchw"])) for mode in args.modes}
    bench_models.check_args(parser, args)
    bench_grad.check_args(parser, args)
    if args.autotune and (args.suite in ("models", "transposed") or args.passes != ["fwd"]):
        parser.error("--autotune: for the layer suites' forward only")
    return args


def markdown(meta: dict, cells: list[list[str]], notes=()) -> str:
    """A table of text cells (header first) under a line naming the GPU, versions and settings and a
    ``commit:`` line, then ``notes`` (one line each): the form of every table in benchmarks/RESULTS.md."""
    header, *rows = cells
    lines = [f"GPU: {meta['gpu']}; torch {meta['torch']}, cuDNN {meta['cudnn']}, CuPy {meta['cupy']}; "
             f"layout {meta['layout']}; cudnn.benchmark {meta['cudnn_benchmark']}"
             f"{'; cupyconv autotune on' if meta.get('autotune') else ''}; {meta['date']}",
             f"commit: {meta['commit']}{' (dirty tree)' if meta['dirty'] else ''}", "",
             "| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    if notes:
        lines += ["", *notes]
    return "\n".join(lines) + "\n"


def to_markdown(results: dict) -> str:
    """The table of one run, with the GPU and the commit it measured, for benchmarks/RESULTS.md."""
    return markdown(results["meta"], table_rows(results))


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


class _Runner:
    """Holds torch and cupy, the measured ceilings, and runs one (shape, mode) row."""

    def __init__(self, repeats: int, quick: bool = False, autotune: bool = False):
        import cupy
        import torch

        self.torch, self.cupy, self.repeats, self.autotune = torch, cupy, repeats, autotune
        self.ceilings = self._measure_ceilings(4096 if quick else 8192)

    def _measure_ceilings(self, n: int) -> dict:
        """Matrix-product rates (TFLOP/s) per mode on n x n x n, and device-to-device copy bandwidth (GB/s)."""
        torch = self.torch
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

    def _tuned(self, problem: ConvProblem, allow_tf32: bool):
        """The tuned plan of ``problem`` on the current GPU, and the wall time (ms) its tuning took."""
        from .tuning import tuned_plan

        began = time.perf_counter()
        plan = tuned_plan(problem, allow_tf32, self.cupy.cuda.Device().id)
        return plan, 1e3 * (time.perf_counter() - began)

    def row(self, shape: Shape, mode: str, layout: str = "nchw") -> dict:
        """One (shape, mode, layout) row: cupyconv on arrays in ``layout``, torch in both of its layouts;
        with autotune, the tuned plan, and the fixed rules' one as "untuned"."""
        from .compiler import compute_capability
        from .launch import conv2d_cupy
        from .planner import make_plan, program
        from .tuning import label

        torch, cupy = self.torch, self.cupy
        F = torch.nn.functional
        torch_dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[MODE_DTYPE[mode]]
        allow_tf32 = mode == "tf32"  # the one place cupyconv's precision mode is chosen
        torch.backends.cudnn.allow_tf32 = allow_tf32
        problem = shape.problem(MODE_DTYPE[mode], layout)
        plan = make_plan(problem, allow_tf32=allow_tf32, compute_capability=compute_capability())
        row = {"shape": shape.name, "mode": mode, "layout": layout, "kernel": plan.kernel, "plan": str(plan)}
        untuned = None
        same_launches = False
        if self.autotune:
            untuned, (plan, tuning_ms) = plan, self._tuned(problem, allow_tf32)
            # The tuner kept the fixed rules' plan: the same launches, timed once (two loops of one
            # program differ by timing noise alone, up to 10 % on rows of 10-20 us).
            same_launches = program(plan, problem) == program(untuned, problem)
            row.update(kernel=plan.kernel, plan=str(plan), untuned_kernel=untuned.kernel,
                       tuned_plan=label(plan) + (" (the fixed rules' plan)" if same_launches else ""),
                       tuning_ms=tuning_ms, tuned_is_fixed=same_launches)
        sets = max(1, min(4, math.ceil(2 * L2_BYTES / bytes_moved(problem))))
        by_layout = {"nchw": self._inputs(shape, torch_dtype, sets)}
        by_layout["channels_last"] = [(x.to(memory_format=torch.channels_last), w.to(memory_format=torch.channels_last), b)
                                      for x, w, b in by_layout["nchw"]]
        inputs = by_layout[layout]
        memory_format = torch.channels_last if layout == "channels_last" else torch.contiguous_format
        outs = [torch.empty(problem.out_shape, device="cuda", dtype=torch_dtype, memory_format=memory_format)
                for _ in range(sets)]

        def view(t):
            """A zero-copy CuPy array of ``t`` in the problem's layout (bfloat16 as its int16 bits)."""
            if t is None:
                return None
            if t.dim() == 4 and layout == "channels_last":
                t = t.permute(0, 2, 3, 1)  # NHWC / KHWC, C-contiguous
            return cupy.from_dlpack(t.view(torch.int16) if t.dtype == torch.bfloat16 else t)
        stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
        args = (shape.stride, shape.padding, shape.dilation, shape.groups)
        with stream:  # zero-copy views, made once: the DLPack exchange is the benchmark's cost, not cupyconv's
            views = [(*(view(t) for t in inputs[i]), view(outs[i])) for i in range(sets)]

        def run_plan(chosen):
            def run(i):
                with stream:
                    conv2d_cupy(*views[i][:3], problem, views[i][3], plan=chosen)
            return run
        ours = run_plan(plan)

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
        err = relative_error(outs[0][sample], ref)
        torch_err = relative_error(F.conv2d(x[sample], w, b, *args), ref)
        row.update(error=err, torch_error=torch_err)
        wrong = error_status(err, error_bound(mode, torch_err))
        if wrong:
            row["status"] = wrong
            return row
        del ref

        counter = dict.fromkeys(["cupyconv", "untuned", *LAYOUTS], 0)

        def timed_plan(name, chosen):
            run = run_plan(chosen)

            def timed():
                run(counter[name] % sets)
                counter[name] += 1
            return timed

        def timed_torch(torch_layout):
            def run():
                x, w, b = by_layout[torch_layout][counter[torch_layout] % sets]
                F.conv2d(x, w, b, *args)
                counter[torch_layout] += 1
            return run

        fns = {"cupyconv": timed_plan("cupyconv", plan)}
        if untuned is not None and not same_launches:
            fns["untuned"] = timed_plan("untuned", untuned)
        times = alternating_ms({**fns, **{name: timed_torch(name) for name in LAYOUTS}}, self.repeats)
        ours_t, ours_host_us = times["cupyconv"]
        torch_layout = min(LAYOUTS, key=lambda name: times[name][0])  # torch's faster layout
        torch_t, torch_host_us = times[torch_layout]
        row.update(status="ok", torch_ms=torch_t, torch_layout=torch_layout, cupyconv_ms=ours_t,
                   speedup=torch_t / ours_t, torch_host_us=torch_host_us, cupyconv_host_us=ours_host_us,
                   input_sets=sets, tflops=problem.flops / ours_t / 1e9, gbps=bytes_moved(problem) / ours_t / 1e6,
                   **{f"torch_{name}_ms": times[name][0] for name in LAYOUTS})
        row.update(roofline(problem, mode, ours_t, self.ceilings))
        if untuned is not None:
            untuned_ms = ours_t if same_launches else times["untuned"][0]
            row.update(untuned_ms=untuned_ms, autotune_speedup=untuned_ms / ours_t)
        row["host_us"] = self._host_us(inputs[0], views[0], args, allow_tf32, stream,
                                       (problem.layout, problem.weight_layout))
        return row

    def _host_us(self, tensors, views, args, allow_tf32: bool, stream, layouts=("NCHW", "KCHW")) -> dict:
        """Host time of one call (us) through each public way in, with the GPU kept busy.

        ``cupyconv``: cupyconv.conv2d on CuPy arrays, out= given (None in bf16: CuPy has no bfloat16, so
        the public CuPy call cannot take one); ``cupyconv_torch``: cupyconv.torch.conv2d on the torch
        tensors; ``torch``: F.conv2d. Unlike the GPU timing above, these include argument checks,
        planning and, for the adapter, DLPack and the output allocation: what an eager model pays.
        """
        import cupyconv
        from .torch import conv2d as adapter_conv2d

        (x, w, b), (xv, wv, bv, outv) = tensors, views
        fns = {"torch": lambda: self.torch.nn.functional.conv2d(x, w, b, *args),
               "cupyconv_torch": lambda: adapter_conv2d(x, w, b, *args)}
        if x.dtype != self.torch.bfloat16:
            fns["cupyconv"] = lambda: cupyconv.conv2d(xv, wv, bv, *args, out=outv, allow_tf32=allow_tf32,
                                                      layout=layouts[0], weight_layout=layouts[1])
        with stream:  # CuPy's current stream is torch's, behind the same spin
            per_call_ms = alternating_loop_ms(fns, HOST_CALLS, HOST_LOOPS, gpu_busy=True)
        return {name: 1e3 * per_call_ms[name] if name in per_call_ms else None for name in HOST_APIS}


def _driver_version() -> str | None:
    """The NVIDIA driver's version string (e.g. 580.159.04), from nvidia-smi where it is installed."""
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, check=True).stdout.split("\n")[0].strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


def _meta(args) -> dict:
    """What was measured, where and with what: GPU, driver, library versions, commit, settings."""
    import cupy
    import numpy
    import torch

    import cupyconv

    return {"gpu": torch.cuda.get_device_name(), "driver": cupy.cuda.runtime.driverGetVersion(),
            "driver_version": _driver_version(), "cuda_torch": torch.version.cuda,
            "cuda_cupy": cupy.cuda.runtime.runtimeGetVersion(), "torch": torch.__version__,
            "cudnn": torch.backends.cudnn.version(), "cupy": cupy.__version__, "numpy": numpy.__version__,
            "python": platform.python_version(), "cupyconv": cupyconv.__version__,
            "commit": args.commit or _git("rev-parse", "HEAD") or "unknown",
            # A commit named with --commit (a tree without git) is taken as the caller's word.
            "dirty": not args.commit and bool(_git("status", "--porcelain", "--untracked-files=no")),
            "layout": ", ".join(dict.fromkeys(layout for layouts in args.layouts.values() for layout in layouts)),
            "suite": args.suite, "modes": args.modes, "repeats": args.repeats, "quick": args.quick,
            "cudnn_benchmark": args.cudnn_benchmark, "autotune": args.autotune,
            "date": datetime.datetime.now().isoformat(timespec="seconds")}


def _chart(results: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in results["rows"] if r["status"] == "ok"]
    fig, ax = plt.subplots(figsize=(10, max(3, 0.3 * len(rows))))
    labels = [f"{r['shape']} {r['mode']}{' CL' if r.get('layout') == 'channels_last' else ''}" for r in rows]
    ax.barh(labels, [r["speedup"] for r in rows], color=["tab:green" if r["speedup"] >= 1 else "tab:red" for r in rows])
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("speed-up over torch's faster layout (torch ms / cupyconv ms)")
    ax.set_title(f"cupyconv vs torch, {results['meta']['gpu']}, commit {results['meta']['commit'][:10]}")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


#: The columns --autotune adds: the fixed rules' plan's time, the tuning's wall time, the tuned plan.
AUTOTUNE_COLUMNS = ("untuned ms", "tuning ms", "tuned plan")


def _us(value) -> str:
    """A host cost in us as a table cell; n/a where it was not measured (bf16 on CuPy)."""
    return "n/a" if value is None else f"{value:.0f}"


def table_rows(results: dict) -> list[list[str]]:
    """The result table as text cells, header first: what the console and markdown tables show."""
    autotune = results["meta"].get("autotune", False)
    rows = [["shape", "mode", "layout", "kernel", "torch NCHW ms", "torch CL ms", "cupyconv ms",
             "speed-up (torch's faster)", "torch host µs", "cupyconv host µs", "cupyconv.torch host µs", "TFLOP/s",
             "% of ceiling", "GB/s", "% of bandwidth", "% of roofline"] + (list(AUTOTUNE_COLUMNS) if autotune else [])]
    for r in results["rows"]:
        layout = "CL" if r.get("layout") == "channels_last" else "NCHW"
        if r["status"] != "ok":
            rows.append([r["shape"], r["mode"], layout, r.get("kernel", ""), "", "", "", r["status"]] + [""] * 8
                        + [""] * (len(AUTOTUNE_COLUMNS) if autotune else 0))
            continue
        host = r["host_us"]
        torch_ms = [f"{r[key]:.3f}" if key in r else "" for key in ("torch_nchw_ms", "torch_channels_last_ms")]
        rows.append([r["shape"], r["mode"], layout, r["kernel"], *torch_ms, f"{r['cupyconv_ms']:.3f}",
                     f"{r['speedup']:.2f}x", *(_us(host[name]) for name in HOST_APIS),
                     f"{r['tflops']:.1f}", f"{100 * r['compute_fraction']:.0f}%",
                     f"{r['gbps']:.0f}", f"{100 * r['bandwidth_fraction']:.0f}%",
                     f"{100 * r['roofline']:.0f}% ({r['bound']})" if "roofline" in r else ""]
                    + ([f"{r['untuned_ms']:.3f}", f"{r['tuning_ms']:.0f}", r["tuned_plan"]] if autotune else []))
    return rows


def print_table(results: dict) -> None:
    """The result table on the console: with rich where it is installed, else as markdown."""
    try:
        import rich.console
        import rich.table
    except ImportError:
        print(to_markdown(results))
        return
    header, *rows = table_rows(results)
    table = rich.table.Table(title=f"cupyconv vs torch on {results['meta']['gpu']}, commit {results['meta']['commit']}")
    for i, name in enumerate(header):
        table.add_column(name, justify="left" if i < 4 or name == "tuned plan" else "right")
    for cells, row in zip(rows, results["rows"]):
        table.add_row(*cells, style=None if row["status"] == "ok" else "bold red")
    console = rich.console.Console()
    if not console.is_terminal:  # a log or the device's output: wide enough that rows stay on one line
        console.width = 160
    console.print(table)


def _progress(items: list, total: int):
    """``items`` with a tqdm progress bar on stderr where tqdm is installed."""
    try:
        import tqdm
    except ImportError:
        return items
    return tqdm.tqdm(items, total=total, unit="row", file=sys.stderr)


def _row_line(row: dict) -> str:
    if row["status"] != "ok":
        return f"{row['shape']:24s} {row['mode']:5s} {row.get('layout', 'nchw'):13s} {row['status']}  <<<<<<<<<<"
    host = "/".join(_us(row["host_us"][name]) for name in HOST_APIS)
    tuned = (f"  untuned {row['untuned_ms']:8.3f} ms, tuned in {row['tuning_ms']:.0f} ms: {row['tuned_plan']}"
             if "tuning_ms" in row else "")
    return (f"{row['shape']:24s} {row['mode']:5s} {row.get('layout', 'nchw'):13s} torch "
            f"{row['torch_ms']:8.3f} ms ({row.get('torch_layout', 'nchw')})  cupyconv {row['cupyconv_ms']:8.3f} ms"
            f"  {row['speedup']:5.2f}x  {row['tflops']:6.1f} TFLOP/s  {100 * row['roofline']:3.0f}% of roofline"
            f" ({row['bound']})  host us {host}  {row['kernel']}{tuned}")


def _gpu_missing() -> str | None:
    """Why the benchmark cannot run here (no torch, CuPy or CUDA GPU), or None when it can."""
    try:
        import cupy
        import torch
    except ImportError as error:
        return f"cupyconv.bench needs torch and CuPy: {error}"
    if not torch.cuda.is_available():
        return f"cupyconv.bench needs a CUDA GPU; torch {torch.__version__} sees none"
    try:
        cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as error:
        return f"cupyconv.bench needs a CUDA GPU; CuPy sees none ({error})"
    return None


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.suite == "models":
        from . import bench_models

        return bench_models.main(args)
    if args.suite == "transposed" or args.passes != ["fwd"]:
        from . import bench_grad

        status = bench_grad.main(args)
        if args.suite == "transposed" or "fwd" not in args.passes:
            return status
    missing = _gpu_missing()
    if missing:
        print(missing, file=sys.stderr)
        return 2
    import torch

    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    if args.autotune:
        # A cache of this run's own: every row is tuned (and its cost measured) here, never read from an
        # earlier run's winners. Removed at exit.
        cache_dir = tempfile.TemporaryDirectory(prefix="cupyconv-autotune-")
        os.environ[DIRECTORY_VARIABLE] = cache_dir.name
    runner = _Runner(args.repeats, args.quick, args.autotune)
    results = {"meta": {**_meta(args), "ceilings": runner.ceilings}, "rows": []}
    print("ceilings: " + ", ".join(f"{k} {v:.1f}" for k, v in runner.ceilings.items()), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    layouts = args.layouts[args.modes[0]]
    stem = args.out / (f"{args.suite}_{'-'.join(args.modes)}{'_' + '-'.join(layouts) if layouts != ['nchw'] else ''}"
                       f"{'_autotune' if args.autotune else ''}{'_quick' if args.quick else ''}")
    cases = [(shape, mode, layout) for shape in SUITES[args.suite] for mode in args.modes for layout in layouts]
    progress = _progress(cases, len(cases))
    for shape, mode, layout in progress:
        row = runner.row(shape, mode, layout)
        results["rows"].append(row)
        (progress.write if hasattr(progress, "write") else print)(_row_line(row))
        # Written after every row: a run stopped at the device's time limit keeps what it measured.
        stem.with_suffix(".json").write_text(json.dumps(results, indent=1))
        torch.cuda.empty_cache()
    stem.with_suffix(".md").write_text(to_markdown(results))
    _chart(results, stem.with_suffix(".png"))
    print()
    print_table(results)
    print(f"\nwrote {stem}.json, .md and .png", flush=True)
    return 1 if any(r["status"] != "ok" for r in results["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
