"""The tensor-core weight gradient's dual problem and plan, without a GPU: the forward convolution it
runs (x as [C][H][W][N], dy as the weight [K][Ho][Wo][N]) computes the weight gradient, checked with
the NumPy convolution against torch; the plan's split-K runs; the refusals."""
import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cases import GRID
from checks import relative_error
from cupyconv import wgrad_tensor_cores
from cupyconv.arguments import make_problem
from cupyconv.reference import conv2d_numpy


@pytest.mark.parametrize("case", [c for c in GRID if c.groups == 1 and c.n > 0], ids=lambda c: c.id)
def test_dual_problem_computes_the_weight_gradient(case):
    rng = np.random.default_rng(len(case.id))
    problem = make_problem((case.n, case.c, case.h, case.w), (case.k, case.c, case.kh, case.kw), None, "float16",
                           case.stride, case.padding, case.dilation)
    x = rng.standard_normal(problem.x_shape)
    dy = rng.standard_normal(problem.out_shape)
    dual = wgrad_tensor_cores.dual_problem(problem)
    assert dual.c % 8 == 0 and dual.c >= case.n and (dual.ho, dual.wo) >= (case.kh, case.kw)
    pad = ((0, 0), (0, dual.c - case.n), (0, 0), (0, 0))
    x_dual = np.pad(x.transpose(1, 0, 2, 3), pad)        # [C][Np][H][W]: the NCHW view of [C][H][W][Np]
    dy_dual = np.pad(dy.transpose(1, 0, 2, 3), pad)      # [K][Np][Ho][Wo]
    out = np.empty(dual.out_shape)
    conv2d_numpy(x_dual, dy_dual, None, dataclasses.replace(dual, dtype="float64", layout="NCHW",
                                                            weight_layout="KCHW"), out)
    got = out[:, :, :case.kh, :case.kw].transpose(1, 0, 2, 3)
    xt, wt = torch.from_numpy(x).requires_grad_(), torch.from_numpy(rng.standard_normal(problem.weight_shape))
    wt.requires_grad_()
    F.conv2d(xt, wt, None, case.stride, case.padding, case.dilation).backward(torch.from_numpy(dy))
    assert relative_error(got, wt.grad.numpy()) < 1e-12


def test_plan_splits_the_reduction_to_fill_the_gpu():
    problem = make_problem((32, 256, 56, 56), (256, 256, 3, 3), None, "float16", 1, 1)
    dual, plan = wgrad_tensor_cores.make_plan(problem, 90)
    assert (dual.n, dual.c, dual.kh, dual.kw, dual.k) == (256, 32, 56, 56, 256)
    assert plan.kernel == "implicit_gemm_nhwc" and plan.config.wgmma and plan.splits > 1
    assert plan.grid[2] == plan.splits and 132 <= plan.grid[0] * plan.grid[1] * plan.grid[2] <= 600
    tiny = make_problem((1, 64, 7, 7), (64, 64, 1, 1), None, "bfloat16")
    assert wgrad_tensor_cores.make_plan(tiny, 90)[1].splits == 1  # a reduction of 8 x 49 products: one run


@pytest.mark.parametrize("dtype,allow_tf32,groups,n,reason", [
    ("float32", False, 1, 2, "strict"),
    ("float64", True, 1, 2, "float64"),
    ("float16", False, 2, 2, "groups"),
    ("float16", False, 1, 0, "empty"),
])
def test_refusals(dtype, allow_tf32, groups, n, reason):
    problem = make_problem((n, 8, 9, 9), (8, 8 // groups, 3, 3), None, dtype, 1, 1, 1, groups)
    assert reason in wgrad_tensor_cores.refusal(problem, allow_tf32)


def test_takes_16_bit_and_tf32():
    for dtype, tf32 in (("float16", False), ("bfloat16", False), ("float32", True)):
        assert wgrad_tensor_cores.refusal(make_problem((3, 8, 9, 9), (8, 8, 3, 3), None, dtype, 2, 1), tf32) == ""
