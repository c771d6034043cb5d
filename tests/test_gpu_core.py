"""conv2d on CuPy arrays against torch in float64, on the GPU: the shared grid in every dtype, 200
hypothesis-drawn configurations, both seed shapes at full size, a tensor past 2^31 elements, streams,
and errors that leave nothing allocated. Outputs are poisoned with NaN before every launch."""
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import cupyconv
from cupyconv.families.depthwise_conv2d import DEPTHWISE_TAPS
from cases import GRID, Case
from checks import relative_error
from devices import gpu_count

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("strict_torch_fp32")]
torch = pytest.importorskip("torch", reason="the GPU tests compare with torch")
F = torch.nn.functional
cupy = pytest.importorskip("cupy")

DTYPES = ["float64", "float32", "float16", "bfloat16"]
TORCH_DTYPES = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
                "bfloat16": torch.bfloat16}
# Relative error floors: float64 and strict float32 are absolute bounds; 16-bit types may also reach
# twice torch's own error in the same dtype (flash-attention's rule), whichever is larger.
FLOOR = {"float64": 1e-12, "float32": 1e-5, "float16": 1e-3, "bfloat16": 8e-3}


def to_cupy(t):
    """Zero-copy CuPy view of a CUDA tensor; bfloat16 (which CuPy lacks) as its int16 bits."""
    if t is None:
        return None
    return cupy.from_dlpack(t.view(torch.int16) if t.dtype == torch.bfloat16 else t)


def run_cupyconv(x, weight, bias, case: Case, kernel=None, config=None):
    """cupyconv on torch CUDA tensors, writing into a NaN-poisoned torch output; returns that output.

    ``kernel`` (and ``config``) force a kernel family (planner.KERNELS) and tile; None lets the planner
    choose, through the public conv2d where CuPy has the dtype.
    """
    from cupyconv.arguments import make_problem
    from cupyconv.launch import conv2d_cupy
    from cupyconv.planner import make_plan

    dtype = str(x.dtype).replace("torch.", "")
    problem = make_problem(x.shape, weight.shape, None if bias is None else bias.shape, dtype,
                           case.stride, case.padding, case.dilation, case.groups)
    out = torch.full(problem.out_shape, float("nan"), device=x.device, dtype=x.dtype)
    if kernel is not None or dtype == "bfloat16":
        plan = make_plan(problem, kernel=kernel, config=config) if kernel else None
        conv2d_cupy(to_cupy(x), to_cupy(weight), to_cupy(bias), problem, to_cupy(out), plan=plan)
    else:  # the public entry point, with its own checks
        y = cupyconv.conv2d(to_cupy(x), to_cupy(weight), to_cupy(bias), case.stride, case.padding,
                            case.dilation, case.groups, out=to_cupy(out))
        assert y.data.ptr == out.data_ptr()
    cupy.cuda.get_current_stream().synchronize()
    return out


def random_inputs(case: Case, dtype: str, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    make = lambda *shape: torch.randn(*shape, device="cuda", dtype=torch.float64, generator=g).to(TORCH_DTYPES[dtype])
    x = make(case.n, case.c, case.h, case.w)
    weight = make(case.k, case.c // case.groups, case.kh, case.kw)
    bias = make(case.k) if case.bias else None
    return x, weight, bias


def check(case: Case, dtype: str, seed: int, kernel=None, config=None):
    x, weight, bias = random_inputs(case, dtype, seed)
    saved = [t.clone() for t in (x, weight, bias) if t is not None]
    out = run_cupyconv(x, weight, bias, case, kernel, config)
    up = lambda t: None if t is None else t.double()
    conv = lambda *ts: F.conv2d(*ts, case.stride, case.padding, case.dilation, case.groups)
    ref = conv(up(x), up(weight), up(bias))
    assert out.shape == ref.shape
    assert not out.isnan().any(), "an output element was never written (or is NaN)"
    error = relative_error(out, ref)
    allowed = FLOOR[dtype]
    if dtype in ("float16", "bfloat16"):
        allowed = max(allowed, 2 * relative_error(conv(x, weight, bias), ref))
    assert error <= allowed, f"{dtype} relative error {error:.3g} > {allowed:.3g}"
    for before, after in zip(saved, (t for t in (x, weight, bias) if t is not None)):
        assert torch.equal(before, after), "an input was modified"


@pytest.mark.parametrize("kernel", ["direct_conv2d", None], ids=["direct", "planned"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", GRID, ids=lambda c: c.id)
def test_grid(case, dtype, kernel):
    check(case, dtype, seed=len(case.id), kernel=kernel)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", [Case(2, 1, 64, 1, 900, 1, 10, stride=(1, 5)),
                                  Case(2, 1, 40, 30, 33, 7, 7, stride=2, padding=3, bias=False)],
                         ids=lambda c: c.id)
def test_one_input_channel_of_many_taps(case, dtype):
    """One input channel in one group (wav2vec 2.0's first layer, a grayscale stem): the planner's
    kernel (the tensor-core GEMM in 16 bits, planner.ONE_CHANNEL_GEMM_MIN_TAPS), against torch."""
    check(case, dtype, seed=len(case.id))


DEPTHWISE_CASES = [
    Case(2, 8, 8, 14, 15, 3, 3, padding=1, groups=8),
    Case(1, 4, 12, 11, 10, 3, 3, padding=1, groups=4),               # channel multiplier 3
    Case(2, 6, 6, 70, 45, 3, 3, stride=2, padding=1, groups=6),      # several tiles each way, stride 2
    Case(1, 5, 10, 33, 40, 5, 3, stride=(1, 2), padding=(2, 0), dilation=(1, 2), groups=5, bias=False),
    Case(3, 3, 3, 14, 14, 3, 3, padding="same", dilation=2, groups=3),  # 14 x 14: MobileNet's late stages
    Case(1, 2, 2, 9, 40, 1, 7, padding=(0, 3), groups=2),           # a 1 x 7 kernel
    Case(0, 4, 4, 9, 9, 3, 3, padding=1, groups=4),                 # empty batch
    # Each unrolled instance (DEPTHWISE_TAPS), rows of every copy-piece width (W a multiple of 8, 4, 2
    # elements, odd: 16-bit loads), partial tiles, channel multipliers 1 and 2.
    Case(2, 6, 6, 56, 56, 3, 3, padding=1, groups=6),               # MobileNetV2's 56 x 56 layer, small
    Case(2, 4, 4, 112, 112, 3, 3, stride=2, padding=1, groups=4),   # ... and its stride-2 layer
    Case(1, 3, 6, 29, 31, 3, 3, stride=2, padding=1, groups=3),     # multiplier 2, odd sizes, stride 2
    Case(1, 4, 8, 23, 28, 5, 5, padding=2, groups=4),               # 5 x 5, multiplier 2
    Case(2, 3, 3, 40, 36, 5, 5, stride=2, padding=2, groups=3, bias=False),
    Case(1, 4, 4, 19, 22, 7, 7, padding=3, groups=4),               # 7 x 7 (ConvNeXt)
    Case(2, 5, 10, 7, 7, 3, 3, padding=1, groups=5),                # 7 x 7 planes: odd rows
    Case(1, 3, 3, 17, 20, 1, 1, groups=3),                          # 1 x 1
    Case(1, 2, 4, 25, 34, 3, 5, stride=(2, 1), padding=(0, 2), groups=2),  # 3 x 5: run-time taps
    Case(1, 4, 4, 30, 33, 3, 3, padding=1, dilation=2, groups=4),   # row dilation: run-time taps
    Case(1, 3, 3, 18, 24, 4, 2, padding="same", groups=3),          # asymmetric padding
    Case(1, 2, 2, 33, 65, 3, 3, padding=(0, 1), groups=2),          # 3 tiles across, last one 1 wide
    # Height-1 problems (conv1d's): rows of 256 outputs, a kernel of 31 taps, a stride, a partial row.
    Case(2, 6, 6, 1, 600, 1, 31, padding=(0, 15), groups=6),
    Case(1, 4, 8, 1, 1283, 1, 10, stride=(1, 5), groups=4, bias=False),
]


@pytest.mark.parametrize("config", ["dw_32x32", "dw_16x16", "dw_1x256"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", DEPTHWISE_CASES, ids=lambda c: c.id)
def test_depthwise_kernel(case, dtype, config):
    """The depthwise kernel, each tile forced, in every dtype; and the planner chooses a depthwise kernel
    (depthwise_column_conv2d for outputs at most 16 wide with unrolled taps)."""
    from cupyconv.arguments import make_problem
    from cupyconv.planner import make_plan

    check(case, dtype, seed=len(case.id), kernel="depthwise_conv2d", config=config)
    problem = make_problem((case.n, case.c, case.h, case.w), (case.k, 1, case.kh, case.kw), None, dtype,
                           case.stride, case.padding, case.dilation, case.groups)
    assert make_plan(problem).kernel in ("depthwise_conv2d", "depthwise_column_conv2d")


def assert_matches_torch(out, x, weight, bias, case: Case, dtype: str, plan):
    """``out`` (computed by ``plan``) has every element written and is within ``dtype``'s tolerance of
    torch in float64."""
    up = lambda t: None if t is None else t.double()
    conv = lambda *ts: F.conv2d(*ts, case.stride, case.padding, case.dilation, case.groups)
    ref = conv(up(x), up(weight), up(bias))
    assert not out.isnan().any(), "an output element was never written (or is NaN)"
    allowed = FLOOR[dtype]
    if dtype in ("float16", "bfloat16"):
        allowed = max(allowed, 2 * relative_error(conv(x, weight, bias), ref))
    error = relative_error(out, ref)
    assert error <= allowed, f"{dtype} relative error {error:.3g} > {allowed:.3g} ({plan})"


def check_depthwise(case: Case, dtype: str, seed: int, config=None, channels_per_lane=None, x_offset=0):
    """The depthwise kernel with ``config`` and ``channels_per_lane`` forced (depthwise_conv2d.make_plan), x
    starting ``x_offset`` elements into its allocation (less aligned than the planner assumes), into a
    NaN-poisoned output; compared with torch in float64 as check() does. Returns the plan."""
    from cupyconv.arguments import make_problem
    from cupyconv.families import depthwise_conv2d
    from cupyconv.launch import conv2d_cupy

    x, weight, bias = random_inputs(case, dtype, seed)
    storage = torch.empty(x.numel() + x_offset, device=x.device, dtype=x.dtype)
    storage[x_offset:] = x.reshape(-1)
    x = storage[x_offset:].view(x.shape)
    problem = make_problem(x.shape, weight.shape, None if bias is None else bias.shape, dtype, case.stride,
                           case.padding, case.dilation, case.groups)
    plan = depthwise_conv2d.make_plan(problem, config, channels_per_lane=channels_per_lane)
    out = torch.full(problem.out_shape, float("nan"), device=x.device, dtype=x.dtype)
    conv2d_cupy(to_cupy(x), to_cupy(weight), to_cupy(bias), problem, to_cupy(out), plan=plan)
    cupy.cuda.get_current_stream().synchronize()
    assert_matches_torch(out, x, weight, bias, case, dtype, plan)
    return plan


@pytest.mark.parametrize("channels_per_lane", [2, 3, 6])
@pytest.mark.parametrize("config", ["dw_32x32", "dw_16x16", "dw_1x256"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", [
    Case(2, 5, 10, 13, 13, 3, 3, padding=1, groups=5),              # 10 channels: the last block's lanes part idle
    Case(1, 7, 7, 36, 40, 3, 3, stride=2, padding=1, groups=7),
    Case(1, 4, 4, 21, 19, 5, 5, padding=2, groups=4, bias=False),
    Case(1, 3, 6, 24, 24, 2, 3, padding=(1, 0), dilation=(2, 1), groups=3),  # run-time taps
], ids=lambda c: c.id)
def test_depthwise_channel_loop(case, dtype, config, channels_per_lane):
    """Several channels per lane, one after another: the next channels' patches copied while this one
    is computed (a ring of up to four buffers), and blocks whose channels run out part-way."""
    plan = check_depthwise(case, dtype, seed=3, config=config, channels_per_lane=channels_per_lane)
    assert plan.channels_per_block == plan.block[2] * channels_per_lane
    assert plan.patch_buffers >= 2 or (dtype, case.stride) == ("float64", 2)  # 2 x 34 KB do not fit


@pytest.mark.parametrize("channels_per_lane", [None, 3])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", [
    Case(2, 6, 6, 1, 600, 1, 31, padding=(0, 15), groups=6),              # the Conformer's: 31 taps, 3 runs of 8 and 7
    Case(1, 4, 4, 1, 1100, 1, 8, padding=(0, 4), groups=4),               # kw = 8: one whole run; a 76-wide second tile
    Case(1, 3, 3, 1, 2057, 1, 3, padding=(0, 1), groups=3, bias=False),   # kw < 8 alone; odd rows: scalar stores
    Case(2, 4, 8, 1, 513, 1, 5, stride=(1, 2), groups=4),                 # stride 2, multiplier 2: the strided sums
    Case(1, 2, 2, 1, 700, 1, 7, padding=(0, 6), dilation=(1, 2), groups=2),  # dilation: the strided sums
    Case(1, 3, 3, 5, 90, 3, 9, padding=(1, 4), groups=3),                 # a 2-D layer on rows one high: kh 3
], ids=lambda c: c.id)
def test_depthwise_row_runs(case, dtype, channels_per_lane):
    """The depthwise kernel's rows of runs (ROW_RUNS_CONFIG, forced; the rule for outputs one row high
    of column stride 1): 8 consecutive outputs of a row per thread, their inputs rotated through registers,
    stored as vectors where aligned; every dtype against torch, NaN-poisoned."""
    from cupyconv.families.depthwise_conv2d import ROW_RUNS_CONFIG

    plan = check_depthwise(case, dtype, seed=9, config=ROW_RUNS_CONFIG, channels_per_lane=channels_per_lane)
    assert plan.block[:2] == (128, 1) and plan.config.row_runs


@pytest.mark.parametrize("channels_per_lane", [1, 2, 3, 4, 5, 7])
@pytest.mark.parametrize("config", ["dw_32x32", "dw_16x16", "dw_1x256"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_depthwise_ring_depths(dtype, config, channels_per_lane):
    """Each ring depth, min(4, channels per lane) patch buffers, over 11 channels: the last block's
    lanes run out part-way through the ring (some before others with four lanes), and with 5 or 7
    channels per lane the ring wraps. float64 patches of the 2-D tiles (9.2 KB; 4 lanes of 2.6 KB) fit
    only 3 deep in depthwise_conv2d.DEPTHWISE_RING_BYTES."""
    case = Case(2, 11, 11, 30, 29, 3, 3, padding=1, groups=11)
    plan = check_depthwise(case, dtype, seed=7, config=config, channels_per_lane=channels_per_lane)
    deepest = 3 if dtype == "float64" and config != "dw_1x256" else 4  # a row's patch is 2.1 KB
    assert plan.patch_buffers == min(channels_per_lane, deepest)
    assert plan.channels_per_block == plan.block[2] * channels_per_lane


@pytest.mark.parametrize("channels_per_lane", [2, 4])
@pytest.mark.parametrize("dtype", DTYPES)
def test_depthwise_channel_loop_one_buffer(dtype, channels_per_lane):
    """A patch too large for two buffers (~32 KB, by a dilation that grows as the dtype narrows): one,
    refilled after a barrier for each channel; with 4 channels per lane the second block of 6 has 2."""
    d = {"float64": 15, "float32": 27}.get(dtype, 45)
    case = Case(1, 3, 6, 2 * d + 40, 2 * d + 41, 3, 3, padding=1, dilation=d, groups=3)
    plan = check_depthwise(case, dtype, seed=5, channels_per_lane=channels_per_lane)
    assert plan.patch_buffers == 1 and plan.channels_per_block == channels_per_lane


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layer", [(144, 56, 1), (96, 112, 2), (384, 14, 1)], ids=["dw144", "dw96s2", "dw384"])
def test_depthwise_mobilenet_layers(layer, dtype):
    """The benchmark's MobileNetV2 depthwise layers (channels, size, stride) at batch 2: as planned (the
    column kernel for the 14 x 14 one), with the tile kernel forced, and with the tile kernel's block
    layout for the benchmark's batch 32 (its channels per block and ring), which only the grid's image
    count tells apart."""
    from cupyconv.arguments import make_problem
    from cupyconv.families import depthwise_conv2d

    c, hw, stride = layer
    case = Case(2, c, c, hw, hw, 3, 3, stride=stride, padding=1, groups=c)
    check(case, dtype, seed=c)
    check(case, dtype, seed=c, kernel="depthwise_conv2d")
    full = depthwise_conv2d.make_plan(make_problem((32, c, hw, hw), (c, 1, 3, 3), None, dtype, stride, 1, 1, c))
    plan = check_depthwise(case, dtype, seed=c + 1, channels_per_lane=full.channels_per_block // full.block[2])
    layout = lambda p: (p.config, p.block, p.channels_per_block, p.patch_buffers, p.vec, p.pitch, p.grid[:2])
    assert layout(plan) == layout(full) and plan.grid[2] == 2


# The depthwise cases with unrolled taps (DEPTHWISE_TAPS, row dilation 1), and more.
COLUMN_CASES = [case for case in DEPTHWISE_CASES
                if (case.kh, case.kw, case.stride if isinstance(case.stride, int) else case.stride[0]) in DEPTHWISE_TAPS
                and (case.dilation if isinstance(case.dilation, int) else case.dilation[0]) == 1] + [
    Case(2, 6, 12, 14, 14, 3, 3, stride=(1, 2), padding=(1, 0), dilation=(1, 2), groups=6),  # column stride, dilation
    Case(3, 8, 8, 7, 7, 3, 3, padding=1, groups=8),                 # MobileNet's 7 x 7 planes
    Case(2, 5, 5, 13, 11, 5, 5, stride=2, padding=2, groups=5, bias=False),
    Case(1, 4, 4, 9, 12, 7, 7, padding=3, groups=4),
    Case(2, 3, 6, 17, 5, 3, 3, stride=2, padding=(2, 1), groups=3),  # more padding than the taps reach
    Case(1, 130, 130, 3, 40, 3, 3, padding=1, groups=130),           # 3 channels a block: the last block's 2 idle
    Case(1, 3, 3, 5, 200, 3, 3, padding=1, groups=3),                # rows wider than a block of 128: one channel
    Case(1, 4, 4, 10, 12, 3, 3, padding=(2, 0), groups=4),           # pairs: the left padding even, the top's 2
    Case(2, 4, 4, 16, 18, 5, 5, stride=2, padding=(2, 1), groups=4),  # pairs of a 5 x 5 layer at stride 2
]


def check_column(case: Case, dtype: str, seed: int, config=None, index_type=None, pairs=None):
    """depthwise_column_conv2d with ``config`` (and ``index_type``, ``pairs``) forced, into a NaN-poisoned
    output, against torch in float64 as check() does. Returns the plan."""
    import dataclasses

    from cupyconv.arguments import make_problem
    from cupyconv.families import depthwise_column_conv2d
    from cupyconv.launch import conv2d_cupy

    x, weight, bias = random_inputs(case, dtype, seed)
    problem = make_problem(x.shape, weight.shape, None if bias is None else bias.shape, dtype, case.stride,
                           case.padding, case.dilation, case.groups)
    plan = depthwise_column_conv2d.make_plan(problem, config, pairs=pairs)
    if index_type:
        plan = dataclasses.replace(plan, index_type=index_type)
    out = torch.full(problem.out_shape, float("nan"), device=x.device, dtype=x.dtype)
    conv2d_cupy(to_cupy(x), to_cupy(weight), to_cupy(bias), problem, to_cupy(out), plan=plan)
    cupy.cuda.get_current_stream().synchronize()
    assert_matches_torch(out, x, weight, bias, case, dtype, plan)
    return plan


@pytest.mark.parametrize("config", ["col_r4", "col_r7", "col_r8"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", COLUMN_CASES, ids=lambda c: c.id)
def test_depthwise_column_kernel(case, dtype, config):
    """The column kernel, each rows-per-thread config forced, in every dtype: partial last segments,
    channel multipliers, column stride and dilation, every unrolled tap set."""
    plan = check_column(case, dtype, seed=len(case.id) + 1, config=config)
    assert plan.kernel == "depthwise_column_conv2d" and plan.shared_bytes == 0


PAIR_CASES = [case for case in COLUMN_CASES if case.w % 2 == 0 and case.stride in (1, 2) and case.dilation == 1]


@pytest.mark.parametrize("pairs", [False, True], ids=["one_column", "pairs"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", PAIR_CASES, ids=lambda c: c.id)
def test_depthwise_column_pairs(case, dtype, pairs):
    """Where rows are even, threads of one column and of two (loaded as pairs) both match torch; double
    has no pairs (a clear ValueError)."""
    from cupyconv.arguments import make_problem
    from cupyconv.families import depthwise_column_conv2d

    problem = make_problem((case.n, case.c, case.h, case.w), (case.k, 1, case.kh, case.kw), None, dtype, case.stride,
                           case.padding, case.dilation, case.groups)
    if pairs and not depthwise_column_conv2d.column_pairs(problem):
        with pytest.raises(ValueError, match="pairs of output columns"):
            depthwise_column_conv2d.make_plan(problem, pairs=True)
        return
    plan = check_column(case, dtype, seed=len(case.id) + 2, pairs=pairs)
    assert (plan.config.pair_odd >= 0) == pairs


@pytest.mark.parametrize("dtype", DTYPES)
def test_depthwise_column_kernel_64bit_indices(dtype):
    """The 64-bit-index instance on a small problem (the planner takes it past 2^31 elements)."""
    check_column(Case(2, 6, 12, 15, 14, 3, 3, stride=2, padding=1, groups=6), dtype, seed=9, index_type="long long")


@pytest.mark.parametrize("x_offset", [1, 2, 3, 4])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", [
    Case(2, 3, 3, 20, 32, 3, 3, padding=1, groups=3),               # rows allow 16-byte pieces
    Case(1, 4, 8, 9, 16, 5, 5, stride=2, padding=2, groups=4),      # 16 x 16 tiles, 4 lanes
], ids=lambda c: c.id)
def test_depthwise_misaligned_input(case, dtype, x_offset):
    """x less aligned than its rows: the kernel narrows its copy pieces to what the address allows."""
    plan = check_depthwise(case, dtype, seed=6, x_offset=x_offset)
    assert plan.vec == 16


def test_depthwise_refuses_what_does_not_fit():
    """A patch past 48 KB (huge dilation): the planner falls back to the direct kernel, a forced
    depthwise plan is a clear ValueError, and the planned result is right."""
    from cupyconv.arguments import make_problem
    from cupyconv.planner import make_plan

    case = Case(1, 2, 2, 200, 300, 3, 3, dilation=(60, 90), groups=2)
    problem = make_problem((case.n, case.c, case.h, case.w), (case.k, 1, 3, 3), None, "float32",
                           case.stride, case.padding, case.dilation, case.groups)
    assert make_plan(problem).kernel == "direct_conv2d"
    with pytest.raises(ValueError, match="cannot run this problem"):
        make_plan(problem, kernel="depthwise_conv2d")
    check(case, "float32", seed=4)


@st.composite
def cases(draw):
    groups = draw(st.sampled_from([1, 1, 1, 2, 3, 4]))
    c = groups * draw(st.integers(1, 6))
    k = groups * draw(st.integers(1, 40))
    kh, kw = draw(st.integers(1, 7)), draw(st.integers(1, 7))
    stride = draw(st.sampled_from([1, 2, 3, (1, 2), (3, 1)]))
    dilation = draw(st.sampled_from([1, 1, 2, (1, 3)]))
    padding = draw(st.sampled_from([0, 1, 2, (0, 3), "valid"] + (["same"] if stride == 1 else [])))
    case = Case(n=draw(st.integers(0, 3)), c=c, k=k, h=draw(st.integers(1, 40)), w=draw(st.integers(1, 40)),
                kh=kh, kw=kw, stride=stride, padding=padding, dilation=dilation, groups=groups,
                bias=draw(st.booleans()))
    try:
        cupyconv.arguments.make_problem((case.n, case.c, case.h, case.w), (case.k, case.c // groups, kh, kw),
                                        None, "float32", stride, padding, dilation, groups)
    except ValueError:
        assume(False)  # torch rejects it too: a kernel larger than the padded input
    return case, draw(st.sampled_from(DTYPES)), draw(st.integers(0, 2**31)), draw(st.sampled_from(["direct_conv2d", None]))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(cases())
def test_hypothesis_configurations(drawn):
    case, dtype, seed, kernel = drawn
    check(case, dtype, seed, kernel)


SEEDS = {
    "alexnet_conv1": Case(256, 3, 96, 224, 224, 11, 11, stride=4, padding=2),
    "wide_5x9": Case(8, 32, 64, 512, 512, 5, 9, bias=False),
}


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("name", SEEDS)
def test_seed_shapes_full_size(name, dtype):
    """Whole batch computed by the direct kernel; every element checked for being written, a sample
    of images against float64."""
    case = SEEDS[name]
    x, weight, bias = random_inputs(case, dtype, seed=7)
    out = run_cupyconv(x, weight, bias, case, kernel="direct_conv2d")
    assert not out.isnan().any()
    sample = [0, case.n // 2, case.n - 1]
    up = lambda t: None if t is None else t.double()
    ref = F.conv2d(up(x[sample]), up(weight), up(bias), case.stride, case.padding, case.dilation, case.groups)
    assert relative_error(out[sample], ref) <= (1e-5 if dtype == "float32" else 2e-3)


def test_tensor_past_2_31_elements():
    """Input and output of 2.15e9 elements each: the planner switches to 64-bit indices."""
    n, h, w = 2, 32768, 32800
    assert n * h * w > 2**31
    x = torch.randn(n, 1, h, w, device="cuda", dtype=torch.float16)
    weight = torch.randn(1, 1, 3, 3, device="cuda", dtype=torch.float16)
    case = Case(n, 1, 1, h, w, 3, 3, padding=1, bias=False)
    assert cupyconv.plan(to_cupy(x), to_cupy(weight), padding=1).index_type == "long long"
    out = run_cupyconv(x, weight, None, case, kernel="direct_conv2d")
    # The last rows of the last image lie past element 2^31; recompute them from a crop, padded as
    # the full input is at the bottom, left and right.
    crop = F.pad(x[-1:, :, h - 10:].double(), (1, 1, 0, 1))
    ref = F.conv2d(crop, weight.double())
    tail = out[-1:, :, h - ref.shape[2]:]
    assert not tail.isnan().any()
    assert relative_error(tail, ref) <= 2e-3
    del x, out


def test_public_api_returns_cupy_on_x_device_and_unbatched_shape():
    rng = cupy.random.default_rng(0)
    x = rng.standard_normal((3, 10, 11), dtype=cupy.float32)
    weight = rng.standard_normal((4, 3, 3, 3), dtype=cupy.float32)
    y = cupyconv.conv2d(x, weight)
    assert isinstance(y, cupy.ndarray) and y.shape == (4, 8, 9) and y.device.id == x.device.id
    ref = cupyconv.conv2d(cupy.asnumpy(x), cupy.asnumpy(weight))
    np.testing.assert_allclose(cupy.asnumpy(y), ref, rtol=1e-4, atol=1e-4)


def test_non_contiguous_inputs_are_read_correctly():
    rng = cupy.random.default_rng(1)
    nhwc = rng.standard_normal((2, 20, 21, 6), dtype=cupy.float64)
    x = nhwc.transpose(0, 3, 1, 2)[:, 1:5, ::2, 1:]
    weight = rng.standard_normal((3, 4, 3, 2), dtype=cupy.float64)[..., ::-1]
    y = cupyconv.conv2d(x, weight, padding=1, stride=(1, 2))
    ref = cupyconv.conv2d(cupy.asnumpy(x), cupy.asnumpy(weight), padding=1, stride=(1, 2))
    np.testing.assert_allclose(cupy.asnumpy(y), ref, rtol=1e-12, atol=1e-12)


_SPIN = r'''
extern "C" __global__ void spin_then_fill(double* x, long long n, long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {}
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += gridDim.x * (long long)blockDim.x)
        x[i] = (double)((i * 7919) % 1000) / 500.0 - 1.0;
}
'''


def test_runs_on_cupy_current_stream():
    """A slow producer on a non-blocking stream, then conv2d on that stream: right only if ordered."""
    spin = cupy.RawKernel(_SPIN, "spin_then_fill")
    x = cupy.full((2, 3, 30, 30), cupy.nan)
    weight = cupy.asarray(np.random.default_rng(2).standard_normal((4, 3, 3, 3)))
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        spin((4,), (128,), (x, np.int64(x.size), np.int64(200_000_000)))
        y = cupyconv.conv2d(x, weight)
    stream.synchronize()
    ref = cupyconv.conv2d(cupy.asnumpy(x), cupy.asnumpy(weight))
    np.testing.assert_allclose(cupy.asnumpy(y), ref, rtol=1e-12, atol=1e-12)


def test_errors_leave_nothing_allocated():
    pool = cupy.get_default_memory_pool()
    x = cupy.ones((2, 4, 9, 9), cupy.float32)
    weight = cupy.ones((6, 4, 3, 3), cupy.float32)
    before = pool.used_bytes()
    bad_calls = [
        lambda: cupyconv.conv2d(x, cupy.asnumpy(weight)),  # NumPy and CuPy mixed
        lambda: cupyconv.conv2d(cupy.asnumpy(x), weight),
        lambda: cupyconv.conv2d(x, weight, groups=3),
        lambda: cupyconv.conv2d(x, weight, cupy.ones(5, cupy.float32)),
        lambda: cupyconv.conv2d(x, weight.astype(cupy.float16)),
        lambda: cupyconv.conv2d(x, weight, out=cupy.empty((2, 6, 7, 8), cupy.float32)),
        lambda: cupyconv.conv2d(x, weight, out=np.empty((2, 6, 7, 7), np.float32)),
        lambda: cupyconv.conv2d(x, weight, padding="same", stride=2),
    ]
    for call in bad_calls:
        with pytest.raises((TypeError, ValueError)):
            call()
    assert pool.used_bytes() == before


@pytest.mark.skipif(gpu_count() < 2, reason="needs two GPUs")
def test_second_gpu():
    with cupy.cuda.Device(1):
        x = cupy.random.standard_normal((1, 2, 8, 8))
        weight = cupy.random.standard_normal((3, 2, 3, 3))
    with cupy.cuda.Device(0):
        y = cupyconv.conv2d(x, weight)
        with pytest.raises(ValueError, match="one GPU"):
            cupyconv.conv2d(x, cupy.asarray(cupy.asnumpy(weight)))
    assert y.device.id == 1
    np.testing.assert_allclose(cupy.asnumpy(y), cupyconv.conv2d(cupy.asnumpy(x), cupy.asnumpy(weight)), rtol=1e-12)
