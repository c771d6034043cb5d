"""The benchmark's tables, arithmetic and command line, without a GPU."""
import contextlib
import os
import subprocess
import sys
import types

import numpy as np
import pytest

from cupyconv import bench


def test_suites_are_valid_distinct_and_hold_the_seeds():
    for shape in bench.SUITES["all"]:
        for dtype in ("float32", "float16", "bfloat16"):
            shape.problem(dtype)  # raises on an invalid shape
    keys = [(s.n, s.c, s.k, s.h, s.w, s.kh, s.kw, s.stride, s.padding, s.dilation, s.groups) for s in bench.SUITES["all"]]
    assert len(keys) == len(set(keys)), "duplicate shapes"
    alexnet, wide = bench.SEEDS
    assert alexnet.problem("float32").out_shape == (256, 96, 55, 55) and alexnet.bias
    assert wide.problem("float32").out_shape == (8, 64, 508, 504) and not wide.bias
    layers = bench.SUITES["layers"]
    assert any(s.groups == s.c > 1 for s in layers) and any(s.kh == s.kw == 1 for s in layers)
    assert any(s.dilation > 1 for s in layers) and any(s.stride == 2 for s in layers)


def test_bytes_and_flops():
    p = bench.SEEDS[0].problem("float32")
    assert p.flops == 2 * 256 * 96 * 55 * 55 * 3 * 121
    assert bench.bytes_moved(p) == 4 * (256 * 3 * 224 * 224 + 96 * 3 * 121 + 256 * 96 * 55 * 55 + 96)
    assert bench.bytes_moved(bench.SEEDS[0].problem("bfloat16")) * 2 == bench.bytes_moved(p)


RESULTS = {"meta": {"gpu": "H100", "torch": "2", "cudnn": 9, "cupy": "14", "layout": "nchw",
                    "cudnn_benchmark": False, "date": "today", "commit": "abc1234", "dirty": False},
           "rows": [{"shape": "s", "mode": "fp32", "kernel": "direct_conv2d", "status": "ok", "torch_ms": 2.0,
                     "torch_nchw_ms": 2.0, "torch_channels_last_ms": 3.0, "layout": "nchw",
                     "cupyconv_ms": 1.0, "speedup": 2.0, "tflops": 10.0, "compute_fraction": 0.2,
                     "gbps": 100.0, "bandwidth_fraction": 0.03, "bound": "compute", "roofline": 0.2,
                     "host_us": {"torch": 19.7, "cupyconv": 159.2, "cupyconv_torch": 289.0}},
                    {"shape": "u", "mode": "bf16", "kernel": "implicit_gemm_nhwc", "status": "ok", "torch_ms": 1.0,
                     "cupyconv_ms": 1.0, "speedup": 1.0, "tflops": 10.0, "compute_fraction": 0.2,
                     "gbps": 100.0, "bandwidth_fraction": 0.03,
                     "host_us": {"torch": 20.0, "cupyconv": None, "cupyconv_torch": 300.0}},
                    {"shape": "t", "mode": "fp16", "kernel": "x", "status": "WRONG (error 1)"}]}


def test_markdown_names_the_commit_and_marks_wrong_rows():
    text = bench.to_markdown(RESULTS)
    assert "commit: abc1234" in text and "| s | fp32 | NCHW | direct_conv2d | 2.000 | 3.000 | 1.000 | 2.00x | 20 | 159 | 289 |" in text
    assert "| 1.00x | 20 | n/a | 300 |" in text  # no public CuPy call in bf16
    assert "WRONG (error 1)" in text
    table = [line for line in text.splitlines() if line.startswith("|")]
    assert len({line.count("|") for line in table}) == 1, "every markdown row has as many cells as the header"
    assert len(table) == 2 + len(RESULTS["rows"])
    assert "| 10.0 | 20% | 100 | 3% | 20% (compute) |" in text
    assert "| 10.0 | 20% | 100 | 3% |  |" in text  # a row from before the roofline column


def test_roofline_binds_at_the_slower_limit():
    ceilings = {"fp16": 500.0, "fp32": 50.0, "bandwidth_gbps": 3000.0}  # TFLOP/s and GB/s
    pointwise = bench.LARGE[0].problem("float16")  # 1x1, 64 -> 64: 128 FLOP per 256 bytes moved
    memory_ms = bench.bytes_moved(pointwise) / 3000.0 / 1e6
    limits = bench.roofline(pointwise, "fp16", 2 * memory_ms, ceilings)
    assert (limits["bound"], limits["roofline"]) == ("memory", pytest.approx(0.5))
    assert limits["bandwidth_fraction"] == limits["roofline"] > limits["compute_fraction"]
    big = bench.LARGE[7].problem("float16")  # 3x3, 512 -> 512
    compute_ms = big.flops / 500.0 / 1e9
    limits = bench.roofline(big, "fp16", compute_ms / 0.6, ceilings)
    assert (limits["bound"], limits["roofline"]) == ("compute", pytest.approx(0.6))
    assert limits["compute_fraction"] == limits["roofline"] > limits["bandwidth_fraction"]


def test_large_suite_is_what_issue_15_asks_for():
    large = bench.SUITES["large"]
    for shape in large:
        shape.problem("float16")
    memory = [s for s in large if s.kh == s.kw == 1 or s.groups == s.c > 1]
    assert all(bench.bytes_moved(s.problem("float16")) >= 64e6 for s in memory)
    assert any(s.groups > 1 for s in memory) and any(s.kh == 1 for s in memory)
    compute = [s.problem("float16") for s in large if s not in memory]
    assert {p.kh for p in compute} == {3, 5, 7}
    assert all(p.flops >= 10e9 and 64 <= p.c <= 512 for p in compute)


def test_conv1d_suite_rows_are_what_conv1d_plans():
    """Each row is the height-1 problem cupyconv.conv1d makes of its 1-D layer: one row of taps, no
    stride, padding or dilation along the height, and torch's conv1d output length."""
    from cupyconv.conv1d import _single

    for shape in bench.SUITES["conv1d"]:
        p = shape.problem("float16")
        assert (p.h, p.kh, p.ho, p.stride[0], p.dilation[0], p.pad_top, p.pad_bottom) == (1, 1, 1, 1, 1, 0, 0)
        s, pad, d = p.stride[1], p.pad_left, p.dilation[1]
        assert p.pad_right == pad and p.stride == _single(s, "stride") and p.dilation == _single(d, "dilation")
        assert (p.pad_top, p.pad_left) == _single(pad, "padding")
        assert p.wo == (shape.w + 2 * pad - d * (shape.kw - 1) - 1) // s + 1
    kinds = bench.SUITES["conv1d"]
    assert any(s.groups == s.c > 1 for s in kinds) and any(s.kw == 1 for s in kinds) and any(s.c < 8 for s in kinds)


def test_autotune_columns_report_the_untuned_time_the_tuning_cost_and_the_plan(capsys):
    tuned = {**RESULTS["rows"][0], "untuned_ms": 1.25, "tuning_ms": 431.7, "untuned_kernel": "direct_conv2d",
             "tuned_plan": "simt_gemm_conv2d simt_m64n64 split-K 4", "autotune_speedup": 1.25}
    results = {"meta": {**RESULTS["meta"], "autotune": True}, "rows": [tuned, RESULTS["rows"][2]]}
    text = bench.to_markdown(results)
    assert "cupyconv autotune on" in text and "| untuned ms | tuning ms | tuned plan |" in text
    assert "| 1.250 | 432 | simt_gemm_conv2d simt_m64n64 split-K 4 |" in text
    table = [line for line in text.splitlines() if line.startswith("|")]
    assert len({line.count("|") for line in table}) == 1, "every markdown row has as many cells as the header"
    assert "autotune" not in bench.to_markdown(RESULTS)  # runs without it read as before
    line = bench._row_line(tuned)
    assert "untuned    1.250 ms, tuned in 432 ms: simt_gemm_conv2d simt_m64n64 split-K 4" in line
    bench.print_table(results)
    assert "simt_m64n64" in capsys.readouterr().out


def test_console_table_and_chart(tmp_path, capsys):
    bench.print_table(RESULTS)
    out = capsys.readouterr().out
    assert "abc1234" in out and "2.00x" in out and "WRONG (error 1)" in out
    pytest.importorskip("matplotlib")
    bench._chart(RESULTS, tmp_path / "chart.png")
    assert (tmp_path / "chart.png").read_bytes()[:4] == b"\x89PNG"


class _FakeCuda:
    """torch.cuda as alternating_ms uses it: each 'GPU' interval is what the callable under test says."""

    def __init__(self):
        self.clock, self.sleeps = 0.0, 0
        fake = self

        class Event:
            def __init__(self, enable_timing):
                assert enable_timing

            def record(self):
                self.at = fake.clock

            def elapsed_time(self, end):
                return end.at - self.at

        self.Event = Event

    def _sleep(self, cycles):
        assert cycles > 0
        self.sleeps += 1

    def synchronize(self):
        pass


def test_alternating_ms_interleaves_and_takes_medians(monkeypatch):
    cuda = _FakeCuda()
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    calls = []

    def launch(name, ms):
        def fn():
            calls.append(name)
            cuda.clock += ms
        return fn

    times = bench.alternating_ms({"a": launch("a", 1.0), "b": launch("b", 3.0)}, repeats=4, warmup=2)
    assert times["a"][0] == 1.0 and times["b"][0] == 3.0 and times["a"][1] >= 0
    assert calls[:4] == ["a", "b", "a", "b"]  # warm-up
    assert calls[4:] == ["a", "b", "b", "a", "a", "b", "b", "a"]  # the order flips every run
    assert cuda.sleeps == 8  # the GPU is kept busy before every timed run
    assert bench.median_ms(launch("c", 2.0), repeats=3) == 2.0


def test_alternating_loop_ms_times_loops_of_calls(monkeypatch):
    cuda = _FakeCuda()
    clock = types.SimpleNamespace(now=0.0)
    cuda.synchronize = lambda: setattr(clock, "now", clock.now + 1.0)  # waiting for the GPU: 1 s
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    monkeypatch.setattr(bench, "time", types.SimpleNamespace(perf_counter=lambda: clock.now))
    calls, cycles = [], []
    cuda._sleep = cycles.append

    def host(name, seconds):
        def fn():
            calls.append(name)
            clock.now += seconds
        return fn

    fns = {"a": host("a", 0.001), "b": host("b", 0.003)}
    busy = bench.alternating_loop_ms(fns, calls=4, loops=3, warmup=1, gpu_busy=True)
    assert busy == pytest.approx({"a": 1.0, "b": 3.0})  # the host's cost alone: the wait is outside the clock
    assert cycles == [4 * bench.QUEUE_AHEAD_CYCLES] * 6  # a spin per loop, 1 ms-ish per call
    assert calls[2:] == ["a"] * 4 + ["b"] * 8 + ["a"] * 8 + ["b"] * 4  # alternating loop by loop
    wall = bench.alternating_loop_ms(fns, calls=4, loops=3, warmup=1)
    assert wall == pytest.approx({"a": 1.0 + 250.0, "b": 3.0 + 250.0})  # a user's loop waits at its end
    assert len(cycles) == 6  # no spin without gpu_busy


def test_host_cost_calls_each_public_way_in(monkeypatch):
    # On the CPU the public calls run NumPy's and torch's paths: what is checked is the wiring (every
    # argument reaches every call, out= is written, no public CuPy call in bf16), not the times.
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    runner = object.__new__(bench._Runner)  # no ceilings measured
    runner.torch = torch
    args = (2, 1, 1, 2)  # stride, padding, dilation, groups
    x, w, b = torch.randn(2, 4, 9, 9), torch.randn(6, 2, 3, 3), torch.randn(6)
    out = np.full((2, 6, 5, 5), np.nan, dtype=np.float32)
    host = runner._host_us((x, w, b), (x.numpy(), w.numpy(), b.numpy(), out), args, False, contextlib.nullcontext())
    assert set(host) == set(bench.HOST_APIS) and all(us > 0 for us in host.values())
    np.testing.assert_allclose(out, torch.nn.functional.conv2d(x, w, b, *args).numpy(), rtol=1e-5, atol=1e-5)
    x16, w16, b16 = (t.to(torch.bfloat16) for t in (x, w, b))
    host = runner._host_us((x16, w16, b16), (None, None, None, None), args, False, contextlib.nullcontext())
    assert host["cupyconv"] is None and host["torch"] > 0 and host["cupyconv_torch"] > 0


def test_error_bounds():
    assert bench.error_bound("fp32", 1.0) == bench.MODE_FLOOR["fp32"]  # strict fp32: absolute
    assert bench.error_bound("fp16", 1.0) == 2.0 and bench.error_bound("fp16", 0.0) == bench.MODE_FLOOR["fp16"]
    assert bench.error_status(1e-6, 1e-5) is None
    assert bench.error_status(2e-5, 1e-5) == "WRONG (error 2.00e-05 > 1.0e-05)"
    assert bench.error_status(float("nan"), 1.0).startswith("WRONG")


def test_command_line():
    args = bench.parse_args(["--suite", "layers", "--dtype", "fp16", "--dtype", "bf16"])
    assert args.suite == "layers" and args.modes == ["fp16", "bf16"]
    assert bench.parse_args(["--dtype", "all"]).modes == list(bench.MODES)
    assert bench.parse_args([]).repeats == bench.REPEATS
    with pytest.raises(SystemExit):
        bench.parse_args(["--repeats", "5"])
    quick = bench.parse_args(["--quick"])
    assert quick.quick and quick.repeats == bench.QUICK_REPEATS
    assert bench.parse_args(["--quick", "--repeats", "7"]).repeats == 7
    assert str(bench.parse_args(["--out", "/tmp/x"]).out) == "/tmp/x"
    assert bench.parse_args(["--dtype", "fp16"]).layouts == {"fp16": ["nchw"]}
    both = bench.parse_args(["--suite", "layers", "--dtype", "fp16", "--layout", "nchw", "--layout", "channels_last"])
    assert both.layouts == {"fp16": ["nchw", "channels_last"]}
    with pytest.raises(SystemExit):  # models options on a layer suite
        bench.parse_args(["--suite", "layers", "--model", "resnet50"])
    assert bench.parse_args(["--suite", "layers", "--autotune"]).autotune and not bench.parse_args([]).autotune
    for other in (["--suite", "models"], ["--suite", "transposed"], ["--suite", "layers", "--pass", "dgrad"]):
        with pytest.raises(SystemExit):  # the layer suites' forward only
            bench.parse_args([*other, "--autotune"])


def test_importing_the_benchmark_imports_no_torch():
    code = "import sys, cupyconv, cupyconv.bench; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_without_a_gpu_it_says_so_and_fails_cleanly(tmp_path):
    # No GPU visible, also on a machine that has one: the test must never start a benchmark.
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run([sys.executable, "-m", "cupyconv.bench", "--suite", "seeds", "--quick",
                             "--out", str(tmp_path)], capture_output=True, text=True, env=env)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "needs" in result.stderr and ("GPU" in result.stderr or "torch" in result.stderr)
    assert not list(tmp_path.iterdir())
