"""TMA tensor maps (CUtensorMap, the descriptor a kernel's cp.async.bulk.tensor reads), encoded by the
CUDA driver's cuTensorMapEncodeTiled through ctypes: CuPy does not wrap it, and the map embeds the
tensor's global address, so it is made (again) at the call wherever that address changed
(executor.PackedLaunch). Only the 2-D row-major, 128-byte swizzled form the channels-last GEMM's
producer tile reads (program.TensorMap)."""
from __future__ import annotations

import ctypes
import functools

#: CUtensorMapDataType values (cuda.h) of the storage dtypes.
DATA_TYPES = {"float16": 6, "float32": 7, "bfloat16": 9}
SWIZZLE_128B = 3
L2_PROMOTION_128B = 2
MAP_BYTES = 128
MAP_ALIGNMENT = 64


@functools.lru_cache(maxsize=None)
def _encode_tiled():
    """cuTensorMapEncodeTiled from the driver library (RuntimeError where there is none)."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError as error:
        raise RuntimeError(f"the CUDA driver library (libcuda.so.1) is needed for TMA tensor maps: {error}") from error
    encode = driver.cuTensorMapEncodeTiled
    u32p, u64p = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64)
    encode.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p, u32p, u32p,
                       ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    encode.restype = ctypes.c_int
    return encode


def encode_2d(destination: int, dtype: str, address: int, rows: int, columns: int, row_bytes: int,
              box_rows: int, box_columns: int) -> None:
    """Write at ``destination`` (MAP_BYTES, MAP_ALIGNMENT-aligned host memory) the map of the row-major
    ``rows`` x ``columns`` matrix of ``dtype`` at device ``address``, rows ``row_bytes`` apart, read in
    ``box_rows`` x ``box_columns`` boxes with the 128-byte swizzle; reads outside it give zeros."""
    if destination % MAP_ALIGNMENT or address % 16 or row_bytes % 16:
        raise ValueError(f"a tensor map needs a {MAP_ALIGNMENT}-byte aligned map and 16-byte aligned rows; got map "
                         f"{destination:#x}, address {address:#x}, rows {row_bytes} bytes apart")
    dims = (ctypes.c_uint64 * 2)(columns, rows)
    strides = (ctypes.c_uint64 * 1)(row_bytes)
    box = (ctypes.c_uint32 * 2)(box_columns, box_rows)
    element_strides = (ctypes.c_uint32 * 2)(1, 1)
    result = _encode_tiled()(destination, DATA_TYPES[dtype], 2, address, dims, strides, box, element_strides, 0,
                             SWIZZLE_128B, L2_PROMOTION_128B, 0)
    if result != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed (CUresult {result}) for a {rows} x {columns} {dtype} "
                           f"matrix at {address:#x}, rows {row_bytes} bytes apart, boxes {box_rows} x {box_columns}")
