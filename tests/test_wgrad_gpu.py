"""The weight gradient (cupyconv.wgrad, kernels/wgrad_gemm.cu) against torch.nn.grad.conv2d_weight in float64,
on the GPU.

Fresh random inputs (never zeros), the output poisoned with NaN before every launch: every dtype at its
tolerance (float64 1e-12, strict float32 1e-5, float16/bfloat16 within 4x torch's own error in that dtype
plus a small floor), NCHW and NHWC inputs with KCHW and KHWC weights, groups, depthwise, channel
multipliers, stride, dilation, asymmetric ('same') padding, odd sizes, a batch of 0, every tile and forced
splits (with empty runs), the 64-bit index specialisation, the same bits over 10 runs, and a float32
reduction of a million products whose error stays near 1e-6 where a serial float32 sum's does not.
"""
import dataclasses

import numpy as np
import pytest

from cases import Case
from checks import relative_error

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch", reason="the GPU tests compare with torch")
cupy = pytest.importorskip("cupy")
F = torch.nn.functional

from cupyconv.arguments import make_problem  # noqa: E402
from cupyconv.wgrad import (WGRAD_CONFIGS, conv2d_weight_cupy, gemm_specialisation,  # noqa: E402
                            make_wgrad_plan)

DTYPES = ["float64", "float32", "float16", "bfloat16"]
TORCH_DTYPES = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
                "bfloat16": torch.bfloat16}
BITS = {"float64": torch.int64, "float32": torch.int32, "float16": torch.int16, "bfloat16": torch.int16}
#: float64 and strict float32: absolute bounds on the relative error; float16 and bfloat16: a floor added to
#: 4x torch's own error in that dtype (our fp32 sums round once; torch's may round more).
FLOOR = {"float64": 1e-12, "float32": 1e-5, "float16": 5e-4, "bfloat16": 4e-3}
LAYOUTS = [("NCHW", "KCHW"), ("NHWC", "KHWC")]
CROSS_LAYOUTS = [("NCHW", "KHWC"), ("NHWC", "KCHW")]


CASES = [
    Case(2, 3, 5, 9, 11, 3, 3, padding=1),                                   # odd everything, J 27
    Case(3, 16, 32, 12, 10, 3, 3, stride=2, padding=1),                      # stride 2
    Case(2, 12, 24, 10, 11, 3, 3, padding=1, groups=3),                      # grouped
    Case(2, 8, 8, 13, 9, 3, 3, padding=1, groups=8),                         # depthwise
    Case(2, 6, 18, 11, 12, 5, 3, padding=(2, 1), groups=6),                  # channel multiplier 3
    Case(1, 5, 7, 17, 15, 3, 3, stride=(2, 3), padding=(1, 2), dilation=2),  # stride, dilation, padding
    Case(2, 4, 6, 9, 10, 4, 2, padding="same", dilation=(1, 2)),             # 'same': asymmetric padding
    Case(4, 70, 96, 7, 7, 1, 1),                                             # 1x1: Kg 96, J 70 past 64
    Case(2, 33, 65, 8, 8, 3, 3, padding=1),                                  # Kg 65, J 297: partial tiles
    Case(1, 3, 16, 31, 29, 7, 7, stride=2, padding=3),                       # a stem
    Case(8, 16, 16, 32, 32, 3, 3, padding=1),                                # small grid, long l: auto splits
    Case(1, 2, 3, 3, 3, 5, 5, padding=2),                                    # mostly padding
]
#: Channels in fours, which NHWC 8 x 8 tiles need (they load 4 a time).
FOURS_CASES = [
    Case(2, 36, 44, 9, 10, 3, 3, padding=1),                                   # rows past Kg, a partial column tile
    Case(3, 8, 132, 7, 6, 3, 3, stride=2, padding=1),                          # a second row tile of 4 rows
    Case(1, 8, 12, 17, 15, 3, 3, stride=(2, 3), padding=(1, 2), dilation=2),  # stride, dilation, padding
]
SPLIT_CASE = Case(4, 6, 10, 20, 18, 3, 3, padding=1)  # 1440 l: 45 l tiles of 32
TINY_CASE = Case(1, 2, 3, 5, 5, 3, 3, padding=1)      # 25 l: one l tile, so 7 splits leave 6 runs empty


def problem_of(case: Case, dtype: str, layout: str, weight_layout: str):
    x = (case.n, case.h, case.w, case.c) if layout == "NHWC" else (case.n, case.c, case.h, case.w)
    cg = case.c // case.groups
    weight = (case.k, case.kh, case.kw, cg) if weight_layout == "KHWC" else (case.k, cg, case.kh, case.kw)
    return make_problem(x, weight, None, dtype, case.stride, case.padding, case.dilation, case.groups, layout,
                        weight_layout)


def to_cupy(t):
    """Zero-copy CuPy view of a CUDA tensor; bfloat16 (which CuPy lacks) as its int16 bits."""
    return cupy.from_dlpack(t.view(torch.int16) if t.dtype == torch.bfloat16 else t)


def random_inputs(problem, seed: int, mean: float = 0.0):
    """x and grad_output, logical NCHW, N(mean, 1) rounded to the problem's dtype."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    make = lambda shape: (torch.randn(*shape, device="cuda", dtype=torch.float64, generator=g) + mean).to(
        TORCH_DTYPES[problem.dtype])
    return make(problem.x_shape), make(problem.out_shape)


def run_wgrad(problem, x, dy, plan=None):
    """cupyconv's weight gradient of logical NCHW ``x`` and ``dy`` into a NaN-poisoned weight of the problem's
    layouts; returns it, and its logical (K, Cg, kh, kw) view."""
    to_layout = lambda t: (t.permute(0, 2, 3, 1) if problem.layout == "NHWC" else t).contiguous()
    out = torch.full(problem.weight_array_shape, float("nan"), device="cuda", dtype=x.dtype)
    result = conv2d_weight_cupy(to_cupy(to_layout(x)), to_cupy(to_layout(dy)), problem, to_cupy(out), plan=plan)
    assert result.data.ptr == out.data_ptr()
    cupy.cuda.get_current_stream().synchronize()
    return out, (out.permute(0, 3, 1, 2) if problem.weight_layout == "KHWC" else out)


def torch_wgrad(problem, x, dy):
    """torch.nn.grad.conv2d_weight in x's dtype; padding applied to x first (torch's takes symmetric only)."""
    p = problem
    padded = F.pad(x, (p.pad_left, p.pad_right, p.pad_top, p.pad_bottom))
    return torch.nn.grad.conv2d_weight(padded, p.weight_shape, dy, p.stride, 0, p.dilation, p.groups)


def check(case: Case, dtype: str, layout: str, weight_layout: str, seed: int, config=None, splits=None):
    problem = problem_of(case, dtype, layout, weight_layout)
    plan = make_wgrad_plan(problem, config, splits) if (config, splits) != (None, None) else None
    x, dy = random_inputs(problem, seed)
    _, out = run_wgrad(problem, x, dy, plan)
    assert not out.isnan().any(), "a weight-gradient element was never written (or is NaN)"
    ref = torch_wgrad(problem, x.double(), dy.double())
    error = relative_error(out, ref)
    allowed = FLOOR[dtype]
    if dtype in ("float16", "bfloat16"):
        allowed += 4 * relative_error(torch_wgrad(problem, x, dy), ref)
    assert error <= allowed, f"relative error {error:.3g} > {allowed:.3g} ({make_wgrad_plan(problem, config, splits)})"
    return problem


@pytest.mark.parametrize("layout,weight_layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_cases(case, dtype, layout, weight_layout):
    check(case, dtype, layout, weight_layout, seed=len(case.id) + DTYPES.index(dtype))


@pytest.mark.parametrize("layout,weight_layout", CROSS_LAYOUTS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_cross_layouts(case, layout, weight_layout):
    """The reduction transposes the workspace's column order into the other weight layout."""
    check(case, "float32", layout, weight_layout, seed=3 + len(case.id))


def test_auto_splits_are_exercised():
    """The grid's case of a small grid and a long reduction really splits (so test_cases covers it)."""
    assert make_wgrad_plan(problem_of(CASES[-2], "float32", "NCHW", "KCHW")).splits > 1


@pytest.mark.parametrize("layout,weight_layout", LAYOUTS)
@pytest.mark.parametrize("config", [c.name for c in WGRAD_CONFIGS])
@pytest.mark.parametrize("case", [CASES[4], CASES[8], CASES[9], *FOURS_CASES], ids=lambda c: c.id)
def test_every_config(case, config, layout, weight_layout):
    cfg = next(c for c in WGRAD_CONFIGS if c.name == config)
    if cfg.refusal(problem_of(case, "float32", layout, weight_layout)):  # NHWC channels not in fours
        with pytest.raises(ValueError, match="multiples of 4"):
            make_wgrad_plan(problem_of(case, "float32", layout, weight_layout), config)
        return
    check(case, "float32", layout, weight_layout, seed=5, config=config)


@pytest.mark.parametrize("dtype", ["float64", "float16"])
@pytest.mark.parametrize("config", [c.name for c in WGRAD_CONFIGS])
def test_every_config_other_dtypes(config, dtype):
    if not next(c for c in WGRAD_CONFIGS if c.name == config).takes(dtype):
        with pytest.raises(ValueError, match="float32 only"):
            make_wgrad_plan(problem_of(CASES[8], dtype, "NHWC", "KHWC"), config)
        return
    check(CASES[8], dtype, "NHWC", "KHWC", seed=9, config=config)


@pytest.mark.parametrize("layout,weight_layout", LAYOUTS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("splits", [1, 2, 7])
def test_forced_splits(splits, dtype, layout, weight_layout):
    check(SPLIT_CASE, dtype, layout, weight_layout, seed=splits, splits=splits)


@pytest.mark.parametrize("layout,weight_layout", LAYOUTS)
def test_empty_runs(layout, weight_layout):
    check(TINY_CASE, "float32", layout, weight_layout, seed=2, splits=7)


@pytest.mark.parametrize("layout,weight_layout", LAYOUTS + CROSS_LAYOUTS)
@pytest.mark.parametrize("config", ["wgrad_m128j128", "wgrad_m64j64", "wgrad_m16j64"])
def test_64_bit_index_specialisation(config, layout, weight_layout):
    problem = problem_of(FOURS_CASES[2] if config == "wgrad_m128j128" else CASES[5], "float32", layout, weight_layout)
    plan = make_wgrad_plan(problem, config, 3)
    plan = dataclasses.replace(plan, index_type="long long", gemm_expression=gemm_specialisation(
        "float32", layout == "NHWC", "long long", plan.config))
    x, dy = random_inputs(problem, seed=13)
    _, out = run_wgrad(problem, x, dy, plan)
    assert not out.isnan().any()
    assert relative_error(out, torch_wgrad(problem, x.double(), dy.double())) <= 1e-5


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout,weight_layout", LAYOUTS)
def test_batch_of_zero(dtype, layout, weight_layout):
    problem = problem_of(dataclasses.replace(CASES[0], n=0), dtype, layout, weight_layout)
    x, dy = random_inputs(problem, seed=1)
    raw, _ = run_wgrad(problem, x, dy)
    assert (raw == 0).all()


@pytest.mark.parametrize("layout,weight_layout", LAYOUTS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_same_bits_every_run(dtype, layout, weight_layout):
    """Ten runs of a split reduction (no atomics) give the same bits."""
    problem = problem_of(CASES[-2], dtype, layout, weight_layout)
    assert make_wgrad_plan(problem).splits > 1
    x, dy = random_inputs(problem, seed=21)
    first, _ = run_wgrad(problem, x, dy)
    for _ in range(9):
        again, _ = run_wgrad(problem, x, dy)
        assert torch.equal(again.view(BITS[dtype]), first.view(BITS[dtype]))


@pytest.mark.parametrize("config,splits", [(None, None), (None, 1), ("wgrad_m64j64", 1), ("wgrad_m128j128", 1)])
def test_long_reduction_precision(config, splits):
    """A float32 reduction over N Ho Wo = 2^20 products of mean 1 (no cancellation: every entry is ~2^20). The
    blocked sums keep the error against float64 near 1e-6 (2e-6 bound on the norm, 5e-6 on any entry), even in
    one run; a serial float32 sum of the same products is off by ~1e-5 to 1e-4 on some of a few entries."""
    problem = make_problem((16, 4, 256, 256), (4, 4, 3, 3), None, "float32", padding=1)
    assert problem.n * problem.ho * problem.wo == 2**20
    x, dy = random_inputs(problem, seed=7, mean=1.0)
    _, out = run_wgrad(problem, x, dy, make_wgrad_plan(problem, config, splits) if config or splits else None)
    ref = torch_wgrad(problem, x.double(), dy.double())
    assert not out.isnan().any()
    assert relative_error(out, ref) <= 2e-6
    per_entry = ((out.double() - ref).abs() / ref.abs())
    assert float(per_entry.max()) <= 5e-6
    # Serial float32 sums (numpy's cumsum adds in order) of the same products for a few entries.
    padded = F.pad(x.double(), (1, 1, 1, 1))
    serial_errors, our_errors = [], []
    for k, c, r, s in [(0, 0, 0, 0), (1, 2, 1, 1), (2, 3, 2, 0), (3, 1, 0, 2), (0, 3, 1, 2), (1, 0, 2, 2),
                       (2, 1, 1, 0), (3, 2, 2, 1)]:
        products = (dy.double()[:, k] * padded[:, c, r:r + 256, s:s + 256]).flatten().cpu().numpy()
        serial = np.cumsum(products.astype(np.float32), dtype=np.float32)[-1]
        exact = float(ref[k, c, r, s])
        serial_errors.append(abs(float(serial) - exact) / abs(exact))
        our_errors.append(float(per_entry[k, c, r, s]))
    assert max(serial_errors) > 4e-6 and max(serial_errors) > 4 * max(our_errors), (serial_errors, our_errors)
