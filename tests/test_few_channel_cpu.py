"""The few-channel kernel (families/few_channel_nhwc.py) without a GPU: where the rules take it, its refusals
with their reasons, its plan's grid and shared memory, and its launch's arguments."""
import pytest

from cupyconv import planner
from cupyconv.arguments import make_problem
from cupyconv.families import few_channel_nhwc
from cupyconv.families.common import H100_SMS, SHARED_MEMORY_BYTES


def problem(n=32, c=3, k=32, h=224, w=224, kernel=3, stride=2, padding=1, dilation=1, groups=1, dtype="float16",
            layout="NHWC", weight_layout="KHWC"):
    x = (n, h, w, c) if layout == "NHWC" else (n, c, h, w)
    weight = (k, kernel, kernel, c // groups) if weight_layout == "KHWC" else (k, c // groups, kernel, kernel)
    return make_problem(x, weight, None, dtype, stride, padding, dilation, groups, layout=layout,
                        weight_layout=weight_layout)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("weight_layout", ["KHWC", "KCHW"])
def test_the_rules_take_rgb_stems(dtype, weight_layout):
    """MobileNetV2's and EfficientNet's stem in channels_last: persistent blocks taking 16 x 16 output tiles in
    turn (1568 of them at batch 32), two k steps (27 taps), the weight read in its own layout (no copy)."""
    p = problem(dtype=dtype, weight_layout=weight_layout)
    plan = planner.make_plan(p, compute_capability=90)
    assert plan.kernel == planner.FEW_CHANNEL_KERNEL, str(plan)
    assert plan.grid == (few_channel_nhwc.BLOCKS_PER_SM * H100_SMS, 1, 1)
    assert plan.block == (few_channel_nhwc.THREADS, 1, 1)
    assert plan.name_expression.endswith(",int,2>")
    assert planner.make_plan(problem(n=1), compute_capability=90).grid == (49, 1, 1)  # one block a tile
    assert plan.shared_bytes == few_channel_nhwc.shared_bytes(p) <= SHARED_MEMORY_BYTES
    (launch,) = planner.program(plan, p).launches
    assert launch.args[-4:] == (7, 7, int(weight_layout == "KHWC"), 1)  # 224 x 3 elements: whole vectors a row
    assert "read in place" in str(plan) and "transposed" not in str(plan)


@pytest.mark.parametrize("p,reason", [
    (problem(layout="NCHW", weight_layout="KCHW"), "NHWC arrays only"),
    (problem(dtype="float32"), "on the tensor cores"),
    (problem(c=6, groups=2), "one group"),
    (problem(c=3, kernel=7, padding=3), "at most 48"),
    (problem(k=20), "multiples of 8"),
    (problem(k=96), "multiples of 8 output channels up to 64"),
    (problem(c=4, kernel=3, dilation=60, padding=60), "shared memory"),
], ids=["nchw", "float32", "groups", "reduction", "k_20", "k_96", "patch"])
def test_refusals(p, reason):
    assert reason in few_channel_nhwc.refusal(p)
    with pytest.raises(ValueError, match="cannot run this problem"):
        planner.make_plan(p, kernel=planner.FEW_CHANNEL_KERNEL)
    assert planner.make_plan(p, allow_tf32=True, compute_capability=90).kernel != planner.FEW_CHANNEL_KERNEL


def test_the_rules_leave_wider_inputs_and_one_channel_gemms():
    """Inputs of more than RULE_MAX_CHANNELS channels make pieces for the GEMM tiles' copies; one input
    channel and >= 32 outputs keeps the one-channel GEMM rule (planner.ONE_CHANNEL_GEMM_*)."""
    wide = problem(c=5, kernel=3, stride=1)
    assert not few_channel_nhwc.refusal(wide) and not few_channel_nhwc.pays(wide)
    assert planner.make_plan(wide, compute_capability=90).kernel != planner.FEW_CHANNEL_KERNEL
    one = problem(c=1, k=32)
    assert planner.make_plan(one, compute_capability=90).kernel == planner.GEMM_KERNEL


def test_specialisations_cover_its_plans():
    plans = [planner.make_plan(problem(dtype=dtype, c=c, kernel=kernel), kernel=planner.FEW_CHANNEL_KERNEL)
             for dtype in few_channel_nhwc.DTYPES for c, kernel in ((3, 2), (3, 3), (4, 3))]
    assert {plan.name_expression[-2] for plan in plans} == {"1", "2", "3"}
    assert {plan.name_expression for plan in plans} <= set(few_channel_nhwc.specialisations())


@pytest.mark.parametrize("w,c,vectors", [(224, 3, True), (225, 3, False), (18, 4, True), (11, 2, False), (40, 1, True)])
def test_rows_copied_as_vectors_where_they_hold_whole_ones(w, c, vectors):
    p = problem(n=2, c=c, w=w, h=20)
    assert few_channel_nhwc.vector_rows(p) == vectors
    plan = planner.make_plan(p, kernel=planner.FEW_CHANNEL_KERNEL)
    assert planner.program(plan, p).launches[0].args[-1] == int(vectors)


@pytest.mark.parametrize("options", [{"bias": (32,)}, {"activation": "silu"}, {"residual_shape": (32, 112, 112, 32)}],
                         ids=["bias", "silu", "residual"])
def test_the_rules_take_fused_stems(options):
    p = make_problem((32, 224, 224, 3), (32, 3, 3, 3), options.pop("bias", None), "float16", 2, 1, layout="NHWC",
                     weight_layout="KHWC", **options)
    assert few_channel_nhwc.pays(p) and planner.make_plan(p, compute_capability=90).kernel == planner.FEW_CHANNEL_KERNEL
