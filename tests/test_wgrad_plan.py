"""The weight gradient's planner without a GPU (cupyconv/wgrad.py): the tile chosen by shape, the runs of
the reduction (fixed by the problem, within the workspace cap and CUDA's grid), the index width, forced
configs and splits, refusals, and that every plan names a specialisation the compile test builds."""
import dataclasses
import itertools
import math

import pytest

from cupyconv import wgrad
from cupyconv.arguments import make_problem
from cupyconv.families.common import MAX_GRID_Y
from cupyconv.wgrad import (CONFIG_NAMES, MAX_WORKSPACE_BYTES, MIN_RUN_L, WGRAD_CONFIGS, make_wgrad_plan,
                            wgrad_specialisations)


def problem(n=2, c=16, h=14, w=14, k=32, kh=3, kw=3, dtype="float32", groups=1, layout="NCHW",
            weight_layout="KCHW", **kwargs):
    x = (n, h, w, c) if layout == "NHWC" else (n, c, h, w)
    weight = (k, kh, kw, c // groups) if weight_layout == "KHWC" else (k, c // groups, kh, kw)
    return make_problem(x, weight, None, dtype, groups=groups, layout=layout, weight_layout=weight_layout, **kwargs)


def sweep():
    """Problems of many shapes, dtypes and layouts (ResNet-like, depthwise, stems, 1x1, tiny)."""
    shapes = [(32, 64, 56, 56, 64, 3, 3, 1), (1, 3, 224, 224, 64, 7, 7, 1), (64, 256, 14, 14, 256, 3, 3, 1),
              (16, 32, 112, 112, 32, 3, 3, 32), (8, 512, 7, 7, 2048, 1, 1, 1), (1, 2, 5, 5, 3, 3, 3, 1),
              (0, 4, 5, 5, 4, 3, 3, 1), (4, 12, 9, 11, 36, 3, 5, 12), (2, 130, 17, 17, 70, 3, 3, 2)]
    for (n, c, h, w, k, kh, kw, groups), dtype, layout, weight_layout in itertools.product(
            shapes, ["float16", "bfloat16", "float32", "float64"], ["NCHW", "NHWC"], ["KCHW", "KHWC"]):
        yield problem(n, c, h, w, k, kh, kw, dtype, groups, layout, weight_layout, padding=kh // 2)


@pytest.mark.parametrize("shape,expected", [
    ((32, 256, 14, 14, 256, 3, 3, 1), "wgrad_m128j128"),  # large Kg and J
    ((32, 64, 56, 56, 64, 3, 3, 1), "wgrad_m64j64"),      # Kg 64: half of a 128-row tile empty
    ((16, 32, 56, 56, 32, 3, 3, 32), "wgrad_m16j16"),    # depthwise: Kg 1, J 9
    ((8, 64, 28, 28, 8, 3, 3, 1), "wgrad_m16j64"),       # Kg 8, J 576
    ((8, 3, 64, 64, 128, 3, 3, 1), "wgrad_m64j16"),      # Kg 128, J 27
])
def test_config_by_shape(shape, expected):
    n, c, h, w, k, kh, kw, groups = shape
    plan = make_wgrad_plan(problem(n, c, h, w, k, kh, kw, groups=groups, padding=1))
    assert plan.config.name == expected
    assert plan.block == (plan.config.threads, 1, 1) == (256, 1, 1)
    assert f"threads of {plan.config.thread_tile} x {plan.config.thread_tile}" in str(plan)
    assert expected in str(plan) and plan.reason in str(plan)


def test_every_config_is_a_256_thread_block_of_whole_tiles():
    for cfg in WGRAD_CONFIGS:
        assert cfg.threads == 256 and cfg.thread_tile in (4, 8)
        assert cfg.bl % cfg.slices == 0 and 256 % cfg.bl == 0 and 256 % cfg.bm == 0 and 256 % cfg.bj == 0
        assert cfg.bm * cfg.bl % 256 == 0 and cfg.bj * cfg.bl % 256 == 0


def test_8_by_8_thread_tiles_take_float32_in_fours():
    """8 x 8 tiles take float32 only (float64's accumulators would not fit, 16 bits would need converting
    loads), and in NHWC read 4 channels a load: other dtypes and NHWC channels not in fours get other tiles,
    forcing one raises, and no other instance is compiled."""
    p = problem(32, 256, 14, 14, 256)
    wide = [c.name for c in WGRAD_CONFIGS if c.thread_tile == 8]
    assert wide and make_wgrad_plan(p).config.name in wide
    for other, why in ((dataclasses.replace(p, dtype="float64"), "float32 only"),
                       (dataclasses.replace(p, dtype="float16"), "float32 only"),
                       (problem(32, 254, 14, 14, 256, layout="NHWC", weight_layout="KHWC"), "multiples of 4"),
                       (problem(32, 256, 14, 14, 250, layout="NHWC", weight_layout="KHWC"), "multiples of 4")):
        assert make_wgrad_plan(other).config.thread_tile == 4
        for name in wide:
            with pytest.raises(ValueError, match=why):
                make_wgrad_plan(other, config=name)
    assert make_wgrad_plan(problem(32, 254, 14, 14, 250)).config.name in wide  # NCHW: a channel a load
    assert all(e.startswith("cupyconv::wgrad_gemm<float,") for e in wgrad_specialisations() if e.endswith(",8>"))


@pytest.mark.parametrize("p", list(sweep()), ids=str)
def test_plan_rules(p):
    plan = make_wgrad_plan(p)
    kg, j, length = p.k // p.groups, p.c // p.groups * p.kh * p.kw, p.n * p.ho * p.wo
    cfg = plan.config
    tiles = math.ceil(kg / cfg.bm) * math.ceil(j / cfg.bj) * p.groups
    assert plan.grid == (tiles, plan.splits, 1)
    assert plan.grid[0] < 2**31 and plan.grid[1] <= MAX_GRID_Y
    assert plan.workspace_bytes == plan.splits * p.k * j * (8 if p.dtype == "float64" else 4)
    assert plan.splits == 1 or plan.workspace_bytes <= MAX_WORKSPACE_BYTES
    # Each run of at least MIN_RUN_L of l (whole tiles), the count the runs' model times fastest.
    l_tiles = math.ceil(length / cfg.bl)
    assert plan.splits == 1 or l_tiles // plan.splits >= math.ceil(MIN_RUN_L / cfg.bl)
    assert all(wgrad._run_time(p, cfg, plan.splits) <= wgrad._run_time(p, cfg, s) for s in (1, plan.splits + 1)
               if s == 1 or l_tiles // s >= math.ceil(MIN_RUN_L / cfg.bl))
    width = 256 // (8 if plan.splits >= 16 and p.k * j < 65536 else 1)  # 8 slices: many runs of few sums
    assert plan.reduce_grid == (math.ceil(p.k * j / width), 1, 1)
    assert plan.gemm_expression in wgrad_specialisations() and plan.reduce_expression in wgrad_specialisations()
    assert ("true" in plan.gemm_expression.split(",")[1]) == (p.layout == "NHWC")
    assert (plan.dtype, plan.layout, plan.weight_layout) == (p.dtype, p.layout, p.weight_layout)


def test_splits_fixed_by_the_problem_alone():
    """The same problem gets the same plan, also from a fresh cache, and split runs where the grid is small and
    the reduction long; none where the reduction is short."""
    p = problem(8, 16, 32, 32, 16, padding=1)
    first = make_wgrad_plan(p)
    make_wgrad_plan.cache_clear()
    assert make_wgrad_plan(p) == first and make_wgrad_plan(dataclasses.replace(p)) == first
    assert first.splits > 1
    assert make_wgrad_plan(problem(1, 16, 4, 4, 16, padding=1)).splits == 1
    assert make_wgrad_plan(problem(0, 16, 4, 4, 16, padding=1)).splits == 1
    # Many tiles already fill the GPU: one run.
    assert make_wgrad_plan(problem(16, 8448, 14, 14, 1024, 1, 1)).splits == 1  # 528 tiles: 4 whole waves


def test_workspace_cap(monkeypatch):
    p = problem(64, 64, 28, 28, 64, padding=1)
    assert make_wgrad_plan(p).splits > 4
    cap = 3 * p.k * p.c * 9 * 4
    monkeypatch.setattr(wgrad, "MAX_WORKSPACE_BYTES", cap)
    make_wgrad_plan.cache_clear()
    try:
        plan = make_wgrad_plan(p)
        assert plan.splits == 3 and plan.workspace_bytes <= cap
        with pytest.raises(ValueError, match="workspace"):
            make_wgrad_plan(p, splits=4)
        assert make_wgrad_plan(p, splits=3).splits == 3
    finally:
        make_wgrad_plan.cache_clear()


def test_forced_config_and_splits():
    p = problem()
    for name in CONFIG_NAMES:
        plan = make_wgrad_plan(p, config=name, splits=7)
        assert plan.config.name == name and plan.splits == 7 and plan.grid[1] == 7
        assert "forced" in plan.reason
    assert make_wgrad_plan(p, splits=1).splits == 1


@pytest.mark.parametrize("splits", [0, -1, MAX_GRID_Y + 1, 2.0, "2", True])
def test_bad_splits(splits):
    with pytest.raises(ValueError, match="splits"):
        make_wgrad_plan(problem(), splits=splits)


def test_bad_config():
    with pytest.raises(ValueError, match="wgrad_m64j64"):
        make_wgrad_plan(problem(), config="simt_m64n64")


def test_index_width():
    assert make_wgrad_plan(problem()).index_type == "int"
    big = problem(2**16, 8, 64, 64, 8)  # x of 2^31 elements
    plan = make_wgrad_plan(big)
    assert plan.index_type == "long long" and ",long long," in plan.gemm_expression
    assert make_wgrad_plan(problem(2**16, 8, 63, 64, 8)).index_type == "int"


@pytest.mark.parametrize("kwargs,match", [
    (dict(n=1, c=1, h=2**29, w=1, k=1, kh=1, kw=1), "extent"),
    (dict(n=1, c=2**15, h=1, w=1, k=2**16, kh=1, kw=1), "weight"),
])
def test_refusals(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_wgrad_plan(problem(**kwargs))


def test_plan_is_frozen_and_printable():
    plan = make_wgrad_plan(problem(layout="NHWC", weight_layout="KHWC"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.splits = 3
    text = str(plan)
    for part in (plan.gemm_expression, plan.reduce_expression, "NHWC -> KHWC", f"workspace {plan.workspace_bytes} B"):
        assert part in text


def test_specialisations_are_unique_and_complete():
    names = wgrad_specialisations()
    wide = sum(c.thread_tile == 8 for c in WGRAD_CONFIGS)  # float32 instances only
    assert len(names) == len(set(names)) == 4 * 2 * 2 * len(WGRAD_CONFIGS) - 3 * 2 * 2 * wide + 4
    assert sum("wgrad_reduce" in n for n in names) == 4


@pytest.mark.parametrize("elements,splits,grid,block", [
    (1296, 264, (41, 1, 1), (32, 8, 1)),     # a depthwise weight from many runs: 8 slices of 33
    (1296, 15, (6, 1, 1), (256, 1, 1)),      # few runs: one thread an element, in run order
    (65535, 16, (2048, 1, 1), (32, 8, 1)),
    (147456, 16, (576, 1, 1), (256, 1, 1)),  # many sums fill the GPU a thread each
])
def test_reduce_shape_slices_many_runs(elements, splits, grid, block):
    from cupyconv.wgrad import reduce_shape

    assert reduce_shape(elements, splits) == (grid, block)
