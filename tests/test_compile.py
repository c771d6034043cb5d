"""Every kernel specialisation the planner can choose compiles with NVRTC for sm_80 and sm_90, without
a GPU, and spills no registers (ptxas's report)."""
import pytest

from cupyconv.compiler import compile_offline
from cupyconv.planner import kernel_specialisations


def _by_kernel():
    families: dict[str, list[str]] = {}
    for expression in kernel_specialisations():
        family = expression.split("<")[0].split("::")[-1]
        families.setdefault(family, []).append(expression)
    return families


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("kernel", sorted(_by_kernel()))
def test_specialisations_compile_without_spills(kernel, arch):
    expressions = tuple(_by_kernel()[kernel])
    report = compile_offline(kernel, expressions, arch)
    assert set(report) == set(expressions), "ptxas reported on other kernels than asked for"
    for expression, resources in report.items():
        assert resources["spill_stores"] == 0 and resources["spill_loads"] == 0, (expression, resources)
        assert resources["stack_bytes"] == 0, (expression, resources)
        assert 0 < resources["registers"] <= 255, (expression, resources)
