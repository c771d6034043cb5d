"""The Winograd weight gradient's choice, refusals, plans and programs without a GPU (wgrad_winograd.py):
which layers take it, why others do not, and that every launch names a compiled instance, passes what its
kernel asks for, reads only x and grad_output, keeps its temporaries aligned in the workspace, and that
the passes' runs of partial sums lie one after another where the filter gradient's transform adds them; and the
program replayed in NumPy (float64 models of its kernels, driven by each launch's arguments) gives torch's
weight gradient, in both layouts, both tile sizes and in passes."""
import dataclasses

import numpy as np
import pytest

from test_gradient_programs_cpu import check_launches
from cupyconv import grad, wgrad, wgrad_winograd as ww
from cupyconv.arguments import make_problem
from cupyconv.program import GRAD_OUTPUT, OUT, WORKSPACE, X, Pointer

LAYOUTS = [("NCHW", "KCHW"), ("NHWC", "KHWC"), ("NCHW", "KHWC"), ("NHWC", "KCHW")]


def problem(n=8, c=64, h=28, w=28, k=64, kh=3, kw=3, dtype="float32", stride=1, padding=1, dilation=1, groups=1,
            layout="NCHW", weight_layout="KCHW"):
    x = (n, h, w, c) if layout == "NHWC" else (n, c, h, w)
    weight = (k, kh, kw, c // groups) if weight_layout == "KHWC" else (k, c // groups, kh, kw)
    return make_problem(x, weight, None, dtype, stride, padding, dilation, groups, layout, weight_layout)


@pytest.mark.parametrize("kwargs,why", [
    (dict(dtype="float16"), "float32 only"), (dict(dtype="float64"), "float32 only"),
    (dict(kh=5, kw=5, padding=2), "3x3"), (dict(stride=2), "stride 1"), (dict(dilation=2), "undilated"),
    (dict(groups=2), "ungrouped"), (dict(n=0), "batch of 0"),
])
def test_refusals(kwargs, why):
    p = problem(**kwargs)
    assert why in ww.refusal(p)
    with pytest.raises(ValueError, match=why):
        ww.make_plan(p)
    assert grad.weight_gradient_plan(p, False)[0] is not ww


def test_the_route_takes_winograd_where_it_pays():
    assert ww.pays(problem(c=64, k=64)) and grad.weight_gradient_plan(problem(c=64, k=64), False)[0] is ww
    assert not ww.pays(problem(c=32, k=32)) and grad.weight_gradient_plan(problem(c=32, k=32), False)[0] is wgrad
    assert grad.weight_gradient_plan(problem(c=64, k=64, dtype="float16"), False)[0] is not ww
    assert grad.weight_gradient_plan(problem(c=64, k=64), True)[0] is not ww  # TF32: the tensor cores


def test_bad_arguments():
    with pytest.raises(ValueError, match="tile must be one of"):
        ww.make_plan(problem(), tile=3)
    with pytest.raises(ValueError, match="config"):
        ww.make_plan(problem(), config="simt_m64n64")
    with pytest.raises(ValueError, match="splits"):
        ww.make_plan(problem(), splits=0)


@pytest.mark.parametrize("layout,weight_layout", LAYOUTS)
@pytest.mark.parametrize("tile", ww.WINOGRAD_WGRAD_TILES)
@pytest.mark.parametrize("shape", [(8, 64, 28, 28, 64), (2, 5, 9, 11, 7), (1, 512, 7, 7, 512), (3, 48, 13, 6, 80)])
def test_programs(shape, tile, layout, weight_layout):
    n, c, h, w, k = shape
    p = problem(n, c, h, w, k, layout=layout, weight_layout=weight_layout)
    plan = ww.make_plan(p, tile)
    call = ww.program(plan, p)
    check_launches(call, {X, GRAD_OUTPUT, WORKSPACE}, {OUT, WORKSPACE})
    assert call.weight is None and [launch.kernel for launch in call.launches] == [
        ww.INPUT_TRANSFORM, ww.OUTPUT_GRADIENT_TRANSFORM, wgrad.KERNEL, ww.WEIGHT_GRADIENT_TRANSFORM]
    assert call.launches[-1].args[:2] == (Pointer(WORKSPACE, call.launches[2].args[2].offset), Pointer(OUT))
    assert call.launches[-1].args[4:] == (plan.passes.runs, int(weight_layout == "KHWC"))
    assert plan.passes.runs == plan.passes.gemm.splits and plan.passes.count == 1
    tiles = n * -(-h // tile) * -(-w // tile)
    gemm = ww.gemm_problem(p, tile, n)
    assert (gemm.groups, gemm.n * gemm.ho * gemm.wo, gemm.c, gemm.k) == ((tile + 2) ** 2, tiles,
                                                                     (tile + 2) ** 2 * c, (tile + 2) ** 2 * k)
    assert gemm.layout == layout and f"F({tile}x{tile}, 3x3)" in str(plan) and plan.reason in str(plan)


@pytest.mark.parametrize("layout,weight_layout", LAYOUTS[:2])
def test_passes_write_their_runs_one_after_another(layout, weight_layout, monkeypatch):
    """Passes of 2 images over a batch of 5 (the cap lowered): three passes' launches, each pass's images at
    its offset of x and grad_output, its GEMM's runs after the last pass's, the transform adding all."""
    p = problem(5, 16, 20, 20, 8, layout=layout, weight_layout=weight_layout)
    monkeypatch.setattr(ww, "WINOGRAD_WGRAD_MAX_WORKSPACE_BYTES", 5 * ww._transformed_bytes(p, 4, 1))
    ww._passes.cache_clear()
    try:
        plan = ww.make_plan(p, splits=2)
        call = ww.program(plan, p)
    finally:
        ww._passes.cache_clear()
    assert (plan.passes.images, plan.passes.count, plan.passes.runs) == (2, 3, 6)
    check_launches(call, {X, GRAD_OUTPUT, WORKSPACE}, {OUT, WORKSPACE})
    run_bytes = 4 * 36 * p.k * p.c
    gemms = [launch for launch in call.launches if launch.kernel == wgrad.KERNEL]
    first_run = gemms[0].args[2].offset
    assert [g.args[2].offset for g in gemms] == [first_run + 2 * run_bytes * i for i in range(3)]
    inputs = [launch.args[0] for launch in call.launches if launch.kernel == ww.INPUT_TRANSFORM]
    assert inputs == [Pointer(X, 4 * p.c * p.h * p.w * first) for first in (0, 2, 4)]
    assert call.launches[-1].args[0] == Pointer(WORKSPACE, first_run) and call.launches[-1].args[4] == 6
    assert call.workspace_bytes >= first_run + 6 * run_bytes


def test_passes_need_runs_of_whole_pieces(monkeypatch):
    """Where a run of partial sums is not a whole number of 256-byte pieces, passes would misalign the next
    pass's runs: the path refuses, and the direct GEMM runs the layer."""
    p = problem(5, 5, 20, 20, 7)
    monkeypatch.setattr(ww, "WINOGRAD_WGRAD_MAX_WORKSPACE_BYTES", 5 * ww._transformed_bytes(p, 4, 1))
    ww._passes.cache_clear()
    try:
        assert "256-byte" in ww.refusal(p)
    finally:
        ww._passes.cache_clear()


def test_specialisations_are_new_and_unique():
    from cupyconv.families import winograd_conv2d

    names = ww.specialisations()
    assert len(names) == len(set(names)) and not set(names) & set(winograd_conv2d.specialisations())
    plan = ww.make_plan(problem(layout="NHWC", weight_layout="KHWC"))
    assert dataclasses.replace(plan).tile == ww.WINOGRAD_WGRAD_TILE


# --- The program replayed in NumPy, float64: each launch's arguments, by the parameter names of its kernel's
# signature, drive a NumPy model of that kernel (the matrices of kernels/winograd_conv2d.cu, Lavin and Gray's
# points 0, +-1, +-2), over flat operands and workspace. The result must be torch's weight gradient: the
# transforms' layouts, the GEMM's view of V and dM, the passes' offsets and the runs all agree.
BT = {2: [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]],
      4: [[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0], [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0],
          [0, 4, 0, -5, 0, 1]]}
G = {2: [[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]],
     4: [[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6], [1 / 24, 1 / 12, 1 / 6],
         [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]]}
AT = {2: [[1, 1, 1, 0], [0, 1, -1, -1]],
      4: [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]]}


def _replay(plan, problem, x, dy):
    """OUT of ww.program(plan, problem) on float64 ``x`` and ``dy`` (NumPy, in the problem's layout)."""
    from test_programs import signature

    m, nhwc = plan.tile, problem.layout == "NHWC"
    a = m + 2
    bt, g, at = (np.array(t[m], dtype=np.float64) for t in (BT, G, AT))
    memory = {X: x.ravel(), GRAD_OUTPUT: dy.ravel(), WORKSPACE: np.full(plan.passes.workspace_bytes // 4, np.nan),
              OUT: np.full(problem.weight_array_shape, np.nan).ravel()}

    def at_(pointer):  # the flat array from the pointer's byte offset on (views: writes land in memory)
        return memory[pointer.operand][pointer.offset // 4:]

    for launch in ww.program(plan, problem).launches:
        args = dict(zip((name for _, name in signature(launch.kernel)), launch.args))
        if launch.kernel == ww.INPUT_TRANSFORM:
            n, c, h, w, th, tw = (args[k] for k in ("N", "C", "H", "W", "tiles_h", "tiles_w"))
            assert (args["sh"], args["sw"], args["bh"], args["bw"]) == (1, 1, 1, 1)
            image = at_(args["x"])[:n * c * h * w].reshape((n, h, w, c) if nhwc else (n, c, h, w))
            image = image.transpose(0, 3, 1, 2) if nhwc else image
            padded = np.zeros((n, c, th * m + 2 + args["pt"] + h, tw * m + 2 + args["pl"] + w))
            padded[:, :, args["pt"]:args["pt"] + h, args["pl"]:args["pl"] + w] = image
            patches = np.stack([np.stack([padded[:, :, i * m:i * m + a, j * m:j * m + a] for j in range(tw)], 2)
                                for i in range(th)], 2)  # n c th tw a a
            v = np.einsum("pr,nctwrs,qs->ntwpqc", bt, patches, bt).reshape(n * th * tw, a * a, c)
            out = v if nhwc else v.transpose(1, 2, 0)  # [T][a^2][C] or [a^2][C][T]
            at_(args["v"])[:out.size] = out.ravel()
        elif launch.kernel == ww.OUTPUT_GRADIENT_TRANSFORM:
            n, k, ho, wo, th, tw = (args[key] for key in ("N", "K", "Ho", "Wo", "tiles_h", "tiles_w"))
            grad = at_(args["dy"])[:n * k * ho * wo].reshape((n, ho, wo, k) if nhwc else (n, k, ho, wo))
            grad = grad.transpose(0, 3, 1, 2) if nhwc else grad
            padded = np.zeros((n, k, th * m, tw * m))
            padded[:, :, :ho, :wo] = grad
            blocks = padded.reshape(n, k, th, m, tw, m).transpose(0, 1, 2, 4, 3, 5)  # n k th tw m m
            dm = np.einsum("rp,nktwrs,sq->ntwpqk", at, blocks, at).reshape(n * th * tw, a * a, k)
            out = dm if nhwc else dm.transpose(1, 2, 0)
            at_(args["dm"])[:out.size] = out.ravel()
        elif launch.kernel == wgrad.KERNEL:  # a 1x1 weight gradient of a^2 groups over one image of 1 x T pixels
            assert (args["N"], args["kh"], args["kw"], args["groups"]) == (1, 1, 1, a * a)
            t, cc, kk = args["H"] * args["W"], args["C"], args["K"]
            v = at_(args["x"])[:t * cc].reshape((t, cc) if nhwc else (cc, t))
            dm = at_(args["dy"])[:t * kk].reshape((t, kk) if nhwc else (kk, t))
            v, dm = (v, dm) if nhwc else (v.T, dm.T)  # [T][a^2 C], [T][a^2 K]
            bl = plan.passes.gemm.config.bl
            tiles, splits = -(-t // bl), args["splits"]
            runs = at_(args["ws"])[:splits * kk * (cc // (a * a))].reshape(splits, a * a, kk // (a * a), cc // (a * a))
            for s in range(splits):  # run s: l tiles [tiles s / splits, tiles (s + 1) / splits)
                rows = slice(tiles * s // splits * bl, tiles * (s + 1) // splits * bl)
                runs[s] = np.einsum("txk,txc->xkc", dm[rows].reshape(-1, a * a, kk // (a * a)),
                                    v[rows].reshape(-1, a * a, cc // (a * a)))
        else:
            assert launch.kernel == ww.WEIGHT_GRADIENT_TRANSFORM
            k, c = args["K"], args["C"]
            du = at_(args["du"])[:args["splits"] * a * a * k * c].reshape(args["splits"], a, a, k, c).sum(0)
            dw = np.einsum("pr,pqkc,qs->kcrs", g, du, g)
            out = dw.transpose(0, 2, 3, 1) if args["weight_khwc"] else dw
            at_(args["dw"])[:out.size] = out.ravel()
    return memory[OUT].reshape(problem.weight_array_shape)


@pytest.mark.parametrize("layout,weight_layout", LAYOUTS)
@pytest.mark.parametrize("tile", ww.WINOGRAD_WGRAD_TILES)
@pytest.mark.parametrize("shape,padding", [((3, 8, 9, 10, 12), 1), ((2, 4, 7, 6, 8), (0, 2)), ((2, 12, 5, 9, 4), 2)])
def test_program_replayed_in_numpy(shape, padding, tile, layout, weight_layout, monkeypatch):
    """The program's launches, replayed in NumPy in float64 (passes of 2 images where the batch has more),
    give torch.nn.grad.conv2d_weight's result."""
    torch = pytest.importorskip("torch")
    n, c, h, w, k = shape
    p = problem(n, c, h, w, k, padding=padding, layout=layout, weight_layout=weight_layout)
    if n > 2:
        # Just under 3 images' V and dM twice: passes of 2 images, room for the runs.
        monkeypatch.setattr(ww, "WINOGRAD_WGRAD_MAX_WORKSPACE_BYTES", 6 * ww._transformed_bytes(p, tile, 1) - 4)
    ww._passes.cache_clear()
    try:
        plan = ww.make_plan(p, tile, splits=3)
    finally:
        ww._passes.cache_clear()
    assert plan.passes.count == (2 if n > 2 else 1)
    rng = np.random.default_rng(len(shape) + tile)
    x, dy = rng.standard_normal(p.x_shape), rng.standard_normal(p.out_shape)  # logical NCHW
    got = _replay(plan, p, x.transpose(0, 2, 3, 1).copy() if layout == "NHWC" else x,
                  dy.transpose(0, 2, 3, 1).copy() if layout == "NHWC" else dy)
    got = got.transpose(0, 3, 1, 2) if weight_layout == "KHWC" else got
    padded = torch.nn.functional.pad(torch.from_numpy(x), (p.pad_left, p.pad_right, p.pad_top, p.pad_bottom))
    ref = torch.nn.grad.conv2d_weight(padded, p.weight_shape, torch.from_numpy(dy)).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-10)
