"""1-D convolutions (height 1) read in place, the NCHW input and the KCHW weight both, by the channels-last
GEMM's NCHW_A tiles (families/implicit_gemm_nhwc.py _nchw_a_vec; kernels/implicit_gemm_nhwc.cu NCHW_A,
row (c, r, s) of A^T shifted by its tap), planned without a GPU: which problems qualify, the piece width
their shifts allow, and that their programs copy nothing."""
import pytest

from cupyconv.arguments import make_problem
from cupyconv.families import implicit_gemm_nhwc
from cupyconv.planner import NHWC_KERNEL, make_plan, program

TENSOR_CORES = [("float16", False), ("bfloat16", False), ("float32", True)]


def problem_1d(n, c, k, length, taps, dtype, stride=1, padding=0, dilation=1, groups=1, layout="NCHW",
               weight_layout="KCHW"):
    x = (n, 1, length, c) if layout == "NHWC" else (n, c, 1, length)
    weight = (k, 1, taps, c // groups) if weight_layout == "KHWC" else (k, c // groups, 1, taps)
    return make_problem(x, weight, (k,), dtype, (1, stride), padding, (1, dilation), groups, layout=layout,
                        weight_layout=weight_layout)


#: (problem arguments, piece bytes in 16 bits, in float32; 0: copied): a TCN layer of 64 channels (8-byte
#: pieces: its shifts are 4 pixels) and issue 16's of 256 (past NCHW_A_ROW_TAPS_MAX_CHANNELS: copied),
#: WaveNet's, a 'same' layer of even width (padding 1 left, 2 right), a grouped one and a pointwise one.
IN_PLACE = {
    "tcn_64_k3_d4": ((16, 64, 64, 4096, 3), {"padding": (0, 4), "dilation": 4}, 8, 16),
    "tcn_256_k3_d4": ((16, 256, 256, 4096, 3), {"padding": (0, 4), "dilation": 4}, 0, 0),
    "wavenet_64_k2_d8": ((4, 64, 64, 16000, 2), {"dilation": 8}, 16, 16),
    "same_k4": ((2, 32, 48, 96, 4), {"padding": "same"}, 0, 4),
    "grouped_k3_d8": ((2, 64, 32, 48, 3), {"padding": (0, 8), "dilation": 8, "groups": 2}, 16, 16),
    "conformer_pw_512to1024": ((16, 512, 1024, 1000, 1), {}, 16, 16),
}
POINTWISE = {"conformer_pw_512to1024"}


@pytest.mark.parametrize("dtype,tf32", TENSOR_CORES)
@pytest.mark.parametrize("layer", IN_PLACE)
def test_1d_layers_read_in_place(layer, dtype, tf32):
    """Each layer whose taps shift whole pieces reads x and the weight in place, in the widest piece the
    row lengths, padding and dilation allow: no copy launch, no prepared weight. The others copy x to
    channels-last as before."""
    args, options, piece16, piece32 = IN_PLACE[layer]
    problem = problem_1d(*args, dtype, **options)
    piece = piece32 if dtype == "float32" else piece16
    assert implicit_gemm_nhwc._nchw_a_vec(problem) == piece
    for cc in (80, 90):
        plan = make_plan(problem, allow_tf32=tf32, compute_capability=cc)
        assert plan.kernel == NHWC_KERNEL
        mode = implicit_gemm_nhwc.NCHW_A_POINTWISE if layer in POINTWISE else implicit_gemm_nhwc.NCHW_A_ROW_TAPS
        assert plan.a_from_nchw == (mode if piece else 0), str(plan)
        call = program(plan, problem)
        if piece:
            assert plan.vec == piece and "read in place" in plan.reason
            assert call.weight is None and len(call.launches) == (2 if plan.splits > 1 else 1)
        else:
            assert call.weight is not None  # the KCHW weight of several taps is prepared as KHWC


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_what_is_not_read_in_place(dtype):
    """Stride along the row, a KHWC weight, an NHWC input, more than NCHW_A_ROW_TAPS_MAX_CHANNELS output
    channels per group, a shift of part of a piece (16 bits: 'same' padding of one pixel), and 2-D
    problems with taps: not in place."""
    shapes = [problem_1d(2, 64, 64, 128, 3, dtype, stride=2, padding=(0, 8)),
              problem_1d(2, 64, implicit_gemm_nhwc.NCHW_A_ROW_TAPS_MAX_CHANNELS + 8, 128, 3, dtype, padding=(0, 8),
                         dilation=8),
              problem_1d(2, 64, 64, 128, 3, dtype, padding=(0, 8), dilation=8, layout="NCHW", weight_layout="KHWC"),
              problem_1d(2, 64, 64, 128, 3, dtype, padding=(0, 8), dilation=8, layout="NHWC"),
              make_problem((2, 64, 16, 16), (64, 64, 3, 3), None, dtype, 1, 1)]
    if dtype == "float16":
        shapes.append(problem_1d(2, 64, 64, 128, 3, dtype, padding=(0, 1)))
    for problem in shapes:
        assert implicit_gemm_nhwc._nchw_a_vec(problem) == 0, problem
        assert not make_plan(problem, allow_tf32=True, compute_capability=90).a_from_nchw


def test_every_in_place_plan_has_an_instance():
    """Every tile the rules or a caller may force on a 1-D problem read in place, split or not: its
    instance is one the family compiles (mma.sync's tiles); the wgmma tiles refuse it."""
    compiled = set(implicit_gemm_nhwc.specialisations()) | \
        set(implicit_gemm_nhwc.arch_specialisations()[implicit_gemm_nhwc.WGMMA_ARCH])
    for dtype, tf32 in TENSOR_CORES:
        problem = problem_1d(2, 64, 48, 512, 3, dtype, padding=(0, 8), dilation=8)
        for cfg in implicit_gemm_nhwc.NHWC_CONFIGS[dtype]:
            if cfg.wgmma:
                with pytest.raises(ValueError, match="runs on mma.sync's tiles alone"):
                    make_plan(problem, cfg.name, NHWC_KERNEL, tf32, 90)
                continue
            for splits in (1, 3):
                plan = make_plan(problem, cfg.name, NHWC_KERNEL, tf32, 90, splits=splits)
                assert plan.a_from_nchw and plan.name_expression in compiled, plan.name_expression
