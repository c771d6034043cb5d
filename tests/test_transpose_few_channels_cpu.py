"""transpose_few_channels without a GPU: its launch replayed in NumPy (a float64 model of the kernel's sum,
driven by the launch's arguments and phase table) against torch's conv_transpose2d, so the phases' taps,
offsets, weight strides and grid are checked on every machine; every output written by exactly one phase;
what it refuses and what the rules give it."""
import numpy as np
import pytest

from cupyconv import transpose_few_channels as few
from cupyconv.arguments import make_problem
from cupyconv.conv_transpose import input_gradient_problem, make_transpose_problem, transpose_plan

torch = pytest.importorskip("torch")
F = torch.nn.functional

FIELDS = ("start", "size", "taps", "first", "offset")


def _axis(values):
    count, rest = values[0], values[1:]
    return count, {name: rest[f * few.MAX_AXIS_PHASES:(f + 1) * few.MAX_AXIS_PHASES] for f, name in enumerate(FIELDS)}


def replay(launch, y, weight, bias):
    """The kernel's output for y and weight (flat, in their memory orders) from ``launch``'s arguments: float64
    sums per phase, and how many phases wrote each output."""
    (n, k, hy, wy, h, w, sh, sw, step_r, step_s, sk, sc, sr, ss, has_bias, bx, _vector) = launch.args[4:21]
    table = launch.args[21].values
    assert len(table) == 2 * (1 + 5 * few.MAX_AXIS_PHASES)
    nhwc = launch.name_expression.endswith("true>")
    c = int(launch.name_expression.split(",")[1])
    yy = y.reshape(n, hy, wy, k).transpose(0, 3, 1, 2) if nhwc else y.reshape(n, k, hy, wy)
    out, written = np.zeros((n, c, h, w)), np.zeros((h, w), int)
    (rows_count, rows), (cols_count, cols) = _axis(table[:len(table) // 2]), _axis(table[len(table) // 2:])
    tile_h, tile_w = 4 * (few.THREADS // bx), 4 * bx
    assert launch.grid[1] * tile_h >= max(rows["size"]) and launch.grid[0] % (rows_count * cols_count) == 0
    assert launch.grid[0] // (rows_count * cols_count) * tile_w >= max(cols["size"])
    for pr in range(rows_count):
        for pc in range(cols_count):
            si, sj = rows["size"][pr], cols["size"][pc]
            oi, oj = rows["start"][pr] + sh * np.arange(si), cols["start"][pc] + sw * np.arange(sj)
            written[np.ix_(oi, oj)] += 1
            part = np.zeros((n, c, si, sj))
            for u in range(rows["taps"][pr]):
                for v in range(cols["taps"][pc]):
                    r, s = rows["first"][pr] - u * step_r, cols["first"][pc] - v * step_s
                    taps = weight[np.arange(k)[:, None] * sk + np.arange(c)[None] * sc + r * sr + s * ss]
                    p, q = np.arange(si) + rows["offset"][pr] + u, np.arange(sj) + cols["offset"][pc] + v
                    inside = ((p >= 0) & (p < hy))[:, None] & ((q >= 0) & (q < wy))[None]
                    window = yy[:, :, np.clip(p, 0, hy - 1)][:, :, :, np.clip(q, 0, wy - 1)] * inside
                    part += np.einsum("nkij,kc->ncij", window, taps)
            out[:, :, oi[:, None], oj[None]] = part + (bias[:c, None, None] if has_bias else 0)
    return (out.transpose(0, 2, 3, 1) if nhwc else out), written


CASES = [
    # y shape (n, c_in, h, w), c_out, k (kh, kw), stride, padding, output_padding, dilation
    ((2, 64, 15, 17), 3, (7, 7), 2, 3, 1, 1),          # ResNet's stem input gradient (odd sizes)
    ((4, 64, 8, 8), 3, (4, 4), 2, 1, 0, 1),            # DCGAN's RGB layer
    ((3, 20, 17, 19), 1, (3, 3), 1, 1, 0, 1),          # one phase
    ((2, 12, 12, 7), 2, (5, 4), (2, 3), (2, 1), (1, 0), (2, 1)),
    ((1, 12, 20, 19), 4, (15, 15), 2, 7, 1, 1),        # 8 taps a phase
    ((2, 9, 7, 5), 3, (2, 2), 4, 0, 0, 1),             # phases no tap reaches
    ((2, 24, 6, 5), 4, (5, 5), 3, 4, 2, 1),            # phases reading past y's edges
]


@pytest.mark.parametrize("layouts", [("NCHW", "KCHW"), ("NHWC", "KHWC"), ("NHWC", "KCHW")], ids=str)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_launch_replayed_matches_torch(case, layouts):
    y_shape, c_out, (kh, kw), stride, padding, output_padding, dilation = case
    rng = np.random.default_rng(len(str(case)))
    y, w, b = rng.standard_normal(y_shape), rng.standard_normal((y_shape[1], c_out, kh, kw)), rng.standard_normal(c_out)
    ref = F.conv_transpose2d(torch.from_numpy(y), torch.from_numpy(w), torch.from_numpy(b), stride, padding,
                             output_padding, 1, dilation).numpy()
    layout, weight_layout = layouts
    ya = y.transpose(0, 2, 3, 1) if layout == "NHWC" else y
    wa = w.transpose(0, 2, 3, 1) if weight_layout == "KHWC" else w
    tp = make_transpose_problem(ya.shape, wa.shape, b.shape, "float32", stride, padding, output_padding, 1, dilation,
                                layout, weight_layout)
    plan = transpose_plan(tp, False, 90, tp.c)
    assert plan.few is not None and plan.channels == tp.c
    (launch,) = few.program(plan.few, tp).launches
    got, written = replay(launch, np.ascontiguousarray(ya).ravel(), np.ascontiguousarray(wa).ravel(), b)
    assert (written == 1).all()
    got = got.transpose(0, 3, 1, 2) if layout == "NHWC" else got
    assert got.shape == ref.shape and np.abs(got - ref).max() <= 1e-12 * np.abs(ref).max()
    assert launch.shared_bytes <= 227 * 1024 and launch.name_expression in few.specialisations()


def test_a_mutated_table_fails_the_replay():
    """The replay can fail: a phase's y offset moved by one row changes the sums."""
    tp = make_transpose_problem((2, 8, 9, 9), (8, 3, 7, 7), None, "float32", 2, 3, 1, 1, 1)
    (launch,) = few.program(few.make_plan(tp), tp).launches
    rng = np.random.default_rng(0)
    y, w = rng.standard_normal(2 * 8 * 81), rng.standard_normal(8 * 3 * 49)
    good, _ = replay(launch, y, w, np.zeros(3))
    values = list(launch.args[21].values)
    values[1 + 4 * few.MAX_AXIS_PHASES] += 1  # the first row phase's offset
    table = type(launch.args[21])(tuple(values))
    bad, _ = replay(launch.__class__(**{**launch.__dict__, "args": (*launch.args[:21], table)}), y, w, np.zeros(3))
    assert np.abs(good - bad).max() > 1e-3


def test_the_input_gradient_of_an_rgb_stem_takes_it_unwidened():
    problem = make_problem((32, 224, 224, 3), (64, 7, 7, 3), None, "float32", 2, 3, 1, 1, "NHWC", "KHWC")
    tp = input_gradient_problem(problem)
    plan = transpose_plan(tp, True, 90, tp.c)
    assert plan.few is not None and plan.phases == () and plan.gemm is None
    assert few.make_plan(tp).taps == 4 and few.make_plan(tp).vector_k
    assert "3 output channels" in few.describe(plan.few, tp)


@pytest.mark.parametrize("change,why", [
    (dict(groups=3, c=6), "groups=3"),
    (dict(c=5), "5 output channels"),
    (dict(dtype="float64"), "dtype float64"),
    (dict(stride=(3, 2), dilation=(2, 1)), "does not divide"),
    (dict(stride=(9, 1)), "stride (9, 1)"),
    (dict(kh=17, kw=17), "9 taps"),
    (dict(n=2**20), "2^31"),
])
def test_refusals_name_the_reason(change, why):
    import dataclasses

    tp = make_transpose_problem((2, 64, 16, 16), (64, 3, 7, 7), None, "float32", 2, 3, 1, 1, 1)
    assert few.refusal(tp) == ""
    changed = dataclasses.replace(tp, **change)
    assert why in few.refusal(changed)
    with pytest.raises(ValueError, match="cannot run"):
        few.make_plan(changed)
    assert transpose_plan(changed, False, 90, changed.c).few is None


@pytest.mark.parametrize("dtype,tf32,k,stride,taken", [
    ("float32", False, 4, 2, True),     # strict float32: wherever it runs
    ("float32", False, 3, 1, True),
    ("float32", True, 4, 2, True),      # TF32 too
    ("float16", False, 3, 1, False),    # 16-bit: the tensor cores below 12 taps a phase
    ("bfloat16", False, 4, 2, False),
    ("float16", False, 7, 2, True),     # 3.5 x 3.5 taps a phase
    ("float32", True, 7, 2, True),
])
def test_the_rule_sends_16_bit_problems_of_few_taps_to_the_phase_route(dtype, tf32, k, stride, taken):
    tp = make_transpose_problem((8, 64, 20, 20), (64, 3, k, k), None, dtype, stride, k // 2, stride - 1, 1, 1)
    plan = transpose_plan(tp, tf32, 90, tp.c)
    assert (plan.few is not None) == taken == few.pays(tp)
    assert few.refusal(tp) == ""
