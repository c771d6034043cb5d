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


def specialisation(dtype: str, index: str, nhwc: bool, vec: int) -> str:
    return f"cupyconv::{KERNEL}<{CTYPES[dtype]},{index},{'true' if nhwc else 'false'},{vec}>"


def specialisations() -> list[str]:
    """Every dtype, index type and layout, of single elements and 16-byte vectors."""
    return [specialisation(dtype, index, nhwc, vec) for dtype in CTYPES for index in INDEX_TYPES
            for nhwc in (False, True) for vec in sorted({1, 16 // STORAGE_BYTES[dtype]})]


def vector(problem: ConvProblem) -> int:
    """Elements per thread: a 16-byte vector where it holds elements of one image (and, in NCHW, one
    channel) -- C (NHWC) or H W (NCHW) a multiple of it -- else 1."""
    vec = 16 // STORAGE_BYTES[problem.dtype]
    return vec if (problem.c if problem.layout == "NHWC" else problem.h * problem.w) % vec == 0 else 1


def scaled_first(call: CallProgram, problem: ConvProblem) -> CallProgram:
    """``call`` (a program reading X) run on x * input_scale: the scaled copy made in the workspace,
    after ``call``'s own temporaries, and every launch of ``call`` reading it instead of X."""
    p = problem
    copy = Pointer(WORKSPACE, align(call.workspace_bytes))
    total, vec = p.n * p.c * p.h * p.w, vector(p)
    blocks = max(1, min(MAX_BLOCKS, math.ceil(total / vec / THREADS)))
    scale = Launch(KERNEL, specialisation(p.dtype, index_type(p), p.layout == "NHWC", vec), (blocks, 1, 1),
                   (THREADS, 1, 1), 0, (Pointer(X), Pointer(INPUT_SCALE), copy, p.n, p.c, p.h * p.w))
    return CallProgram((scale, *relocated(call.launches, {X: copy})),
                       copy.offset + total * STORAGE_BYTES[p.dtype], call.weight)
