"""The gradient and transposed-convolution benchmark's command line, suite and table, without a GPU."""
import pytest

from cupyconv import bench, bench_grad
from cupyconv.conv_transpose import make_transpose_problem

META = {"gpu": "H100", "torch": "2", "cudnn": 9, "cupy": "14", "layout": "nchw", "cudnn_benchmark": False,
        "date": "today", "commit": "abc1234", "dirty": False}


def test_pass_options():
    args = bench.parse_args(["--suite", "layers", "--pass", "dgrad", "--pass", "wgrad"])
    assert args.passes == ["dgrad", "wgrad"]
    assert bench.parse_args(["--suite", "layers", "--pass", "all"]).passes == list(bench_grad.PASSES)
    assert bench.parse_args(["--suite", "layers"]).passes == ["fwd"]
    assert bench.parse_args(["--suite", "transposed", "--dtype", "fp16"]).suite == "transposed"
    with pytest.raises(SystemExit):
        bench.parse_args(["--suite", "models", "--pass", "dgrad"])


def test_transposed_suite_is_valid():
    for name, n, c_in, c_out, h, w, k, stride, padding, output_padding in bench_grad.TRANSPOSED:
        tp = make_transpose_problem((n, c_in, h, w), (c_in, c_out, k, k), (c_out,), "float16", stride, padding,
                                    output_padding, 1, 1)
        assert tp.h >= h and tp.w >= w, name


def test_table_reports_geomeans_and_failures():
    ok = {"shape": "a", "pass": "dgrad", "mode": "fp32", "layout": "nchw", "status": "ok", "torch_nchw_ms": 2.0,
          "torch_channels_last_ms": 3.0, "cupyconv_ms": 1.0, "speedup": 2.0, "tflops": 10.0, "compute_fraction": 0.2,
          "torch_tflops": 5.0, "error": 1e-7, "torch_error": 2e-7}
    text = bench_grad.table({"meta": META, "rows": [ok, {**ok, "shape": "b", "speedup": 0.5},
                                                    {**ok, "shape": "c", "status": "WRONG (error 1)"}]})
    assert "geomean dgrad fp32 nchw: 1.00x over 2 rows, slowest 0.50x" in text
    assert "WRONG (error 1)" in text and "20%" in text
