"""Every kernel specialisation the planner can choose compiles with NVRTC for sm_80 and sm_90 (and the
architecture-specific ones, wgmma, for sm_90a), without a GPU, and spills no registers (ptxas's report).

Each test compiles one NVRTC program of at most CHUNK expressions of one kernel: a program of hundreds
of instances compiles slower than the same instances in pieces, and pieces let pytest-xdist spread
the compiler's work (most of the suite's time) over the machine's cores."""
import pytest

from cupyconv.compiler import compile_offline
from cupyconv.conv_transpose import phase_weight_specialisations
from cupyconv.planner import arch_specialisations, kernel_specialisations
from cupyconv.pooling import specialisations as pooling_specialisations
from cupyconv.wgrad import wgrad_specialisations
from cupyconv.wgrad_depthwise import specialisations as depthwise_wgrad_specialisations
from cupyconv.wgrad_tensor_cores import arch_specialisations as tensor_core_wgrad_arch_specialisations
from cupyconv.wgrad_tensor_cores import specialisations as tensor_core_wgrad_specialisations

CHUNK = 48
PORTABLE_ARCHS = ("sm_80", "sm_90")


def _programs(expressions, archs):
    """pytest params (kernel, arch, expressions) of at most CHUNK expressions each, ids kernel-arch-part."""
    families: dict[str, list[str]] = {}
    for expression in expressions:
        families.setdefault(expression.split("<")[0].split("::")[-1], []).append(expression)
    return [pytest.param(kernel, arch, tuple(chunk[start:start + CHUNK]), id=f"{kernel}-{arch}-{start // CHUNK}")
            for arch in archs for kernel, chunk in sorted(families.items()) for start in range(0, len(chunk), CHUNK)]


def _forward():
    """The planner's kernels, and the squeeze-excitation pooling that fused models run before them."""
    return _programs(kernel_specialisations() + pooling_specialisations(), PORTABLE_ARCHS) + \
        [param for arch, expressions in arch_specialisations().items() for param in _programs(expressions, (arch,))]


def _gradients():
    """The weight gradient's FMA GEMM (every dtype, layout, index width and tile), its reduction, the
    depthwise kernel (every dtype, layout and kernel size), the tensor-core GEMM (every dtype, index
    width, tile and piece; its wgmma instances for sm_90a) and the input gradient's phase weight."""
    portable = (wgrad_specialisations() + depthwise_wgrad_specialisations() + tensor_core_wgrad_specialisations()
                + phase_weight_specialisations())
    return _programs(portable, PORTABLE_ARCHS) + \
        [param for arch, expressions in tensor_core_wgrad_arch_specialisations().items()
         for param in _programs(expressions, (arch,))]


@pytest.mark.parametrize("kernel,arch,expressions", _forward() + _gradients())
def test_specialisations_compile_without_spills(kernel, arch, expressions):
    report = compile_offline(kernel, expressions, arch)
    assert set(report) == set(expressions), "ptxas reported on other kernels than asked for"
    for expression, resources in report.items():
        assert resources["spill_stores"] == 0 and resources["spill_loads"] == 0, (expression, resources)
        assert resources["stack_bytes"] == 0, (expression, resources)
        assert 0 < resources["registers"] <= 255, (expression, resources)


def test_pieces_cover_every_specialisation_once():
    """Cutting the families into programs drops no expression and compiles none twice for an arch."""
    seen = [(arch, expression) for kernel, arch, expressions in (p.values for p in _forward() + _gradients())
            for expression in expressions]
    assert len(seen) == len(set(seen))
    portable = kernel_specialisations() + pooling_specialisations() + wgrad_specialisations() + \
        depthwise_wgrad_specialisations() + tensor_core_wgrad_specialisations() + phase_weight_specialisations()
    specific = {**arch_specialisations()}
    for arch, expressions in tensor_core_wgrad_arch_specialisations().items():
        specific[arch] = specific.get(arch, []) + expressions
    assert set(seen) == {(arch, e) for arch in PORTABLE_ARCHS for e in portable} | \
        {(arch, e) for arch, es in specific.items() for e in es}
