"""A convolution call as data: the kernel launches it makes, the operands they read and write, and
the temporaries they need.

Each kernel family turns its :class:`~cupyconv.planner.LaunchPlan` into a :class:`CallProgram` once
per problem (``program(plan, problem)`` in its module under ``cupyconv/families/``). The executor
(executor.py) resolves the kernels, packs the arguments and keeps the result, so a call for a shape
seen before is a dictionary lookup, the allocations and the launches.
"""
from __future__ import annotations

import dataclasses

#: The operands a launch may point into. X: the caller's input, C-contiguous NCHW. WEIGHT: the
#: caller's weight, C-contiguous (K, C/groups, kh, kw). PREPARED: the weight in the form the family
#: reads (written by WeightPreparation.launches, kept while the weight is unchanged). BIAS: the bias
#: (K,), or, where the call has none, any valid pointer (the kernels read it only when has_bias).
#: OUT: the C-contiguous NCHW output. WORKSPACE: this call's temporaries. RESIDUAL: the array added
#: in the epilogue (the output's shape and layout; may be OUT itself), or, where the call has none,
#: any valid pointer (read only when has_residual). GRAD_OUTPUT: the gradient of a convolution's
#: output (the weight gradient's programs read it with X and write the gradient to OUT). FLAGS:
#: FLAG_COUNT ints that are zero before each launch that points into them and that it leaves zero
#: (stream-K's, kernels/stream_k.cuh); the executor keeps them per stream (Workspaces.flags).
#: INPUT_SCALE: the (N, C) scale x is multiplied by before the convolution (cupyconv/input_scale.py),
#: or, where the call has none, any valid pointer (read only when has_input_scale).
X, WEIGHT, PREPARED, BIAS, OUT, WORKSPACE, RESIDUAL = "x", "weight", "prepared", "bias", "out", "workspace", "residual"
GRAD_OUTPUT, FLAGS, INPUT_SCALE = "grad_output", "flags", "input_scale"
OPERANDS = (X, WEIGHT, PREPARED, BIAS, OUT, WORKSPACE, RESIDUAL, GRAD_OUTPUT, FLAGS, INPUT_SCALE)
#: Ints of the FLAGS operand: one per stream-K block, at most (families/implicit_gemm_nhwc.py).
FLAG_COUNT = 1024
#: Offsets of the temporaries in the workspace are multiples of this (cp.async and vector loads need 16).
WORKSPACE_ALIGNMENT = 256
#: The kernels read some caller operands in place with cp.async and vector loads of up to 16 bytes:
#: the fronts copy an operand whose address is not a multiple of this first.
OPERAND_ALIGNMENT = 16


@dataclasses.dataclass(frozen=True)
class Pointer:
    """A pointer argument: ``operand``'s address plus ``offset`` bytes."""

    operand: str
    offset: int = 0

    def __post_init__(self):
        if self.operand not in OPERANDS:
            raise ValueError(f"operand must be one of {OPERANDS}, got {self.operand!r}")


@dataclasses.dataclass(frozen=True)
class Table:
    """A struct parameter of 32-bit ints passed by value (the phase launch's PhaseTable): ``values`` in
    the struct's field order, as many as it has."""

    values: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class TensorMap:
    """A TMA tensor map parameter (a CUtensorMap by value, kernels' __grid_constant__ TensorMap) of the
    row-major ``rows`` x ``columns`` matrix of ``dtype`` at ``pointer``, rows ``row_bytes`` apart, read
    in ``box_rows`` x ``box_columns`` boxes, landing 128-byte swizzled or (``swizzled`` False) as
    plain rows (cupyconv/tensor_map.py); the executor makes it for the pointer's address at the call."""

    pointer: Pointer
    dtype: str
    rows: int
    columns: int
    row_bytes: int
    box_rows: int
    box_columns: int
    swizzled: bool = True


@dataclasses.dataclass(frozen=True)
class Im2colMap:
    """A TMA tensor map parameter in im2col mode of the NHWC tensor of ``shape`` (n, h, w, c) of ``dtype``
    at ``pointer``: a copy reads ``pixels_per_column`` window corners, ``strides`` (h, w) apart in the
    box from ``lower`` to (h, w) + ``upper`` (the padding's bounds), ``channels_per_pixel`` channels of
    each (cupyconv/tensor_map.py); made at the call for the pointer's address."""

    pointer: Pointer
    dtype: str
    shape: tuple[int, int, int, int]
    lower: tuple[int, int]
    upper: tuple[int, int]
    strides: tuple[int, int]
    channels_per_pixel: int
    pixels_per_column: int


@dataclasses.dataclass(frozen=True)
class PixelStripMap:
    """A TMA tensor map parameter (tiled, 4-D) of the NHWC tensor of ``shape`` (n, h, w, c) of ``dtype`` at
    ``pointer``, read in boxes of ``pixels`` consecutive pixels of one row of one image, all c channels each,
    swizzled across each pixel's row (c of 16 bits: 64 bytes), zeros outside the tensor (cupyconv/tensor_map.py);
    made at the call for the pointer's address."""

    pointer: Pointer
    dtype: str
    shape: tuple[int, int, int, int]
    pixels: int


#: The tensor map parameters: made by the executor at the call for their operand's address.
MAP_TYPES = (TensorMap, Im2colMap, PixelStripMap)


class ActivationArg(int):
    """The ``activation`` int parameter of a kernel's epilogue (kernels/epilogue.cuh): ACTIVATIONS' index
    (cupyconv/arguments.py). The kernel's module is compiled for this value (Launch.epilogue)."""


class ResidualArg(int):
    """The ``has_residual`` int parameter of a kernel's epilogue (0 or 1), compiled for as ActivationArg is."""


@dataclasses.dataclass(frozen=True)
class Launch:
    """One kernel launch. ``args`` are the kernel's parameters in order: a Pointer for each pointer
    parameter, a Python int for each ``int`` parameter (passed as a 32-bit int; the epilogue's as an
    ActivationArg and a ResidualArg), a Table for a struct of ints, a TensorMap, an Im2colMap or a PixelStripMap for a
    TMA descriptor."""

    kernel: str
    name_expression: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    args: tuple
    #: NVRTC target where the specialisation needs one (LaunchPlan.arch), else "" (the device's own).
    arch: str = ""

    @property
    def epilogue(self) -> tuple[int, int]:
        """(activation, has_residual) that the kernel's module is compiled for: its epilogue arguments,
        (0, 0) for a kernel without them or a launch that gives plain ints (no epilogue)."""
        activation = [int(arg) for arg in self.args if isinstance(arg, ActivationArg)]
        residual = [int(arg) for arg in self.args if isinstance(arg, ResidualArg)]
        if len(activation) > 1 or len(residual) > 1:
            raise ValueError(f"{self.kernel}: one epilogue a launch, got activations {activation}, residuals {residual}")
        return (activation[0] if activation else 0, residual[0] if residual else 0)


@dataclasses.dataclass(frozen=True)
class WeightPreparation:
    """How a family's PREPARED operand is made from WEIGHT: ``launches`` write ``nbytes`` bytes.
    ``key`` names the prepared form, so that plans with the same key share one prepared weight."""

    key: tuple
    nbytes: int
    launches: tuple[Launch, ...]


@dataclasses.dataclass(frozen=True)
class CallProgram:
    """Everything one call runs: ``launches`` in order, a workspace of ``workspace_bytes`` (0: none),
    and the weight preparation its launches' PREPARED pointers need (None: they read WEIGHT)."""

    launches: tuple[Launch, ...]
    workspace_bytes: int = 0
    weight: WeightPreparation | None = None


def align(nbytes: int) -> int:
    """``nbytes`` rounded up to WORKSPACE_ALIGNMENT, for the next temporary's offset."""
    return -(-nbytes // WORKSPACE_ALIGNMENT) * WORKSPACE_ALIGNMENT


def relocated(launches, moves: dict[str, Pointer]) -> tuple[Launch, ...]:
    """``launches`` with each pointer into an operand that ``moves`` names moved to where it says
    (offsets add): how a program runs inside another, on its operands or in its workspace."""
    def moved(arg):
        if isinstance(arg, Pointer) and arg.operand in moves:
            target = moves[arg.operand]
            return Pointer(target.operand, target.offset + arg.offset)
        if isinstance(arg, MAP_TYPES):
            return dataclasses.replace(arg, pointer=moved(arg.pointer))
        return arg

    return tuple(dataclasses.replace(launch, args=tuple(moved(arg) for arg in launch.args)) for launch in launches)
