"""Kernel sources, run-time compilation with NVRTC, and the per-device kernel cache.

The CUDA C lives in ``kernels/`` (in the source tree) or ``cupyconv/kernels/`` (in an installed
package). Local ``#include "..."`` lines are expanded here, once, so that CuPy's on-disk cache, which
keys on the source text, sees every header's content. Each specialisation is compiled once per
(device, name expression, epilogue) and kept in memory; CuPy's disk cache makes later processes fast.
The epilogue (activation, has_residual) is compiled in through -D options (kernels/epilogue.cuh).
"""
from __future__ import annotations

import functools
import pathlib
import re

#: NVRTC options shared by the run-time and the offline (no GPU) compile. -default-device: every
#: function is device code, so that the generic lambdas of the epilogue (kernels/epilogue.cuh,
#: with_epilogue) compile; the kernels have no host code.
NVRTC_OPTIONS = ("-std=c++17", "-default-device")

_PACKAGE_DIR = pathlib.Path(__file__).resolve().parent
_INCLUDE = re.compile(r'^#include "([^"]+)"[^\n]*$', re.MULTILINE)


def kernels_dir() -> pathlib.Path:
    """Where the kernel sources are: inside the installed package, else the source tree's kernels/."""
    for candidate in (_PACKAGE_DIR / "kernels", _PACKAGE_DIR.parent / "kernels"):
        if (candidate / "dtypes.cuh").is_file():
            return candidate
    raise FileNotFoundError(
        f"cupyconv's CUDA sources were not found in {_PACKAGE_DIR / 'kernels'} or {_PACKAGE_DIR.parent / 'kernels'}; "
        "reinstall the package")


@functools.lru_cache(maxsize=None)
def kernel_source(filename: str) -> str:
    """The source of kernels/<filename> with its local includes expanded (each header once)."""
    seen: set[str] = set()

    def expand(name: str) -> str:
        if name in seen:
            return ""
        seen.add(name)
        text = (kernels_dir() / name).read_text()
        return _INCLUDE.sub(lambda m: expand(m.group(1)), text)

    return expand(filename)


#: Kernels defined in a file of another name.
_SOURCE_FILES = {"nchw_to_nhwc_tiled": "nchw_to_nhwc.cu", "nchw_to_nhwc_narrow": "nchw_to_nhwc.cu",
                 "nchw_to_nhwc_pairs": "nchw_to_nhwc.cu",
                 "pad_channels": "nchw_to_nhwc.cu", "wgrad_reduce": "wgrad_gemm.cu",
                 "wgrad_tensor_cores_tma": "wgrad_tensor_cores.cu",
                 "wgrad_tensor_cores_tma_tf32": "wgrad_tensor_cores.cu",
                 "wgrad_depthwise_nhwc": "wgrad_depthwise.cu",
                 "transpose_depthwise_cells": "transpose_depthwise.cu",
                 "strided_fill": "strided_copy.cu", "implicit_gemm_nhwc_phases": "implicit_gemm_nhwc.cu",
                 "implicit_gemm_nhwc_stream_k": "implicit_gemm_nhwc.cu",
                 "implicit_gemm_nhwc_tma": "implicit_gemm_nhwc.cu", "implicit_gemm_nhwc_tma_pair": "implicit_gemm_nhwc.cu",
                 "implicit_gemm_nhwc_tma_stacked": "implicit_gemm_nhwc.cu",
                 "implicit_gemm_nhwc_pingpong": "implicit_gemm_nhwc.cu",
                 "implicit_gemm_nhwc_pingpong_cluster": "implicit_gemm_nhwc.cu",
                 "implicit_gemm_nhwc_pingpong_strips": "implicit_gemm_nhwc.cu",
                 "phase_weights": "phase_weight.cu", "mean_pixels_partial": "mean_pixels.cu",
                 "mean_pixels_finish": "mean_pixels.cu",
                 **{f"winograd_{part}_transform": "winograd_conv2d.cu"
                    for part in ("weight", "input", "output", "output_gradient", "weight_gradient")}}


def source_file(kernel: str) -> str:
    """Kernel name -> the .cu file that defines it."""
    return _SOURCE_FILES.get(kernel, f"{kernel}.cu")


def epilogue_options(epilogue: tuple[int, int]) -> tuple[str, ...]:
    """The NVRTC options that compile kernels/epilogue.cuh's one epilogue, (activation, has_residual)."""
    activation, residual = epilogue
    return f"-DCUPYCONV_ACTIVATION={int(activation)}", f"-DCUPYCONV_RESIDUAL={int(bool(residual))}"


@functools.lru_cache(maxsize=None)
def _module(device_id: int, filename: str, expression: str, arch: str, epilogue: tuple[int, int]):
    import cupy

    # CuPy appends the device's own -arch=sm_XX; NVRTC keeps an architecture-specific target given
    # before it (sm_90a stays sm_90a: checked on the cubin's header).
    options = NVRTC_OPTIONS + epilogue_options(epilogue) + ((f"-arch={arch}",) if arch else ())
    with cupy.cuda.Device(device_id):
        module = cupy.RawModule(code=kernel_source(filename), options=options, name_expressions=(expression,))
        function = module.get_function(expression)
        # Let launches use all the shared memory the device allows a block (the default stops at 48 KB).
        optin = cupy.cuda.runtime.deviceGetAttribute(cupy.cuda.runtime.cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                                     device_id)
        function.max_dynamic_shared_size_bytes = optin - function.shared_size_bytes
        return function


def get_kernel(kernel: str, expression: str, arch: str = "", device_id: int | None = None,
               epilogue: tuple[int, int] = (0, 0)):
    """The compiled cupy.RawKernel for ``expression`` on device ``device_id`` (default: the current
    one), compiled on first use, for NVRTC target ``arch`` where the specialisation needs one
    (planner.LaunchPlan.arch), else for the device's own, with the ``epilogue`` (activation,
    has_residual) its launches pass (program.Launch.epilogue)."""
    import cupy

    return _module(cupy.cuda.Device().id if device_id is None else device_id, source_file(kernel), expression, arch,
                   (int(epilogue[0]), int(bool(epilogue[1]))))


def compute_capability(device_id: int | None = None) -> int:
    """The compute capability of device ``device_id`` (default: the current one) as an int (90 for
    sm_90), for planner.make_plan."""
    import cupy

    return _compute_capability(cupy.cuda.Device().id if device_id is None else device_id)


@functools.lru_cache(maxsize=None)
def _compute_capability(device_id: int) -> int:
    # Asked once per device: every conv2d call plans with it.
    import cupy

    return int(cupy.cuda.Device(device_id).compute_capability)


@functools.lru_cache(maxsize=None)
def compile_offline(kernel: str, expressions: tuple[str, ...], arch: str,
                    epilogue: tuple[int, int] = (0, 0)) -> dict[str, dict[str, int]]:
    """Compile with NVRTC for ``arch`` (e.g. 'sm_90') and ``epilogue`` (activation, has_residual) without
    a GPU; ptxas's resource report per expression.

    Returns {expression: {'registers', 'stack_bytes', 'spill_stores', 'spill_loads'}}, and 'wgmma_serialized': 1
    where ptxas serialized the expression's wgmma instructions (its C7520 advisory). Raises
    RuntimeError with the compiler log when compilation fails.
    """
    from cupy.cuda import nvrtc

    program = nvrtc.createProgram(kernel_source(source_file(kernel)), source_file(kernel), [], [])
    try:
        for expression in expressions:
            nvrtc.addNameExpression(program, expression)
        options = [*NVRTC_OPTIONS, *epilogue_options(epilogue), f"-arch={arch}", "--ptxas-options=--verbose"]
        try:
            nvrtc.compileProgram(program, options)
        except nvrtc.NVRTCError as error:
            raise RuntimeError(f"NVRTC failed for {arch}:\n{nvrtc.getProgramLog(program)}") from error
        log = nvrtc.getProgramLog(program).replace("\0", "")
        mangled = {nvrtc.getLoweredName(program, e): e for e in expressions}
    finally:
        nvrtc.destroyProgram(program)
    return _parse_ptxas_log(log, mangled)


def _parse_ptxas_log(log: str, mangled: dict[str, str]) -> dict[str, dict[str, int]]:
    report: dict[str, dict[str, int]] = {}
    current = None
    for line in log.splitlines():
        # ptxas's C7520: a kernel's wgmma instructions run one at a time (~2.6x slower: the pixel strips' tile with
        # its taps' loop broken early, benchmarks/NOTES.md), named by function wherever the line falls.
        serialized = re.search(r"wgmma\.mma_async instructions are serialized.* in the function '([^']+)'", line)
        if serialized:
            report.setdefault(mangled.get(serialized.group(1), serialized.group(1)), {})["wgmma_serialized"] = 1
            continue
        entry = re.search(r"Compiling entry function '([^']+)'", line)
        if entry:
            current = report.setdefault(mangled.get(entry.group(1), entry.group(1)), {})
            continue
        if current is None:
            continue
        frame = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if frame:
            current.update(stack_bytes=int(frame.group(1)), spill_stores=int(frame.group(2)),
                           spill_loads=int(frame.group(3)))
        registers = re.search(r"Used (\d+) registers", line)
        if registers:
            current["registers"] = int(registers.group(1))
    return report
