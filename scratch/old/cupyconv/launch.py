"""Running a convolution on CuPy arrays: the output's temporaries from CuPy's memory pool, the
launches through the executor on CuPy's current stream."""
from __future__ import annotations

import functools

from .arguments import ConvProblem
from .executor import Executable, Workspaces, executable, executable_for_plan
from .program import OPERAND_ALIGNMENT


def allocate(nbytes: int):
    """``nbytes`` of CuPy memory, as Workspaces wants it: (the memory, its address)."""
    import cupy

    memory = cupy.cuda.alloc(nbytes)
    return memory, memory.ptr


#: The workspaces of CuPy calls, from CuPy's memory pool.
_WORKSPACES = Workspaces(allocate)


def release_workspaces() -> None:
    """Give the workspaces kept per stream back to CuPy's memory pool."""
    _WORKSPACES.clear()


def run(exe: Executable, x, weight, bias, out, prepared=None, residual=None, input_scale=None) -> None:
    """Launch ``exe`` on CuPy's current stream (its device must be current): C-contiguous CuPy
    arrays ``x``, ``weight``, ``bias`` (or None), ``out``, ``residual`` (or None; may be ``out``) and
    ``input_scale`` (or None).
    ``prepared`` (a weights.PreparedWeight) supplies the prepared weight where the program reads
    one; without it the weight is prepared into the workspace first."""
    import cupy

    cuda = cupy.cuda
    stream = cuda.get_current_stream().ptr
    _WORKSPACES.launch(exe, x.data.ptr, weight.data.ptr,
                       prepared.address(exe, stream) if prepared is not None and exe.weight is not None else 0,
                       0 if bias is None else bias.data.ptr, out.data.ptr, stream,
                       cuda.runtime.streamIsCapturing(stream), 0 if residual is None else residual.data.ptr,
                       0 if input_scale is None else input_scale.data.ptr)


def run_program(exe: Executable, **arrays) -> None:
    """Launch ``exe`` (a program without weight preparation: the gradients') on CuPy's current
    stream (its device must be current), its operands C-contiguous CuPy arrays by name (program's
    operands: x, grad_output, out, ...)."""
    import cupy

    stream = cupy.cuda.get_current_stream().ptr
    _WORKSPACES.run(exe, stream, cupy.cuda.runtime.streamIsCapturing(stream),
                    **{name: array.data.ptr for name, array in arrays.items()})


def conv2d_cupy(x, weight, bias, problem: ConvProblem, out, plan=None, allow_tf32: bool = False, residual=None,
                input_scale=None):
    """Run ``plan`` (by default the planner's choice for ``problem``, ``allow_tf32`` and the current
    device) on CuPy's current stream and device, writing ``out``; for tests and benchmarks that force
    a plan. ``problem.dtype`` names the element type, so 16-bit arrays may come as any 2-byte dtype
    view (bfloat16 as int16). ``out`` must be C-contiguous; other inputs are copied first. The inputs
    themselves are never written. ``residual``: the epilogue's, where ``problem.has_residual``
    (C-contiguous; it may be ``out``); ``input_scale``: the (N, C) scale, where ``problem.has_input_scale``."""
    import cupy

    if problem.n == 0:
        return out
    device_id = cupy.cuda.Device().id
    exe = executable(problem, allow_tf32, device_id) if plan is None else executable_for_plan(plan, problem, device_id)
    run(exe, cupy.ascontiguousarray(x), cupy.ascontiguousarray(weight),
        None if bias is None else cupy.ascontiguousarray(bias), out, residual=residual,
        input_scale=None if input_scale is None else aligned(input_scale))
    return out


def aligned(a):
    """CuPy array ``a`` C-contiguous at an address the kernels read with 16-byte vectors (a copy if not)."""
    import cupy

    a = cupy.ascontiguousarray(a)
    return a.copy() if a.data.ptr % OPERAND_ALIGNMENT else a


@functools.lru_cache(maxsize=None)
def device_memory(device_id: int) -> int:
    """Bytes of memory of GPU ``device_id`` (asked once per device)."""
    import cupy

    return int(cupy.cuda.runtime.getDeviceProperties(device_id)["totalGlobalMem"])
