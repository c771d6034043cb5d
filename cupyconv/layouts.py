"""The NHWC layout and KHWC weights for kernel families that compute NCHW only.

A family that computes a layout natively says so (``LAYOUTS`` / ``WEIGHT_LAYOUTS`` in its module:
implicit_gemm_nhwc reads NHWC inputs and KHWC weights in place and writes NHWC outputs;
implicit_gemm_conv2d NHWC arrays, but KCHW weights only). For the others the call's program is the
family's NCHW program with transposes around it (kernels/nchw_to_nhwc.cu): the NHWC input to NCHW in
the workspace first, the NCHW output from the workspace to the caller's NHWC output last, and a KHWC
weight to KCHW as (part of) the prepared weight, so that a kept preparation transposes it once. Each transpose is a pass over its tensor:
correct and complete, not as fast as a native kernel. One-pixel planes and 1x1 kernels need none (the
same memory in either order).
"""
from __future__ import annotations

import dataclasses

from .arguments import ConvProblem
from .families.common import STORAGE_BYTES
from .program import (OUT, PREPARED, RESIDUAL, WEIGHT, WORKSPACE, X, CallProgram, Launch, Pointer, WeightPreparation,
                      align, relocated)

NCHW, NHWC, KCHW, KHWC = "NCHW", "NHWC", "KCHW", "KHWC"


def in_place(family) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(array layouts, weight layouts) that ``family`` (a module of cupyconv/families) computes as they are."""
    return getattr(family, "LAYOUTS", (NCHW,)), getattr(family, "WEIGHT_LAYOUTS", (KCHW,))


def native(family, problem: ConvProblem) -> bool:
    """Whether ``family`` computes ``problem``'s layouts as they are."""
    layouts, weight_layouts = in_place(family)
    return problem.layout in layouts and problem.weight_layout in weight_layouts


def nchw(problem: ConvProblem) -> ConvProblem:
    """``problem`` with NCHW arrays and a KCHW weight."""
    return dataclasses.replace(problem, layout=NCHW, weight_layout=KCHW)


def describe(plan) -> str:
    """The printed plan's lines on layouts: what the kernel reads in place and what is transposed."""
    from .planner import FAMILIES

    if (plan.layout, plan.weight_layout) == (NCHW, KCHW):
        return ""
    array_layouts, weight_layouts = in_place(FAMILIES[plan.kernel])
    lines = []
    for what, layout, layouts in (("x and the output", plan.layout, array_layouts),
                                  ("the weight", plan.weight_layout, weight_layouts)):
        if layout in (NHWC, KHWC):
            same = "planes of one pixel" if layout == NHWC else "1x1 kernels"  # the same memory in either order
            lines.append(f"  {what} in {layout}: " + ("read in place by the kernel" if layout in layouts else
                                                      f"transposed for the kernel, which computes {layouts[0]} only "
                                                      f"({same} are read as they are)"))
    return "".join(f"{line}\n" for line in lines)


def transpose_launch(dtype: str, batch: int, rows: int, columns: int, source: Pointer, target: Pointer,
                     round_tf32: bool = False) -> Launch:
    """[batch][rows][columns] at ``source`` -> [batch][columns][rows] at ``target`` (float32 rounded to
    TF32 on the way where ``round_tf32``)."""
    from .families.implicit_gemm_nhwc import channels_last_copy

    return channels_last_copy(dtype, batch, rows, columns, rows, round_tf32, source, target)


def transposed(call: CallProgram, plan, problem: ConvProblem) -> CallProgram:
    """``call`` (``plan``'s program for nchw(problem)) run on ``problem``'s arrays: transposes of the
    NHWC input, residual and output through the workspace (after the family's own temporaries), and
    of a KHWC weight into the prepared weight, which the family's own preparation (if any) then reads --
    each only where the kernel does not compute that layout itself (in_place)."""
    from .planner import FAMILIES

    p, item = problem, STORAGE_BYTES[problem.dtype]
    array_layouts, weight_layouts = in_place(FAMILIES[plan.kernel])
    before, after, moves = [], [], {}
    workspace = call.workspace_bytes
    # Planes of one pixel (squeeze-excitation's) are the same memory in NHWC as in NCHW, and 1x1 kernels
    # in KHWC as in KCHW: those are read and written as they are.
    if p.layout not in array_layouts and p.h * p.w > 1:
        x_nchw = Pointer(WORKSPACE, align(workspace))
        workspace = x_nchw.offset + p.n * p.c * p.h * p.w * item
        before.append(transpose_launch(p.dtype, p.n, p.h * p.w, p.c, Pointer(X), x_nchw))
        moves[X] = x_nchw
    if p.layout not in array_layouts and p.ho * p.wo > 1:
        out_nchw = Pointer(WORKSPACE, align(workspace))
        workspace = out_nchw.offset + p.n * p.k * p.ho * p.wo * item
        after.append(transpose_launch(p.dtype, p.n, p.k, p.ho * p.wo, out_nchw, Pointer(OUT)))
        moves[OUT] = out_nchw
        if p.has_residual:  # read before anything is written: the residual may be the output itself
            residual_nchw = Pointer(WORKSPACE, align(workspace))
            workspace = residual_nchw.offset + p.n * p.k * p.ho * p.wo * item
            before.append(transpose_launch(p.dtype, p.n, p.ho * p.wo, p.k, Pointer(RESIDUAL), residual_nchw))
            moves[RESIDUAL] = residual_nchw
    weight = call.weight
    if p.weight_layout not in weight_layouts and p.kh * p.kw > 1:
        kept = align(weight.nbytes) if weight else 0
        kchw = Pointer(PREPARED, kept)
        transpose = transpose_launch(p.dtype, p.k, p.kh * p.kw, p.c // p.groups, Pointer(WEIGHT), kchw)
        own = relocated(weight.launches, {WEIGHT: kchw}) if weight else ()
        key = (weight.key if weight else (plan.kernel, p.dtype, p.weight_shape)) + (KHWC,)
        weight = WeightPreparation(key, kept + p.k * (p.c // p.groups) * p.kh * p.kw * item, (transpose, *own))
        moves[WEIGHT] = kchw
    launches = (*before, *relocated(call.launches, moves), *after)
    return CallProgram(launches, workspace, weight)
