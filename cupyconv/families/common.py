"""What the kernel families share: CUDA's limits, the C++ names of the dtypes, index widths, the
implicit GEMMs' grid, the convolution kernels' common parameter list, and split-K (the runs of a
GEMM's reduction and their ordered sum, kernels/split_k_reduce.cu)."""
from __future__ import annotations

import math

from ..arguments import ACTIVATIONS, ConvProblem
from ..program import BIAS, OUT, RESIDUAL, WEIGHT, X, ActivationArg, Launch, Pointer, ResidualArg

#: Dynamic shared memory a block may use without opting in to more (the same on every GPU since sm_20).
SHARED_MEMORY_BYTES = 48 * 1024
#: CUDA's limit on gridDim.y; images beyond it are looped over inside the kernel.
MAX_GRID_Y = 65535
#: CUDA's limit on threads per block.
MAX_BLOCK_THREADS = 1024
#: The H100's SMs, the shared memory of one, and what the driver reserves of it per block: the GPU the
#: tensor-core families size their persistent grids and blocks per SM for.
H100_SMS = 132
SM_SHARED_BYTES = 228 * 1024
BLOCK_RESERVED_SHARED_BYTES = 1024

#: C++ storage type of each dtype in kernels/dtypes.cuh, and its size in bytes.
CTYPES = {"float16": "cupyconv::half_t", "bfloat16": "cupyconv::bfloat16_t", "float32": "float", "float64": "double"}
STORAGE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}
INDEX_TYPES = ("int", "long long")
#: Element types that kernels taking two adjacent columns of a row load and store as pairs (one 4- or 8-byte
#: word): depthwise_column_conv2d's threads and wgrad_depthwise's NCHW lanes; double keeps one column.
PAIR_DTYPES = ("float16", "bfloat16", "float32")


def forced_config(configs, name: str, what: str):
    """The config called ``name`` among ``configs``; ValueError naming ``what`` and the choices if none is."""
    for cfg in configs:
        if cfg.name == name:
            return cfg
    raise ValueError(f"{what} must be one of {sorted(c.name for c in configs)}, got {name!r}")


def index_type(problem: ConvProblem, copy: int = 0) -> str:
    """32-bit indices while every tensor (and a copy of ``copy`` elements the kernel reads, if any)
    has fewer than 2^31 elements, else 64-bit."""
    largest = max(math.prod(problem.x_shape), math.prod(problem.out_shape), math.prod(problem.weight_shape), copy)
    return "int" if largest < 2**31 else "long long"


def gemm_grid(problem: ConvProblem, cfg) -> tuple[int, int, int]:
    """The implicit GEMMs' grid for a tile of cfg.bm pixels x cfg.bn channels: (pixel tiles, channel
    tiles, groups)."""
    m = problem.n * problem.ho * problem.wo
    return (math.ceil(m / cfg.bm), math.ceil(problem.k // problem.groups / cfg.bn), problem.groups)


def grid_fits(grid: tuple[int, int, int]) -> bool:
    """Whether CUDA can launch ``grid`` (x below 2^31, y and z at most MAX_GRID_Y)."""
    return grid[0] < 2**31 and grid[1] <= MAX_GRID_Y and grid[2] <= MAX_GRID_Y


def grid_refusal(grid: tuple[int, int, int]) -> str:
    """Why CUDA cannot launch ``grid`` ("" when it can), for the families' refusals."""
    return "" if grid_fits(grid) else f"grid {grid} past CUDA's limits"


def epilogue_args(problem: ConvProblem, residual: Pointer = Pointer(RESIDUAL), partial: bool = False) -> tuple:
    """The epilogue's kernel arguments (kernels/epilogue.cuh): residual, has_residual, activation, the
    last two typed so that the kernel is compiled for them (program.Launch.epilogue); none of it where
    the kernel writes partial sums (``partial``: split-K's runs, Winograd's GEMM)."""
    if partial:
        return residual, ResidualArg(0), ActivationArg(0)
    return residual, ResidualArg(problem.has_residual), ActivationArg(ACTIVATIONS.index(problem.activation))


def conv_launch(plan, problem: ConvProblem, *plan_ints: int, x: Pointer = Pointer(X), weight: Pointer = Pointer(WEIGHT),
                out: Pointer = Pointer(OUT), channels: int | None = None, partial: bool = False) -> Launch:
    """The launch of ``plan``'s convolution kernel. The convolution kernels share their parameters:
    x, w, bias, y, has_bias, the epilogue's (epilogue_args), the problem's sizes (``channels``: x's,
    where a copy pads them; default problem.c), then ``plan_ints``, their own (ints, or
    Pointers: stream-K's workspace slots and flags). ``partial``: the
    kernel writes float32 partial sums that a later launch finishes (no bias, residual or activation)."""
    p = problem
    args = (x, weight, Pointer(BIAS), out, int(p.has_bias and not partial), *epilogue_args(p, partial=partial),
            p.n, p.c if channels is None else channels, p.h, p.w, p.k,
            p.ho, p.wo, p.kh, p.kw, p.stride[0], p.stride[1], p.pad_top, p.pad_left, p.dilation[0], p.dilation[1],
            p.groups, *plan_ints)
    return Launch(plan.kernel, plan.name_expression, plan.grid, plan.block, plan.shared_bytes, args, plan.arch)


#: Split-K, for GEMMs of too few tiles to fill the GPU: at most SPLIT_K_MAX runs of the reduction,
#: while the float32 partial sums (runs x the output) stay within SPLIT_K_MAX_WORKSPACE_BYTES.
SPLIT_K_MAX = 16
SPLIT_K_MAX_WORKSPACE_BYTES = 2**28
REDUCE_KERNEL = "split_k_reduce"
#: Threads per block of kernels/split_k_reduce.cu.
REDUCE_BLOCK = 256


def split_k_runs(problem: ConvProblem, grid: tuple[int, int, int], k_tiles: int, wanted: int, min_tiles: int) -> int:
    """Runs of the reduction (1: none): ``wanted``, within SPLIT_K_MAX, ``min_tiles`` of its ``k_tiles``
    per run (shorter runs spend their time filling the pipeline), the partials' workspace, CUDA's grid
    z (``grid``'s z: groups) and 32-bit offsets into the partials."""
    splits = min(wanted, k_tiles // min_tiles, SPLIT_K_MAX)
    elements = math.prod(problem.out_shape)
    while splits > 1 and (4 * splits * elements > SPLIT_K_MAX_WORKSPACE_BYTES or grid[2] * splits > MAX_GRID_Y
                          or splits * elements >= 2**31):
        splits -= 1
    return max(splits, 1)


def check_splits(splits, grid: tuple[int, int, int], problem: ConvProblem) -> None:
    """ValueError unless a caller's forced ``splits`` fits ``grid`` (z: groups) and 32-bit offsets."""
    if not (isinstance(splits, int) and 1 <= splits <= MAX_GRID_Y // grid[2]) or \
            splits * math.prod(problem.out_shape) >= 2**31:
        raise ValueError(f"splits must be 1 to {MAX_GRID_Y // grid[2]} with splits x the output below 2^31 "
                         f"elements, got {splits!r}")


def partial_bytes(splits: int, problem: ConvProblem) -> int:
    """Workspace bytes of split-K's float32 partial sums (0 without split-K)."""
    return 4 * splits * math.prod(problem.out_shape) if splits > 1 else 0


def split_k_reduce(dtype: str, index: str, problem: ConvProblem, splits: int, partial: Pointer,
                   out: Pointer = Pointer(OUT), channels_last: bool = False) -> Launch:
    """The launch adding ``splits`` runs of float32 partial sums at ``partial`` in run order, plus the
    bias, through the epilogue into ``out`` of ``dtype`` (NCHW, or NHWC where ``channels_last``): the
    same bits on every run."""
    elements = math.prod(problem.out_shape)
    return Launch(REDUCE_KERNEL, reduce_specialisation(dtype, index),
                  (math.ceil(elements / REDUCE_BLOCK), 1, 1), (REDUCE_BLOCK, 1, 1), 0,
                  (partial, Pointer(BIAS), out, int(problem.has_bias), *epilogue_args(problem), splits, elements,
                   problem.k, 1 if channels_last else problem.ho * problem.wo))


def reduce_specialisation(dtype: str, index: str) -> str:
    """The C++ template instance of split-K's reduction writing ``dtype``."""
    return f"cupyconv::{REDUCE_KERNEL}<{CTYPES[dtype]},{index}>"
