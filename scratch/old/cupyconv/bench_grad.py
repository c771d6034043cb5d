"""Benchmark of the backward passes and of transposed convolution against torch, in the same process.

    python -m cupyconv.bench --suite layers --pass dgrad --pass wgrad --dtype fp32 --dtype fp16
    python -m cupyconv.bench --suite transposed --dtype fp16 --layout channels_last

``--pass dgrad``: cupyconv.grad's input gradient (a transposed convolution, one forward convolution
per stride phase) against torch.nn.grad.conv2d_input; ``--pass wgrad``: the weight gradient
(kernels/wgrad_gemm.cu) against torch.nn.grad.conv2d_weight (cuDNN's backward-filter); ``--suite
transposed``: conv_transpose2d against F.conv_transpose2d on DCGAN and U-Net decoder layers. As in
cupyconv.bench: correctness against float64 first (a wrong result is WRONG and not timed), then GPU
time by CUDA events behind a spin, cupyconv and torch alternating, torch in both of its layouts and
the speed-up over its faster one. cupyconv runs on torch's current stream through zero-copy CuPy
views; its temporaries come from CuPy's pool.
"""
from __future__ import annotations

import json
import math
import sys

from .bench import (MODE_DTYPE, SUITES, Shape, _gpu_missing, _meta, _progress, _Runner, alternating_ms,
                    error_bound, error_status, markdown, relative_error)

PASSES = ("fwd", "dgrad", "wgrad")

#: Transposed convolutions: (name, n, c_in, c_out, h, w, k, stride, padding, output_padding).
TRANSPOSED = (
    ("dcgan_g1_100to512_4x4", 128, 100, 512, 1, 1, 4, 1, 0, 0),
    ("dcgan_g2_512to256_s2", 128, 512, 256, 4, 4, 4, 2, 1, 0),
    ("dcgan_g3_256to128_s2", 128, 256, 128, 8, 8, 4, 2, 1, 0),
    ("dcgan_g4_128to64_s2", 128, 128, 64, 16, 16, 4, 2, 1, 0),
    ("dcgan_g5_64to3_s2", 128, 64, 3, 32, 32, 4, 2, 1, 0),
    ("unet_up_1024to512_2x2", 16, 1024, 512, 28, 28, 2, 2, 0, 0),
    ("unet_up_256to128_2x2", 16, 256, 128, 112, 112, 2, 2, 0, 0),
    ("decoder_3x3s2_op1_256to128", 16, 256, 128, 56, 56, 3, 2, 1, 1),
    ("decoder_3x3s2_op1_64to32", 16, 64, 32, 112, 112, 3, 2, 1, 1),
)


def add_arguments(parser) -> None:
    """This benchmark's options, on cupyconv.bench's parser."""
    parser.add_argument("--pass", action="append", choices=PASSES + ("all",), dest="passes",
                        help="layer suites: the forward (default), the input gradient (dgrad) or the weight "
                             "gradient (wgrad); repeatable")


def check_args(parser, args) -> None:
    """Resolve ``args.passes`` (default: the forward alone); refuse --pass on the models suite."""
    passes = args.passes or ["fwd"]
    if args.suite == "models" and args.passes:
        parser.error("--pass: for the layer suites only")
    args.passes = list(PASSES) if "all" in passes else list(dict.fromkeys(passes))


class _GradRunner(_Runner):
    """Holds torch, cupy and the measured ceilings (cupyconv.bench's), and times one (shape, mode,
    layout, pass) row."""

    def _view(self, t, layout: str):
        """A zero-copy CuPy array of ``t`` in ``layout`` (bfloat16 as its int16 bits)."""
        torch = self.torch
        if t is None:
            return None
        if t.dim() == 4 and layout == "channels_last":
            t = t.permute(0, 2, 3, 1)
        return self.cupy.from_dlpack(t.view(torch.int16) if t.dtype == torch.bfloat16 else t)

    def _back(self, array, like, layout: str):
        """The CuPy result ``array`` (in ``layout``) as a torch tensor of ``like``'s dtype, logical (NCHW) order."""
        torch = self.torch
        t = torch.from_dlpack(array)
        if like.dtype == torch.bfloat16:
            t = t.view(torch.bfloat16)
        return t.permute(0, 3, 1, 2) if layout == "channels_last" else t

    def _time(self, row: dict, ours, torch_fns: dict, flops: int, check) -> dict:
        """Check ``ours`` with ``check`` (error, torch error), then time it against ``torch_fns`` (by layout)."""
        err, torch_err = check()
        row.update(error=err, torch_error=torch_err)
        wrong = error_status(err, error_bound(row["mode"], torch_err))
        if wrong:
            row["status"] = wrong
            return row
        times = alternating_ms({"cupyconv": ours, **torch_fns}, self.repeats)
        torch_layout = min(torch_fns, key=lambda name: times[name][0])
        row.update(status="ok", torch_ms=times[torch_layout][0], torch_layout=torch_layout,
                   cupyconv_ms=times["cupyconv"][0], speedup=times[torch_layout][0] / times["cupyconv"][0],
                   tflops=flops / times["cupyconv"][0] / 1e9,
                   torch_tflops=flops / times[torch_layout][0] / 1e9,
                   **{f"torch_{name}_ms": times[name][0] for name in torch_fns})
        row["compute_fraction"] = row["tflops"] / self.ceilings[row["mode"]]
        return row

    def grad_row(self, shape: Shape, mode: str, layout: str, which: str) -> dict:
        """dgrad or wgrad of a layer."""
        from .grad import input_gradient, weight_gradient

        torch, cupy = self.torch, self.cupy
        torch_dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[MODE_DTYPE[mode]]
        allow_tf32 = mode == "tf32"
        torch.backends.cudnn.allow_tf32 = allow_tf32
        problem = shape.problem(MODE_DTYPE[mode], layout)
        row = {"shape": shape.name, "mode": mode, "layout": layout, "pass": which}
        if which == "wgrad":
            from . import wgrad_tensor_cores

            why_not = wgrad_tensor_cores.refusal(problem, allow_tf32)
            row["kernel"] = "wgrad tensor cores" if not why_not else f"wgrad FMA ({why_not})"
        make = lambda *s: torch.randn(*s, device="cuda", dtype=torch.float32).to(torch_dtype)
        x = make(shape.n, shape.c, shape.h, shape.w)
        w = make(shape.k, shape.c // shape.groups, shape.kh, shape.kw)
        dy = make(*problem.out_shape)
        by_layout = {"nchw": (x, w, dy), "channels_last": tuple(t.to(memory_format=torch.channels_last)
                                                                  for t in (x, w, dy))}
        xs, ws, dys = by_layout[layout]
        xv, wv, dyv = (self._view(t, layout) for t in (xs, ws, dys))
        stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
        args = (shape.stride, shape.padding, shape.dilation, shape.groups)
        up = lambda t: t.double()

        if which == "dgrad":
            def ours():
                with stream:
                    return input_gradient(problem, wv, dyv, "cupy", allow_tf32)

            def check():
                sample = [0, shape.n - 1]
                ref = torch.nn.grad.conv2d_input((2, *x.shape[1:]), up(w), up(dy[sample]), *args)
                got = self._back(ours(), x, layout)[sample]
                mine = torch.nn.grad.conv2d_input((2, *x.shape[1:]), w, dy[sample], *args)
                return relative_error(got, ref), relative_error(mine, ref)

            torch_fns = {name: (lambda t=t: torch.nn.grad.conv2d_input(x.shape, t[1], t[2], *args))
                         for name, t in by_layout.items()}
        else:
            def ours():
                with stream:
                    return weight_gradient(problem, xv, dyv, "cupy", allow_tf32)

            def check():
                ref = torch.nn.grad.conv2d_weight(up(x), w.shape, up(dy), *args)
                got = self._back(ours(), w, layout)
                mine = torch.nn.grad.conv2d_weight(x, w.shape, dy, *args)
                return relative_error(got, ref), relative_error(mine, ref)

            torch_fns = {name: (lambda t=t: torch.nn.grad.conv2d_weight(t[0], w.shape, t[2], *args))
                         for name, t in by_layout.items()}
        return self._time(row, ours, torch_fns, problem.flops, check)

    def transposed_row(self, case: tuple, mode: str, layout: str) -> dict:
        """conv_transpose2d of one TRANSPOSED layer."""
        from .conv_transpose import make_transpose_problem, transposed

        torch, cupy = self.torch, self.cupy
        F = torch.nn.functional
        name, n, c_in, c_out, h, w_, k, stride, padding, output_padding = case
        torch_dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[MODE_DTYPE[mode]]
        allow_tf32 = mode == "tf32"
        torch.backends.cudnn.allow_tf32 = allow_tf32
        make = lambda *s: torch.randn(*s, device="cuda", dtype=torch.float32).to(torch_dtype)
        x, w, b = make(n, c_in, h, w_), make(c_in, c_out, k, k), make(c_out)
        by_layout = {"nchw": (x, w), "channels_last": tuple(t.to(memory_format=torch.channels_last) for t in (x, w))}
        xs, ws = by_layout[layout]
        nhwc = layout == "channels_last"
        tp = make_transpose_problem(tuple(xs.permute(0, 2, 3, 1).shape) if nhwc else tuple(xs.shape),
                                    tuple(ws.permute(0, 2, 3, 1).shape) if nhwc else tuple(ws.shape), (c_out,),
                                    MODE_DTYPE[mode], stride, padding, output_padding, 1, 1,
                                    "NHWC" if nhwc else "NCHW", "KHWC" if nhwc else "KCHW")
        xv, wv, bv = self._view(xs, layout), self._view(ws, layout), self._view(b, layout)
        stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
        row = {"shape": name, "mode": mode, "layout": layout, "pass": "transposed"}
        args = (stride, padding, output_padding)

        def ours():
            with stream:
                return transposed(xv, wv, bv, tp, "cupy", allow_tf32)

        def check():
            up = lambda t: t.double()
            ref = F.conv_transpose2d(up(x), up(w), up(b), *args)
            mine = F.conv_transpose2d(x, w, b, *args)
            return relative_error(self._back(ours(), x, layout), ref), relative_error(mine, ref)

        flops = 2 * n * c_in * h * w_ * c_out * k * k
        torch_fns = {name_: (lambda t=t: F.conv_transpose2d(t[0], t[1], b, *args)) for name_, t in by_layout.items()}
        return self._time(row, ours, torch_fns, flops, check)


def table(results: dict) -> str:
    cells = [["layer", "pass", "mode", "layout", "torch NCHW ms", "torch CL ms", "cupyconv ms",
              "speed-up (torch's faster)", "TFLOP/s", "% of matrix/FMA rate", "torch TFLOP/s", "error",
              "torch error"]]
    for r in results["rows"]:
        layout = "CL" if r["layout"] == "channels_last" else "NCHW"
        if r["status"] != "ok":
            cells.append([r["shape"], r["pass"], r["mode"], layout, "", "", "", r["status"], "", "", "", "", ""])
            continue
        cells.append([r["shape"], r["pass"], r["mode"], layout, f"{r['torch_nchw_ms']:.3f}",
                      f"{r['torch_channels_last_ms']:.3f}", f"{r['cupyconv_ms']:.3f}", f"{r['speedup']:.2f}x",
                      f"{r['tflops']:.1f}", f"{100 * r['compute_fraction']:.0f}%", f"{r['torch_tflops']:.1f}",
                      f"{r['error']:.1e}", f"{r['torch_error']:.1e}"])
    speedups = {}
    for r in results["rows"]:
        if r["status"] == "ok":
            speedups.setdefault((r["pass"], r["mode"], r["layout"]), []).append(r["speedup"])
    notes = [f"geomean {p} {m} {l}: {math.exp(sum(map(math.log, s)) / len(s)):.2f}x over {len(s)} rows, "
             f"slowest {min(s):.2f}x" for (p, m, l), s in speedups.items()]
    return markdown(results["meta"], cells, notes)


def main(args) -> int:
    missing = _gpu_missing()
    if missing:
        print(missing, file=sys.stderr)
        return 2
    import torch

    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    runner = _GradRunner(args.repeats, args.quick)
    results = {"meta": {**_meta(args), "passes": args.passes, "ceilings": runner.ceilings}, "rows": []}
    print("ceilings: " + ", ".join(f"{k} {v:.1f}" for k, v in runner.ceilings.items()), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    layouts = args.layouts[args.modes[0]]
    transposed_suite = args.suite == "transposed"
    passes = ["transposed"] if transposed_suite else [p for p in args.passes if p != "fwd"]
    stem = args.out / (f"{args.suite}_{'-'.join(passes)}_{'-'.join(args.modes)}"
                       f"{'_' + '-'.join(layouts) if layouts != ['nchw'] else ''}{'_quick' if args.quick else ''}")
    shapes = TRANSPOSED if transposed_suite else SUITES[args.suite]
    cases = [(shape, mode, layout, which) for which in passes for shape in shapes for mode in args.modes
             for layout in layouts]
    for shape, mode, layout, which in _progress(cases, len(cases)):
        try:
            row = (runner.transposed_row(shape, mode, layout) if transposed_suite
                   else runner.grad_row(shape, mode, layout, which))
        except Exception as error:  # one failing row must not lose the others' figures
            row = {"shape": shape[0] if transposed_suite else shape.name, "mode": mode, "layout": layout,
                   "pass": which, "status": f"ERROR {type(error).__name__}: {error}"}
        results["rows"].append(row)
        line = (f"{row['shape']:28s} {row['pass']:10s} {mode:5s} {layout:13s} "
                + (f"torch {row['torch_ms']:8.3f} ({row['torch_layout']})  cupyconv {row['cupyconv_ms']:8.3f}  "
                   f"{row['speedup']:5.2f}x" if row["status"] == "ok" else row["status"]))
        print(line, flush=True)
        stem.with_suffix(".json").write_text(json.dumps(results, indent=1))
        torch.cuda.empty_cache()
    text = table(results)
    stem.with_suffix(".md").write_text(text)
    print("\n" + text, flush=True)
    return 1 if any(r["status"] != "ok" for r in results["rows"]) else 0

