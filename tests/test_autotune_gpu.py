"""Autotuning on the GPU (cupyconv/tuning.py): tuned conv2d results equal the untuned ones against
torch in float64 at the dtype's tolerance, for several families, dtypes and both layouts; the winner
is cached (a second call times nothing), a fresh process state and a fresh process read the cache
file; nothing is timed for bad input or inside a CUDA-graph capture. Outputs are poisoned with NaN
before each call."""
import dataclasses
import os
import pathlib
import subprocess
import sys

import pytest

import cupyconv
from cases import Case
from checks import relative_error
from cupyconv import tuning, tuning_cache

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("strict_torch_fp32")]
torch = pytest.importorskip("torch", reason="the GPU tests compare with torch")
F = torch.nn.functional
cupy = pytest.importorskip("cupy")

ROOT = pathlib.Path(__file__).resolve().parents[1]
TORCH_DTYPES = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
                "bfloat16": torch.bfloat16}
# Relative error floors against float64 (test_gpu_core.py's); 16-bit types may also reach twice torch's
# own error in the dtype. TF32: its products round to 10 mantissa bits (test_igemm_gpu.py's bound).
FLOOR = {"float64": 1e-12, "float32": 1e-5, "float16": 1e-3, "bfloat16": 8e-3, "tf32": 2e-3}


@pytest.fixture(autouse=True)
def timers(monkeypatch, tmp_path):
    """Autotuning on, with an empty memory and a cache file of the test's own; yields the problems a
    GpuTimer was made for (each a tuning, or an attempt at one)."""
    monkeypatch.setattr(tuning, "_PLANS", {})
    monkeypatch.setenv(tuning_cache.DIRECTORY_VARIABLE, str(tmp_path))
    made = []
    real = tuning.GpuTimer

    def counting(problem, device):
        made.append(problem)
        return real(problem, device)

    monkeypatch.setattr(tuning, "GpuTimer", counting)
    previous = cupyconv.autotune(False)
    cupyconv.autotune(True)  # a switch: no call signature checked before this test is remembered
    yield made
    cupyconv.autotune(False)
    cupyconv.autotune(previous)


def to_cupy(t):
    """Zero-copy CuPy view of a CUDA tensor; bfloat16 (which CuPy lacks) as its int16 bits."""
    return None if t is None else cupy.from_dlpack(t.view(torch.int16) if t.dtype == torch.bfloat16 else t)


def inputs(case: Case, dtype: str, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    make = lambda *shape: torch.randn(*shape, device="cuda", dtype=torch.float64, generator=g).to(TORCH_DTYPES[dtype])
    return (make(case.n, case.c, case.h, case.w), make(case.k, case.c // case.groups, case.kh, case.kw),
            make(case.k) if case.bias else None)


def run(x, weight, bias, case: Case, layout: str, allow_tf32: bool = False):
    """cupyconv on torch tensors (logical NCHW) in ``layout`` ("NCHW", or "NHWC" with a KHWC weight),
    into a NaN-poisoned output: the public conv2d, and for bfloat16 (no CuPy dtype) launch.conv2d_cupy,
    which plans the same way. Returns the output as a logical NCHW tensor."""
    from cupyconv.arguments import make_problem
    from cupyconv.launch import conv2d_cupy

    nhwc = layout == "NHWC"
    dtype = str(x.dtype).replace("torch.", "")
    problem = make_problem(x.shape, weight.shape, None if bias is None else bias.shape, dtype, case.stride,
                           case.padding, case.dilation, case.groups)
    if nhwc:
        problem = dataclasses.replace(problem, layout="NHWC", weight_layout="KHWC")
        x, weight = x.permute(0, 2, 3, 1).contiguous(), weight.permute(0, 2, 3, 1).contiguous()
    out = torch.full(problem.out_array_shape, float("nan"), device="cuda", dtype=x.dtype)
    if dtype == "bfloat16":
        conv2d_cupy(to_cupy(x), to_cupy(weight), to_cupy(bias), problem, to_cupy(out), allow_tf32=allow_tf32)
    else:
        cupyconv.conv2d(to_cupy(x), to_cupy(weight), to_cupy(bias), case.stride, case.padding, case.dilation,
                        case.groups, out=to_cupy(out), allow_tf32=allow_tf32, layout=layout,
                        weight_layout="KHWC" if nhwc else "KCHW")
    cupy.cuda.get_current_stream().synchronize()
    return out.permute(0, 3, 1, 2) if nhwc else out


#: (case, dtype, layout, TF32 allowed): the tensor-core GEMMs (split-K at batch 1), Winograd and the
#: FMA GEMM, TF32, depthwise kernels, the direct kernel in float64.
CASES = [
    (Case(1, 64, 64, 7, 7, 3, 3, padding=1), "float16", "NCHW", False),
    (Case(2, 32, 48, 12, 12, 3, 3, padding=1), "bfloat16", "NHWC", False),
    (Case(2, 64, 64, 12, 12, 3, 3, padding=1), "float32", "NCHW", False),
    (Case(2, 48, 64, 11, 13, 3, 3, padding=1), "float32", "NHWC", True),
    (Case(4, 64, 96, 9, 9, 1, 1), "float16", "NHWC", False),
    (Case(2, 32, 32, 28, 28, 3, 3, padding=1, groups=32), "float32", "NCHW", False),
    (Case(2, 32, 32, 14, 14, 3, 3, padding=1, groups=32), "float16", "NHWC", False),
    (Case(1, 4, 12, 13, 11, 5, 5, stride=2, padding=2), "float64", "NCHW", False),
]


@pytest.mark.parametrize("case,dtype,layout,tf32", CASES, ids=lambda v: getattr(v, "id", None))
def test_tuned_results_equal_untuned_ones_against_float64(case, dtype, layout, tf32, timers):
    x, weight, bias = inputs(case, dtype, seed=len(case.id))
    up = lambda t: None if t is None else t.double()
    conv = lambda *ts: F.conv2d(*ts, case.stride, case.padding, case.dilation, case.groups)
    ref = conv(up(x), up(weight), up(bias))
    allowed = FLOOR["tf32" if tf32 else dtype]
    if dtype in ("float16", "bfloat16"):
        allowed = max(allowed, 2 * relative_error(conv(x, weight, bias), ref))
    tuned = run(x, weight, bias, case, layout, tf32)
    assert len(timers) == 1, "the first call of the problem tunes it"
    cupyconv.autotune(False)
    untuned = run(x, weight, bias, case, layout, tf32)
    for name, out in (("tuned", tuned), ("untuned", untuned)):
        assert not out.isnan().any(), f"{name}: an output element was never written (or is NaN)"
        error = relative_error(out, ref)
        assert error <= allowed, f"{name} {dtype} relative error {error:.3g} > {allowed:.3g}"
    problem, = timers
    plan = tuning.choose_plan(problem, tf32, tuning.gpu(cupy.cuda.Device().id))  # from memory
    assert plan.tuning.startswith("picked "), plan.tuning
    assert len(timers) == 1


def test_the_winner_is_cached_and_a_second_call_times_nothing(timers):
    case = Case(2, 64, 64, 12, 12, 3, 3, padding=1)
    x, weight, bias = (to_cupy(t) for t in inputs(case, "float32"))
    first = cupyconv.conv2d(x, weight, bias, padding=1)
    assert len(timers) == 1
    plan = cupyconv.plan(x, weight, bias, padding=1)
    assert plan.tuning.startswith("picked ") and "(from the cache file)" not in plan.tuning
    strided = cupy.empty((2, 64, 12, 24), dtype=x.dtype)[..., ::2]  # another call signature, the same problem
    strided[...] = x
    second = cupyconv.conv2d(strided, weight, bias, padding=1)
    cupyconv.autotune(False)
    cupyconv.autotune(True)  # every signature forgotten: planned again, from the tuned plans in memory
    third = cupyconv.conv2d(x, weight, bias, padding=1)
    assert len(timers) == 1, "a problem seen before was timed again"
    assert cupy.array_equal(first, second) and cupy.array_equal(first, third)  # one plan, the same bits
    assert cupyconv.plan(x, weight, bias, padding=1) is plan


def test_a_fresh_state_reads_the_cache_file(timers, monkeypatch, tmp_path):
    case = Case(1, 64, 64, 7, 7, 3, 3, padding=1)
    x, weight, bias = (to_cupy(t) for t in inputs(case, "float16"))
    tuned = cupyconv.plan(x, weight, bias, padding=1)
    assert len(timers) == 1 and (tmp_path / "autotune.json").is_file()
    monkeypatch.setattr(tuning, "_PLANS", {})  # this process forgets ...
    cupyconv.autotune(False)
    cupyconv.autotune(True)
    y = cupyconv.conv2d(x, weight, bias, padding=1)
    again = cupyconv.plan(x, weight, bias, padding=1)
    assert len(timers) == 1, "the cache file was not read"
    assert tuning._identity(again) == tuning._identity(tuned) and again.tuning.endswith("(from the cache file)")
    assert not cupy.isnan(y).any()
    # ... and so does another process, with the same cache directory.
    code = ("import cupy, cupyconv; cupyconv.autotune(True); "
            "x = cupy.ones((1, 64, 7, 7), cupy.float16); w = cupy.ones((64, 64, 3, 3), cupy.float16); "
            "b = cupy.ones(64, cupy.float16); print(cupyconv.plan(x, w, b, padding=1).tuning)")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                            env={**os.environ, tuning_cache.DIRECTORY_VARIABLE: str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == again.tuning


def test_bad_input_raises_before_anything_is_timed(timers):
    x, weight = cupy.ones((1, 3, 9, 9), cupy.float32), cupy.ones((8, 4, 3, 3), cupy.float32)
    with pytest.raises(ValueError, match="channels"):
        cupyconv.conv2d(x, weight)
    with pytest.raises(ValueError, match="channels"):
        cupyconv.plan(x, weight)
    with pytest.raises(ValueError, match="out"):
        cupyconv.conv2d(x, cupy.ones((8, 3, 3, 3), cupy.float32), out=cupy.empty((1, 8, 9, 9), cupy.float32))
    assert timers == []


def test_nothing_is_timed_inside_a_graph_capture(timers):
    """Autotuning switched on after a warm-up: a torch CUDA-graph capture of a problem not tuned yet runs
    the fixed rules' plan (timing would break the capture), keeps nothing, and replays correctly."""
    from cupyconv.torch import conv2d

    case = Case(2, 32, 64, 10, 10, 3, 3, padding=1)
    x, weight, bias = inputs(case, "float16")
    cupyconv.autotune(False)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: the fixed rules' kernels compiled outside the capture
        conv2d(x, weight, bias, padding=1)
    torch.cuda.current_stream().wait_stream(side)
    cupyconv.autotune(True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = conv2d(x, weight, bias, padding=1)
    assert len(timers) == 1 and tuning._PLANS == {}, "tuned inside the capture"
    y.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    ref = F.conv2d(x.double(), weight.double(), bias.double(), padding=1)
    allowed = max(FLOOR["float16"], 2 * relative_error(F.conv2d(x, weight, bias, padding=1), ref))
    assert relative_error(y, ref) <= allowed
