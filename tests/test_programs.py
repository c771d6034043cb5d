"""Each family's CallProgram without a GPU, for every plan the planner makes on the shared grid (every
dtype, TF32 or not, on the H100 or any GPU) and with every family and tile forced: each launch names a
specialisation the compile test builds, passes what its kernel's __global__ signature asks for,
fits CUDA's limits, and writes only the output, the workspace or the prepared weight; temporaries
sit aligned and apart inside the workspace. Also: Winograd's passes of images, and the printed
plans as they read before the families were split out of the planner."""
import dataclasses
import functools
import itertools
import math
import re

import pytest

from cases import GRID, Case
from cupyconv import input_scale, layouts, planner
from cupyconv.layouts import native
from cupyconv.arguments import ACTIVATIONS, make_problem
from cupyconv.compiler import kernel_source, source_file
from cupyconv.families import (depthwise_column_conv2d, depthwise_conv2d, depthwise_nhwc, direct_conv2d, few_channel_nhwc,
                               implicit_gemm_conv2d, implicit_gemm_nhwc, one_pixel_conv2d, pointwise_nhwc,
                               simt_gemm_conv2d, winograd_conv2d)
from cupyconv.families.common import REDUCE_KERNEL, STORAGE_BYTES, gemm_grid
from cupyconv.program import (BIAS, FLAGS, INPUT_SCALE, OUT, PREPARED, RESIDUAL, WEIGHT, WORKSPACE, WORKSPACE_ALIGNMENT, X,
                              MAP_TYPES, ActivationArg, Launch, Pointer, ResidualArg, Table, align,
                              relocated)

DTYPES = ("float16", "bfloat16", "float32", "float64")
#: The grid, 1x1 problems the channels-last GEMM reads in place (no copies) in every dtype, and one-pixel
#: planes (one_pixel_conv2d's; 6 channels are not whole 16-byte pieces in any dtype).
CASES = GRID + [Case(2, 64, 32, 8, 8, 1, 1), Case(3, 16, 24, 4, 6, 1, 1, bias=False), Case(9, 40, 12, 1, 1, 1, 1),
                Case(1, 6, 5, 1, 1, 1, 1, bias=False)]
#: Dynamic shared memory a block may opt in to on the H100 (227 KB).
MAX_SHARED_BYTES = 227 * 1024


def problem_of(case: Case, dtype: str, layout: str = "NCHW", weight_layout: str = "KCHW", activation: str = "none",
               has_residual: bool = False):
    problem = make_problem((case.n, case.c, case.h, case.w), (case.k, case.c // case.groups, case.kh, case.kw),
                           (case.k,) if case.bias else None, dtype, case.stride, case.padding, case.dilation,
                           case.groups)
    return dataclasses.replace(problem, layout=layout, weight_layout=weight_layout, activation=activation,
                               has_residual=has_residual)


def config_names(kernel: str, dtype: str) -> list[str]:
    """The tiles ``kernel`` may be forced to in ``dtype`` (Winograd's are its GEMM's)."""
    tables = {planner.DIRECT_KERNEL: direct_conv2d.TILE_CONFIGS,
              planner.DEPTHWISE_KERNEL: depthwise_conv2d.DEPTHWISE_CONFIGS,
              planner.DEPTHWISE_COLUMN_KERNEL: depthwise_column_conv2d.COLUMN_CONFIGS,
              planner.DEPTHWISE_NHWC_KERNEL: depthwise_nhwc.NHWC_DEPTHWISE_CONFIGS + depthwise_nhwc.RUN_CONFIGS,
              planner.SIMT_KERNEL: simt_gemm_conv2d.SIMT_CONFIGS,
              planner.WINOGRAD_KERNEL: simt_gemm_conv2d.SIMT_CONFIGS,
              planner.GEMM_KERNEL: implicit_gemm_conv2d.GEMM_CONFIGS.get(dtype, ()),
              planner.NHWC_KERNEL: implicit_gemm_nhwc.NHWC_CONFIGS.get(dtype, ()),
              planner.POINTWISE_KERNEL: pointwise_nhwc.POINTWISE_CONFIGS.get(dtype, ()),
              planner.FEW_CHANNEL_KERNEL: few_channel_nhwc.CONFIGS,
              planner.ONE_PIXEL_KERNEL: one_pixel_conv2d.CONFIGS}
    return [c.name for c in tables[kernel]]


def plans_for(case: Case, dtype: str, layout: str = "NCHW", weight_layout: str = "KCHW", activation: str = "none",
              has_residual: bool = False):
    """The distinct plans make_plan makes for ``case`` in ``dtype``: its own choices (strict or TF32,
    compute capability 0 or 90), and each family with each of its tiles forced where it takes them
    (the channels-last GEMM's wgmma tiles with stream-K forced on too)."""
    problem = problem_of(case, dtype, layout, weight_layout, activation, has_residual)
    plans = [planner.make_plan(problem, allow_tf32=tf32, compute_capability=cc)
             for tf32, cc in itertools.product((False, True), (0, 90))]
    for kernel in planner.KERNELS:
        for config, cc in itertools.product([None, *config_names(kernel, dtype)], (0, 90)):
            try:
                plans.append(planner.make_plan(problem, config, kernel, compute_capability=cc))
            except ValueError:  # the family (or the tile) does not take this problem
                continue
    for config in config_names(planner.NHWC_KERNEL, dtype):
        try:
            plans.append(planner.make_plan(problem, config, planner.NHWC_KERNEL, compute_capability=90, stream_k=True))
        except ValueError:  # not a wgmma tile, or not for this problem
            continue
    return problem, list(dict.fromkeys(plans))


@functools.lru_cache(maxsize=None)
def parameters(kernel: str) -> tuple[str, ...]:
    """Each parameter of ``kernel``'s __global__ signature in its .cu: 'in' (const pointer), 'out'
    (pointer written), 'int' or 'table' (a __grid_constant__ struct of ints)."""
    return tuple(kind for kind, _ in signature(kernel))


@functools.lru_cache(maxsize=None)
def signature(kernel: str) -> tuple[tuple[str, str], ...]:
    """(kind, name) of each parameter of ``kernel``'s __global__ signature (kinds as parameters())."""
    source = kernel_source(source_file(kernel))
    match = re.search(rf"__global__[^{{;]*?\b{kernel}\s*\(([^)]*)\)", source)
    assert match, f"no __global__ {kernel} in {source_file(kernel)}"
    kinds = []
    for parameter in match.group(1).split(","):
        words = parameter.replace("*", " * ").split()
        if "*" in words:
            kinds.append(("in" if words[0] == "const" else "out", words[-1]))
        elif "__grid_constant__" in words and "TensorMap" in words:  # a TMA descriptor (program.MAP_TYPES)
            kinds.append(("map", words[-1]))
        elif "__grid_constant__" in words:  # a struct of ints by value (program.Table)
            kinds.append(("table", words[-1]))
        else:
            assert words[0] == "int", f"{kernel}: parameter {parameter!r} is neither a pointer nor an int"
            kinds.append(("int", words[-1]))
    return tuple(kinds)


def temporaries(plan, problem) -> list[int]:
    """Bytes of each per-call temporary, in workspace order: the channels-last GEMM's input copy (of an
    NCHW input, or of an NHWC one that needs zero channels or, float32 with several taps on a wgmma
    tile but the 128-pixel producer's and the 64-channel ping-pong one, or any float32 on the 256-pixel
    producer's, rounding; or its
    space-to-depth copy) and
    stream-K's float32 slots, one tile per block; Winograd's transformed
    input V and GEMM output M of one pass (with split-K, its runs of partial sums in M's place); split-K's
    partial sums (after the input's copy); then, for an NHWC problem of a family that computes NCHW alone, the NCHW copies
    of x, of the output and (where there is one) of the residual, each where its planes are larger than
    one pixel -- none for the NCHW-gather GEMM, which reads and writes them in place. (The ping-pong tile's
    split-K in clusters adds its runs in shared memory: no partial sums.)"""
    item = STORAGE_BYTES[problem.dtype]
    clusters = plan.config is not None and plan.config.name == planner.implicit_gemm_nhwc.PINGPONG_CLUSTER_CONFIG
    partials = [4 * plan.splits * math.prod(problem.out_shape)] if plan.splits > 1 and not clusters else []
    if plan.stream_k_blocks:
        partials = [4 * plan.stream_k_blocks * plan.config.bm * plan.config.bn]
    if plan.kernel == planner.NHWC_KERNEL and plan.space_to_depth != (1, 1):  # always a copy, of blocked pixels
        blocked = planner.implicit_gemm_nhwc.space_to_depth_problem(problem, plan.space_to_depth)
        return [math.prod(blocked.x_shape) * item] + partials
    if plan.kernel == planner.NHWC_KERNEL:
        tall = plan.config.wgmma and planner.implicit_gemm_nhwc._float32_rounding(plan.config) == "copy"
        nhwc = planner.implicit_gemm_nhwc
        pingpong_copy = plan.config.wgmma == nhwc.WGMMA_PINGPONG and plan.config.bn >= nhwc.PINGPONG_TF32_COPY_CHANNELS \
            and math.prod(gemm_grid(problem, plan.config)) >= nhwc.PINGPONG_TF32_COPY_MIN_TILES
        copied = not plan.a_from_nchw if problem.layout == "NCHW" else plan.channels_padded != problem.c or (
            problem.dtype == "float32" and ((problem.kh * problem.kw != 1 and plan.config.wgmma and
                                             (not plan.config.producer_warps or pingpong_copy)) or tall))
        return ([problem.n * problem.h * problem.w * plan.channels_padded * item] if copied else []) + partials
    if plan.kernel == planner.GEMM_KERNEL:
        return []
    if problem.layout == "NHWC" and not layouts.native(planner.FAMILIES[plan.kernel], problem):
        # (one-pixel planes are NCHW memory already: not copied)
        x_copy, out_copy = problem.h * problem.w > 1, problem.ho * problem.wo > 1
        return temporaries(plan, dataclasses.replace(problem, layout="NCHW")) + \
            ([math.prod(problem.x_shape) * item] if x_copy else []) + \
            ([math.prod(problem.out_shape) * item] if out_copy else []) + \
            ([math.prod(problem.out_shape) * item] if problem.has_residual and out_copy else [])
    if plan.kernel == planner.WINOGRAD_KERNEL:
        floats = 4 * (plan.winograd_tile + 2) ** 2 * plan.winograd_images * plan.tiles
        partials = [4 * gemm.splits * (plan.winograd_tile + 2) ** 2 * problem.k * count * plan.tiles
                    for gemm, count in ((plan.gemm, plan.winograd_images),
                                        (plan.gemm_last, problem.n % plan.winograd_images or plan.winograd_images))
                    if gemm.splits > 1]
        # M, or with split-K the GEMM's runs of partial sums of M in its place.
        return [floats * winograd_conv2d.winograd_channels(problem), max([floats * problem.k] + partials)]
    if plan.kernel == planner.SIMT_KERNEL:
        return partials
    return []


#: The epilogue's int parameters (kernels/epilogue.cuh) and the types their arguments carry, so that the kernel's
#: module is compiled for them (program.Launch.epilogue); every other int is a plain int.
EPILOGUE_ARGS = {"activation": ActivationArg, "has_residual": ResidualArg}


def check_arguments(launch, kinds, reads: set, writes: set) -> None:
    """Each int argument fits 32 bits, the epilogue's typed (EPILOGUE_ARGS); each pointer points into an
    operand the launch may read (or, for a parameter its kernel writes, write)."""
    names = [name for _, name in signature(launch.kernel)]
    for kind, name, arg in zip(kinds, names, launch.args):
        if kind == "int":
            assert type(arg) is EPILOGUE_ARGS.get(name, int) and -2**31 <= arg < 2**31, (launch.kernel, name, arg)
        elif kind == "table":
            assert isinstance(arg, Table) and all(-2**31 <= v < 2**31 for v in arg.values), (launch.kernel, arg)
        elif kind == "map":
            assert isinstance(arg, MAP_TYPES) and arg.pointer.operand in reads, (launch.kernel, arg)
        else:
            assert isinstance(arg, Pointer), (launch.kernel, arg)
            assert arg.operand in (writes if kind == "out" else reads), (launch.kernel, kind, arg)


def check_program(plan, problem):
    """Checks the program of ``plan`` (see the module docstring); returns it."""
    call = planner.program(plan, problem)
    if problem.n == 0:  # nothing to launch
        assert call.launches == () and call.weight is None and call.workspace_bytes == 0
        return call
    any_gpu, one_arch = set(planner.kernel_specialisations()), planner.arch_specialisations()
    preparation = [(launch, True) for launch in (call.weight.launches if call.weight else ())]
    for launch, prepares in preparation + [(launch, False) for launch in call.launches]:
        assert launch.name_expression in (one_arch[launch.arch] if launch.arch else any_gpu), launch
        kinds = parameters(launch.kernel)
        assert len(launch.args) == len(kinds), (launch.kernel, launch.args)
        # The caller's operands are never written; the preparation reads the weight alone.
        # (A KHWC weight transposed for an NCHW family is read from the prepared weight by the
        # family's own preparation.)
        writes = {PREPARED} if prepares else {OUT, WORKSPACE, FLAGS}
        reads = ({WEIGHT, PREPARED} if problem.weight_layout == "KHWC" else {WEIGHT}) if prepares else \
            {X, WEIGHT, PREPARED, BIAS, WORKSPACE, RESIDUAL, INPUT_SCALE}
        check_arguments(launch, kinds, reads, writes)
        grid, block = launch.grid, launch.block
        assert len(grid) == len(block) == 3, launch
        assert 1 <= grid[0] < 2**31 and 1 <= grid[1] <= 65535 and 1 <= grid[2] <= 65535, launch
        assert min(block) >= 1 and block[0] <= 1024 and block[1] <= 1024 and block[2] <= 64, launch
        assert math.prod(block) <= 1024 and 0 <= launch.shared_bytes <= MAX_SHARED_BYTES, launch
    pointers = [arg for launch in call.launches for arg in launch.args if isinstance(arg, Pointer)]
    assert any(p.operand == PREPARED for p in pointers) == (call.weight is not None)
    if call.weight:
        assert call.weight.nbytes > 0 and call.weight.key[0] == plan.kernel
    sizes = {X: math.prod(problem.x_shape), OUT: math.prod(problem.out_shape)}
    for p in pointers:
        if p.operand in sizes:
            assert 0 <= p.offset < sizes[p.operand] * STORAGE_BYTES[problem.dtype], p
    offsets = sorted({p.offset for p in pointers if p.operand == WORKSPACE})
    extents = temporaries(plan, problem)
    assert len(offsets) == len(extents) and (call.workspace_bytes > 0) == bool(extents)
    for i, (offset, nbytes) in enumerate(zip(offsets, extents)):
        assert offset % WORKSPACE_ALIGNMENT == 0 and offset + nbytes <= call.workspace_bytes
        assert i + 1 == len(offsets) or offset + nbytes <= offsets[i + 1], "temporaries overlap"
    return call


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_programs(case, dtype):
    problem, plans = plans_for(case, dtype)
    for plan in plans:
        check_program(plan, problem)


LAYOUT_PAIRS = [("NHWC", "KCHW"), ("NCHW", "KHWC"), ("NHWC", "KHWC")]


@pytest.mark.parametrize("layouts", LAYOUT_PAIRS, ids="-".join)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_layout_programs(case, dtype, layouts):
    """Every plan's program for NHWC arrays and KHWC weights: the channels-last GEMM reads them in
    place (one launch where nothing needs zero channels or rounding), the others through transposes;
    the NCHW-gather GEMM's NHWC instance reads and writes them in place."""
    problem, plans = plans_for(case, dtype, *layouts)
    for plan in plans:
        assert (plan.layout, plan.weight_layout) == layouts
        call = check_program(plan, problem)
        if problem.n == 0:
            continue
        names = [launch.kernel for launch in call.launches]
        if plan.kernel == planner.GEMM_KERNEL and layouts[0] == "NHWC":  # one launch, of the NHWC instance
            assert names == [planner.GEMM_KERNEL] and call.launches[0].name_expression.endswith(",true>"), names
        elif not native(planner.FAMILIES[plan.kernel], problem) and layouts[0] == "NHWC":
            # x transposed first and the output last, where their planes are larger than one pixel
            transposes = (implicit_gemm_nhwc.CHANNELS_LAST_TILED, implicit_gemm_nhwc.CHANNELS_LAST_NARROW,
                          implicit_gemm_nhwc.CHANNELS_LAST_PAIRS)
            assert (names[0] in transposes) == (problem.h * problem.w > 1), names
            assert (names[-1] in transposes) == (problem.ho * problem.wo > 1), names
        one_tap = problem.kh * problem.kw == 1  # a 1x1 KCHW weight is KHWC memory: read in place too
        if plan.kernel == planner.NHWC_KERNEL and layouts in (("NHWC", "KHWC"), ("NHWC", "KCHW") if one_tap else ()) \
                and plan.channels_padded == problem.c:
            cluster = plan.config.name == implicit_gemm_nhwc.PINGPONG_CLUSTER_CONFIG
            gemm = implicit_gemm_nhwc.STREAM_K_KERNEL if plan.stream_k_blocks else \
                implicit_gemm_nhwc.PINGPONG_CLUSTER_KERNEL if cluster else \
                implicit_gemm_nhwc.PIXEL_STRIPS_KERNEL if plan.config.name in implicit_gemm_nhwc.PIXEL_STRIPS_CONFIGS \
                else implicit_gemm_nhwc.PINGPONG_KERNEL if plan.config.wgmma == implicit_gemm_nhwc.WGMMA_PINGPONG else \
                implicit_gemm_nhwc.PAIR_KERNEL if plan.config.cluster > 1 else \
                implicit_gemm_nhwc.TMA_KERNEL if plan.config.producer_warps else planner.NHWC_KERNEL
            in_place = [gemm] + ([REDUCE_KERNEL] if plan.splits > 1 and not cluster else [])
            # float32 several taps (and any on the 256-pixel producer tile) may read a rounded copy
            rounded_copy = dtype == "float32" and (problem.kh * problem.kw > 1 or (
                plan.config.wgmma and implicit_gemm_nhwc._float32_rounding(plan.config) == "copy"))
            assert names == in_place or rounded_copy, names
            assert (call.weight is None) == (dtype != "float32"), "KHWC weight read in place but to round to TF32"
        if plan.kernel == planner.POINTWISE_KERNEL:  # everything in place, float32 rounded in the fragments
            assert names == [planner.POINTWISE_KERNEL] and call.weight is None and call.workspace_bytes == 0, names


@pytest.mark.parametrize("layouts", [("NCHW", "KCHW"), ("NHWC", "KHWC")], ids="-".join)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_input_scale_programs(case, dtype, layouts):
    """With an input scale, every plan's program is the plain one with the scale applied: by the
    family's own kernel (pointwise_nhwc: the same launch, its has_input_scale set), or by a scaled
    copy of x made first in the workspace past the plain program's temporaries, which every other
    launch reads in place of x."""
    problem, plans = plans_for(case, dtype, *layouts)
    scaled = dataclasses.replace(problem, has_input_scale=True)
    for plan in plans:
        plain = planner.program(plan, problem)
        call = planner.program(dataclasses.replace(plan, has_input_scale=True), scaled)
        if problem.n == 0:
            assert call == plain
            continue
        if input_scale.applied_by(planner.FAMILIES[plan.kernel]):
            (launch,), (plain_launch,) = call.launches, plain.launches
            position = launch.args.index(Pointer(INPUT_SCALE))
            assert launch.args[position + 1] == 1 and plain_launch.args[position + 1] == 0
            assert launch.args[:position + 1] + launch.args[position + 2:] == \
                plain_launch.args[:position + 1] + plain_launch.args[position + 2:]
            assert call.workspace_bytes == plain.workspace_bytes
            continue
        copy = Pointer(WORKSPACE, align(plain.workspace_bytes))
        first = call.launches[0]
        assert first.kernel == input_scale.KERNEL and first.args[:3] == (Pointer(X), Pointer(INPUT_SCALE), copy)
        check_arguments(first, parameters(first.kernel), {X, INPUT_SCALE}, {WORKSPACE})
        assert call.launches[1:] == relocated(plain.launches, {X: copy}) and call.weight == plain.weight
        assert call.workspace_bytes == copy.offset + math.prod(problem.x_shape) * STORAGE_BYTES[dtype]
        vec = input_scale.vector(problem)
        assert first.name_expression.endswith(f",{vec}>") and \
            (problem.c if problem.layout == "NHWC" else problem.h * problem.w) % vec == 0
        assert math.prod(first.grid) * math.prod(first.block) >= min(
            math.prod(problem.x_shape) / vec, input_scale.THREADS * input_scale.MAX_BLOCKS)
        assert all(arg != Pointer(X) for launch in call.launches[1:] for arg in launch.args)


def test_the_grid_covers_every_family_and_form():
    """The plans test_programs checks take every family, the wgmma tiles, NHWC in place and Winograd."""
    plans = [plan for case, dtype, layouts in itertools.product(CASES, DTYPES, [("NCHW", "KCHW"), ("NHWC", "KHWC")])
             for plan in plans_for(case, dtype, *layouts)[1]]
    assert {plan.kernel for plan in plans} == set(planner.KERNELS)
    assert any(plan.arch for plan in plans) and any(plan.a_from_nchw for plan in plans)
    assert any(plan.kernel == planner.NHWC_KERNEL and not plan.a_from_nchw for plan in plans)
    assert {plan.kernel for plan in plans if plan.splits > 1} == {planner.NHWC_KERNEL, planner.SIMT_KERNEL}
    assert any(plan.stream_k_blocks for plan in plans)


@pytest.mark.parametrize("fit,counts", [(1, [1] * 5), (2, [2, 2, 1]), (3, [3, 2])])
def test_winograd_passes(monkeypatch, fit, counts):
    """With the temporaries capped at ``fit`` images' worth, 5 images run in passes of ``counts``:
    each pass's input transform reads its images of x, its GEMM multiplies their tiles, its output
    transform writes its images of out."""
    case = Case(5, 6, 10, 52, 56, 5, 9, padding=(2, 1))
    problem = problem_of(case, "float32")
    # 52 x 50 outputs: 13 x 13 tiles an image; 36 phase channels; 10 outputs, 12 weight columns.
    per_image, weight = 4 * 36 * (36 + 10) * 13 * 13, 4 * 36 * 36 * 12
    monkeypatch.setattr(winograd_conv2d, "WINOGRAD_MAX_WORKSPACE_BYTES", weight + fit * per_image + 1)
    plan = winograd_conv2d.make_plan(problem)
    call = check_program(plan, problem)
    assert call.workspace_bytes <= fit * per_image + WORKSPACE_ALIGNMENT and call.weight.nbytes == weight
    inputs = [launch for launch in call.launches if launch.kernel == "winograd_input_transform"]
    outputs = [launch for launch in call.launches if launch.kernel == "winograd_output_transform"]
    gemms = [launch for launch in call.launches if launch.kernel == planner.SIMT_KERNEL]
    assert [launch.args[2] for launch in inputs] == [launch.args[8] for launch in outputs] == counts
    firsts = [sum(counts[:i]) for i in range(len(counts))]
    assert [launch.args[0] for launch in inputs] == [Pointer(X, first * 4 * 6 * 52 * 56) for first in firsts]
    assert [launch.args[2] for launch in outputs] == [Pointer(OUT, first * 4 * 10 * 52 * 50) for first in firsts]
    assert [launch.args[11] for launch in gemms] == [count * 13 * 13 for count in counts]  # the GEMMs' W: tiles


@pytest.mark.parametrize("splits", [2, 5])
def test_winograd_output_transform_adds_split_k_runs(monkeypatch, splits):
    """With split-K GEMMs (here in passes of 2, 2 and 1 images), each pass's GEMM writes its runs of
    partial sums where M goes and its output transform, the split instance given the run count, adds
    them: no reduction launch."""
    case = Case(5, 6, 10, 52, 56, 5, 9, padding=(2, 1))
    problem = problem_of(case, "float32")
    per_image, weight = 4 * 36 * (36 + 10) * 13 * 13, 4 * 36 * 36 * 12
    monkeypatch.setattr(winograd_conv2d, "WINOGRAD_MAX_WORKSPACE_BYTES", weight + 2 * per_image + 1)
    plan = winograd_conv2d.make_plan(problem, splits=splits)
    call = check_program(plan, problem)
    assert REDUCE_KERNEL not in {launch.kernel for launch in call.launches}
    gemms = [launch for launch in call.launches if launch.kernel == planner.SIMT_KERNEL]
    outputs = [launch for launch in call.launches if launch.kernel == "winograd_output_transform"]
    assert len(gemms) == len(outputs) == 3
    for gemm, output in zip(gemms, outputs):
        assert gemm.args[3] == output.args[0] == Pointer(WORKSPACE, winograd_conv2d.align(4 * 36 * 36 * 2 * 13 * 13))
        assert output.args[7] == splits and output.name_expression.endswith(",true>")
    unsplit = check_program(winograd_conv2d.make_plan(problem, splits=1), problem)
    assert {launch.name_expression for launch in unsplit.launches if launch.kernel == "winograd_output_transform"} \
        == {"cupyconv::winograd_output_transform<4,int,false>"}
    assert call.workspace_bytes > unsplit.workspace_bytes


def test_a_launch_names_the_epilogue_its_module_is_compiled_for():
    """Launch.epilogue is (activation, has_residual) as its typed arguments give them, (0, 0) without them; two of
    either is refused."""
    from cupyconv.compiler import epilogue_options

    args = (Pointer(X), ResidualArg(1), ActivationArg(ACTIVATIONS.index("relu6")), 7)
    launch = Launch("pointwise_nhwc", "cupyconv::k<1>", (1, 1, 1), (32, 1, 1), 0, args)
    assert launch.epilogue == (ACTIVATIONS.index("relu6"), 1)
    assert epilogue_options(launch.epilogue) == (f"-DCUPYCONV_ACTIVATION={ACTIVATIONS.index('relu6')}",
                                                 "-DCUPYCONV_RESIDUAL=1")
    assert dataclasses.replace(launch, args=(Pointer(X), 1, 2)).epilogue == (0, 0)
    with pytest.raises(ValueError, match="one epilogue a launch"):
        _ = dataclasses.replace(launch, args=args + (ActivationArg(1),)).epilogue


def test_weight_preparations_name_their_form():
    """Plans that read the same prepared bytes share a key; anything that changes the bytes changes it."""
    def key(x_shape, w_shape, dtype="float32", stride=1, groups=1, **kw):
        problem = make_problem(x_shape, w_shape, None, dtype, stride, 1, 1, groups)
        return planner.program(planner.make_plan(problem, **kw), problem).weight.key

    simt = dict(kernel=planner.SIMT_KERNEL)
    assert key((2, 16, 9, 9), (32, 16, 3, 3), **simt) == key((8, 16, 30, 20), (32, 16, 3, 3), stride=2, **simt)
    assert key((2, 16, 9, 9), (32, 8, 3, 3), groups=2, **simt) != key((2, 8, 9, 9), (32, 8, 3, 3), **simt)
    nhwc = dict(kernel=planner.NHWC_KERNEL)
    assert key((2, 16, 9, 9), (32, 16, 3, 3), **nhwc) != key((2, 16, 9, 9), (32, 16, 3, 3), "float16", **nhwc)
    assert key((2, 16, 9, 9), (32, 16, 3, 3), **nhwc) != key((2, 16, 9, 9), (32, 16, 3, 3), **simt)
    winograd = dict(kernel=planner.WINOGRAD_KERNEL)
    assert key((2, 16, 9, 9), (32, 16, 3, 3), **winograd) != key((2, 16, 9, 9), (32, 16, 3, 3), stride=2, **winograd)


#: (x, weight, dtype, stride, padding, groups, allow_tf32, compute capability) -> lines of the plan
#: as printed before the families moved out of planner.py.
PRINTED = [
    (((32, 256, 14, 14), (256, 256, 3, 3), "float16", 1, 1, 1, False, 90), [
        "implicit_gemm_nhwc [nhwc_wgmma_producer_m128n128: block 128 px x 128 ch, k 64 per stage, 4 stages, 2 "
        "warpgroups of 64 px with wgmma (sm_90a), a producer warpgroup copying both operands by TMA, 384 threads]",
        "  grid (49, 2, 1) (pixel tiles, channel tiles, groups), block (384, 1, 1)",
        "  reads channels-last copies made first: input [N][H][W][256], weight [K][kh][kw][256 / groups], in "
        "16-byte pieces",
        "  why: tensor cores in float16, 256 output channels per group; wgmma; 256 output channels per group, 98 "
        "blocks of 128 pixels x 128 channels (1.00 waves of 128-pixel blocks' time, the fewest of the producer "
        "tiles), copied by TMA (a producer warpgroup)"]),
    (((32, 488, 14, 14), (512, 488, 3, 3), "float16", 1, 1, 1, False, 90), [
        "  grid (49, 4, 1) (pixel tiles, channel tiles, groups), block (256, 1, 1)",
        "  stream-K: 264 persistent blocks (implicit_gemm_nhwc_stream_k) share the grid's tiles x k tiles equally; "
        "a tile's owner adds the other blocks' float32 sums in block order (the same bits on every run)",
        "  why: tensor cores in float16, 512 output channels per group; wgmma; 512 output channels per group, 196 "
        "blocks of 128 channels; stream-K (196 tiles keep 132 SMs 74% busy; 51 k tiles of 128 x 128 a block): "
        "264 blocks share the 13524 tiles x k tiles"]),
    (((32, 256, 14, 14), (256, 256, 3, 3), "float16", 1, 1, 1, False, 0), [
        "implicit_gemm_nhwc [nhwc_m128n64k64: block 128 px x 64 ch, k 64 per stage, 3 stages, 2x2 warps, 128 "
        "threads]",
        "  float16 (float16 on tensor cores, float32 accumulators), int indices; 82944 B shared memory"]),
    (((64, 64, 8, 8), (64, 64, 1, 1), "float32", 1, 0, 1, True, 0), [
        "  float32 (TF32 on tensor cores, float32 accumulators), int indices; 55296 B shared memory",
        "  why: tensor cores in TF32 (allow_tf32=True), 64 output channels per group; 64 output channels per group: "
        "one 64-channel tile; k rows of 64 bytes; 1x1: the NCHW input and KCHW weight read in place, 16-byte pieces of pixels"]),
    (((4, 64, 8, 8), (64, 64, 1, 1), "float32", 1, 0, 1, True, 0), [
        "implicit_gemm_nhwc [nhwc_m64n64k32: block 64 px x 64 ch, k 32 per stage, 3 stages, 2x2 warps, 128 threads]",
        "  why: tensor cores in TF32 (allow_tf32=True), 64 output channels per group; 1x1, NCHW read in place: 4 tiles "
        "of 64 x 64 (<= 44), k rows of 128 bytes; 1x1: the NCHW input and KCHW weight read in place, 16-byte pieces "
        "of pixels"]),
    (((2, 6, 9, 9), (16, 3, 3, 3), "float16", 1, 0, 2, False, 0), [
        "implicit_gemm_conv2d [m128n32k32: block 128 px x 32 ch, k 32 per stage, 2 stages, 4x1 warps, 128 threads]",
        "  why: tensor cores in float16, 8 output channels per group; NCHW gather: 3 channels per group is odd, with "
        "2 groups (no 4-byte pieces); 8 output channels per group fit one 32-channel tile"]),
    (((32, 384, 14, 14), (384, 1, 3, 3), "float32", 1, 1, 384, False, 0), [
        "depthwise_column_conv2d [col_r7: 7 rows of two output columns, loaded as pairs, per thread, 3x3 taps at "
        "row stride 1 unrolled]",
        "  grid (22, 2, 32) (channel blocks, row segments, images), block (7, 18, 1)"]),
    (((32, 144, 56, 56), (144, 1, 3, 3), "bfloat16", 1, 1, 144, False, 0), [
        "depthwise_column_conv2d [col_r8: 8 rows of two output columns, loaded as pairs, per thread, 3x3 taps at "
        "row stride 1 unrolled]",
        "  grid (36, 7, 32) (channel blocks, row segments, images), block (28, 4, 1)",
        "  why: one input channel per group, output 56x56 (even rows, at most 224 wide): a thread per pair of output "
        "columns, no shared memory; config col_r8, output 56 rows"]),
    (((32, 144, 57, 57), (144, 1, 3, 3), "bfloat16", 1, 1, 144, False, 0), [
        "  grid (4, 18, 32) (tiles, channel blocks, images), block (32, 4, 1), 8 channels per block"]),
    (((32, 128, 56, 56), (128, 128, 3, 3), "float32", 2, 1, 1, False, 0), [
        "simt_gemm_conv2d [simt_m64n128k16: block 64 px x 128 ch, k 16 per stage, 3 stages, warps of 64 px x 32 ch, "
        "8x8 outputs per thread, 128 threads]",
        "  reads the NCHW input in place and a transposed weight copy [groups][Cg kh kw][128]"]),
    (((8, 32, 512, 512), (64, 32, 5, 9), "float32", 1, 0, 1, False, 0), [
        "winograd_conv2d [F(4x4, 3x3): 127x126 output tiles of 4x4 per image; transforms of the weight, the input "
        "and the output around 36 GEMMs]",
        "      grid (751, 1, 36) (pixel tiles, channel tiles, groups), block (64, 1, 1)",
        "  why: strict float32 (allow_tf32=False), 5x9 stride (1, 1) with 32 -> 64 channels: Winograd, fewer "
        "multiplies; F(4x4, 3x3): 192 phase channels (32 channels x 2x3 blocks of 3 strides) <= 512; 3 passes of 3 "
        "image(s) keep the temporaries within 2048 MiB"]),
    (((1, 4, 16, 13), (5, 4, 3, 5), "float64", 2, (1, 2), 1, False, 0), [
        "direct_conv2d [k16_8x32: block 16 ch x 8x32 px, thread 4 ch x 4 px, 256 threads]",
        "  float64, int indices; stage 4 ch x 3x5 taps, 48768 B shared memory",
        "  why: float64 has no tensor-core path; 5 output channels per group (<= 16)"]),
]


@pytest.mark.parametrize("arguments,lines", PRINTED)
def test_printed_plans_are_unchanged(arguments, lines):
    x_shape, w_shape, dtype, stride, padding, groups, allow_tf32, cc = arguments
    problem = make_problem(x_shape, w_shape, None, dtype, stride, padding, 1, groups)
    text = str(planner.make_plan(problem, allow_tf32=allow_tf32, compute_capability=cc)).splitlines()
    for line in lines:
        assert line in text


@pytest.mark.parametrize("layouts", [("NCHW", "KCHW"), ("NHWC", "KHWC")], ids="-".join)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES[::3], ids=lambda c: c.id)
def test_epilogue_programs(case, dtype, layouts):
    """With an activation and a residual, every plan's program has a launch that finishes the output
    (has_residual = 1 and the activation's code); the launches that write partial sums to the
    workspace pass neither."""
    problem, plans = plans_for(case, dtype, *layouts, activation="silu", has_residual=True)
    code = ACTIVATIONS.index("silu")
    for plan in plans:
        assert (plan.activation, plan.has_residual) == ("silu", True) and "epilogue: silu(conv + bias + residual)" in str(plan)
        call = check_program(plan, problem)
        if problem.n == 0:
            continue
        finishing = []
        for launch in call.launches:
            kinds, names = zip(*signature(launch.kernel))
            if "residual" not in names:
                continue
            index = names.index("residual")
            flags = launch.args[index + 1: index + 3]
            written = launch.args[kinds.index("out")]
            if flags == (1, code):
                finishing.append(launch)
            else:  # partial sums (split-K's runs, Winograd's GEMM) to the workspace: no epilogue
                assert flags == (0, 0) and written.operand == WORKSPACE, (launch.kernel, launch.args)
            assert launch.epilogue == (flags[1], flags[0]), "the module is compiled for the epilogue it is passed"
        assert finishing, [launch.kernel for launch in call.launches]
