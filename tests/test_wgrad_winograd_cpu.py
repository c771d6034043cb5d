"""The Winograd weight gradient's choice, refusals, plans and programs without a GPU (wgrad_winograd.py):
which layers take it, why others do not, and that every launch names a compiled instance, passes what its
kernel asks for, reads only x and grad_output, keeps its temporaries aligned in the workspace, and that
the passes' runs of partial sums lie one after another where the filter gradient's transform adds them."""
import dataclasses

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
