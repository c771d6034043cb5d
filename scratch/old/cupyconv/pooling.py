"""The mean over each image's pixels of a channels-last tensor (kernels/mean_pixels.cu): squeeze-and-
excitation's pooling, which ``convert(model, fuse=True)`` runs before the squeeze convolution
(cupyconv.torch_fusion). torch reduces the non-contiguous (H, W) of a channels_last tensor at about a
third of the copy bandwidth (H100, EfficientNet-B0 b32: 181 us for its 17 poolings).

The program: partial float sums per (split of the pixels, image, channel) in the workspace, then their
sum in a fixed order: deterministic, with enough blocks to fill the GPU for one image's large plane.
"""
from __future__ import annotations

import functools
import math

from .families.common import CTYPES, H100_SMS, STORAGE_BYTES
from .program import OUT, WORKSPACE, X, CallProgram, Launch, Pointer

PARTIAL, FINISH = "mean_pixels_partial", "mean_pixels_finish"
DTYPES = ("float16", "bfloat16", "float32")
THREADS = 256
#: Blocks asked of a launch: a few per SM, so that the copies in flight cover the memory latency.
TARGET_BLOCKS = 4 * H100_SMS


def vector(dtype: str, c: int) -> int:
    """Channels per thread: a 16-byte vector where C is a multiple of it, else 1."""
    vec = 16 // STORAGE_BYTES[dtype]
    return vec if c % vec == 0 else 1


def refusal(n: int, c: int, pixels: int, dtype: str) -> str:
    """Why the kernels cannot pool this tensor ("" when they can)."""
    if dtype not in DTYPES:
        return f"it pools {DTYPES}, not {dtype}"
    if min(n, c, pixels) < 1 or n > 65535 or n * c >= 2**31 or n * pixels * c >= 2**62:
        return f"shape ({n}, {pixels} pixels, {c} channels) outside its grid"
    return ""


@functools.lru_cache(maxsize=1024)
def program(n: int, c: int, pixels: int, dtype: str) -> CallProgram:
    """The two launches pooling X [n][pixels][c] into OUT [n][c] (x's dtype), the float partial sums
    in the workspace."""
    why_not = refusal(n, c, pixels, dtype)
    if why_not:
        raise ValueError(f"cannot pool: {why_not}")
    vec = vector(dtype, c)
    vectors = c // vec
    lanes_c = min(vectors, THREADS)
    channel_blocks = math.ceil(vectors / lanes_c)
    lanes_p = THREADS // lanes_c
    splits = max(1, min(math.ceil(pixels / lanes_p), math.ceil(TARGET_BLOCKS / (n * channel_blocks)), 65535))
    per_split = math.ceil(pixels / splits)
    splits = math.ceil(pixels / per_split)
    partial = Launch(PARTIAL, f"cupyconv::{PARTIAL}<{CTYPES[dtype]},{vec}>", (channel_blocks, n, splits),
                     (THREADS, 1, 1), 0, (Pointer(X), Pointer(WORKSPACE), n, pixels, c, lanes_c, per_split))
    finish = Launch(FINISH, f"cupyconv::{FINISH}<{CTYPES[dtype]}>", (math.ceil(n * c / THREADS), 1, 1),
                    (THREADS, 1, 1), 0, (Pointer(WORKSPACE), Pointer(OUT), n, pixels, c, splits))
    return CallProgram((partial, finish), 4 * splits * n * c)


def specialisations() -> list[str]:
    """Every dtype, of single channels and 16-byte vectors."""
    return [f"cupyconv::{PARTIAL}<{CTYPES[dtype]},{vec}>" for dtype in DTYPES
            for vec in sorted({1, 16 // STORAGE_BYTES[dtype]})] + \
        [f"cupyconv::{FINISH}<{CTYPES[dtype]}>" for dtype in DTYPES]


@functools.lru_cache(maxsize=1024)
def executable(n: int, c: int, pixels: int, dtype: str, device_id: int):
    """``program`` ready to launch on GPU ``device_id`` (executor.Executable; its X and OUT by address)."""
    from .executor import Executable

    return Executable(program(n, c, pixels, dtype), None, None, device_id)
