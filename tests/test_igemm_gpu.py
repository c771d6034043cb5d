"""The implicit-GEMM tensor-core kernels (TF32, float16, bfloat16) against torch in float64, on the GPU.

Both families -- implicit_gemm_nhwc (channels-last copies, the default) and implicit_gemm_conv2d
(NCHW gather, the fallback) -- with every tile configuration forced in turn over the shared grid plus
GEMM-specific edges (channel counts and reduction lengths that are not multiples of the tiles,
groups, zero-channel padding, N = 0), then both seed shapes at full size, the 64-bit index
specialisation and the dispatch rules. Outputs are poisoned
with NaN before each launch; relative error below 2e-3 for TF32 and 1e-2 for float16/bfloat16.
"""
import dataclasses
import math

import pytest

from cases import GRID, Case
from checks import relative_error


def _cuda_device_count() -> int:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no CuPy, no driver or no device
        return 0


pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(_cuda_device_count() == 0, reason="needs a CUDA GPU (cupy finds none)")]
torch = pytest.importorskip("torch", reason="the GPU tests compare with torch")
cupy = pytest.importorskip("cupy")
F = torch.nn.functional

import cupyconv  # noqa: E402
from cupyconv.arguments import make_problem  # noqa: E402
from cupyconv.compiler import compute_capability  # noqa: E402
from cupyconv.launch import conv2d_cupy  # noqa: E402
from cupyconv.families.implicit_gemm_conv2d import GEMM_CONFIGS  # noqa: E402
from cupyconv.families import implicit_gemm_nhwc  # noqa: E402
from cupyconv.families.common import gemm_grid  # noqa: E402
from cupyconv.families.implicit_gemm_nhwc import NHWC_CONFIGS  # noqa: E402
from cupyconv.planner import GEMM_KERNEL, NHWC_KERNEL, make_plan  # noqa: E402

# "tf32" is float32 storage computed as TF32.
DTYPES = {"tf32": ("float32", torch.float32), "float16": ("float16", torch.float16),
          "bfloat16": ("bfloat16", torch.bfloat16)}
TOLERANCE = {"tf32": 2e-3, "float16": 1e-2, "bfloat16": 1e-2}

GEMM_GRID = GRID + [
    Case(2, 3, 8, 9, 11, 3, 3, padding=1),                     # Kgemm 27: shorter than one k tile
    Case(1, 5, 70, 13, 17, 3, 3, padding=1),                   # K 70: past the 64-channel tile
    Case(2, 7, 130, 11, 9, 3, 2, stride=(2, 1), padding=(1, 0)),  # K 130: two 128-channel tiles
    Case(1, 9, 40, 15, 16, 5, 5, padding="same", dilation=(1, 2)),  # asymmetric 'same', Kgemm 225
    Case(1, 4, 8, 10, 9, 4, 2, padding="same"),                # even kernel: extra row/column bottom/right
    Case(2, 12, 24, 10, 11, 3, 3, padding=1, groups=3),        # grouped, 8 channels per group
    Case(1, 16, 16, 9, 9, 3, 3, padding=1, groups=16),         # depthwise, forced onto the GEMM
    Case(3, 6, 48, 7, 5, 1, 1, stride=2),                      # 1x1 with stride, tiles across images
    Case(0, 8, 16, 9, 11, 3, 3, padding=1),                    # empty batch
    Case(5, 3, 9, 31, 29, 3, 3, stride=3, padding=(2, 0), dilation=2),  # odd everything
    Case(2, 5, 20, 13, 12, 3, 5, padding=(1, 2)),              # channels-last: 5 -> 6 (16-bit), 4-byte pieces
    Case(2, 1, 16, 12, 12, 3, 3, padding=1),                   # one channel: 16-bit falls back to NCHW
    Case(2, 16, 24, 9, 10, 3, 3, padding=1, groups=4),         # 4 channels per group: 8-byte 16-bit pieces
    Case(2, 6, 16, 9, 10, 3, 3, padding=1, groups=2),          # 3 per group: float 4-byte pieces, 16-bit NCHW
    Case(1, 40, 200, 9, 7, 2, 2, stride=2),                    # Kgemm 160; two channel tiles of 128
    Case(2, 16, 24, 6, 8, 1, 1),                               # 1x1 read in place: 16-byte pixel pieces
    Case(3, 24, 40, 5, 6, 1, 1),                               # in place, 4/8-byte pieces, tile spans 3 images
    Case(1, 136, 72, 9, 12, 1, 1, bias=False),                 # in place, Kgemm 136: a partial last k tile
    Case(2, 32, 48, 8, 8, 1, 1, groups=2),                     # in place, grouped
]
IN_PLACE_1X1 = GEMM_GRID[-4:]
#: 1-D problems (height 1, <= 64 output channels per group) whose taps shift whole pieces of pixels: the
#: NCHW input and KCHW weight read in place (16- and 8-byte pieces in 16 bits, 16 and 4 in float32), or
#: copied where a shift is not a whole piece (16-bit 'same' padding of 1 or 2 pixels).
IN_PLACE_1D = [
    Case(2, 32, 40, 1, 64, 1, 3, padding=(0, 4), dilation=(1, 4)),   # a TCN layer: shifts -4, 0, 4
    Case(3, 16, 24, 1, 40, 1, 2, dilation=(1, 8)),                   # WaveNet's: 32 outputs, tiles span images
    Case(1, 24, 48, 1, 100, 1, 5, padding=(0, 2)),                   # 16-bit copies; float32 4-byte pieces
    Case(2, 64, 32, 1, 48, 1, 3, padding=(0, 8), dilation=(1, 8), groups=2),  # grouped
    Case(1, 8, 16, 1, 24, 1, 4, padding="same", bias=False),         # asymmetric 'same' padding (1, 2)
]
GEMM_GRID += IN_PLACE_1D
# Problems the wgmma tiles run by default (16-byte pieces of >= 64 bytes of channels per tap: 16-bit
# types with 32 channels per group, float32 with 16), with partial pixel, channel and k tiles.
WGMMA_GRID = [
    Case(2, 32, 64, 17, 19, 3, 3, padding=1),                  # one 64-channel tile, k rows = taps
    Case(1, 40, 70, 13, 11, 5, 3, stride=(2, 1), padding=(2, 1)),  # k rows straddle taps; K 70
    Case(3, 64, 130, 9, 9, 3, 3, padding=1),                   # two 128-channel tiles, the second partial
    Case(2, 128, 96, 10, 12, 3, 3, padding=2, dilation=2, groups=2),  # grouped, 64 channels per group
    Case(1, 96, 32, 7, 7, 1, 1, stride=2),                     # 1x1 with stride: copies, one tap
    Case(2, 16, 24, 9, 10, 3, 3, padding=1),                   # float32 only: 16 channels = 64 bytes
    Case(1, 32, 40, 8, 8, 2, 2, bias=False),                   # Kgemm 128: two k tiles of 16-bit
    # The producer tile's im2col copies: an even kernel's asymmetric 'same' padding; stride, padding
    # and dilation together; tiles that run past the last image.
    Case(2, 64, 136, 10, 9, 4, 2, padding="same"),
    Case(1, 128, 130, 15, 13, 3, 3, stride=2, padding=2, dilation=2),
]


def to_cupy(t):
    """Zero-copy CuPy view of a CUDA tensor; bfloat16 (which CuPy lacks) as its int16 bits."""
    if t is None:
        return None
    return cupy.from_dlpack(t.view(torch.int16) if t.dtype == torch.bfloat16 else t)


def random_inputs(case: Case, torch_dtype, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    make = lambda *shape: torch.randn(*shape, device="cuda", dtype=torch.float64, generator=g).to(torch_dtype)
    x = make(case.n, case.c, case.h, case.w)
    weight = make(case.k, case.c // case.groups, case.kh, case.kw)
    return x, weight, make(case.k) if case.bias else None


def gemm_problem(case: Case, dtype: str):
    return make_problem((case.n, case.c, case.h, case.w), (case.k, case.c // case.groups, case.kh, case.kw),
                        (case.k,) if case.bias else None, dtype, case.stride, case.padding, case.dilation,
                        case.groups)


def run_gemm(x, weight, bias, case: Case, dtype: str, config=None, index_type=None, family=NHWC_KERNEL):
    """cupyconv's implicit GEMM ``family`` (forced) into a NaN-poisoned torch output; returns the output."""
    problem = gemm_problem(case, dtype)
    plan = make_plan(problem, config=config, kernel=family, compute_capability=compute_capability())
    assert plan.kernel == family
    if index_type is not None:
        plan = dataclasses.replace(plan, index_type=index_type)
    out = torch.full(problem.out_shape, float("nan"), device="cuda", dtype=x.dtype)
    conv2d_cupy(to_cupy(x), to_cupy(weight), to_cupy(bias), problem, to_cupy(out), plan=plan)
    torch.cuda.synchronize()
    return out


def reference(x, weight, bias, case: Case):
    up = lambda t: None if t is None else t.double()
    return F.conv2d(up(x), up(weight), up(bias), case.stride, case.padding, case.dilation, case.groups)


def nhwc_refuses(case: Case, dtype: str) -> bool:
    """True (after checking the refusal is a clear ValueError) where the channels-last family cannot
    run ``case``: odd channels per group in 16 bits leave no 4-byte piece, unless one group can be
    padded by a zero channel at a third more work or less (3 -> 4, 5 -> 6)."""
    cg = case.c // case.groups
    if dtype == "float32" or cg % 2 == 0 or (case.groups == 1 and cg >= 3):
        return False
    with pytest.raises(ValueError, match="cannot run this problem"):
        make_plan(gemm_problem(case, dtype), kernel=NHWC_KERNEL)
    return True


def check(case: Case, name: str, config=None, index_type=None, seed=0, family=NHWC_KERNEL):
    dtype, torch_dtype = DTYPES[name]
    if family == NHWC_KERNEL and nhwc_refuses(case, dtype):
        return
    x, weight, bias = random_inputs(case, torch_dtype, seed)
    saved = [t.clone() for t in (x, weight, bias) if t is not None]
    out = run_gemm(x, weight, bias, case, dtype, config, index_type, family)
    ref = reference(x, weight, bias, case)
    assert out.shape == ref.shape
    assert not out.isnan().any(), "an output element was never written (or is NaN)"
    error = relative_error(out, ref)
    assert error < TOLERANCE[name], f"{name} relative error {error:.3g} >= {TOLERANCE[name]}"
    for before, after in zip(saved, (t for t in (x, weight, bias) if t is not None)):
        assert torch.equal(before, after), "an input was modified"


FAMILY_CONFIGS = [(GEMM_KERNEL, i) for i in range(len(GEMM_CONFIGS["float16"]))] + \
                 [(NHWC_KERNEL, i) for i, c in enumerate(NHWC_CONFIGS["float16"]) if not c.wgmma]
WGMMA_CONFIGS = [i for i, c in enumerate(NHWC_CONFIGS["float16"]) if c.wgmma]
STREAM_K_CONFIGS = [i for i in WGMMA_CONFIGS if not NHWC_CONFIGS["float16"][i].producer_warps]
#: (dtype name, index of a wgmma tile of that dtype): the 256-pixel producer tile is 16-bit only. The ping-pong
#: tile runs 1x1 NHWC problems alone, not this file's NCHW ones (tests/test_pingpong_*.py).
WGMMA_TILES = [(name, i) for name in DTYPES for i, c in enumerate(NHWC_CONFIGS[DTYPES[name][0]])
               if c.wgmma and c.wgmma != implicit_gemm_nhwc.WGMMA_PINGPONG]  # the ping-pong tiles: test_pingpong_gpu


@pytest.mark.parametrize("family,config_index", FAMILY_CONFIGS, ids=lambda v: str(v))
@pytest.mark.parametrize("name", DTYPES)
@pytest.mark.parametrize("case", GEMM_GRID, ids=lambda c: c.id)
def test_grid_every_config(case, name, family, config_index):
    configs = (NHWC_CONFIGS if family == NHWC_KERNEL else GEMM_CONFIGS)[DTYPES[name][0]]
    check(case, name, configs[config_index].name, seed=len(case.id) + config_index, family=family)


def _wgmma_runs(case: Case, dtype: str, config: str = "") -> bool:
    """Whether the wgmma tile ``config`` ("": every one) can take ``case``: 16-byte pieces (channels per
    group a multiple of 8 16-bit or 4 float32 values, or one group padded to it by a third at most, or
    a strided layer's blocks of pixels made so by space-to-depth) and not an NCHW input read in place
    with no copies: 1x1 ones only the pixel-row tile takes, 1-D ones none."""
    item, cg = (4 if dtype == "float32" else 2), case.c // case.groups
    per_piece = 16 // item
    padded = -(-cg // per_piece) * per_piece
    pieces = padded == cg or (case.groups == 1 and 3 * padded <= 4 * cg) or \
        implicit_gemm_nhwc.space_to_depth_block(gemm_problem(case, dtype)) != (1, 1)
    in_place = implicit_gemm_nhwc._nchw_a_mode(gemm_problem(case, dtype))
    return (pieces and not in_place) or \
        (in_place == implicit_gemm_nhwc.NCHW_A_POINTWISE and config == implicit_gemm_nhwc.PIXEL_ROWS_CONFIG)


@pytest.mark.skipif(_cuda_device_count() == 0 or compute_capability() != 90,
                    reason="wgmma runs on compute capability 9.0 (sm_90a) alone")
@pytest.mark.parametrize("name,config_index", WGMMA_TILES,
                         ids=lambda v: v if isinstance(v, str) else NHWC_CONFIGS["float16"][v].name)
@pytest.mark.parametrize("case", GEMM_GRID + WGMMA_GRID, ids=lambda c: c.id)
def test_wgmma_every_config(case, name, config_index):
    """Every wgmma tile on every problem it takes; a clear refusal on the others."""
    dtype = DTYPES[name][0]
    cfg = NHWC_CONFIGS[dtype][config_index]
    if not _wgmma_runs(case, dtype, cfg.name):
        with pytest.raises(ValueError, match="wgmma needs|cannot run this problem"):
            make_plan(gemm_problem(case, dtype), config=cfg.name, compute_capability=90)
        return
    if cfg.producer_warps and (case.groups > 1 or case.c % cfg.bk):  # TMA copies k tiles of one tap
        with pytest.raises(ValueError, match="cannot run this problem: its producer warpgroup"):
            make_plan(gemm_problem(case, dtype), config=cfg.name, compute_capability=90)
        return
    if not _pairs_run(case, cfg):
        with pytest.raises(ValueError, match="cannot run this problem: its blocks run in clusters of 2"):
            make_plan(gemm_problem(case, dtype), config=cfg.name, compute_capability=90)
        return
    check(case, name, cfg.name, seed=len(case.id) + config_index)


#: 1x1 NCHW problems read in place on wgmma's pixel-row tile (implicit_gemm_nhwc.PIXEL_ROWS_CONFIG): 16-, 8-
#: and 4-byte pixel pieces, tiles across images, partial channel and k tiles, groups; and 1-D ones,
#: which it refuses where they are read in place.
NCHW_A_WGMMA_GRID = IN_PLACE_1X1 + IN_PLACE_1D + [
    Case(2, 256, 130, 14, 14, 1, 1),                           # two channel tiles, the second partial
    Case(3, 64, 136, 10, 10, 1, 1, bias=False),                # 300 pixels: tiles across images
    Case(1, 512, 256, 7, 7, 1, 1),                             # 49 pixels: float32's 4-byte pieces
    Case(2, 264, 128, 6, 6, 1, 1),                             # Kgemm 264: a partial last k tile
]


@pytest.mark.skipif(_cuda_device_count() == 0 or compute_capability() != 90,
                    reason="wgmma runs on compute capability 9.0 (sm_90a) alone")
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("name", DTYPES)
@pytest.mark.parametrize("case", NCHW_A_WGMMA_GRID, ids=lambda c: c.id)
def test_nchw_in_place_on_wgmma(case, name, splits):
    """The NCHW input read in place, its fragments in registers, the weight from swizzled rows (float32
    rounded to TF32 in shared memory), whole or in three runs of split-K: every element written, within
    the dtype's tolerance. Planes that cannot be read in place (16-bit 7 x 7; 16-bit taps shifted by 1
    or 2 pixels) take the tile's channels-last copies instead; 1-D ones read in place are refused."""
    dtype, torch_dtype = DTYPES[name]
    problem = gemm_problem(case, dtype)
    if implicit_gemm_nhwc._nchw_a_mode(problem) == implicit_gemm_nhwc.NCHW_A_ROW_TAPS:
        with pytest.raises(ValueError, match="1-D NCHW input read in place runs on mma.sync"):
            make_plan(problem, config=implicit_gemm_nhwc.PIXEL_ROWS_CONFIG, compute_capability=90)
        return
    plan, (out,), ref = run_split(case, dtype, torch_dtype, "NCHW", splits, implicit_gemm_nhwc.PIXEL_ROWS_CONFIG,
                                  seed=len(case.id) + splits)
    assert bool(plan.a_from_nchw) == bool(implicit_gemm_nhwc._nchw_a_vec(problem))
    assert plan.config.wgmma and plan.splits == splits
    assert not out.isnan().any(), "an output element was never written (or is NaN)"
    assert relative_error(out, ref) < TOLERANCE[name], relative_error(out, ref)


@pytest.mark.skipif(_cuda_device_count() == 0 or compute_capability() != 90,
                    reason="wgmma runs on compute capability 9.0 (sm_90a) alone")
@pytest.mark.parametrize("name", DTYPES)
def test_1x1_nchw_rule_on_wgmma(name):
    """The planner's choice (executor.executable, as cupyconv.conv2d asks) for a deep 1x1 NCHW layer of
    49 x 2 tiles of 128 x 128, read in place: the pixel-row wgmma tile in every dtype (TF32 through
    allow_tf32); it matches torch, twice the same bits."""
    dtype, torch_dtype = DTYPES[name]
    case = Case(32, 512, 256, 14, 14, 1, 1)
    problem = gemm_problem(case, dtype)
    plan = make_plan(problem, allow_tf32=True, compute_capability=90)
    assert plan.a_from_nchw and plan.config.wgmma, str(plan)
    x, weight, bias = random_inputs(case, torch_dtype, seed=5)
    outs = []
    for _ in range(2):
        outs.append(torch.full(problem.out_shape, float("nan"), device="cuda", dtype=torch_dtype))
        conv2d_cupy(to_cupy(x), to_cupy(weight), to_cupy(bias), problem, to_cupy(outs[-1]), allow_tf32=True)
    torch.cuda.synchronize()
    assert relative_error(outs[0], reference(x, weight, bias, case)) < TOLERANCE[name]
    assert torch.equal(outs[0], outs[1])


def _pairs_run(case: Case, cfg) -> bool:
    """Whether ``cfg`` runs ``case``'s channel tiles: alone, or in pairs of an even number of them."""
    return -(-case.k // case.groups // cfg.bn) % cfg.cluster == 0


@pytest.mark.skipif(_cuda_device_count() == 0 or compute_capability() != 90,
                    reason="wgmma and TMA run on compute capability 9.0 (sm_90a) alone")
@pytest.mark.parametrize("name", DTYPES)
def test_producer_weight_map_follows_the_weight(name):
    """The producer tile's tensor maps are made for the operands' addresses at the call and kept per
    address (executor.MapSlot): NHWC arrays and KHWC weights read in place (16-bit; float32 ones are
    rounded into the prepared weight), three weights and two inputs of one shape through one plan, each
    pair revisited, each call giving its own convolution, NaN-poisoned."""
    dtype, torch_dtype = DTYPES[name]
    case = Case(2, 64, 136, 9, 9, 3, 3, padding=1, bias=False)
    config = next(c.name for c in NHWC_CONFIGS[dtype] if c.producer_warps)
    problem = dataclasses.replace(gemm_problem(case, dtype), layout="NHWC", weight_layout="KHWC")
    plan = make_plan(problem, config=config, kernel=NHWC_KERNEL, compute_capability=90)
    xs = [random_inputs(case, torch_dtype, seed=seed)[0] for seed in (1, 2)]
    weights = [random_inputs(case, torch_dtype, seed=seed)[1] for seed in (4, 5, 6)]
    nhwc = lambda t: t.permute(0, 2, 3, 1).contiguous()
    xs_nhwc, weights_khwc = [nhwc(x) for x in xs], [nhwc(w) for w in weights]
    for i, j in ((0, 0), (1, 1), (2, 0), (0, 1), (1, 0), (2, 1), (0, 0)):
        out = torch.full(problem.out_array_shape, float("nan"), device="cuda", dtype=torch_dtype)
        conv2d_cupy(to_cupy(xs_nhwc[j]), to_cupy(weights_khwc[i]), None, problem, to_cupy(out), plan=plan,
                    allow_tf32=True)
        torch.cuda.synchronize()
        out = out.permute(0, 3, 1, 2)
        assert not out.isnan().any()
        assert relative_error(out, reference(xs[j], weights[i], None, case)) < TOLERANCE[name], (i, j)


@pytest.mark.skipif(_cuda_device_count() == 0 or compute_capability() != 90,
                    reason="wgmma and TMA run on compute capability 9.0 (sm_90a) alone")
@pytest.mark.parametrize("case", [Case(2, 64, 136, 9, 9, 3, 3, padding=1),
                                  Case(1, 128, 130, 15, 13, 3, 3, stride=2, padding=2, dilation=2),
                                  Case(2, 96, 72, 8, 7, 1, 1, stride=2, bias=False)], ids=lambda c: c.id)
def test_producer_rounds_float32_in_place(case):
    """The producer tile reads a float32 NHWC input in place and rounds it to TF32 in shared memory
    (ROUND_A): bitwise the result of the same tile reading an NCHW input's rounded copy, and within
    TF32's tolerance of float64; outputs NaN-poisoned."""
    config = next(c.name for c in NHWC_CONFIGS["float32"] if c.producer_warps)
    x, weight, bias = random_inputs(case, torch.float32, seed=11)
    outs = []
    for layout in ("NHWC", "NCHW"):
        problem = dataclasses.replace(gemm_problem(case, "float32"), layout=layout)
        plan = make_plan(problem, config=config, kernel=NHWC_KERNEL, compute_capability=90)
        assert plan.round_a == (layout == "NHWC")
        xs = x.permute(0, 2, 3, 1).contiguous() if layout == "NHWC" else x
        out = torch.full(problem.out_array_shape, float("nan"), device="cuda")
        conv2d_cupy(to_cupy(xs), to_cupy(weight), None if bias is None else to_cupy(bias), problem, to_cupy(out),
                    plan=plan, allow_tf32=True)
        torch.cuda.synchronize()
        outs.append(out.permute(0, 3, 1, 2) if layout == "NHWC" else out)
    assert not outs[0].isnan().any()
    assert torch.equal(outs[0], outs[1])
    assert relative_error(outs[0], reference(x, weight, bias, case)) < TOLERANCE["tf32"]


def tf32(t):
    """float32 ``t`` rounded to TF32 as the kernels round it (cvt.rna: to nearest, ties away from zero)."""
    return ((t.view(torch.int32) + 0x1000) & ~0x1FFF).view(torch.float32)


ROUND_A_CASES = [Case(2, 96, 136, 9, 10, 1, 1, bias=False), Case(1, 64, 136, 6, 7, 1, 1, stride=2, bias=False),
                 Case(1, 64, 72, 7, 8, 3, 3, padding=1, bias=False)]


#: (tile, stream-K): every tile whole, and stream-K on the wgmma tiles that take it.
ROUND_A_TILES = [(i, None) for i in range(len(NHWC_CONFIGS["float32"]))] + [(i, True) for i in STREAM_K_CONFIGS]


@pytest.mark.parametrize("config_index,stream_k", ROUND_A_TILES,
                         ids=lambda v: NHWC_CONFIGS["float32"][v].name if isinstance(v, int) else
                         ("stream_k" if v else "whole"))
@pytest.mark.parametrize("case", ROUND_A_CASES, ids=lambda c: c.id)
def test_round_a_every_tile(case, config_index, stream_k):
    """Every tile reading a float32 NHWC input in place rounds it to TF32 (ROUND_A: in its fragments,
    in wgmma's A registers, or in shared memory; of layers of several taps, mma.sync's and the
    producer's tiles read x in place, the other wgmma tiles a rounded copy): the result is the
    float64 convolution of the TF32-rounded operands to float32 accumulation's error (1e-5), where
    one left unrounded is off by ~1e-4; NaN-poisoned."""
    cfg = NHWC_CONFIGS["float32"][config_index]
    if cfg.wgmma and compute_capability() != 90:
        pytest.skip("wgmma runs on compute capability 9.0 alone")
    problem = dataclasses.replace(gemm_problem(case, "float32"), layout="NHWC")
    if not _pairs_run(case, cfg):
        with pytest.raises(ValueError, match="cannot run this problem: its blocks run in clusters of 2"):
            make_plan(problem, config=cfg.name, kernel=NHWC_KERNEL, compute_capability=90, splits=1)
        return
    clusters = cfg.name == implicit_gemm_nhwc.PINGPONG_CLUSTER_CONFIG  # the ping-pong tile's runs, 2 at least
    plan = make_plan(problem, config=cfg.name, kernel=NHWC_KERNEL, compute_capability=compute_capability(),
                     stream_k=stream_k, splits=2 if clusters else 1)
    tall = implicit_gemm_nhwc._float32_rounding(cfg) == "copy"  # reads a rounded copy: in registers it spills
    pingpong_copy = cfg.wgmma == implicit_gemm_nhwc.WGMMA_PINGPONG and \
        cfg.bn >= implicit_gemm_nhwc.PINGPONG_TF32_COPY_CHANNELS and \
        math.prod(gemm_grid(problem, cfg)) >= implicit_gemm_nhwc.PINGPONG_TF32_COPY_MIN_TILES  # many taps: a copy
    in_place = not tall and (case.kh * case.kw == 1 or not cfg.wgmma or (bool(cfg.producer_warps) and
                                                                         not pingpong_copy))
    assert plan.round_a == in_place and bool(plan.stream_k_blocks) == bool(stream_k)
    x, weight, _ = random_inputs(case, torch.float32, seed=config_index)
    out = torch.full(problem.out_array_shape, float("nan"), device="cuda")
    conv2d_cupy(to_cupy(x.permute(0, 2, 3, 1).contiguous()), to_cupy(weight), None, problem, to_cupy(out), plan=plan,
                allow_tf32=True)
    torch.cuda.synchronize()
    out = out.permute(0, 3, 1, 2)
    assert not out.isnan().any()
    assert relative_error(out, reference(tf32(x), tf32(weight), None, case)) < 1e-5


def test_wgmma_needs_sm_90():
    """Forcing a wgmma tile for another GPU is refused before any launch; the default there is mma.sync."""
    problem = gemm_problem(WGMMA_GRID[0], "float16")
    with pytest.raises(ValueError, match="compute capability 90"):
        make_plan(problem, config=NHWC_CONFIGS["float16"][WGMMA_CONFIGS[0]].name, compute_capability=80)
    assert not make_plan(problem, compute_capability=80).config.wgmma
    assert make_plan(problem, compute_capability=90).config.wgmma


@pytest.mark.parametrize("family", [GEMM_KERNEL, NHWC_KERNEL])
@pytest.mark.parametrize("name", DTYPES)
@pytest.mark.parametrize("case", [GEMM_GRID[0], GEMM_GRID[3], GEMM_GRID[-1], GEMM_GRID[-5], GEMM_GRID[-9]],
                         ids=lambda c: c.id)
def test_64_bit_index_specialisation(case, name, family):
    check(case, name, index_type="long long", seed=3, family=family)


SEEDS = {
    "alexnet_conv1": Case(256, 3, 96, 224, 224, 11, 11, stride=4, padding=2),
    "wide_5x9": Case(8, 32, 64, 512, 512, 5, 9, bias=False),
}


@pytest.mark.parametrize("family", [GEMM_KERNEL, NHWC_KERNEL])
@pytest.mark.parametrize("name", DTYPES)
@pytest.mark.parametrize("seed_shape", SEEDS)
def test_seed_shapes_full_size(seed_shape, name, family):
    """Whole batch computed (no NaN left); first, middle and last images against float64."""
    case = SEEDS[seed_shape]
    dtype, torch_dtype = DTYPES[name]
    x, weight, bias = random_inputs(case, torch_dtype, seed=11)
    out = run_gemm(x, weight, bias, case, dtype, family=family)
    assert not out.isnan().any()
    sample = [0, case.n // 2, case.n - 1]
    ref = reference(x[sample], weight, bias, case)
    error = relative_error(out[sample], ref)
    assert error < TOLERANCE[name], f"{name} relative error {error:.3g}"


def test_input_past_2_31_elements():
    """float16 input of 2.15e9 elements: 64-bit indices chosen, and the last rows (past 2^31) right."""
    n, c, h, w = 1, 16, 8192, 16400
    assert n * c * h * w > 2**31
    case = Case(n, c, 8, h, w, 3, 3, padding=1, bias=True)
    g = torch.Generator(device="cuda").manual_seed(5)
    x = torch.randn(n, c, h, w, device="cuda", dtype=torch.float16, generator=g)
    weight = torch.randn(8, c, 3, 3, device="cuda", dtype=torch.float16, generator=g)
    bias = torch.randn(8, device="cuda", dtype=torch.float16, generator=g)
    assert make_plan(gemm_problem(case, "float16")).index_type == "long long"
    crop = F.pad(x[:, :, h - 10:].double(), (1, 1, 0, 1))  # the bottom rows, padded as the full input is
    ref = F.conv2d(crop, weight.double(), bias.double())
    for family in (NHWC_KERNEL, GEMM_KERNEL):
        out = run_gemm(x, weight, bias, case, "float16", family=family)
        tail = out[:, :, h - ref.shape[2]:]
        assert not tail.isnan().any(), family
        assert relative_error(tail, ref) < TOLERANCE["float16"], family
        del out, tail
    del x


def test_dispatch_rules():
    """16-bit types take the GEMM by default (channels-last unless it cannot run); float32 only with
    allow_tf32 (strict float32 takes the FMA implicit GEMM); float64 never; depthwise takes its own kernel."""
    case = Case(2, 8, 32, 12, 12, 3, 3, padding=1)
    assert make_plan(gemm_problem(case, "float16")).kernel == NHWC_KERNEL
    assert make_plan(gemm_problem(case, "bfloat16")).kernel == NHWC_KERNEL
    assert make_plan(gemm_problem(case, "float32")).kernel == "simt_gemm_conv2d"
    assert make_plan(gemm_problem(case, "float32"), allow_tf32=True).kernel == NHWC_KERNEL
    odd_groups = Case(2, 6, 16, 9, 10, 3, 3, padding=1, groups=2)
    assert make_plan(gemm_problem(odd_groups, "float16")).kernel == GEMM_KERNEL
    assert make_plan(gemm_problem(odd_groups, "float32"), allow_tf32=True).kernel == NHWC_KERNEL
    assert make_plan(gemm_problem(case, "float64"), allow_tf32=True).kernel == "direct_conv2d"
    depthwise = Case(2, 8, 8, 12, 12, 3, 3, padding=1, groups=8)
    assert make_plan(gemm_problem(depthwise, "float16")).kernel == "depthwise_column_conv2d"  # 12 wide
    with pytest.raises(ValueError, match="computes in"):
        make_plan(gemm_problem(case, "float64"), kernel=GEMM_KERNEL)


@pytest.mark.parametrize("name", DTYPES)
@pytest.mark.parametrize("case", IN_PLACE_1X1, ids=lambda c: c.id)
def test_1x1_reads_the_input_in_place(case, name):
    """1x1, stride 1, no padding: the plan makes no channels-last copies (checked above for values)."""
    plan = make_plan(gemm_problem(case, DTYPES[name][0]), kernel=NHWC_KERNEL)
    assert plan.a_from_nchw and "read in place" in str(plan.reason)


def test_public_conv2d_allow_tf32():
    """cupyconv.conv2d(..., allow_tf32=True) on CuPy float32 runs the GEMM; the default stays strict."""
    case = Case(2, 16, 40, 20, 18, 3, 3, stride=(1, 2), padding=1)
    x, weight, bias = random_inputs(case, torch.float32, seed=9)
    ref = reference(x, weight, bias, case)
    cx, cw, cb = to_cupy(x), to_cupy(weight), to_cupy(bias)
    assert cupyconv.plan(cx, cw, cb, case.stride, case.padding, allow_tf32=True).kernel == NHWC_KERNEL
    fast = torch.from_dlpack(cupyconv.conv2d(cx, cw, cb, case.stride, case.padding, allow_tf32=True))
    strict = torch.from_dlpack(cupyconv.conv2d(cx, cw, cb, case.stride, case.padding))
    fast_error, strict_error = relative_error(fast, ref), relative_error(strict, ref)
    assert fast_error < TOLERANCE["tf32"]
    assert strict_error < 1e-5
    assert fast_error > strict_error  # TF32 really ran (its rounding shows)


# --- split-K ---------------------------------------------------------------------------------------

def run_split(case: Case, dtype: str, torch_dtype, layout: str, splits=None, config=None, seed=0, runs=1,
              stream_k=None):
    """The channels-last GEMM's plan for ``case`` in ``layout`` (NCHW, or NHWC arrays with a KHWC
    weight), split-K forced to ``splits`` runs (None: the planner's choice) and stream-K to
    ``stream_k`` (likewise), run ``runs`` times into NaN-poisoned outputs; returns the plan, the
    outputs (as NCHW views) and the float64 reference."""
    from cupyconv.families import implicit_gemm_nhwc

    problem = dataclasses.replace(gemm_problem(case, dtype), layout=layout,
                                  weight_layout="KHWC" if layout == "NHWC" else "KCHW")
    plan = dataclasses.replace(implicit_gemm_nhwc.make_plan(problem, config, "", compute_capability(), splits,
                                                            stream_k),
                               layout=problem.layout, weight_layout=problem.weight_layout)
    x, weight, bias = random_inputs(case, torch_dtype, seed)
    last = (lambda t: t.permute(0, 2, 3, 1).contiguous()) if layout == "NHWC" else (lambda t: t.contiguous())
    outs = []
    for _ in range(runs):
        out = torch.full(problem.out_array_shape, float("nan"), device="cuda", dtype=torch_dtype)
        conv2d_cupy(to_cupy(last(x)), to_cupy(last(weight)), to_cupy(bias), problem, to_cupy(out), plan=plan)
        outs.append(out.permute(0, 3, 1, 2) if layout == "NHWC" else out)
    torch.cuda.synchronize()
    return plan, outs, reference(x, weight, bias, case)


SPLIT_GRID = [c for c in GEMM_GRID + WGMMA_GRID if c.n and c.k // c.groups >= 8]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("splits", [2, 3, 7])
@pytest.mark.parametrize("name", DTYPES)
@pytest.mark.parametrize("case", SPLIT_GRID, ids=lambda c: c.id)
def test_split_k_forced(case, name, splits, layout):
    """The reduction forced into 2, 3 or 7 runs (7 leaves runs empty on short reductions, which must
    write zeros), with the default tile (wgmma on the H100), an mma.sync one and, where it can run
    (sm_90a, one group, whole k tiles of one tap, an input it copies), the producer warpgroup's, alone
    and (an even number of channel tiles) in pairs: every element written,
    within the dtype's tolerance, in both output layouts."""
    dtype, torch_dtype = DTYPES[name]
    if nhwc_refuses(case, dtype):
        return
    mma_sync = next(c.name for c in NHWC_CONFIGS[dtype] if not c.wgmma)
    producer = next(c for c in NHWC_CONFIGS[dtype] if c.producer_warps)
    pair = next(c for c in NHWC_CONFIGS[dtype] if c.cluster > 1)
    configs = [None, mma_sync]
    in_place = layout == "NCHW" and implicit_gemm_nhwc._nchw_a_vec(gemm_problem(case, dtype))
    if compute_capability() == 90 and case.groups == 1 and not case.c % producer.bk and not in_place:
        configs += [producer.name] + ([pair.name] if _pairs_run(case, pair) else [])
    for config in configs:
        plan, (out,), ref = run_split(case, dtype, torch_dtype, layout, splits, config, seed=splits)
        assert plan.splits == splits and plan.grid[2] == case.groups * splits
        assert not out.isnan().any(), "an output element was never written (or is NaN)"
        assert relative_error(out, ref) < TOLERANCE[name], (config, relative_error(out, ref))


# Batch 1 and 8 layers of ResNet-50 and MobileNetV2 that make too few tiles for the H100's 132 SMs.
SMALL_BATCH_LAYERS = {
    "r50_b1_l4_3x3_512": Case(1, 512, 512, 7, 7, 3, 3, padding=1),
    "r50_b1_l4_1x1_2048to512": Case(1, 2048, 512, 7, 7, 1, 1),
    "r50_b1_l3_3x3_256": Case(1, 256, 256, 14, 14, 3, 3, padding=1),
    "r50_b8_l4_3x3s2_512": Case(8, 512, 512, 14, 14, 3, 3, stride=2, padding=1, bias=False),
    "mv2_b1_1x1_960to160": Case(1, 960, 160, 7, 7, 1, 1),
}


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("name", DTYPES)
@pytest.mark.parametrize("layer", SMALL_BATCH_LAYERS)
def test_split_k_is_planned_and_deterministic(layer, name, layout):
    """The planner splits these small-batch layers, and ten runs on the same inputs give the same
    bits (the runs' partial sums are added in a fixed order, never atomically)."""
    dtype, torch_dtype = DTYPES[name]
    plan, outs, ref = run_split(SMALL_BATCH_LAYERS[layer], dtype, torch_dtype, layout, seed=4, runs=10)
    assert plan.splits > 1, str(plan)
    assert all(torch.equal(outs[0], out) for out in outs[1:]), "split-K must be bitwise repeatable"
    assert not outs[0].isnan().any()
    assert relative_error(outs[0], ref) < TOLERANCE[name]


def test_split_k_refusals():
    """A forced split count past the grid or with 64-bit indices is a ValueError before any launch."""
    from cupyconv.families import implicit_gemm_nhwc

    problem = gemm_problem(SMALL_BATCH_LAYERS["r50_b1_l4_3x3_512"], "float16")
    for bad in (0, -1, 70000, 2.0):
        with pytest.raises(ValueError, match="splits must be"):
            implicit_gemm_nhwc.make_plan(problem, splits=bad)


# --- stream-K (wgmma tiles; kernels/stream_k.cuh) ----------------------------------------------------

wgmma_only = pytest.mark.skipif(_cuda_device_count() == 0 or compute_capability() != 90,
                                reason="stream-K runs the wgmma tiles, on compute capability 9.0 (sm_90a) alone")
STREAM_K_GRID = [c for c in GEMM_GRID + WGMMA_GRID if c.n and c.k // c.groups >= 8]


@wgmma_only
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("blocks", [True, 3, 7, 61])
@pytest.mark.parametrize("config_index", STREAM_K_CONFIGS, ids=lambda i: NHWC_CONFIGS["float16"][i].name)
@pytest.mark.parametrize("name", DTYPES)
@pytest.mark.parametrize("case", STREAM_K_GRID, ids=lambda c: c.id)
def test_stream_k_forced(case, name, config_index, blocks, layout):
    """Every wgmma tile with stream-K forced, with the rule's block count and with 3, 7 and 61 blocks
    (blocks spanning many tiles; tiles spread over several blocks, or more blocks than k tiles per
    tile): every element written, within the dtype's tolerance, in both layouts; run twice, the same
    bits (the flags were left zero by the first run)."""
    dtype, torch_dtype = DTYPES[name]
    if not _wgmma_runs(case, dtype):
        return
    config = NHWC_CONFIGS[dtype][config_index].name
    plan, outs, ref = run_split(case, dtype, torch_dtype, layout, config=config, seed=int(blocks), runs=2,
                                stream_k=blocks)
    assert plan.stream_k_blocks >= 1 and plan.splits == 1, str(plan)
    assert not outs[0].isnan().any(), "an output element was never written (or is NaN)"
    assert relative_error(outs[0], ref) < TOLERANCE[name], relative_error(outs[0], ref)
    assert torch.equal(outs[0], outs[1])


# Layers at batch 32 whose whole tiles leave a quarter of the H100's SMs idle and whose reductions
# are long enough for stream-K (families/implicit_gemm_nhwc.py STREAM_K_MIN_WORK): VGG-16's 14x14
# layer with 488 input channels (512, whole k tiles, take the producer tile) in every dtype.
STREAM_K_LAYERS = {
    "vgg_conv5_2_488": (Case(32, 488, 512, 14, 14, 3, 3, padding=1), tuple(DTYPES)),
}
# ResNet-50's 3x3 layer of 512 channels at batch 32 and 8: 52 and 16 tiles of 128 x 128, which the
# producer tile runs with split-K.
PRODUCER_SPLIT_LAYERS = {
    "r50_l4_3x3_512": Case(32, 512, 512, 7, 7, 3, 3, padding=1, bias=False),
    "r50_b8_l4_3x3_512": Case(8, 512, 512, 7, 7, 3, 3, padding=1),
}


@wgmma_only
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("name", DTYPES)
@pytest.mark.parametrize("layer", PRODUCER_SPLIT_LAYERS)
def test_producer_split_is_planned_and_deterministic(layer, name, layout):
    """The planner takes the producer tile with split-K on these layers; ten runs on the same inputs
    give the same bits (the runs are added in order), every element written, within tolerance."""
    dtype, torch_dtype = DTYPES[name]
    plan, outs, ref = run_split(PRODUCER_SPLIT_LAYERS[layer], dtype, torch_dtype, layout, seed=6, runs=10)
    assert plan.config.producer_warps and plan.splits > 1, str(plan)
    assert all(torch.equal(outs[0], out) for out in outs[1:]), "split-K must be bitwise repeatable"
    assert not outs[0].isnan().any()
    assert relative_error(outs[0], ref) < TOLERANCE[name]


@wgmma_only
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("layer,name", [(layer, name) for layer, (_, names) in STREAM_K_LAYERS.items()
                                        for name in names])
def test_stream_k_is_planned_and_deterministic(layer, name, layout):
    """The planner takes stream-K on these layers, and ten runs on the same inputs give the same bits
    (each tile's owner adds the other blocks' sums in block order, never atomically)."""
    dtype, torch_dtype = DTYPES[name]
    plan, outs, ref = run_split(STREAM_K_LAYERS[layer][0], dtype, torch_dtype, layout, seed=5, runs=10)
    assert plan.stream_k_blocks > 0, str(plan)
    assert all(torch.equal(outs[0], out) for out in outs[1:]), "stream-K must be bitwise repeatable"
    assert not outs[0].isnan().any()
    assert relative_error(outs[0], ref) < TOLERANCE[name]


@wgmma_only
@pytest.mark.parametrize("name", ["float16", "tf32"])
def test_stream_k_epilogue_streams_and_graphs(name):
    """Through the public calls: stream-K finishes the fused epilogue (bias, residual, activation) in
    channels_last; two streams run it side by side (each its own flags); a CUDA graph captured
    through the torch adapter replays it with the same bits as the eager call (float32 there in
    TF32: torch.backends.cudnn.allow_tf32, torch's default)."""
    import cupyconv.torch as cc_torch

    dtype, torch_dtype = DTYPES[name]
    case = STREAM_K_LAYERS["vgg_conv5_2_488"][0]
    x, weight, bias = random_inputs(case, torch_dtype, 11)
    residual = torch.randn(case.n, case.k, case.h, case.w, device="cuda", dtype=torch.float64).to(torch_dtype)
    ref = F.relu(reference(x, weight, bias, case) + residual.double())
    cl = lambda t: t.permute(0, 2, 3, 1).contiguous()
    arrays = [to_cupy(t) for t in (cl(x), cl(weight), bias, cl(residual))]
    problem_plan = cupyconv.plan(*arrays[:3], padding=1, allow_tf32=True, layout="NHWC", weight_layout="KHWC",
                                 activation="relu", residual=arrays[3])
    assert problem_plan.stream_k_blocks > 0, str(problem_plan)
    torch.cuda.synchronize()  # the side streams do not wait for torch's, which made the inputs
    streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(2)]
    outs = []
    for stream in streams:
        with stream:
            outs.append(cupyconv.conv2d(*arrays[:3], padding=1, allow_tf32=True, layout="NHWC",
                                        weight_layout="KHWC", activation="relu", residual=arrays[3]))
    for stream in streams:
        stream.synchronize()
    got = [torch.from_dlpack(out).permute(0, 3, 1, 2) for out in outs]
    assert torch.equal(got[0], got[1]) and not got[0].isnan().any()
    assert relative_error(got[0], ref) < TOLERANCE[name]

    xs, ws = x.to(memory_format=torch.channels_last), weight.to(memory_format=torch.channels_last)
    eager = cc_torch.conv2d(xs, ws, bias, padding=1)
    static = xs.clone()
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        cc_torch.conv2d(static, ws, bias, padding=1)  # warm-up outside the capture
        with torch.cuda.graph(graph):
            captured = cc_torch.conv2d(static, ws, bias, padding=1)
    torch.cuda.current_stream().wait_stream(side)
    for _ in range(2):
        captured.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, eager)
