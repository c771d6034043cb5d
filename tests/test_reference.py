"""The NumPy path against torch's CPU conv2d in float64, over the shared grid and the seed shapes."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import cupyconv
from cases import GRID, Case
from checks import relative_error

# Relative error ||out - ref|| / ||ref|| allowed per dtype (float16 rounds its output to 11 bits).
TOLERANCE = {np.float64: 1e-12, np.float32: 1e-5, np.float16: 2e-3}


def random_case(case: Case, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((case.n, case.c, case.h, case.w))
    weight = rng.standard_normal((case.k, case.c // case.groups, case.kh, case.kw))
    bias = rng.standard_normal(case.k) if case.bias else None
    return x, weight, bias


def torch_reference(x, weight, bias, case: Case) -> np.ndarray:
    t = lambda a: None if a is None else torch.from_numpy(np.asarray(a, dtype=np.float64))
    return F.conv2d(t(x), t(weight), t(bias), case.stride, case.padding, case.dilation, case.groups).numpy()


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", GRID, ids=lambda c: c.id)
def test_numpy_path_matches_torch(case, dtype):
    x, weight, bias = (None if a is None else a.astype(dtype) for a in random_case(case, seed=len(case.id)))
    x_before = x.copy()
    out = cupyconv.conv2d(x, weight, bias, case.stride, case.padding, case.dilation, case.groups)
    ref = torch_reference(x, weight, bias, case)
    assert out.dtype == dtype and out.shape == ref.shape
    assert not np.isnan(out).any()
    assert relative_error(out, ref) < TOLERANCE[dtype]
    np.testing.assert_array_equal(x, x_before)  # inputs are never modified


def test_bfloat16_through_ml_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="bfloat16 NumPy arrays need ml_dtypes")
    case = GRID[2]
    x, weight, bias = (a.astype(ml_dtypes.bfloat16) for a in random_case(case, seed=3))
    out = cupyconv.conv2d(x, weight, bias, case.stride, case.padding, case.dilation, case.groups)
    assert out.dtype == ml_dtypes.bfloat16
    assert relative_error(out.astype(np.float64), torch_reference(x, weight, bias, case)) < 1e-2


def test_unbatched_input_gives_torch_shape():
    case = GRID[0]
    x, weight, bias = random_case(case, seed=4)
    out = cupyconv.conv2d(x[0], weight, bias)
    ref = F.conv2d(torch.from_numpy(x[0]), torch.from_numpy(weight), torch.from_numpy(bias)).numpy()
    assert out.shape == ref.shape
    assert relative_error(out, ref) < 1e-12


def test_non_contiguous_inputs():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 9, 20, 3)).transpose(0, 3, 1, 2)[:, :, ::2, 1:]  # NHWC storage, strided view
    weight = rng.standard_normal((5, 3, 3, 2))[..., ::-1]
    out = cupyconv.conv2d(x, weight, padding=1)
    ref = F.conv2d(torch.from_numpy(x.copy()), torch.from_numpy(weight.copy()), padding=1).numpy()
    assert relative_error(out, ref) < 1e-12


@pytest.mark.parametrize("case", [
    Case(2, 3, 96, 224, 224, 11, 11, stride=4, padding=2),  # AlexNet conv1 at batch 2
    Case(1, 32, 64, 512, 512, 5, 9, bias=False),  # the wide 5x9 seed at batch 1
], ids=["alexnet_conv1_n2", "wide_5x9_n1"])
def test_seed_shapes_small_batch(case):
    x, weight, bias = (None if a is None else a.astype(np.float32) for a in random_case(case, seed=6))
    out = cupyconv.conv2d(x, weight, bias, case.stride, case.padding, case.dilation, case.groups)
    assert relative_error(out, torch_reference(x, weight, bias, case)) < 1e-5
