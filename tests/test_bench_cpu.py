"""The benchmark's tables, arithmetic and command line, without a GPU."""
import subprocess
import sys

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


def test_markdown_names_the_commit_and_marks_wrong_rows():
    results = {"meta": {"gpu": "H100", "torch": "2", "cudnn": 9, "cupy": "14", "layout": "nchw",
                        "cudnn_benchmark": False, "date": "today", "commit": "abc1234", "dirty": False},
               "rows": [{"shape": "s", "mode": "fp32", "kernel": "direct_conv2d", "status": "ok", "torch_ms": 2.0,
                         "cupyconv_ms": 1.0, "speedup": 2.0, "tflops": 10.0, "compute_fraction": 0.2,
                         "gbps": 100.0, "bandwidth_fraction": 0.03},
                        {"shape": "t", "mode": "fp16", "kernel": "x", "status": "WRONG (error 1)"}]}
    text = bench.to_markdown(results)
    assert "commit: abc1234" in text and "| s | fp32 | direct_conv2d | 2.000 | 1.000 | 2.00x |" in text
    assert "WRONG (error 1)" in text


def test_command_line():
    args = bench.parse_args(["--suite", "layers", "--dtype", "fp16", "--dtype", "bf16"])
    assert args.suite == "layers" and args.modes == ["fp16", "bf16"]
    assert bench.parse_args(["--dtype", "all"]).modes == list(bench.MODES)
    with pytest.raises(SystemExit):
        bench.parse_args(["--repeats", "5"])


def test_without_a_gpu_it_says_so_and_fails_cleanly():
    result = subprocess.run([sys.executable, "-m", "cupyconv.bench", "--suite", "seeds"], capture_output=True, text=True)
    if result.returncode == 0:
        pytest.skip("a GPU is present")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "GPU" in result.stderr or "needs" in result.stderr
