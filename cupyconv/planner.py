"""The planner: which kernel family runs a ConvProblem, and its launch plan.

A plan is plain data, chosen from the problem alone, and printable, so a user can ask why a kernel
was picked (``print(cupyconv.plan(x, weight, ...))``). Each family (cupyconv/families/, one module
per file in kernels/) owns its tiles, refusal, plan, description and launches; this module ranks the
families (choose_kernel) and dispatches to them through FAMILIES. Compilation lives in compiler.py,
the launches in executor.py.
"""
from __future__ import annotations

import dataclasses
import functools

from . import input_scale, layouts
from .arguments import ConvProblem
from .families.common import STORAGE_BYTES, grid_fits
from .program import CallProgram, Pointer


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    """Everything a family's program needs to run one problem, and why it was chosen."""

    kernel: str
    dtype: str
    index_type: str
    # The family's config dataclass (families/*.py: TileConfig, DepthwiseConfig, ColumnConfig,
    # SimtConfig, GemmConfig).
    config: object
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    reason: str
    # direct_conv2d only (kernel arguments after the problem's): its stage and tiling; depthwise_conv2d
    # takes tiles_w, channels_per_block, vec, pitch and patch_buffers.
    stage_channels: int = 0
    stage_rows: int = 0
    stage_cols: int = 0
    pitch: int = 0
    tiles_w: int = 0
    tiles: int = 0
    ktiles: int = 0
    # implicit_gemm_nhwc: bytes per cp.async piece (one_pixel_conv2d: of a lane's loads), and the channels of
    # the channels-last copies (C, or C rounded up with zero channels so that a piece never straddles two taps).
    vec: int = 0
    channels_padded: int = 0
    # ... and, on the ping-pong tile, the taps a k tile holds (2: 16-bit layers of 32 channels, two taps' 64-byte
    # pixels side by side in a k tile's 128-byte rows).
    taps_per_k_tile: int = 1
    # ... or, for 1x1 stride-1 unpadded problems and 1-D ones whose taps shift whole pieces, no copies: A
    # read from the NCHW input, vec bytes of consecutive pixels per piece (implicit_gemm_nhwc's
    # NCHW_A_POINTWISE or NCHW_A_ROW_TAPS; 0: none).
    a_from_nchw: int = 0
    # ... and, for float32 NHWC inputs it reads in place (no copy rounded them), TF32 rounding of the
    # input pieces in shared memory as they land.
    round_a: bool = False
    # ... and, for strided layers of few input channels, the blocks of (rows, columns) input pixels that a
    # space-to-depth copy makes one pixel each, the GEMM running the stride-1 problem on them ((1, 1): none).
    space_to_depth: tuple[int, int] = (1, 1)
    # depthwise_conv2d only: output channels each block computes (block z lanes side by side, each
    # channels_per_block / lanes one after another), and input patches each lane keeps in shared
    # memory (a ring of 1 to 4: the next patch_buffers - 1 channels' copies overlap this one's
    # arithmetic). Its vec is bytes per copy piece, its pitch the patch's row pitch in elements.
    channels_per_block: int = 0
    patch_buffers: int = 0
    # simt_gemm_conv2d only: columns of the transposed weight copy [groups][Cg kh kw][weight_columns]
    # it reads (K / groups rounded up to 4 with zero columns, for 16-byte pieces).
    weight_columns: int = 0
    # ... and the runs of the reduction it splits across blocks (split-K, 1: none): grid z is
    # groups x splits, each split's partial sums go to the workspace, kernels/split_k_reduce.cu adds them.
    splits: int = 1
    # implicit_gemm_nhwc only: stream-K's persistent blocks (0: one block per tile of ``grid``, which
    # then counts the tiles those blocks share; kernels/stream_k.cuh).
    stream_k_blocks: int = 0
    # winograd_conv2d only: the batched GEMM between its transforms (a simt_gemm_conv2d plan), and its
    # output tiles of winograd_tile x winograd_tile pixels: tiles_w per row, tiles per image (above).
    gemm: "LaunchPlan | None" = None
    winograd_tile: int = 0
    # ... which runs in passes of winograd_images images (all, unless the temporaries would pass
    # WINOGRAD_MAX_WORKSPACE_BYTES), the last pass's GEMM planned as gemm_last.
    winograd_images: int = 0
    gemm_last: "LaunchPlan | None" = None
    # The NVRTC target the specialisation needs where it is not the device's own ("sm_90a": wgmma).
    arch: str = ""
    # The problem's memory orders of x and the output, and of the weight. Where the family does not
    # compute them natively (LAYOUTS and WEIGHT_LAYOUTS in its module), layouts.py transposes around it.
    layout: str = "NCHW"
    weight_layout: str = "KCHW"
    # The problem's epilogue (ConvProblem.activation, has_residual), which every family applies.
    activation: str = "none"
    has_residual: bool = False
    # The problem's prologue (ConvProblem.has_input_scale): applied in the kernel's loads, or as a
    # scaled copy of x first (cupyconv/input_scale.py).
    has_input_scale: bool = False
    # Whether and how autotuning chose the plan (cupyconv/tuning.py), printed as its "tuned:" line;
    # "" where nobody asked (plans made by make_plan).
    tuning: str = ""

    @property
    def name_expression(self) -> str:
        """The C++ template instance of the plan's kernel, as NVRTC's name_expressions want it."""
        return FAMILIES[self.kernel].name_expression(self)

    def __str__(self) -> str:
        lines = [FAMILIES[self.kernel].describe(self)]
        if self.activation != "none" or self.has_residual:
            lines.append(f"  epilogue: {'' if self.activation == 'none' else self.activation}"
                         f"(conv + bias{' + residual' if self.has_residual else ''}) in the accumulator type, "
                         f"rounded once")
        if self.has_input_scale:
            lines.append("  input scale: x * input_scale[n, c] " +
                         ("in the kernel's loads" if input_scale.applied_by(FAMILIES[self.kernel]) else
                          "copied to the workspace first (scale_channels), which the kernel reads"))
        lines += layouts.describe(self).splitlines()
        if self.tuning:
            lines.append(f"  tuned: {self.tuning}")
        return "\n".join(lines)


# The families build LaunchPlans: imported once the class exists.
from .families import (depthwise_column_conv2d, depthwise_conv2d, depthwise_nhwc, direct_conv2d,  # noqa: E402
                       few_channel_nhwc, implicit_gemm_conv2d, implicit_gemm_nhwc, one_pixel_conv2d, pointwise_nhwc,
                       simt_gemm_conv2d, winograd_conv2d)

#: Kernel family -> its module. A new family is a module in families/ and an entry here (and, to be
#: chosen without being forced, a rule in choose_kernel).
FAMILIES = {family.KERNEL: family for family in (direct_conv2d, depthwise_conv2d, depthwise_column_conv2d,
                                                 depthwise_nhwc, simt_gemm_conv2d, winograd_conv2d,
                                                 implicit_gemm_conv2d, implicit_gemm_nhwc, pointwise_nhwc,
                                                 few_channel_nhwc, one_pixel_conv2d)}
KERNELS = tuple(FAMILIES)
DIRECT_KERNEL = direct_conv2d.KERNEL
DEPTHWISE_KERNEL = depthwise_conv2d.KERNEL
DEPTHWISE_COLUMN_KERNEL = depthwise_column_conv2d.KERNEL
DEPTHWISE_NHWC_KERNEL = depthwise_nhwc.KERNEL
#: One input channel in one group takes the tensor-core GEMMs from this many taps on (H200, fp16 and
#: TF32, both layouts, benchmarks/profile/one_channel.py): wav2vec 2.0's 1 -> 512 k10 s5 0.039 ms
#: against the depthwise kernel's 0.156, 1 -> 64 7x7 s2 on 224^2 0.084 against 0.403, 1 -> 32 5x5 on
#: 28^2 0.014 against 0.022; with 9 taps (1 -> 32 3x3 on 224^2) the depthwise kernel's 0.112 against 0.152.
ONE_CHANNEL_GEMM_MIN_TAPS = 10
#: ... and of this many output channels (the fewest timed; a single-channel filter, 1 -> 1, stays a
#: depthwise layer). On NHWC arrays the GEMM reads and writes in place at any number of taps, where the
#: depthwise kernels transpose the output (H100, 1 -> 32 3x3 on 224^2: fp16 0.174 ms against 0.253,
#: TF32 0.161 against 0.314; benchmarks/NOTES.md).
ONE_CHANNEL_GEMM_MIN_CHANNELS = 32
#: On NHWC arrays, layers of a reduction (C/groups kh kw) within one 16-bit k tile take the NCHW-gather
#: GEMM's NHWC instance where the channels-last GEMM would pad their channels with zeros (RGB stems) and
#: they have at most NHWC_GATHER_MAX_CHANNELS output channels per group: no padding copy, one k tile.
#: H100, EfficientNet-B0's and MobileNetV2's 3 -> 32 3x3 s2 stem at batch 32: fp16 0.051 ms against
#: 0.064, bf16 0.052 against 0.065, TF32 0.053 against 0.100. Wider ones lose: 3 -> 64 3x3 (VGG's, 27
#: elements too) 0.290 against 0.210, ResNet-50's 7x7 0.144 against 0.117, AlexNet's 11x11 0.963
#: against 0.590 (benchmarks/NOTES.md).
NHWC_GATHER_MAX_REDUCTION = 32
NHWC_GATHER_MAX_CHANNELS = 32
#: ... and so do those of at most this many pixels (one tile), on its 32-channel tile, where the pointwise
#: kernel does not take them: EfficientNet-B0's squeeze-excitation expansions at batch 32 (1x1 planes,
#: 6 -> 144 .. 28 -> 672) fp16 0.0071-0.0073 ms against 0.0103-0.0105 on the channels-last GEMM, TF32
#: 0.0065-0.0069 against 0.0088-0.0104; 4 -> 96 fp16 0.0071 against 0.0070.
NHWC_GATHER_MAX_PIXELS = 128
#: On NCHW arrays, strided, undilated layers whose input channels make no 16-byte piece (RGB stems) take
#: the NCHW gather, x read in place in one launch, up to this many output pixels x reduction elements; the
#: channels-last GEMM copies x first (space-to-depth, or channels-last with zero channels), a launch that
#: a small batch's layer does not repay. H200, GPU time behind a spin, the same run
#: (results/candidates_stems_nchw_h200.txt): 3 -> 32 3x3 s2 on 224^2 (MobileNetV2's, EfficientNet-B0's) at
#: batch 1 fp16 7.5 us against 12.5, TF32 7.2 against 14.5; at batch 16 (5.4M) 24.0 against 30.7 and 25.0
#: against 45.5; at batch 32 (10.8M) 43.6 against 50.6 and 44.3 against 87.3 (results/candidates_stem_b32_h200.txt);
#: ResNet-50's 3 -> 64 7x7 s2 at batch 1 fp16 11.7 against 16.6, at batch 4 (7.4M) 22.6 against 24.6, TF32 25.7
#: against 28.7; at batch 16 (29.5M) the channels-last GEMM's, fp16 54.6 against more than 57.6. (The 7x7 at batch
#: 8, 14.7M, and wider outputs than the 7x7's 64 channels were not timed: they keep the channels-last GEMM.)
NCHW_STEM_GATHER_MAX_TAPS = 12 * 2**20
NCHW_STEM_GATHER_MAX_CHANNELS = 64
#: Strict float32 layers of fewer than GEMM_MIN_GROUP_CHANNELS output channels per group and at most this many
#: output pixels (EfficientNet's squeeze-excitation reductions, on one-pixel planes) take the FMA GEMM with
#: split-K, not the direct kernel, whose one block per image stages its channels 16 at a time in series:
#: H100, batch 8, 96 -> 4 on 1x1 0.013-0.014 ms against 0.053, 144 -> 6 0.014-0.016 against 0.079; batch
#: 32, 96 -> 4 0.012-0.014 against 0.053 (benchmarks/NOTES.md, "Few output channels in strict float32").
SIMT_FEW_CHANNELS_MAX_PIXELS = 256
SIMT_KERNEL = simt_gemm_conv2d.KERNEL
WINOGRAD_KERNEL = winograd_conv2d.KERNEL
GEMM_KERNEL = implicit_gemm_conv2d.KERNEL
NHWC_KERNEL = implicit_gemm_nhwc.KERNEL
POINTWISE_KERNEL = pointwise_nhwc.KERNEL
FEW_CHANNEL_KERNEL = few_channel_nhwc.KERNEL
ONE_PIXEL_KERNEL = one_pixel_conv2d.KERNEL


def kernel_specialisations() -> list[str]:
    """Every name expression make_plan can choose for any GPU: what the compile test builds for each
    arch (arch_specialisations() has those of one arch alone)."""
    return [expression for family in FAMILIES.values() for expression in family.specialisations()] + \
        input_scale.specialisations()


def arch_specialisations() -> dict[str, list[str]]:
    """NVRTC target -> the name expressions that compile for it alone."""
    gathered: dict[str, list[str]] = {}
    for family in FAMILIES.values():
        for arch, expressions in getattr(family, "arch_specialisations", dict)().items():
            gathered.setdefault(arch, []).extend(expressions)
    return gathered


def choose_kernel(problem: ConvProblem, kernel: str | None = None, allow_tf32: bool = False,
                  config: str | None = None, compute_capability: int = 0) -> tuple[str, str]:
    """The kernel family for ``problem`` and why: forced by ``kernel`` (or by a config name of one
    family), else for 1x1 layers on one-pixel planes of a small batch (squeeze-excitation's) a
    matrix-vector product (one_pixel_conv2d), else a tensor-core GEMM for float16/bfloat16, and for
    float32 when ``allow_tf32``: the channels-last one (implicit_gemm_nhwc) wherever its copies can be made, else the NCHW gather;
    strict float32 takes Winograd (winograd_conv2d) for undilated, ungrouped layers where its phase
    channels and the multiplies they save pay (3x3 stride 1, AlexNet's 11x11 stride 4, the 5x9), else
    the FMA implicit GEMM (simt_gemm_conv2d) where it can run; depthwise layers
    the depthwise kernels (on NHWC arrays, depthwise_nhwc); memory-bound 1x1 NHWC layers on the tensor
    cores pointwise_nhwc (pointwise_nhwc.pays, which on ``compute_capability`` 90 leaves wide, large
    16-bit ones to wgmma); the rest, and float64, the direct kernel."""
    if kernel is None and config is not None:
        kernel = next((name for name, family in FAMILIES.items() if config in family.CONFIG_NAMES), DIRECT_KERNEL)
    if kernel is not None:
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
        why_not = FAMILIES[kernel].refusal(problem)
        if why_not:
            raise ValueError(f"kernel {kernel!r} cannot run this problem: {why_not}")
        return kernel, "forced by the caller"
    if not one_pixel_conv2d.refusal(problem) and one_pixel_conv2d.pays(problem):
        return ONE_PIXEL_KERNEL, (f"1x1 on one-pixel planes, {problem.n} image(s) of {problem.c} -> {problem.k} "
                                  f"channels: a matrix-vector product per image in one launch")
    kg = problem.k // problem.groups
    tensor_cores = problem.dtype in ("float16", "bfloat16") or (problem.dtype == "float32" and allow_tf32)
    # One input channel in one group (a waveform's or a grayscale image's first layer) is a GEMM of
    # kh kw taps, not a depthwise layer: the depthwise kernels copy its patch again for every output
    # channel and multiply on the FMA units.
    single_channel_gemm = tensor_cores and problem.c == problem.groups == 1 and \
        problem.k >= ONE_CHANNEL_GEMM_MIN_CHANNELS and \
        (problem.kh * problem.kw >= ONE_CHANNEL_GEMM_MIN_TAPS or problem.layout == "NHWC")
    if not single_channel_gemm:
        if not depthwise_nhwc.refusal(problem):
            return DEPTHWISE_NHWC_KERNEL, "NHWC, one channel per group: vectors of channels per thread, in place"
        if depthwise_column_conv2d.column_pairs(problem) and \
                problem.wo <= depthwise_column_conv2d.COLUMN_PAIRS_MAX_WIDTH:
            return DEPTHWISE_COLUMN_KERNEL, (f"one input channel per group, output {problem.ho}x{problem.wo} (even "
                                             f"rows, at most {depthwise_column_conv2d.COLUMN_PAIRS_MAX_WIDTH} wide): "
                                             f"a thread per pair of output columns, no shared memory")
        if not depthwise_column_conv2d.refusal(problem) and problem.wo <= depthwise_column_conv2d.COLUMN_MAX_WIDTH:
            return DEPTHWISE_COLUMN_KERNEL, (f"one input channel per group, output {problem.ho}x{problem.wo} (at "
                                             f"most {depthwise_column_conv2d.COLUMN_MAX_WIDTH} wide): a thread per "
                                             f"output column, no shared memory")
        if not depthwise_conv2d.refusal(problem):
            return DEPTHWISE_KERNEL, "one input channel per group: memory-bound, a patch per output tile"
    if problem.dtype == "float64":
        return DIRECT_KERNEL, "float64 has no tensor-core path"
    if single_channel_gemm and not implicit_gemm_conv2d.refusal(problem):
        # (TF32, H200: wav2vec 2.0's 1 -> 512 0.036 ms on the NCHW gather against 0.054 on a channels-last copy;
        # H100, NHWC in place: 0.050 against 0.050, 1 -> 64 7x7 s2 0.103 against 0.108, 1 -> 32 5x5 0.016 against 0.022)
        return GEMM_KERNEL, (f"one input channel, {problem.kh}x{problem.kw} taps -> {kg} channels: tensor cores, "
                             f"the {problem.layout} input gathered in place")
    if few_channel_nhwc.pays(problem):
        return FEW_CHANNEL_KERNEL, f"{problem.dtype}, NHWC, {problem.c} input channels (an image)"
    # On the tensor cores the channels-last GEMM's 32-channel tile beats the direct kernel even on a few
    # output channels (H100, fp16: 3 output channels of a 256^2 plane 0.169 ms against 1.183; EfficientNet's
    # squeeze-excitation reductions 0.006-0.008 against 0.056-0.081; benchmarks/NOTES.md).
    if kg < implicit_gemm_conv2d.GEMM_MIN_GROUP_CHANNELS and (not tensor_cores or implicit_gemm_nhwc.refusal(problem)):
        pixels = problem.n * problem.ho * problem.wo
        if not tensor_cores and pixels <= SIMT_FEW_CHANNELS_MAX_PIXELS and not simt_gemm_conv2d.refusal(problem):
            return SIMT_KERNEL, (f"strict float32 (allow_tf32=False), {kg} output channel(s) per group on {pixels} "
                                 f"pixels: the FMA GEMM's reduction split across blocks (the direct kernel stages "
                                 f"an image's channels in series)")
        return DIRECT_KERNEL, f"{kg} output channel(s) per group: a GEMM tile would be mostly padding"
    if problem.dtype == "float32" and not allow_tf32:
        if not winograd_conv2d.refusal(problem) and winograd_conv2d.pays(problem):
            return WINOGRAD_KERNEL, (f"strict float32 (allow_tf32=False), {problem.kh}x{problem.kw} stride "
                                     f"{problem.stride} with {problem.c} -> {problem.k} channels: Winograd, "
                                     f"fewer multiplies")
        why_not = simt_gemm_conv2d.refusal(problem)
        if not why_not:
            return SIMT_KERNEL, f"strict float32 (allow_tf32=False) on the FMA units, {kg} output channels per group"
        return DIRECT_KERNEL, f"strict float32 (allow_tf32=False); no FMA implicit GEMM: {why_not}"
    precision = "TF32 (allow_tf32=True)" if problem.dtype == "float32" else problem.dtype
    if not pointwise_nhwc.refusal(problem) and pointwise_nhwc.pays(problem, compute_capability) and \
            not implicit_gemm_nhwc.pingpong_rules_take(problem, compute_capability):
        return POINTWISE_KERNEL, (f"tensor cores in {precision}; 1x1 NHWC of {problem.c} -> {problem.k} channels, "
                                  f"{pointwise_nhwc.flop_per_byte(problem):.0f} FLOP per byte (<= "
                                  f"{pointwise_nhwc.MAX_FLOP_PER_BYTE[problem.dtype]}): streamed over the pixels by "
                                  f"persistent blocks")
    reduction, pixels = problem.c // problem.groups * problem.kh * problem.kw, problem.n * problem.ho * problem.wo
    if problem.layout == "NHWC" and reduction <= NHWC_GATHER_MAX_REDUCTION and \
            not implicit_gemm_conv2d.refusal(problem):
        if kg <= NHWC_GATHER_MAX_CHANNELS and implicit_gemm_nhwc.pads_channels(problem):
            return GEMM_KERNEL, (f"tensor cores in {precision}; {problem.c} input channels, a reduction of "
                                 f"{reduction} and {kg} output channels per group: the NHWC input gathered in "
                                 f"place, not copied with zero channels")
        if pixels <= NHWC_GATHER_MAX_PIXELS:
            return GEMM_KERNEL, (f"tensor cores in {precision}; {pixels} pixels and a reduction of {reduction}: "
                                 f"one k tile, the NHWC input gathered in place")
    if problem.layout == "NCHW" and problem.stride != (1, 1) and problem.dilation == (1, 1) and \
            problem.groups == 1 and problem.c * STORAGE_BYTES[problem.dtype] < 16 and \
            kg <= NCHW_STEM_GATHER_MAX_CHANNELS and pixels * reduction <= NCHW_STEM_GATHER_MAX_TAPS and \
            not implicit_gemm_conv2d.refusal(problem):
        return GEMM_KERNEL, (f"tensor cores in {precision}; a strided layer of {problem.c} input channels on "
                             f"{pixels} output pixels, a reduction of {reduction} (<= {NCHW_STEM_GATHER_MAX_TAPS} "
                             f"pixel-elements): the NCHW input gathered in place, one launch, not copied first")
    why_not = implicit_gemm_nhwc.refusal(problem)
    if not why_not:
        return NHWC_KERNEL, f"tensor cores in {precision}, {kg} output channels per group"
    if implicit_gemm_conv2d.refusal(problem):  # float16, bfloat16 or float32 here: its grid
        return DIRECT_KERNEL, "implicit-GEMM grid exceeds CUDA's limits (groups or channel tiles > 65535)"
    return GEMM_KERNEL, f"tensor cores in {precision}, {kg} output channels per group; NCHW gather: {why_not}"


@functools.lru_cache(maxsize=4096)
def make_plan(problem: ConvProblem, config: str | None = None, kernel: str | None = None,
              allow_tf32: bool = False, compute_capability: int = 0, **options) -> LaunchPlan:
    """Choose the kernel specialisation, stage and launch shape for ``problem``.

    Plans are immutable and depend on the arguments alone, so each is made once and cached (a model
    calls the same few shapes over and over; planning costs ~20 us of Python).

    Args:
        problem: the convolution.
        config: force a tile config of a family by name (tests and benchmarks; the family's
            CONFIG_NAMES choose it where ``kernel`` is None); None lets the shape decide.
        kernel: force the family (one of KERNELS; on 'implicit_gemm_nhwc' or 'implicit_gemm_conv2d'
            float32 runs as TF32); None chooses by dtype, ``allow_tf32`` and shape (see choose_kernel).
        allow_tf32: let float32 run on the tensor cores in TF32 (10-bit mantissa products).
        compute_capability: of the GPU that will run the plan (90 for sm_90), where kernels for one
            architecture alone may be chosen (wgmma on the H100); 0, any GPU.
        options: with a forced ``kernel``, that family's own knobs, passed to its make_plan (the
            tuner's and the tests'): ``splits`` (simt_gemm_conv2d, implicit_gemm_nhwc: split-K's
            runs), ``stream_k`` (implicit_gemm_nhwc: True or False forces stream-K on or off),
            ``space_to_depth`` (implicit_gemm_nhwc: False keeps a strided layer's own stride),
            ``tile`` (winograd_conv2d: F(2x2) or F(4x4)).
    """
    family, family_reason = choose_kernel(problem, kernel, allow_tf32, config, compute_capability)
    if family == NHWC_KERNEL:  # the one family with tiles for one architecture alone
        options["compute_capability"] = compute_capability
    plan = FAMILIES[family].make_plan(problem, config, family_reason, **options)
    return dataclasses.replace(plan, layout=problem.layout, weight_layout=problem.weight_layout,
                               activation=problem.activation, has_residual=problem.has_residual,
                               has_input_scale=problem.has_input_scale)


def as_planned(problem: ConvProblem, allow_tf32: bool = False, compute_capability: int = 0) -> ConvProblem:
    """The problem the fronts plan and run for ``problem``: itself, or, for an NCHW problem of one-pixel
    input and output planes (N, C, 1, 1: the same memory as NHWC), the NHWC problem where the rules'
    family for it reads NHWC in place -- the channels-last kernels, with no copy of the input to NHWC
    first. torch hands such tensors over as contiguous, so NCHW: EfficientNet's squeeze-excitation layers,
    after its pooling."""
    if problem.layout != "NCHW" or (problem.h, problem.w, problem.ho, problem.wo) != (1, 1, 1, 1):
        return problem
    nhwc = dataclasses.replace(problem, layout="NHWC")
    family = FAMILIES[make_plan(nhwc, allow_tf32=allow_tf32, compute_capability=compute_capability).kernel]
    return nhwc if nhwc.layout in layouts.in_place(family)[0] else problem


def program(plan: LaunchPlan, problem: ConvProblem) -> CallProgram:
    """The launches, workspace and weight preparation that run ``plan`` (any plan the families make
    for ``problem``, forced ones included) as data; none for an empty batch.

    Raises:
        ValueError: a launch's int argument is past 32 bits (the kernels' ``int`` parameters).
    """
    if problem.n == 0:
        return CallProgram(())
    family = FAMILIES[plan.kernel]
    if layouts.native(family, problem):
        call = family.program(plan, problem)
    else:
        call = layouts.transposed(family.program(plan, layouts.nchw(problem)), plan, problem)
    if problem.has_input_scale and not input_scale.applied_by(family):
        call = input_scale.scaled_first(call, problem)
    for launch in call.launches + (call.weight.launches if call.weight else ()):
        if not grid_fits(launch.grid):  # the copies' and transposes' grids (the families check their own)
            raise ValueError(f"{launch.kernel} needs grid {launch.grid}, past CUDA's limits: the problem "
                             f"{problem.x_array_shape} -> {problem.out_array_shape} in layout {problem.layout} is too "
                             f"large for {plan.kernel}")
        for position, arg in enumerate(launch.args):
            if isinstance(arg, int) and not -2**31 <= arg < 2**31:
                raise ValueError(f"{launch.kernel} argument {position} is {arg}, past its 32-bit int: the problem "
                                 f"{problem.x_shape} -> {problem.out_shape} is too large for {plan.kernel}")
    return call

