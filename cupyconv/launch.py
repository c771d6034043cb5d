"""Running a convolution on CuPy arrays: the output's temporaries from CuPy's memory pool, the
launches through the executor on CuPy's current stream."""
from __future__ import annotations

import functools

from .arguments import ConvProblem
from .executor import Executable, addresses, executable, executable_for_plan
from .program import align


def run(exe: Executable, x, weight, bias, out, prepared=None) -> None:
    """Launch ``exe`` on CuPy's current stream (its device must be current): C-contiguous CuPy
    arrays ``x``, ``weight``, ``bias`` (or None) and ``out``. ``prepared`` (a weights.PreparedWeight)
    supplies the prepared weight where the program reads one; without it the weight is prepared
    into this call's workspace first."""
    import cupy

    stream = cupy.cuda.get_current_stream().ptr
    preparation = exe.weight
    prepare_here = preparation is not None and prepared is None
    workspace_bytes = exe.workspace_bytes + (align(preparation.nbytes) if prepare_here else 0)
    # Freed to the pool when this returns: the pool hands it out again only in this stream's order.
    workspace = cupy.empty(workspace_bytes, dtype=cupy.uint8) if workspace_bytes else None
    base = workspace.data.ptr if workspace is not None else 0
    prepared_address = 0
    if prepare_here:
        prepared_address, base = base, base + align(preparation.nbytes)
    elif preparation is not None:
        prepared_address = prepared.address(exe, stream)
    operands = addresses(x.data.ptr, weight.data.ptr, prepared_address, 0 if bias is None else bias.data.ptr,
                         out.data.ptr, base)
    if prepare_here:
        exe.prepare_weight(operands, stream)
    exe.run(operands, stream)


def conv2d_cupy(x, weight, bias, problem: ConvProblem, out, plan=None, allow_tf32: bool = False):
    """Run ``plan`` (by default the planner's choice for ``problem``, ``allow_tf32`` and the current
    device) on CuPy's current stream and device, writing ``out``; for tests and benchmarks that force
    a plan. ``problem.dtype`` names the element type, so 16-bit arrays may come as any 2-byte dtype
    view (bfloat16 as int16). ``out`` must be C-contiguous; other inputs are copied first. The inputs
    themselves are never written."""
    import cupy

    if problem.n == 0:
        return out
    device_id = cupy.cuda.Device().id
    exe = executable(problem, allow_tf32, device_id) if plan is None else executable_for_plan(plan, problem, device_id)
    run(exe, cupy.ascontiguousarray(x), cupy.ascontiguousarray(weight),
        None if bias is None else cupy.ascontiguousarray(bias), out)
    return out


@functools.lru_cache(maxsize=None)
def device_memory(device_id: int) -> int:
    """Bytes of memory of GPU ``device_id`` (asked once per device)."""
    import cupy

    return int(cupy.cuda.runtime.getDeviceProperties(device_id)["totalGlobalMem"])
