"""Kernel specialisations the planner can choose compile with NVRTC for sm_80 and sm_90 (and the
architecture-specific ones, wgmma, for sm_90a), without a GPU, spill no registers and keep their wgmma
instructions in flight together (ptxas's report: no C7520 serialization).

By default each kernel compiles a covering of its specialisations. For the H100's targets (sm_90,
sm_90a) it is pairwise: every value of every template argument, and every two values that two
arguments take together somewhere in the full set, appear in at least one compiled instance (a run of
integer arguments, a tile's sizes, counts as one argument, so every tile is compiled with every dtype,
index width and flag). For sm_80 every value appears once: the same sources and the same register
file, and the spills seen so far showed on sm_90 first (6046957). That is 932 of the 3,319 instances,
and keeps CI's two cores within its time (all of them took over 90 minutes there once).
CUPYCONV_COMPILE_ALL=1 compiles every instance: run it when a kernel's source or tile table changes.

Each instance is compiled with the epilogue of the most code (EPILOGUE: the exact gelu and a residual):
a kernel's module holds the one epilogue its launches pass (kernels/epilogue.cuh), and the others'
stores are a subset of that one's work.

Each test compiles one NVRTC program of at most CHUNK expressions of one kernel: a program of hundreds
of instances compiles slower than the same instances in pieces, and pieces let pytest-xdist spread
the compiler's work (most of the suite's time) over the machine's cores."""
import itertools
import os

import pytest

from cupyconv.arguments import ACTIVATIONS
from cupyconv.compiler import compile_offline
from cupyconv.conv_transpose import phase_weight_specialisations
from cupyconv.planner import arch_specialisations, kernel_specialisations
from cupyconv.pooling import specialisations as pooling_specialisations
from cupyconv.transpose_depthwise import specialisations as depthwise_transpose_specialisations
from cupyconv.transpose_few_channels import specialisations as few_channel_transpose_specialisations
from cupyconv.wgrad import wgrad_specialisations
from cupyconv.wgrad_depthwise import specialisations as depthwise_wgrad_specialisations
from cupyconv.wgrad_tensor_cores import arch_specialisations as tensor_core_wgrad_arch_specialisations
from cupyconv.wgrad_tensor_cores import specialisations as tensor_core_wgrad_specialisations
from cupyconv.wgrad_winograd import specialisations as winograd_wgrad_specialisations

CHUNK = 48
PORTABLE_ARCHS = ("sm_80", "sm_90")
COMPILE_ALL = os.environ.get("CUPYCONV_COMPILE_ALL") == "1"
#: (activation, has_residual) of the compiled epilogue: ACTIVATIONS.index("gelu"), a residual.
EPILOGUE = (ACTIVATIONS.index("gelu"), 1)
#: Instances whose wgmma instructions ptxas serializes (its C7520 advisory; benchmarks/NOTES.md, "wgmma serialized by
#: ptxas"): the TF32 weight gradient's K-major 128 x 128 tile (its second l tile a step taken under a branch; taken
#: always, it spills at the 96 registers its 544 threads leave) and its 128 x 128 stream-K tile (async, it spills at
#: 128: see EVERY_THREAD_GIVES_BACK in kernels/wgrad_tensor_cores.cu). The set may only shrink.
KNOWN_SERIALIZED = frozenset(["cupyconv::wgrad_tensor_cores_tma_tf32<128,128,0,6,false>",
                              "cupyconv::wgrad_tensor_cores_tma_tf32<128,128,3,3,true>"])
#: How many template arguments' values each sampled instance set covers together, per target.
STRENGTH = {"sm_80": 1, "sm_90": 2, "sm_90a": 2}


def _factors(expression: str) -> tuple:
    """An expression's template arguments, a run of integer arguments joined into one tuple."""
    factors: list = []
    for argument in expression[expression.index("<") + 1:expression.rindex(">")].split(","):
        if not argument.lstrip("-").isdigit():
            factors.append(argument)
        elif factors and isinstance(factors[-1], tuple):
            factors[-1] += (argument,)
        else:
            factors.append((argument,))
    return tuple(factors)


def _covered(expression: str, strength: int = 2) -> set:
    """What ``expression`` covers: the (position, value) of each factor, and (strength 2) of each two
    factors together."""
    factors = _factors(expression)
    return {tuple((i, factors[i]) for i in sorted(set(positions)))
            for positions in itertools.combinations_with_replacement(range(len(factors)), strength)}


def _covering(expressions: list[str], strength: int = 2) -> list[str]:
    """A greedy covering: expressions, in their order, until every value (strength 1) or pair of values
    (2) of the set is in one."""
    covers = {e: _covered(e, strength) for e in expressions}  # once each, not once per greedy step
    uncovered = set().union(*covers.values())
    chosen = []
    while uncovered:
        best = max(expressions, key=lambda expression: len(uncovered & covers[expression]))
        uncovered -= covers[best]
        chosen.append(best)
    return sorted(chosen, key=expressions.index)


def _families(expressions: list[str]) -> dict[str, list[str]]:
    families: dict[str, list[str]] = {}
    for expression in expressions:
        families.setdefault(expression.split("<")[0].split("::")[-1], []).append(expression)
    return families


def _programs(expressions, archs, every=COMPILE_ALL):
    """pytest params (kernel, arch, expressions) of at most CHUNK expressions each, ids kernel-arch-part:
    every expression, or each kernel's covering of the arch's STRENGTH."""
    families = _families(expressions)
    params = []
    for arch in archs:
        for kernel, family in sorted(families.items()):
            chunk = family if every else _covering(family, STRENGTH[arch])
            params += [pytest.param(kernel, arch, tuple(chunk[start:start + CHUNK]), id=f"{kernel}-{arch}-{start // CHUNK}")
                       for start in range(0, len(chunk), CHUNK)]
    return params


def _forward(every=COMPILE_ALL):
    """The planner's kernels, and the squeeze-excitation pooling that fused models run before them."""
    return _programs(kernel_specialisations() + pooling_specialisations(), PORTABLE_ARCHS, every) + \
        [param for arch, expressions in arch_specialisations().items()
         for param in _programs(expressions, (arch,), every)]


def _gradients(every=COMPILE_ALL):
    """The weight gradient's FMA GEMM (every dtype, layout, index width and tile), its reduction, the
    depthwise kernel (every dtype, layout and kernel size), the tensor-core GEMM (every dtype, index
    width, tile and piece; its wgmma instances for sm_90a), Winograd's transforms for the weight gradient,
    the input gradient's phase weight and the transposed convolutions of few output channels and of
    depthwise layers."""
    portable = (wgrad_specialisations() + depthwise_wgrad_specialisations() + tensor_core_wgrad_specialisations()
                + winograd_wgrad_specialisations() + phase_weight_specialisations()
                + few_channel_transpose_specialisations() + depthwise_transpose_specialisations())
    return _programs(portable, PORTABLE_ARCHS, every) + \
        [param for arch, expressions in tensor_core_wgrad_arch_specialisations().items()
         for param in _programs(expressions, (arch,), every)]


@pytest.mark.parametrize("kernel,arch,expressions", _forward() + _gradients())
def test_specialisations_compile_without_spills(kernel, arch, expressions):
    report = compile_offline(kernel, expressions, arch, EPILOGUE)
    assert set(report) == set(expressions), "ptxas reported on other kernels than asked for"
    for expression, resources in report.items():
        assert resources["spill_stores"] == 0 and resources["spill_loads"] == 0, (expression, resources)
        assert resources["stack_bytes"] == 0, (expression, resources)
        assert 0 < resources["registers"] <= 255, (expression, resources)
        assert not resources.get("wgmma_serialized") or expression in KNOWN_SERIALIZED, \
            ("ptxas serialized the wgmma instructions", expression)


def test_pieces_cover_every_specialisation_once():
    """Cutting the families into programs drops no expression and compiles none twice for an arch."""
    seen = [(arch, expression) for kernel, arch, expressions in (p.values for p in _forward(True) + _gradients(True))
            for expression in expressions]
    assert len(seen) == len(set(seen))
    portable = kernel_specialisations() + pooling_specialisations() + wgrad_specialisations() + \
        depthwise_wgrad_specialisations() + tensor_core_wgrad_specialisations() + winograd_wgrad_specialisations() + \
        phase_weight_specialisations() + few_channel_transpose_specialisations() + depthwise_transpose_specialisations()
    specific = {**arch_specialisations()}
    for arch, expressions in tensor_core_wgrad_arch_specialisations().items():
        specific[arch] = specific.get(arch, []) + expressions
    assert set(seen) == {(arch, e) for arch in PORTABLE_ARCHS for e in portable} | \
        {(arch, e) for arch, es in specific.items() for e in es}


def test_sampled_programs_cover_every_pair_of_each_kernel():
    """Each kernel's sample holds every value (sm_80) or value pair (the H100's targets) of its full set,
    in every arch the full set has."""
    full, sampled = ({}, {})
    for programs, by in ((_forward(True) + _gradients(True), full), (_forward(False) + _gradients(False), sampled)):
        for kernel, arch, expressions in (p.values for p in programs):
            by.setdefault((kernel, arch), []).extend(expressions)
    assert set(sampled) == set(full)
    for key, expressions in full.items():
        assert set(sampled[key]) <= set(expressions) and len(set(sampled[key])) == len(sampled[key]), key
        strength = STRENGTH[key[1]]
        assert set().union(*(_covered(e, strength) for e in sampled[key])) == \
            set().union(*(_covered(e, strength) for e in expressions)), key
    assert 2 * sum(map(len, sampled.values())) < sum(map(len, full.values()))


def test_factors_join_a_tile_into_one():
    assert _factors("cupyconv::k<float,long long,128,64,16,2,true,0,false>") == \
        ("float", "long long", ("128", "64", "16", "2"), "true", ("0",), "false")
