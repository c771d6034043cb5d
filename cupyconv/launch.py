"""Running a convolution on CuPy arrays: the output's temporaries from CuPy's memory pool, the
launches through the executor on CuPy's current stream."""
from __future__ import annotations

import functools
import threading

from .arguments import ConvProblem
from .executor import Executable, executable, executable_for_plan
from .program import align


#: (device, stream handle) -> the workspace kept for calls outside a stream capture, grown as needed:
#: such a call allocates only its output. Calls on one stream use it in the stream's order; the lock
#: keeps two threads' launches on one stream from interleaving.
_WORKSPACES: dict = {}
_WORKSPACE_LOCK = threading.Lock()


def release_workspaces() -> None:
    """Give the workspaces kept per stream back to CuPy's memory pool."""
    with _WORKSPACE_LOCK:
        _WORKSPACES.clear()


def run(exe: Executable, x, weight, bias, out, prepared=None) -> None:
    """Launch ``exe`` on CuPy's current stream (its device must be current): C-contiguous CuPy
    arrays ``x``, ``weight``, ``bias`` (or None) and ``out``. ``prepared`` (a weights.PreparedWeight)
    supplies the prepared weight where the program reads one; without it the weight is prepared
    into the workspace first."""
    import cupy

    stream = cupy.cuda.get_current_stream().ptr
    preparation = exe.weight
    prepare_here = preparation is not None and prepared is None
    operands = (x.data.ptr, weight.data.ptr, 0 if prepare_here or preparation is None else prepared.address(exe, stream),
                0 if bias is None else bias.data.ptr, out.data.ptr)
    nbytes = exe.workspace_bytes + (align(preparation.nbytes) if prepare_here else 0)
    if not nbytes:
        exe.launch(*operands, 0, False, stream)
    elif cupy.cuda.runtime.streamIsCapturing(stream):
        workspace = cupy.cuda.alloc(nbytes)  # from the pool, for the graph's lifetime as CuPy arranges
        exe.launch(*operands, workspace.ptr, prepare_here, stream)
    else:
        with _WORKSPACE_LOCK:
            key = (exe.device_id, stream)
            workspace = _WORKSPACES.get(key)
            if workspace is None or workspace.mem.size < nbytes:
                workspace = _WORKSPACES[key] = cupy.cuda.alloc(nbytes)
            exe.launch(*operands, workspace.ptr, prepare_here, stream)


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
