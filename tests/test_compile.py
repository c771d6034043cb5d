"""Every kernel specialisation the planner can choose compiles with NVRTC for sm_80 and sm_90 (and the
architecture-specific ones, wgmma, for sm_90a), without a GPU, and spills no registers (ptxas's report)."""
import pytest

from cupyconv.compiler import compile_offline
from cupyconv.conv_transpose import phase_weight_specialisations
from cupyconv.planner import arch_specialisations, kernel_specialisations
from cupyconv.wgrad import wgrad_specialisations
from cupyconv.wgrad_depthwise import specialisations as depthwise_wgrad_specialisations
from cupyconv.wgrad_tensor_cores import arch_specialisations as tensor_core_wgrad_arch_specialisations
from cupyconv.wgrad_tensor_cores import specialisations as tensor_core_wgrad_specialisations


def _by_kernel(expressions=None):
    families: dict[str, list[str]] = {}
    for expression in kernel_specialisations() if expressions is None else expressions:
        family = expression.split("<")[0].split("::")[-1]
        families.setdefault(family, []).append(expression)
    return families


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("kernel", sorted(_by_kernel()))
def test_specialisations_compile_without_spills(kernel, arch):
    _check(kernel, tuple(_by_kernel()[kernel]), arch)


@pytest.mark.parametrize("arch,kernel", [(arch, kernel) for arch, expressions in arch_specialisations().items()
                                         for kernel in _by_kernel(expressions)])
def test_arch_specialisations_compile_without_spills(arch, kernel):
    _check(kernel, tuple(_by_kernel(arch_specialisations()[arch])[kernel]), arch)


def _wgrad_specialisations():
    return (wgrad_specialisations() + depthwise_wgrad_specialisations() + tensor_core_wgrad_specialisations()
            + phase_weight_specialisations())


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("kernel", sorted(_by_kernel(_wgrad_specialisations())))
def test_wgrad_specialisations_compile_without_spills(kernel, arch):
    """The weight gradient's FMA GEMM (every dtype, layout, index width and tile), its reduction, the
    depthwise kernel (every dtype, layout and kernel size), the tensor-core GEMM (every dtype,
    index width, tile and piece) and the input gradient's phase weight (every dtype)."""
    _check(kernel, tuple(_by_kernel(_wgrad_specialisations())[kernel]), arch)


@pytest.mark.parametrize("arch", sorted(tensor_core_wgrad_arch_specialisations()))
def test_wgrad_arch_specialisations_compile_without_spills(arch):
    """The tensor-core weight gradient's wgmma instances, for sm_90a."""
    _check("wgrad_tensor_cores", tuple(tensor_core_wgrad_arch_specialisations()[arch]), arch)


def _check(kernel, expressions, arch):
    report = compile_offline(kernel, expressions, arch)
    assert set(report) == set(expressions), "ptxas reported on other kernels than asked for"
    for expression, resources in report.items():
        assert resources["spill_stores"] == 0 and resources["spill_loads"] == 0, (expression, resources)
        assert resources["stack_bytes"] == 0, (expression, resources)
        assert 0 < resources["registers"] <= 255, (expression, resources)
