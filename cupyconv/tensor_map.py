"""TMA tensor maps (CUtensorMap, the descriptor a kernel's cp.async.bulk.tensor reads), encoded by the
CUDA driver's cuTensorMapEncodeTiled through ctypes: CuPy does not wrap it, and the map embeds the
tensor's global address, so it is made at the call for each new address and kept per address
(executor.MapSlot). The forms the channels-last GEMM's producer tile reads, 128-byte swizzled:
a 2-D row-major matrix (program.TensorMap, its weight) and an NHWC tensor in im2col mode
(program.Im2colMap, its input), and an NHWC tensor read in strips of a row's pixels (program.PixelStripMap,
the ping-pong tile's pixel strips)."""
from __future__ import annotations

import ctypes
import functools

from .program import Im2colMap, PixelStripMap

#: CUtensorMapDataType values (cuda.h) of the storage dtypes.
DATA_TYPES = {"float16": 6, "float32": 7, "bfloat16": 9}
SWIZZLE_NONE = 0
SWIZZLE_64B = 2
SWIZZLE_128B = 3
L2_PROMOTION_128B = 2
MAP_BYTES = 128
MAP_ALIGNMENT = 64


@functools.lru_cache(maxsize=None)
def _driver():
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError as error:
        raise RuntimeError(f"the CUDA driver library (libcuda.so.1) is needed for TMA tensor maps: {error}") from error


_U32P, _U64P, _INTP = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_int)


@functools.lru_cache(maxsize=None)
def _encode_tiled():
    """cuTensorMapEncodeTiled from the driver library (RuntimeError where there is none)."""
    encode = _driver().cuTensorMapEncodeTiled
    encode.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, _U64P, _U64P, _U32P, _U32P,
                       ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    encode.restype = ctypes.c_int
    return encode


@functools.lru_cache(maxsize=None)
def _encode_im2col():
    """cuTensorMapEncodeIm2col from the driver library."""
    encode = _driver().cuTensorMapEncodeIm2col
    encode.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, _U64P, _U64P, _INTP, _INTP,
                       ctypes.c_uint32, ctypes.c_uint32, _U32P, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    encode.restype = ctypes.c_int
    return encode


def _row_swizzle(row_bytes: int) -> int:
    """The swizzle across a box's rows of ``row_bytes``: 64 bytes where a row is that wide (a 16-bit pixel of 32
    channels), else 128."""
    return SWIZZLE_64B if row_bytes == 64 else SWIZZLE_128B


def encode(arg, destination: int, address: int) -> None:
    """Write at ``destination`` the map ``arg`` (program.TensorMap, Im2colMap or PixelStripMap) describes, for
    its operand at device ``address``."""
    if isinstance(arg, PixelStripMap):
        encode_pixel_strips(destination, arg.dtype, address, arg.shape, arg.pixels)
    elif isinstance(arg, Im2colMap):
        encode_im2col(destination, arg.dtype, address, arg.shape, arg.lower, arg.upper, arg.strides,
                      arg.channels_per_pixel, arg.pixels_per_column)
    else:
        encode_2d(destination, arg.dtype, address, arg.rows, arg.columns, arg.row_bytes, arg.box_rows,
                  arg.box_columns, arg.swizzled)


def encode_im2col(destination: int, dtype: str, address: int, shape: tuple[int, int, int, int],
                  lower: tuple[int, int], upper: tuple[int, int], strides: tuple[int, int], channels_per_pixel: int,
                  pixels_per_column: int) -> None:
    """Write at ``destination`` the im2col map of the NHWC tensor of ``shape`` (n, h, w, c) of ``dtype`` at
    ``address``: each copy ``pixels_per_column`` window corners, walked along w, then h, then n, ``strides``
    (h, w) apart within the box from ``lower`` to (h, w) + ``upper`` (h, w), ``channels_per_pixel``
    channels each, swizzled across their row (128 bytes, or 64 where a pixel's row is 64 bytes: the ping-pong
    tile's two taps a k tile); reads outside the tensor give zeros."""
    n, h, w, c = shape
    item = 4 if dtype == "float32" else 2
    if destination % MAP_ALIGNMENT or address % 16 or (c * item) % 16:
        raise ValueError(f"an im2col map needs a {MAP_ALIGNMENT}-byte aligned map, a 16-byte aligned tensor and "
                         f"pixels of a multiple of 16 bytes; got map {destination:#x}, address {address:#x}, "
                         f"{c} channels of {dtype}")
    dims = (ctypes.c_uint64 * 4)(c, w, h, n)
    byte_strides = (ctypes.c_uint64 * 3)(c * item, w * c * item, h * w * c * item)
    low = (ctypes.c_int * 2)(lower[1], lower[0])
    high = (ctypes.c_int * 2)(upper[1], upper[0])
    element_strides = (ctypes.c_uint32 * 4)(1, strides[1], strides[0], 1)
    result = _encode_im2col()(destination, DATA_TYPES[dtype], 4, address, dims, byte_strides, low, high,
                              channels_per_pixel, pixels_per_column, element_strides, 0,
                              _row_swizzle(channels_per_pixel * item),
                              L2_PROMOTION_128B, 0)
    if result != 0:
        raise RuntimeError(f"cuTensorMapEncodeIm2col failed (CUresult {result}) for an NHWC {shape} {dtype} tensor at "
                           f"{address:#x}, corners {lower} .. {upper}, strides {strides}, {pixels_per_column} pixels of "
                           f"{channels_per_pixel} channels")


def encode_pixel_strips(destination: int, dtype: str, address: int, shape: tuple[int, int, int, int],
                        pixels: int) -> None:
    """Write at ``destination`` the tiled map of the NHWC tensor of ``shape`` (n, h, w, c) of ``dtype`` at
    ``address`` read in boxes of ``pixels`` consecutive pixels of one row, all c channels (a row of 64 or 128 bytes,
    swizzled across its width); reads outside the tensor (padding, rows past the image) give zeros."""
    n, h, w, c = shape
    item = 4 if dtype == "float32" else 2
    if destination % MAP_ALIGNMENT or address % 16 or c * item not in (64, 128) or not 1 <= pixels <= 256:
        raise ValueError(f"a pixel strip map needs a {MAP_ALIGNMENT}-byte aligned map, a 16-byte aligned tensor, pixels "
                         f"of 64 or 128 bytes and 1-256 of them a box; got map {destination:#x}, address {address:#x}, "
                         f"{c} channels of {dtype}, {pixels} pixels")
    dims = (ctypes.c_uint64 * 4)(c, w, h, n)
    strides = (ctypes.c_uint64 * 3)(c * item, w * c * item, h * w * c * item)
    box = (ctypes.c_uint32 * 4)(c, pixels, 1, 1)
    element_strides = (ctypes.c_uint32 * 4)(1, 1, 1, 1)
    result = _encode_tiled()(destination, DATA_TYPES[dtype], 4, address, dims, strides, box, element_strides, 0,
                             _row_swizzle(c * item), L2_PROMOTION_128B, 0)
    if result != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed (CUresult {result}) for pixel strips of an NHWC {shape} "
                           f"{dtype} tensor at {address:#x}, {pixels} pixels a box")


def encode_2d(destination: int, dtype: str, address: int, rows: int, columns: int, row_bytes: int,
              box_rows: int, box_columns: int, swizzled: bool = True) -> None:
    """Write at ``destination`` (MAP_BYTES, MAP_ALIGNMENT-aligned host memory) the map of the row-major
    ``rows`` x ``columns`` matrix of ``dtype`` at device ``address``, rows ``row_bytes`` apart, read in
    ``box_rows`` x ``box_columns`` boxes with the 128-byte swizzle, or (``swizzled`` False) as plain
    rows; reads outside it give zeros. A copy's box must start on a 16-byte piece of its row either way
    (elsewhere the kernel stops with an illegal instruction, H200)."""
    if destination % MAP_ALIGNMENT or address % 16 or row_bytes % 16:
        raise ValueError(f"a tensor map needs a {MAP_ALIGNMENT}-byte aligned map and 16-byte aligned rows; got map "
                         f"{destination:#x}, address {address:#x}, rows {row_bytes} bytes apart")
    dims = (ctypes.c_uint64 * 2)(columns, rows)
    strides = (ctypes.c_uint64 * 1)(row_bytes)
    box = (ctypes.c_uint32 * 2)(box_columns, box_rows)
    element_strides = (ctypes.c_uint32 * 2)(1, 1)
    result = _encode_tiled()(destination, DATA_TYPES[dtype], 2, address, dims, strides, box, element_strides, 0,
                             SWIZZLE_128B if swizzled else SWIZZLE_NONE, L2_PROMOTION_128B, 0)
    if result != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed (CUresult {result}) for a {rows} x {columns} {dtype} "
                           f"matrix at {address:#x}, rows {row_bytes} bytes apart, boxes {box_rows} x {box_columns}")
