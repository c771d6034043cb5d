"""transpose_depthwise without a GPU: its launch replayed in NumPy thread by thread (the kernel's index
mapping, first taps and tap steps, driven by the launch's arguments) against torch's conv_transpose2d, so the
grid, the phases' taps and the weight strides are checked on every machine, and every output is written by
exactly one thread; what it refuses and what the rules give it."""
import itertools
import math

import numpy as np
import pytest

from cupyconv import transpose_depthwise as dw
from cupyconv.arguments import make_problem
from cupyconv.conv_transpose import input_gradient_problem, make_transpose_problem, transpose_plan

torch = pytest.importorskip("torch")
F = torch.nn.functional


def first_tap(at, pad, dilation, stride, tap_step, taps):
    """The kernel's first_tap."""
    for tap in range(min(tap_step, taps)):
        q = at + pad - tap * dilation
        if q % stride == 0:
            return tap, q // stride
    return taps, 0


def replay(launch, y, weight, bias, out_shape):
    """The kernel's output (float64) for flat y, weight and bias in their memory orders, thread by thread from
    ``launch``'s grid, block and arguments; and how many threads wrote each output."""
    (n, c, m, hy, wy, h, w, kh, kw, sh, sw, dh, dw_, rts, rys, cts, cys, pt, pl, sk, sr, ss, has_bias,
     column_tiles) = launch.args[4:]
    nhwc = ",true," in launch.name_expression
    vec = int(launch.name_expression.rstrip(">").split(",")[-1])
    k = c * m
    out, written = np.full(math.prod(out_shape), np.nan), np.zeros(math.prod(out_shape), int)

    def y_at(image, channel, iy, ix):
        return y[((image * hy + iy) * wy + ix) * k + channel] if nhwc else y[((image * k + channel) * hy + iy) * wy + ix]

    def thread(bx, by, tx, ty):
        if nhwc:
            vector = bx * dw.THREADS + tx
            column, channel = vector // (c // vec), vector % (c // vec) * vec
            group = by
        else:
            tile_row = bx // column_tiles
            column, channel = (bx % column_tiles) * dw.COLUMNS + tx, by
            group = tile_row * (dw.THREADS // dw.COLUMNS) + ty
        row0 = group % sh + group // sh * dw.ROWS * sh  # ROWS rows of one stride phase
        if column >= w or row0 >= h:
            return
        col_tap, col_in = first_tap(column, pl, dw_, sw, cts, kw)
        first_row_tap, first_row_in = first_tap(row0, pt, dh, sh, rts, kh)
        for image in range(n):  # grid z covers the batch
            for t, row in enumerate(range(row0, min(row0 + dw.ROWS * sh, h), sh)):
                row_tap, row_in = first_row_tap, first_row_in + t
                for v in range(vec):
                    g = channel + v
                    acc = bias[g] if has_bias else 0.0
                    for r, iy in zip(range(row_tap, kh, rts), range(row_in, -10**9, -rys)):
                        for s, ix in zip(range(col_tap, kw, cts), range(col_in, -10**9, -cys)):
                            if 0 <= iy < hy and 0 <= ix < wy:
                                for j in range(m):
                                    acc += y_at(image, g * m + j, iy, ix) * weight[(g * m + j) * sk + r * sr + s * ss]
                    at = ((image * h + row) * w + column) * c + g if nhwc else ((image * c + g) * h + row) * w + column
                    out[at] = acc
                    written[at] += 1

    block = (dw.THREADS, 1) if nhwc else (dw.COLUMNS, dw.THREADS // dw.COLUMNS)
    assert launch.block == (*block, 1) and launch.grid[2] == min(n, dw.MAX_GRID_Y)
    for bx in range(launch.grid[0]):
        for by in range(launch.grid[1]):
            for tx in range(block[0]):
                for ty in range(block[1]):
                    thread(bx, by, tx, ty)
    return out, written


def replay_cells(launch, y, weight, bias, out_shape):
    """The cells kernel's output (float64) for flat NCHW y, weight and bias, thread by thread from ``launch``'s
    grid, block and arguments: a thread's cells, their outputs' taps and y positions; and how many threads
    wrote each output."""
    n, c, m, hy, wy, h, w, qt, ql, sk, sr, ss, has_bias, column_tiles = launch.args[4:]
    taps, stride, pt, pl = (int(v) for v in launch.name_expression.rstrip(">").split(",")[-4:])
    k = c * m
    out, written = np.full(math.prod(out_shape), np.nan), np.zeros(math.prod(out_shape), int)
    block = (dw.COLUMNS, dw.THREADS // dw.COLUMNS)
    assert launch.block == (*block, 1) and launch.grid[1] == c and launch.grid[2] == min(n, dw.MAX_GRID_Y)
    for bx, ty, tx in itertools.product(range(launch.grid[0]), range(block[1]), range(block[0])):
        tile_row = bx // column_tiles
        cell_column = (bx % column_tiles) * dw.COLUMNS + tx
        a0 = (tile_row * block[1] + ty) * dw.CELL_ROWS
        for g, image, i, rho, sigma in itertools.product(range(c), range(n), range(dw.CELL_ROWS), range(stride),
                                                         range(stride)):
            row, column = (a0 + i) * stride + rho, cell_column * stride + sigma
            if row >= h or column >= w:
                continue
            acc = bias[g] if has_bias else 0.0
            for r, s_, j in itertools.product(range(taps), range(taps), range(m)):
                if (rho + pt - r) % stride or (sigma + pl - s_) % stride:
                    continue
                iy, ix = a0 + i + qt + (rho + pt - r) // stride, cell_column + ql + (sigma + pl - s_) // stride
                if 0 <= iy < hy and 0 <= ix < wy:
                    acc += y[((image * k + g * m + j) * hy + iy) * wy + ix] * weight[(g * m + j) * sk + r * sr + s_ * ss]
            at = ((image * c + g) * h + row) * w + column
            out[at] = acc
            written[at] += 1
    return out, written


CASES = [
    # y (n, k, hy, wy), channels c (groups), multiplier, kernel, stride, padding, output_padding, dilation
    ((2, 6, 7, 9), 6, 1, (3, 3), 2, 1, 1, 1),            # MobileNet's stride-2 3x3 input gradient
    ((1, 8, 5, 6), 4, 2, (5, 5), 2, 2, 1, 1),            # multiplier 2, 5x5
    ((2, 9, 4, 5), 3, 3, (3, 4), (3, 2), (0, 1), (2, 1), (1, 2)),  # stride 3, dilation, output_padding
    ((1, 5, 6, 4), 5, 1, (3, 3), 2, 3, 1, 2),            # padding past the taps, dilation = stride
    ((3, 16, 3, 3), 16, 1, (2, 2), 2, 0, 0, 1),          # taps = stride: one tap a phase
    ((1, 3, 1, 1), 3, 1, (3, 3), 2, 0, 0, 1),            # a 1x1 y
    # NCHW: the cells kernel (stride 2, 3x3 or 5x5, no dilation), every residue of the paddings
    ((2, 4, 6, 7), 4, 1, (5, 5), 2, 2, 1, 1),            # EfficientNet's 5x5, even padding
    ((1, 6, 5, 5), 2, 3, (3, 3), 2, (1, 0), (0, 1), 1),  # rows' padding odd, columns' even; multiplier 3
    ((1, 3, 4, 9), 3, 1, (5, 5), 2, (2, 3), 0, 1),       # padding past the stride: residues and quotients
    ((1, 2, 70, 3), 2, 1, (3, 3), 2, 1, 1, 1),           # two tiles of cell rows
    ((1, 2, 3, 70), 2, 1, (3, 3), 2, 0, 1, 1),           # two tiles of cell columns, odd output rows
]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("y_shape,c,m,kernel,stride,padding,output_padding,dilation", CASES)
def test_launch_replayed_matches_torch(y_shape, c, m, kernel, stride, padding, output_padding, dilation, layout,
                                       dtype):
    n, k, hy, wy = y_shape
    weight_shape = (k, 1, *kernel)
    shape = (n, hy, wy, k) if layout == "NHWC" else y_shape
    w_shape = (k, *kernel, 1) if layout == "NHWC" else weight_shape
    tp = make_transpose_problem(shape, w_shape, (c,), dtype, stride, padding, output_padding, c, dilation, layout,
                                "KHWC" if layout == "NHWC" else "KCHW")
    plan = transpose_plan(tp, False, 90, tp.c)
    assert plan.depthwise is not None and plan.phases == ()
    (launch,) = dw.program(plan.depthwise, tp).launches
    assert (launch.kernel == dw.CELLS_KERNEL) == (layout == "NCHW" and stride == 2 and dilation == 1 and
                                                  kernel[0] == kernel[1] and kernel[0] in (3, 5))
    rng = np.random.default_rng(sum(y_shape))
    y, weight, bias = rng.standard_normal(y_shape), rng.standard_normal(weight_shape), rng.standard_normal(c)
    ref = F.conv_transpose2d(torch.from_numpy(y), torch.from_numpy(weight), torch.from_numpy(bias), stride, padding,
                             output_padding, c, dilation).numpy()
    y_mem = y.transpose(0, 2, 3, 1) if layout == "NHWC" else y
    w_mem = weight.transpose(0, 2, 3, 1) if layout == "NHWC" else weight
    out, written = (replay_cells if launch.kernel == dw.CELLS_KERNEL else replay)(
        launch, y_mem.ravel(), w_mem.ravel(), bias, tp.out_array_shape)
    assert (written == 1).all()
    got = out.reshape(tp.out_array_shape)
    np.testing.assert_allclose(got.transpose(0, 3, 1, 2) if layout == "NHWC" else got, ref, rtol=1e-12, atol=1e-12)
    nhwc_vector = layout == "NHWC" and m == 1 and c % (16 // (4 if dtype == "float32" else 2)) == 0
    assert plan.depthwise.vec == ((16 // (4 if dtype == "float32" else 2)) if nhwc_vector else 1)
    assert launch.name_expression in dw.specialisations()


def test_vector_channels_replayed():
    """NHWC with 16-byte vectors of channels (multiplier 1, channels a multiple of the vector)."""
    tp = make_transpose_problem((2, 5, 6, 16), (16, 3, 3, 1), (16,), "float16", 2, 1, 1, 16, 1, "NHWC", "KHWC")
    plan = transpose_plan(tp, False, 90, tp.c)
    assert plan.depthwise.vec == 8
    (launch,) = dw.program(plan.depthwise, tp).launches
    rng = np.random.default_rng(3)
    y, weight, bias = rng.standard_normal((2, 16, 5, 6)), rng.standard_normal((16, 1, 3, 3)), rng.standard_normal(16)
    ref = F.conv_transpose2d(*(torch.from_numpy(a) for a in (y, weight, bias)), 2, 1, 1, 16).numpy()
    out, written = replay(launch, y.transpose(0, 2, 3, 1).ravel(), weight.transpose(0, 2, 3, 1).ravel(), bias,
                          tp.out_array_shape)
    assert (written == 1).all()
    np.testing.assert_allclose(out.reshape(tp.out_array_shape).transpose(0, 3, 1, 2), ref, rtol=1e-12, atol=1e-12)


def test_refusals_and_rule():
    base = dict(stride=2, padding=1, output_padding=1, dilation=1, layout="NCHW", weight_layout="KCHW")

    def problem(y_shape, w_shape, groups, dtype="float32", **kw):
        args = {**base, **kw}
        return make_transpose_problem(y_shape, w_shape, None, dtype, args["stride"], args["padding"],
                                      args["output_padding"], groups, args["dilation"], args["layout"],
                                      args["weight_layout"])

    assert dw.refusal(problem((2, 8, 5, 5), (8, 2, 3, 3), 4)) == "groups=4 with 8 output channels (it takes one output channel a group)"
    depthwise = problem((2, 8, 5, 5), (8, 1, 3, 3), 8)
    assert dw.refusal(depthwise) == "" and dw.pays(depthwise)
    assert not dw.pays(problem((2, 8, 5, 5), (8, 1, 3, 3), 8, stride=1, output_padding=0))  # one phase: the forward's
    with pytest.raises(ValueError, match="cannot run this problem: groups=4"):
        dw.make_plan(problem((2, 8, 5, 5), (8, 2, 3, 3), 4))
    # The input gradient of MobileNetV2's stride-2 depthwise layer takes it.
    forward = make_problem((32, 96, 112, 112), (96, 1, 3, 3), None, "float32", 2, 1, 1, 96)
    tp = input_gradient_problem(forward)
    assert transpose_plan(tp, False, 90, tp.c).depthwise is not None
