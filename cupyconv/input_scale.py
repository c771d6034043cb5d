"""The input scale (``conv2d(..., input_scale=s)``): x multiplied by s[n, c] per image and input channel
before the convolution, squeeze-and-excitation's gate ``conv(x * s)``.

A family that applies it as it loads x says so (``APPLIES_INPUT_SCALE = True`` in its module: pointwise_nhwc,
which scales each tile in shared memory) and reads the INPUT_SCALE operand itself. For the others the
call's program starts with a scaled copy of x in the workspace (kernels/scale_channels.cu), which the
family's launches then read in place of x: one more pass over x, as a separate ``x * s`` would be,
and the same values (the product rounded once to x's dtype) either way.
"""
from __future__ import annotations

import math

from .arguments import ConvProblem
from .families.common import CTYPES, INDEX_TYPES, STORAGE_BYTES, index_type
from .program import INPUT_SCALE, WORKSPACE, X, CallProgram, Launch, Pointer, align, relocated

KERNEL = "scale_channels"
#: Threads per block and the most blocks of the grid-stride copy (a few waves of the H100's SMs).
THREADS, MAX_BLOCKS = 256, 132 * 16


def applied_by(family) -> bool:
    """Whether ``family`` (a module of cupyconv/families) applies the input scale in its own loads."""
    return getattr(family, "APPLIES_INPUT_SCALE", False)


def specialisation(dtype: str, index: str, nhwc: bool) -> str:
    return f"cupyconv::{KERNEL}<{CTYPES[dtype]},{index},{'true' if nhwc else 'false'}>"


def specialisations() -> list[str]:
    """Every dtype, index type and layout."""
    return [specialisation(dtype, index, nhwc) for dtype in CTYPES for index in INDEX_TYPES for nhwc in (False, True)]


def scaled_first(call: CallProgram, problem: ConvProblem) -> CallProgram:
    """``call`` (a program reading X) run on x * input_scale: the scaled copy made in the workspace,
    after ``call``'s own temporaries, and every launch of ``call`` reading it instead of X."""
    p = problem
    copy = Pointer(WORKSPACE, align(call.workspace_bytes))
    total = p.n * p.c * p.h * p.w
    blocks = max(1, min(MAX_BLOCKS, math.ceil(total / THREADS)))
    scale = Launch(KERNEL, specialisation(p.dtype, index_type(p), p.layout == "NHWC"), (blocks, 1, 1),
                   (THREADS, 1, 1), 0, (Pointer(X), Pointer(INPUT_SCALE), copy, p.n, p.c, p.h * p.w))
    return CallProgram((scale, *relocated(call.launches, {X: copy})),
                       copy.offset + total * STORAGE_BYTES[p.dtype], call.weight)
