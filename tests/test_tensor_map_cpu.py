"""TMA tensor maps without a GPU: the channels-last GEMM's producer tile passes its weight as a
program.TensorMap and its input as a program.Im2colMap of the right geometry, and cupyconv.tensor_map
refuses misaligned maps before it calls the driver (tests/test_igemm_gpu.py runs the maps on the GPU)."""
import dataclasses

import pytest

from cases import Case
from cupyconv import tensor_map
from cupyconv.arguments import make_problem
from cupyconv.families import implicit_gemm_nhwc
from cupyconv.planner import NHWC_KERNEL, make_plan, program
from cupyconv.program import PREPARED, WEIGHT, WORKSPACE, X, Im2colMap, TensorMap

PRODUCER = next(c.name for c in implicit_gemm_nhwc.NHWC_CONFIGS["float16"] if c.producer_warps)
PIXEL_ROWS = implicit_gemm_nhwc.PIXEL_ROWS_CONFIG


def problem_of(case: Case, dtype: str, layout: str, weight_layout: str):
    problem = make_problem((case.n, case.c, case.h, case.w), (case.k, case.c // case.groups, case.kh, case.kw),
                           None, dtype, case.stride, case.padding, case.dilation, case.groups)
    return dataclasses.replace(problem, layout=layout, weight_layout=weight_layout)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("layouts", [("NHWC", "KHWC"), ("NCHW", "KCHW")])
@pytest.mark.parametrize("case", [Case(2, 64, 200, 9, 9, 3, 3, padding=1),
                                  Case(1, 128, 96, 17, 18, 5, 3, stride=(2, 1), padding=(2, 1), dilation=(1, 2)),
                                  Case(2, 64, 136, 10, 9, 4, 2, padding="same"),
                                  Case(1, 128, 130, 15, 13, 3, 3, stride=2, padding=2, dilation=2)],
                         ids=lambda c: c.id)
def test_producer_tile_reads_by_tensor_maps(case, layouts, dtype):
    problem = problem_of(case, dtype, *layouts)
    plan = make_plan(problem, PRODUCER, NHWC_KERNEL, True, 90, splits=1)
    call = program(plan, problem)
    gemm = call.launches[-1]
    assert gemm.kernel == implicit_gemm_nhwc.TMA_KERNEL and gemm.name_expression.startswith(
        f"cupyconv::{implicit_gemm_nhwc.TMA_KERNEL}<")
    weight_map, x_map, x_is_matrix = gemm.args[-3:]
    assert isinstance(weight_map, TensorMap) and weight_map.pointer.operand in (WEIGHT, PREPARED)
    assert weight_map.pointer.operand == (PREPARED if call.weight else WEIGHT)
    columns = case.kh * case.kw * plan.channels_padded // case.groups
    item = 4 if dtype == "float32" else 2
    assert (weight_map.rows, weight_map.columns, weight_map.row_bytes) == (case.k, columns, columns * item)
    assert (weight_map.box_rows, weight_map.box_columns) == (plan.config.bn, plan.config.bk)
    assert weight_map.box_columns * item == 128  # the 128-byte swizzle's span, the wgmma rows
    assert weight_map.row_bytes % 16 == 0
    # the input in im2col mode: BM window corners, BK channels each
    assert x_is_matrix == 0 and isinstance(x_map, Im2colMap)
    assert x_map.shape == (case.n, case.h, case.w, plan.channels_padded)
    assert (x_map.pixels_per_column, x_map.channels_per_pixel) == (plan.config.bm, plan.config.bk)
    assert x_map.lower == (-problem.pad_top, -problem.pad_left) and x_map.strides == problem.stride
    assert x_map.upper == (problem.pad_bottom - (case.kh - 1) * problem.dilation[0],
                           problem.pad_right - (case.kw - 1) * problem.dilation[1])
    # The box's corners walked at the strides make exactly the output's rows and columns.
    for size, low, high, stride, out in zip((case.h, case.w), x_map.lower, x_map.upper, x_map.strides,
                                            (problem.ho, problem.wo)):
        assert len(range(low, size + high, stride)) == out


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("pixels", [128, 192, 256])
def test_1x1_layers_copy_x_as_a_matrix(pixels, dtype):
    """A 1x1, stride-1, unpadded layer's NHWC x is copied by a 2-D map of the matrix
    [N H W][C] in BM x BK boxes (x_is_matrix 1) on the 128- and 192-pixel producer tiles; the 256-pixel
    tile and strided 1x1 layers keep the im2col map (0)."""
    item = 4 if dtype == "float32" else 2
    for case, matrix in ((Case(3, 128, 136, 10, 11, 1, 1), pixels <= implicit_gemm_nhwc.MATRIX_MAP_MAX_PIXELS),
                         (Case(2, 128, 136, 10, 11, 1, 1, stride=2), False)):
        problem = problem_of(case, dtype, "NHWC", "KHWC")
        plan = make_plan(problem, f"nhwc_wgmma_producer_m{pixels}n128", NHWC_KERNEL, True, 90, splits=1)
        gemm = program(plan, problem).launches[-1]
        assert gemm.kernel == implicit_gemm_nhwc.TMA_KERNEL and gemm.args[-1] == int(matrix)
        x_map = gemm.args[-2]
        if matrix:
            assert isinstance(x_map, TensorMap) and x_map.pointer.operand == X
            assert (x_map.rows, x_map.columns, x_map.row_bytes) == (case.n * case.h * case.w, case.c, case.c * item)
            assert (x_map.box_rows, x_map.box_columns) == (pixels, plan.config.bk)
        else:
            assert isinstance(x_map, Im2colMap)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("pixels", [128, 192, 256])
def test_pairs_copy_half_the_input_tile_each(pixels, dtype):
    """A pair's blocks (a cluster of two channel tiles) each copy half of the input tile: the im2col map's
    box is half the tile's pixels, the launch the pair's kernel; an odd number of channel tiles, or 64-bit
    indices, are refused before any launch."""
    name = f"nhwc_wgmma_producer_m{pixels}n128_pair"
    problem = problem_of(Case(2, 64, 256, 12, 11, 3, 3, padding=1), dtype, "NHWC", "KHWC")
    plan = make_plan(problem, name, NHWC_KERNEL, True, 90, splits=1)
    assert plan.config.cluster == 2 and plan.grid[1] == 2
    gemm = program(plan, problem).launches[-1]
    assert gemm.kernel == implicit_gemm_nhwc.PAIR_KERNEL and gemm.name_expression.startswith(
        f"cupyconv::{implicit_gemm_nhwc.PAIR_KERNEL}<")
    assert gemm.args[-1].pixels_per_column == pixels // 2
    for case in (Case(2, 64, 384, 12, 11, 3, 3, padding=1), Case(4096, 64, 256, 128, 128, 3, 3, padding=1)):
        with pytest.raises(ValueError, match="clusters of 2 channel tiles"):  # 3 channel tiles; 2^32 elements
            make_plan(problem_of(case, dtype, "NHWC", "KHWC"), name, NHWC_KERNEL, True, 90)


def test_producer_tile_refuses_what_it_cannot_run():
    problem = problem_of(Case(1, 256, 256, 7, 7, 3, 3, padding=1), "float16", "NHWC", "KHWC")
    with pytest.raises(ValueError, match="stream_k needs"):
        make_plan(problem, PRODUCER, NHWC_KERNEL, True, 90, stream_k=True)
    grouped = problem_of(Case(2, 128, 96, 6, 6, 3, 3, padding=1, groups=2), "float16", "NHWC", "KHWC")
    straddling = problem_of(Case(1, 40, 96, 7, 8, 3, 3, padding=1), "float16", "NHWC", "KHWC")  # k tiles across taps
    for refused in (grouped, straddling):
        with pytest.raises(ValueError, match="cannot run this problem: its producer warpgroup"):
            make_plan(refused, PRODUCER, NHWC_KERNEL, True, 90)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("layouts", [("NHWC", "KHWC"), ("NCHW", "KCHW")])
def test_producer_tile_splits_the_reduction(layouts, dtype):
    """Split-K on the producer's tile: the TMA launch with both maps writes float32 runs to the
    workspace, no bias, and the ordered reduction finishes them; the instance is compiled for sm_90a."""
    problem = problem_of(Case(2, 256, 256, 7, 7, 3, 3, padding=1), dtype, *layouts)
    problem = dataclasses.replace(problem, has_bias=True)
    plan = make_plan(problem, PRODUCER, NHWC_KERNEL, True, 90, splits=3)
    assert plan.grid[2] == 3 and plan.config.producer_warps
    call = program(plan, problem)
    gemm, reduce = call.launches[-2:]
    assert gemm.kernel == implicit_gemm_nhwc.TMA_KERNEL and gemm.name_expression.endswith(",true>")
    assert gemm.name_expression in implicit_gemm_nhwc.arch_specialisations()[implicit_gemm_nhwc.WGMMA_ARCH]
    assert isinstance(gemm.args[-3], TensorMap) and isinstance(gemm.args[-2], Im2colMap) and gemm.args[-1] == 0
    assert gemm.args[3].operand == WORKSPACE and gemm.args[4] == 0  # partial sums, the bias left to the reduction
    assert reduce.kernel == implicit_gemm_nhwc.REDUCE_KERNEL
    assert call.workspace_bytes >= 4 * 3 * problem.n * problem.k * problem.ho * problem.wo


@pytest.mark.parametrize("destination,address,row_bytes", [(32, 0, 128), (0, 8, 128), (0, 0, 24)])
def test_misaligned_maps_are_refused_before_the_driver(destination, address, row_bytes):
    with pytest.raises(ValueError, match="aligned"):
        tensor_map.encode_2d(destination, "float16", address, 4, 64, row_bytes, 4, 64)


@pytest.mark.parametrize("case", [Case(2, 64, 200, 9, 9, 3, 3, padding=1), Case(2, 64, 128, 8, 8, 1, 1, stride=2),
                                  Case(1, 128, 130, 15, 13, 3, 3, stride=2, padding=2, dilation=2)],
                         ids=lambda c: c.id)
def test_producer_tile_rounds_float32_inputs_in_place(case):
    """A float32 NHWC input goes to the producer's tile in place, its TMA map on x itself, and the
    kernel rounds it to TF32 (ROUND_A) where other tiles of several taps read a rounded copy; an NCHW
    input is still copied and rounded by the copy."""
    nhwc = problem_of(case, "float32", "NHWC", "KHWC")
    plan = make_plan(nhwc, PRODUCER, NHWC_KERNEL, True, 90, splits=1)
    call = program(plan, nhwc)
    assert plan.round_a and len(call.launches) == 1 and call.workspace_bytes == 0
    gemm = call.launches[0]
    assert gemm.name_expression.endswith(",true,true,false>") and gemm.args[-2].pointer.operand == X
    assert gemm.name_expression in implicit_gemm_nhwc.arch_specialisations()[implicit_gemm_nhwc.WGMMA_ARCH]
    nchw = make_plan(problem_of(case, "float32", "NCHW", "KCHW"), PRODUCER, NHWC_KERNEL, True, 90, splits=1)
    assert not nchw.round_a and program(nchw, problem_of(case, "float32", "NCHW", "KCHW")).launches[-1] \
        .name_expression.endswith(",false,false,false>")
    if case.kh * case.kw > 1:  # the other wgmma tiles read a rounded copy; mma.sync's round fragments
        other = make_plan(nhwc, PIXEL_ROWS, NHWC_KERNEL, True, 90)
        copy = program(other, nhwc).launches[0]
        assert not other.round_a and copy.kernel == implicit_gemm_nhwc.PAD_CHANNELS
        assert copy.name_expression.endswith("<float,true>")
        mma_sync = make_plan(nhwc, None, NHWC_KERNEL, True, 80)
        assert not mma_sync.config.wgmma and mma_sync.round_a
        assert implicit_gemm_nhwc.PAD_CHANNELS not in {launch.kernel for launch in program(mma_sync, nhwc).launches}


def test_map_slot_encodes_each_address_once(monkeypatch):
    """executor.MapSlot: calls that alternate their operand's address (layers of one shape sharing a launch)
    have the driver encode each address's map once; after that the slot copies the encoded bytes back, so
    that the bytes at its host address are always those of the current address. Past MAPS_KEPT addresses
    the oldest is dropped and encoded again when it returns."""
    import ctypes

    from cupyconv import executor
    from cupyconv.program import OPERANDS, Pointer

    encoded = []

    def fake_encode(arg, destination, address):  # the driver's bytes: a function of the address alone
        encoded.append(address)
        ctypes.memmove(destination, address.to_bytes(8, "little") * (tensor_map.MAP_BYTES // 8), tensor_map.MAP_BYTES)

    monkeypatch.setattr(tensor_map, "encode", fake_encode)
    monkeypatch.setattr(executor, "MAPS_KEPT", 3)
    buffer = ctypes.create_string_buffer(tensor_map.MAP_BYTES)
    arg = TensorMap(Pointer(WEIGHT, 256), "float16", 64, 64, 128, 128, 64)
    slot = executor.MapSlot(OPERANDS.index(WEIGHT), 256, arg, ctypes.addressof(buffer))

    def call(weight: int) -> int:
        slot.write(executor.addresses(x=1 << 20, weight=weight))
        return int.from_bytes(buffer.raw[-8:], "little")

    assert [call(w) for w in (4096, 8192, 4096, 8192, 8192)] == [4352, 8448, 4352, 8448, 8448]
    assert encoded == [4352, 8448]
    assert [call(w) for w in (12288, 16384, 4096, 8192)] == [12544, 16640, 4352, 8448]
    # Three kept: 16640 dropped 4352 (the oldest), whose return dropped 8448.
    assert encoded == [4352, 8448, 12544, 16640, 4352, 8448]


#: Strides past 8 and windows more than 128 pixels outside the plane, which an im2col map cannot walk.
PAST_THE_IM2COL_MAP = [Case(8, 64, 64, 200, 200, 3, 3, stride=9), Case(2, 64, 128, 16, 16, 3, 3, padding=130),
                       Case(8, 128, 128, 200, 60, 3, 3, stride=(10, 1), padding=1),
                       Case(1, 256, 256, 300, 300, 3, 3, stride=9, padding=1),
                       Case(4, 64, 256, 40, 40, 1, 1, padding=130),
                       Case(2, 64, 64, 300, 20, 1, 1, stride=(1, 16))]
#: The tiles fed by im2col maps (the pixel strips' tiles read x by a tiled map).
TMA_TILES = [c for c in implicit_gemm_nhwc.NHWC_CONFIGS["float16"]
             if c.producer_warps and c.name not in implicit_gemm_nhwc.PIXEL_STRIPS_CONFIGS]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("layouts", [("NHWC", "KHWC"), ("NCHW", "KCHW")])
@pytest.mark.parametrize("case", PAST_THE_IM2COL_MAP, ids=lambda c: c.id)
def test_tiles_fed_by_tma_refuse_windows_past_the_im2col_map(case, layouts, dtype):
    """cuTensorMapEncodeIm2col takes element strides up to 8 and (4-D tensors) window corners within
    [-128, 128): the rules' plans on sm_90a build no im2col map past those bounds, and each tile fed by
    TMA, forced, says why it cannot run the layer before anything is launched."""
    problem = problem_of(case, dtype, *layouts)
    assert not implicit_gemm_nhwc.im2col_map_fits(problem)
    plan = make_plan(problem, None, None, True, 90)
    assert not any(isinstance(arg, Im2colMap) for launch in program(plan, problem).launches for arg in launch.args)
    for cfg in TMA_TILES:
        if cfg.wgmma == implicit_gemm_nhwc.WGMMA_PINGPONG and (dtype, layouts[0]) not in (("float16", "NHWC"),
                                                                                         ("bfloat16", "NHWC")):
            continue  # the ping-pong tiles run 16-bit NHWC layers alone
        with pytest.raises(ValueError, match="im2col copies take strides up to 8"):
            make_plan(problem, cfg.name, NHWC_KERNEL, True, 90)


@pytest.mark.parametrize("channels,dtype,swizzle", [(32, "float16", tensor_map.SWIZZLE_64B),
                                                    (64, "bfloat16", tensor_map.SWIZZLE_128B),
                                                    (32, "float32", tensor_map.SWIZZLE_128B)])
def test_im2col_maps_swizzle_across_their_row(monkeypatch, channels, dtype, swizzle):
    """An im2col map's swizzle spans a pixel's row of channels: 64 bytes (the ping-pong tiles' two taps a k tile,
    whose wgmma descriptors read 64-byte swizzled rows) or 128."""
    import ctypes

    calls = []

    def fake_encode(*args):
        calls.append(args)
        return 0

    monkeypatch.setattr(tensor_map, "_encode_im2col", lambda: fake_encode)
    buffer = ctypes.create_string_buffer(tensor_map.MAP_BYTES + tensor_map.MAP_ALIGNMENT)
    destination = -(-ctypes.addressof(buffer) // tensor_map.MAP_ALIGNMENT) * tensor_map.MAP_ALIGNMENT
    tensor_map.encode_im2col(destination, dtype, 1 << 20, (2, 16, 16, 64), (-1, -1), (-1, -1), (1, 1), channels, 128)
    assert calls[0][12] == swizzle
