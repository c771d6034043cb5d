"""Space-to-depth on the channels-last GEMM without a GPU: which layers the rules block, and the copies
replayed in NumPy from their launches' own arguments (kernels/space_to_depth.cu, element by element as
the kernel's threads write them), whose stride-1 convolution (the GEMM launch's problem) must equal
torch's convolution of the original layer."""
import dataclasses

import numpy as np
import pytest

from cupyconv import planner, tuning
from cupyconv.arguments import make_problem
from cupyconv.families import implicit_gemm_nhwc
from cupyconv.families.implicit_gemm_nhwc import SPACE_TO_DEPTH, space_to_depth_block
from cupyconv.program import PREPARED, WEIGHT, WORKSPACE, X, Pointer
from cupyconv.reference import conv2d_numpy

torch = pytest.importorskip("torch")
F = torch.nn.functional

#: (x NCHW shape, weight KCHW shape, stride, padding): ResNet's and AlexNet's stems on odd planes,
#: EfficientNet's, a patchify layer, a block of 1 x 2 pixels of 2 channels, and 5 channels at (3, 2)
#: (30 padded to 32 in 16 bits).
LAYERS = [((2, 3, 23, 21), (8, 3, 7, 7), 2, 3), ((1, 3, 35, 33), (8, 3, 11, 11), 4, 2),
          ((2, 3, 17, 16), (8, 3, 3, 3), 2, 1), ((2, 3, 16, 20), (8, 3, 4, 4), 4, 0),
          ((1, 2, 13, 15), (8, 2, 3, 5), (1, 2), (1, 2)), ((3, 5, 11, 12), (8, 5, 5, 3), (3, 2), (2, 0))]


def problem_of(x_shape, w_shape, stride, padding, dtype, layout="NCHW", weight_layout="KCHW"):
    problem = make_problem(x_shape, w_shape, (w_shape[0],), dtype, stride, padding)
    return dataclasses.replace(problem, layout=layout, weight_layout=weight_layout)


def replay(launch, source: np.ndarray) -> np.ndarray:
    """The space_to_depth launch's output, from its own arguments, as its threads compute it."""
    _, _, n, c, h, w, hs, ws, cs, bh, bw, pt, pl = launch.args
    nhwc = launch.name_expression.endswith(",true>")
    x = source.reshape((n, h, w, c) if nhwc else (n, c, h, w))
    y = np.zeros((n, hs, ws, cs), source.dtype)
    for channel in range(min(cs, bh * bw * c)):
        a, b, ci = channel // c // bw, channel // c % bw, channel % c
        for i in range(hs):
            ih = i * bh + a - pt
            if not 0 <= ih < h:
                continue
            for j in range(ws):
                iw = j * bw + b - pl
                if 0 <= iw < w:
                    y[:, i, j, channel] = x[:, ih, iw, ci] if nhwc else x[:, ci, ih, iw]
    return y


def test_the_rules_block_strided_layers_of_few_channels():
    resnet_stem = problem_of((32, 3, 224, 224), (64, 3, 7, 7), 2, 3, "float16")
    assert space_to_depth_block(resnet_stem) == (2, 2)
    plan = planner.make_plan(resnet_stem, compute_capability=90)
    assert plan.space_to_depth == (2, 2) and plan.channels_padded == 16 and plan.config.wgmma
    assert "space-to-depth" in str(plan) and "4x4" in plan.reason
    alexnet = problem_of((256, 3, 224, 224), (96, 3, 11, 11), 4, 2, "bfloat16")
    assert space_to_depth_block(alexnet) == (4, 4) and planner.make_plan(alexnet).channels_padded == 48
    # 16-byte pieces already (float32's 3 channels padded to 4, 8 channels in 16 bits), stride 1, a
    # dilated or grouped layer, a kernel smaller than its stride, and blocks of too many channels: none.
    for problem in (problem_of((2, 3, 32, 32), (8, 3, 7, 7), 2, 3, "float32"),
                    problem_of((2, 8, 32, 32), (8, 8, 3, 3), 2, 1, "float16"),
                    problem_of((2, 3, 32, 32), (8, 3, 3, 3), 1, 1, "float16"),
                    dataclasses.replace(problem_of((2, 3, 32, 32), (8, 3, 3, 3), 2, 2, "float16"), dilation=(2, 2)),
                    make_problem((2, 6, 32, 32), (8, 3, 3, 3), None, "float16", 2, 1, 1, 2),
                    problem_of((2, 3, 32, 32), (8, 3, 1, 1), 2, 0, "float16"),
                    problem_of((2, 5, 64, 64), (8, 5, 8, 8), 4, 0, "float16")):
        assert space_to_depth_block(problem) == (1, 1), problem
        assert planner.make_plan(problem, allow_tf32=True).space_to_depth == (1, 1)
    # Forced off (the tuner's other candidate): the layer's own stride on a padded copy.
    off = planner.make_plan(resnet_stem, kernel=planner.NHWC_KERNEL, compute_capability=90, space_to_depth=False)
    assert off.space_to_depth == (1, 1) and off.channels_padded == 4
    # The tuner times both; its labels tell them apart.
    labels = [tuning.label(plan) for _, plan in tuning.candidates(resnet_stem, compute_capability=90)]
    assert labels[0].endswith(" space-to-depth 2x2")
    assert any(label.startswith(planner.NHWC_KERNEL) and "space-to-depth" not in label for label in labels)
    with pytest.raises(ValueError, match="space_to_depth must be"):
        planner.make_plan(resnet_stem, kernel=planner.NHWC_KERNEL, space_to_depth="yes")


@pytest.mark.parametrize("weight_layout", ["KCHW", "KHWC"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("layer", LAYERS, ids=str)
def test_the_copies_and_the_stride_1_problem_make_the_convolution(layer, dtype, layout, weight_layout):
    x_shape, w_shape, stride, padding = layer
    problem = problem_of(x_shape, w_shape, stride, padding, dtype, layout, weight_layout)
    block = space_to_depth_block(problem)
    if block == (1, 1):  # float32's 3 channels: 16-byte pieces already
        assert dtype == "float32" and x_shape[1] == 3
        return
    plan = planner.make_plan(problem, kernel=planner.NHWC_KERNEL, compute_capability=90)
    assert plan.space_to_depth == block
    call = planner.program(plan, problem)
    copy, gemm = call.launches[0], call.launches[-1]
    assert copy.kernel == SPACE_TO_DEPTH and copy.args[:2] == (Pointer(X), Pointer(WORKSPACE))
    assert gemm.args[0] == Pointer(WORKSPACE) and gemm.args[1] == Pointer(PREPARED)
    (weight_copy,) = call.weight.launches
    assert weight_copy.args[:2] == (Pointer(WEIGHT), Pointer(PREPARED))
    rng = np.random.default_rng(len(call.launches))
    x, weight = rng.standard_normal(x_shape), rng.standard_normal(w_shape)
    x_array = x.transpose(0, 2, 3, 1) if layout == "NHWC" else x
    w_array = weight.transpose(0, 2, 3, 1) if weight_layout == "KHWC" else weight
    xs, ws = replay(copy, np.ascontiguousarray(x_array)), replay(weight_copy, np.ascontiguousarray(w_array))
    blocked = implicit_gemm_nhwc.space_to_depth_problem(problem, block)
    # The GEMM launch's sizes are the blocked problem's: N, C, H, W, K, Ho, Wo, kh, kw, strides, pads.
    sizes = (blocked.n, blocked.c, blocked.h, blocked.w, blocked.k, blocked.ho, blocked.wo, blocked.kh, blocked.kw,
             1, 1, 0, 0, 1, 1, 1)
    first = next(i for i, arg in enumerate(gemm.args) if i > 4 and arg == blocked.n and gemm.args[i + 1] == blocked.c)
    assert gemm.args[first:first + len(sizes)] == sizes
    assert xs.shape == (blocked.n, blocked.h, blocked.w, blocked.c) and ws.shape == (blocked.k, blocked.kh,
                                                                                    blocked.kw, blocked.c)
    out = np.empty(blocked.out_shape)
    as_float64 = dataclasses.replace(blocked, dtype="float64", layout="NCHW", weight_layout="KCHW", has_bias=False)
    conv2d_numpy(xs.transpose(0, 3, 1, 2), ws.transpose(0, 3, 1, 2), None, as_float64, out)
    expected = F.conv2d(torch.from_numpy(x), torch.from_numpy(weight), None, stride, padding).numpy()
    assert out.shape == expected.shape
    np.testing.assert_allclose(out, expected, rtol=1e-10, atol=1e-10)
