"""Autotuning: on first sight of a problem, time the plans the planner allows on the GPU and keep the
fastest, as ``torch.backends.cudnn.benchmark`` does for cuDNN's algorithms.

**Mode.** :func:`autotune` switches it (``CUPYCONV_AUTOTUNE=1`` in the environment switches it on at
import); off by default, and then nothing changes: the planner's fixed rules choose every plan. The
mode is read where an executable is made (executor.executable), once per call signature; changing it
empties the fronts' caches of checked signatures (cleared_on_mode_change), so each signature is
planned again under the new mode.

**Candidates** (:func:`candidates`), the fixed rules' plan always first:

* every family whose refusal is "" for the problem, except the tensor-core GEMMs in strict float32
  (they would round to TF32) and the GEMMs (FMA, Winograd, tensor-core) where a group has fewer than
  GEMM_MIN_GROUP_CHANNELS output channels (a tile of mostly padding), but the channels-last GEMM,
  whose 32-channel tile the planner takes there on the tensor cores;
* each tile the family may be forced to (its CONFIG_NAMES, those that take the problem's dtype; the
  channels-last GEMM's 32-channel tiles only for outputs of at most 32 channels per group);
  Winograd each of its tiles m (winograd_conv2d.tiles: F(4x4) within its accuracy limit, each only
  where it saves multiplies) with each of the FMA GEMM's tiles;
* the direct kernel, the other families' fallback, with every tile where the rules chose it, else
  with its own choice alone;
* the split-K GEMMs' own tile with 1, 2, 4, 8 or 16 runs of the reduction where its grid is less than
  a wave (one block per SM), the runs make at most SPLIT_K_MAX_WAVES waves and each has at least
  SPLIT_K_MIN_TILES k tiles (common.split_k_runs' other limits too);
* the channels-last GEMM's wgmma tiles with stream-K forced on and off, where their tiles make
  more than half a wave (fewer are split-K's) and at most STREAM_K_MAX_WAVES waves;
* its ping-pong tiles (128 x 128, 64 x 128, 64 x 64) whole and with each of PINGPONG_SPLIT_CHOICES runs whose work items
  (tiles x runs) make at most two a block on one wave of blocks, each run of at least SPLIT_K_MIN_TILES k tiles;
  and in clusters of 2, 4 or 8 blocks adding their runs' sums (implicit_gemm_nhwc.PINGPONG_CLUSTER_CONFIG),
  likewise;
* the channels-last GEMM without space-to-depth where the rules block a strided layer's pixels
  (implicit_gemm_nhwc.space_to_depth_block).

That is 5 to about 80 plans; equal plans are timed once.

**Timing** (:class:`GpuTimer`; injectable: :func:`choose_plan` takes any ``timer(problem, device)``
returning :func:`tune`'s ``measure(plan, best_ms) -> ms``, which the CPU tests fake): scratch
operands of the problem's shapes on the problem's GPU, each plan run as conv2d runs it with a plain
weight (its weight preparation included), WARMUP runs, then REPEATS runs between CUDA events on
CuPy's current stream, each behind a spin kernel (kernels/spin.cu) that keeps the GPU busy while the
host enqueues the run; the median counts. A plan whose first timed run is PRUNE_RATIO times the
best median so far is not run again. The winner must beat the fixed rules' plan by more than
TIE_MARGIN and by more than TIE_MARGIN_MS (ties go to the rules: tuning is never slower than the
default beyond noise). Inside a CUDA-graph capture nothing is timed (a problem first seen there
runs the rules' plan, or a winner cached earlier): run a model once before capturing it, as for
compilation.

**Cache.** Winners are kept in memory and on disk (cupyconv/tuning_cache.py), keyed by the device's
name, the problem (every ConvProblem field: shapes, dtype, layouts, epilogue), the precision (TF32
allowed) and cupyconv's version; each is rebuilt through make_plan, so an entry that no longer makes
a plan is tuned again.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import statistics
import sys
import threading
import time

import numpy as np

from . import tuning_cache
from .arguments import ConvProblem
# The planner before the families: it imports them, and they import it back.
from .planner import (DIRECT_KERNEL, FAMILIES, GEMM_KERNEL, NHWC_KERNEL, POINTWISE_KERNEL, SIMT_KERNEL,
                      WINOGRAD_KERNEL, LaunchPlan, make_plan)
from .families import implicit_gemm_nhwc, winograd_conv2d
from .families.common import gemm_grid, split_k_runs
from .families.implicit_gemm_conv2d import GEMM_MIN_GROUP_CHANNELS

#: The environment variable that switches autotuning on at import ("1" or "true"; "0", "false" or
#: unset: off).
ENVIRONMENT_VARIABLE = "CUPYCONV_AUTOTUNE"
#: Untimed runs of each plan first (kernels loaded, caches and clocks settled), then timed ones.
WARMUP, REPEATS = 2, 7
#: A plan whose first timed run takes this many times the best median so far is not run again.
PRUNE_RATIO = 3.0
#: A plan must beat the fixed rules' by more than this fraction and by more than TIE_MARGIN_MS to be
#: picked (timing noise is ~1 %, and about a microsecond on rows of 10-20 us: the H100's
#: mbv2_dw_3x3_384 fp16 channels_last tuned 0.92x of untuned with the fraction alone, RESULTS.md).
TIE_MARGIN = 0.02
TIE_MARGIN_MS = 0.001
#: Spin before each timed run, in microseconds: longer than the host takes to enqueue one run.
SPIN_US = 200
#: Split-K candidates: runs of the reduction, at most this many waves of blocks, at least this many
#: k tiles a run (shorter runs spend their time filling the pipeline).
SPLIT_K_CHOICES = (1, 2, 4, 8, 16)
SPLIT_K_MAX_WAVES = 2
PINGPONG_SPLIT_CHOICES = (1, 2, 3, 4, 5, 6, 8)
SPLIT_K_MIN_TILES = 2
#: SMs assumed where no GPU says (candidates() without a device): the H100's.
DEFAULT_SM_COUNT = 132
_TENSOR_CORE_KERNELS = (GEMM_KERNEL, NHWC_KERNEL, POINTWISE_KERNEL)
_GEMM_KERNELS = (SIMT_KERNEL, WINOGRAD_KERNEL, GEMM_KERNEL, NHWC_KERNEL, POINTWISE_KERNEL)
_SPLIT_K_KERNELS = (SIMT_KERNEL, NHWC_KERNEL)


def _from_environment() -> bool:
    value = os.environ.get(ENVIRONMENT_VARIABLE, "").strip().lower()
    if value not in ("", "0", "1", "false", "true"):
        raise ValueError(f"the environment variable {ENVIRONMENT_VARIABLE} must be 1 or 0 (true or false), "
                         f"got {os.environ[ENVIRONMENT_VARIABLE]!r}")
    return value in ("1", "true")


_enabled = _from_environment()
#: The fronts' dicts of checked call signatures (conv.py's, torch.py's), whose executables were
#: planned under the mode of their time: emptied when the mode changes.
_SIGNATURE_CACHES: list[dict] = []


def cleared_on_mode_change(cache: dict) -> dict:
    """Register a front's dict of checked call signatures (returned as is) to be emptied when the mode changes."""
    _SIGNATURE_CACHES.append(cache)
    return cache


def enabled() -> bool:
    """Whether autotuning is on."""
    return _enabled


def autotune(enabled: bool | None = None) -> bool:
    """Switch autotuning on or off, or ask whether it is on, as ``torch.backends.cudnn.benchmark``.

    With autotuning on, the first GPU call of each problem (shapes, dtype, layouts, epilogue,
    precision) times the plans the planner allows for it on scratch copies of its operands and
    keeps the fastest, in memory and in a cache file (``$CUPYCONV_CACHE_DIR``, else
    ``~/.cache/cupyconv/``, as autotune.json) that later processes read instead of timing again.
    The fixed rules' plan is always among those timed, and wins ties, so a tuned call is never
    slower than an untuned one beyond timing noise; results equal the untuned ones to the dtype's
    tolerance (not bitwise: another tile or split of the reduction rounds differently).
    ``cupyconv.plan(...)`` says whether and how its plan was tuned. The environment variable
    ``CUPYCONV_AUTOTUNE=1`` switches it on at import. NumPy calls are never tuned.

    Args:
        enabled: True or False to switch it; None (the default) to leave it as it is.

    Returns:
        Whether it was on before this call (with no argument: whether it is on).

    Raises:
        TypeError: ``enabled`` is neither a bool nor None.
    """
    global _enabled
    if enabled is not None and not isinstance(enabled, bool):
        raise TypeError(f"autotune's enabled must be True, False or None, got {enabled!r}")
    previous = _enabled
    if enabled is not None and enabled != previous:
        _enabled = enabled
        for cache in _SIGNATURE_CACHES:
            cache.clear()
    return previous


@dataclasses.dataclass(frozen=True)
class Device:
    """What tuning needs of a GPU: its id (to time on), its name (the cache's key), its compute
    capability (to plan for) and its SMs (split-K's candidates)."""

    id: int
    name: str
    compute_capability: int
    sm_count: int


@functools.lru_cache(maxsize=None)
def gpu(device_id: int) -> Device:
    """GPU ``device_id`` as tuning sees it (asked once per device)."""
    import cupy

    from .compiler import compute_capability

    runtime = cupy.cuda.runtime
    return Device(device_id, runtime.getDeviceProperties(device_id)["name"].decode(), compute_capability(device_id),
                  runtime.deviceGetAttribute(runtime.cudaDevAttrMultiProcessorCount, device_id))


@dataclasses.dataclass(frozen=True)
class Choice:
    """A candidate as make_plan makes it: a forced ``kernel`` with its ``config`` (None: the family's
    own choice) and family ``options`` ((name, value) pairs: splits, tile); kernel None is the fixed
    rules' plan."""

    kernel: str | None = None
    config: str | None = None
    options: tuple = ()

    def plan(self, problem: ConvProblem, allow_tf32: bool, compute_capability: int) -> LaunchPlan:
        """The plan this choice makes; ValueError where it cannot run the problem."""
        if self.kernel is None:
            return make_plan(problem, allow_tf32=allow_tf32, compute_capability=compute_capability)
        return make_plan(problem, self.config, self.kernel, allow_tf32, compute_capability, **dict(self.options))

    def to_json(self) -> dict:
        return {"kernel": self.kernel, "config": self.config, "options": dict(self.options)}

    @classmethod
    def from_json(cls, data: dict) -> Choice:
        return cls(data["kernel"], data["config"], tuple(sorted(data["options"].items())))


def _identity(plan: LaunchPlan | None) -> LaunchPlan | None:
    """``plan`` without its reasons (Winograd's GEMM plans have theirs) and tuning note: equal plans,
    however chosen."""
    return plan and dataclasses.replace(plan, reason="", tuning="", gemm=_identity(plan.gemm),
                                        gemm_last=_identity(plan.gemm_last))


def _split_choices(kernel: str, problem: ConvProblem, compute_capability: int, sm_count: int):
    """The split-K family ``kernel``'s own tile with each of SPLIT_K_CHOICES runs that fits (module docstring)."""
    plan = make_plan(problem, None, kernel, compute_capability=compute_capability)
    grid = (*plan.grid[:2], plan.grid[2] // plan.splits)
    blocks = math.prod(grid)
    if blocks >= sm_count:  # a wave of tiles already: splitting only adds the reduction's pass
        return
    # The GEMMs' reduction: kh kw taps of the channels per group (the channels-last copies' where padded;
    # the blocked problem's taps where a space-to-depth copy is what the GEMM reads).
    taps = problem if plan.space_to_depth == (1, 1) else \
        implicit_gemm_nhwc.space_to_depth_problem(problem, plan.space_to_depth)
    k_tiles = math.ceil(taps.kh * taps.kw * ((plan.channels_padded or problem.c) // problem.groups)
                        / plan.config.bk)
    for splits in SPLIT_K_CHOICES:
        if splits * blocks <= SPLIT_K_MAX_WAVES * sm_count and \
                split_k_runs(problem, grid, k_tiles, splits, SPLIT_K_MIN_TILES) == splits:
            yield Choice(kernel, None, (("splits", splits),))


def _stream_k_choices(problem: ConvProblem, sm_count: int):
    """Each wgmma tile of the channels-last GEMM with stream-K on and off, where its whole tiles make
    more than half a wave and at most STREAM_K_MAX_WAVES waves (module docstring)."""
    for cfg in implicit_gemm_nhwc.NHWC_CONFIGS[problem.dtype]:
        if cfg.wgmma and not cfg.producer_warps and cfg.name not in implicit_gemm_nhwc.NARROW_CONFIG_NAMES and \
                sm_count // 2 < math.prod(gemm_grid(problem, cfg)) <= \
                implicit_gemm_nhwc.STREAM_K_MAX_WAVES * sm_count:
            for on in (True, False):
                yield Choice(NHWC_KERNEL, cfg.name, (("stream_k", on),))


def _pingpong_split_choices(problem: ConvProblem, sm_count: int):
    """The ping-pong tiles (128 x 128, 64 x 128 and 64 x 64) with each of PINGPONG_SPLIT_CHOICES runs (module
    docstring)."""
    configs = {c.name: c for c in implicit_gemm_nhwc.NHWC_CONFIGS[problem.dtype]}
    if implicit_gemm_nhwc.PINGPONG_CONFIG not in configs or problem.layout != "NHWC":
        return
    for name in (implicit_gemm_nhwc.PINGPONG_SMALL_CONFIG, implicit_gemm_nhwc.PINGPONG_64_PIXEL_CONFIG,
                 implicit_gemm_nhwc.PINGPONG_CONFIG):
        if name not in configs:  # float32's are the 128-pixel tiles alone
            continue
        cfg = configs[name]
        tiles = math.prod(gemm_grid(problem, cfg))
        k_tiles = implicit_gemm_nhwc.reduction_tiles(problem, cfg, problem.c)
        for splits in PINGPONG_SPLIT_CHOICES:
            if splits == 1 or (tiles * splits <= 2 * sm_count and k_tiles // splits >= SPLIT_K_MIN_TILES):
                yield Choice(NHWC_KERNEL, cfg.name, (("splits", splits),))
    for splits in implicit_gemm_nhwc.PINGPONG_CLUSTER_SPLITS:  # the runs' sums added in clusters, 128 x 128
        if tiles * splits <= 2 * sm_count and k_tiles // splits >= SPLIT_K_MIN_TILES:
            yield Choice(NHWC_KERNEL, implicit_gemm_nhwc.PINGPONG_CLUSTER_CONFIG, (("splits", splits),))


def _choices(problem: ConvProblem, allow_tf32: bool, default: LaunchPlan, compute_capability: int, sm_count: int):
    """Every candidate Choice but the fixed rules' (the module docstring's rule); some may not plan."""
    tensor_cores = problem.dtype != "float32" or allow_tf32
    for kernel, family in FAMILIES.items():
        if family.refusal(problem) or (kernel in _TENSOR_CORE_KERNELS and not tensor_cores) or \
                (kernel in _GEMM_KERNELS and kernel != NHWC_KERNEL and
                 problem.k // problem.groups < GEMM_MIN_GROUP_CHANNELS):
            continue
        if kernel == DIRECT_KERNEL and default.kernel != DIRECT_KERNEL:
            yield Choice(kernel)
        elif kernel == WINOGRAD_KERNEL:
            for tile in winograd_conv2d.tiles(problem):
                for config in sorted(FAMILIES[SIMT_KERNEL].CONFIG_NAMES):
                    yield Choice(kernel, config, (("tile", tile),))
        else:
            for config in sorted(family.CONFIG_NAMES):
                if kernel == NHWC_KERNEL and config in implicit_gemm_nhwc.NARROW_CONFIG_NAMES and \
                        problem.k // problem.groups > implicit_gemm_nhwc.NARROW_TILE_CHANNELS:
                    continue
                yield Choice(kernel, config)
            if kernel in _SPLIT_K_KERNELS:
                yield from _split_choices(kernel, problem, compute_capability, sm_count)
            if kernel == NHWC_KERNEL:
                yield from _stream_k_choices(problem, sm_count)
                yield from _pingpong_split_choices(problem, sm_count)
                if implicit_gemm_nhwc.space_to_depth_block(problem) != (1, 1):
                    yield Choice(kernel, None, (("space_to_depth", False),))


def candidates(problem: ConvProblem, allow_tf32: bool = False, compute_capability: int = 0,
               sm_count: int = DEFAULT_SM_COUNT) -> list[tuple[Choice, LaunchPlan]]:
    """The plans tuning times for ``problem`` on a GPU of ``compute_capability`` with ``sm_count``
    SMs, each with the Choice that makes it: the fixed rules' plan first, then the others the
    module docstring lists, each distinct plan once."""
    default = make_plan(problem, allow_tf32=allow_tf32, compute_capability=compute_capability)
    found = {_identity(default): (Choice(), default)}
    for choice in _choices(problem, allow_tf32, default, compute_capability, sm_count):
        try:
            plan = choice.plan(problem, allow_tf32, compute_capability)
        except ValueError:  # the tile does not take this dtype or problem, or the split its indices
            continue
        found.setdefault(_identity(plan), (choice, plan))
    return list(found.values())


def label(plan: LaunchPlan) -> str:
    """A plan in a few words: family, tile, Winograd's m, split-K's runs, stream-K's blocks, space-to-depth's."""
    gemm = plan.gemm or plan
    blocks = "x".join(map(str, plan.space_to_depth))
    return (f"{plan.kernel}{f' F({plan.winograd_tile}x{plan.winograd_tile})' if plan.winograd_tile else ''} "
            f"{plan.config.name}{f' split-K {gemm.splits}' if gemm.splits > 1 else ''}"
            f"{f' stream-K {plan.stream_k_blocks}' if plan.stream_k_blocks else ''}"
            f"{f' space-to-depth {blocks}' if plan.space_to_depth != (1, 1) else ''}")


class CannotRun(Exception):
    """A candidate plan cannot run on this GPU (too much shared memory, no memory for its workspace):
    it is left out."""


class NotTimed(Exception):
    """Nothing can be timed now (the message says why): the fixed rules' plan runs untuned."""


def tune(plans: list[tuple[Choice, LaunchPlan]], measure) -> dict:
    """Time ``plans`` (candidates(): the fixed rules' first) with ``measure(plan, best_ms) -> median
    ms`` (``best_ms``: the best median so far, None for the first plan, so that it may stop early on a
    plan far slower; it raises CannotRun for a plan that cannot run) and return the cache entry of
    the winner: its Choice (``kernel``, ``config``, ``options``), ``label``, ``ms``, the fixed rules'
    ``default_ms``, the number of ``candidates`` and ``tuning_ms``, the wall time spent (compilation
    included).

    Raises:
        CannotRun: from the fixed rules' plan (an untuned call would fail the same way).
    """
    began = time.perf_counter()
    timed = []
    for index, (choice, plan) in enumerate(plans):
        try:
            ms = measure(plan, min((t for t, _, _ in timed), default=None))
        except CannotRun:
            if index == 0:
                raise
            continue
        timed.append((ms, choice, plan))
    default_ms = timed[0][0]
    ms, choice, plan = min(timed, key=lambda t: t[0])
    if ms >= min(default_ms * (1 - TIE_MARGIN), default_ms - TIE_MARGIN_MS):
        ms, choice, plan = timed[0]
    return {**choice.to_json(), "label": label(plan), "ms": ms, "default_ms": default_ms, "candidates": len(plans),
            "tuning_ms": 1e3 * (time.perf_counter() - began)}


def _described(plan: LaunchPlan, entry: dict, device: Device, cached: bool) -> LaunchPlan:
    """``plan`` (the winner of ``entry``) with the reason and the printed "tuned:" line that say so."""
    of = f"{entry['candidates']} candidates in {entry['tuning_ms']:.0f} ms on {device.name}"
    if entry["kernel"] is None:
        tuning = f"picked the fixed rules' plan, {entry['label']} ({entry['ms']:.3f} ms), over {of}"
        reason = f"{plan.reason}; autotuned: the fastest of {entry['candidates']} candidates on {device.name}"
    else:
        tuning = (f"picked {entry['label']} ({entry['ms']:.3f} ms) over {of}; the fixed rules' plan "
                  f"{entry['default_ms']:.3f} ms")
        reason = (f"autotuned: the fastest of {entry['candidates']} candidate plans on {device.name} "
                  f"({entry['ms']:.3f} ms a call against the fixed rules' {entry['default_ms']:.3f} ms)")
    return dataclasses.replace(plan, reason=reason, tuning=tuning + (" (from the cache file)" if cached else ""))


def _key(problem: ConvProblem, allow_tf32: bool, device: Device) -> str:
    """The cache file's key: cupyconv's version, the device's name, the problem, the precision."""
    from . import __version__

    return json.dumps({"cupyconv": __version__, "device": device.name, "problem": dataclasses.asdict(problem),
                       "allow_tf32": allow_tf32}, sort_keys=True)


#: (device name, problem, TF32 allowed) -> the tuned plan, for this process.
_PLANS: dict = {}
#: One tuning at a time: two threads timing at once would each slow the other's candidates.
_TUNING = threading.Lock()


def choose_plan(problem: ConvProblem, allow_tf32: bool, device: Device, timer=None) -> LaunchPlan:
    """The tuned plan for ``problem`` on ``device``: from memory, else from the cache file, else timed
    with ``timer(problem, device)`` (default GpuTimer: a ``measure`` for tune, or NotTimed) and kept
    in both. ``allow_tf32`` counts for float32 alone. Where nothing is timed (NotTimed), the fixed
    rules' plan, saying why, and nothing is kept: a later call tunes."""
    allow_tf32 = allow_tf32 and problem.dtype == "float32"
    memory_key = (device.name, problem, allow_tf32)
    plan = _PLANS.get(memory_key)
    if plan is None:
        with _TUNING:
            plan = _PLANS.get(memory_key)
            if plan is None:
                try:
                    plan = _PLANS[memory_key] = _tuned(problem, allow_tf32, device, timer or GpuTimer)
                except NotTimed as why:
                    return dataclasses.replace(make_plan(problem, allow_tf32=allow_tf32,
                                                         compute_capability=device.compute_capability),
                                               tuning=f"no ({why})")
    return plan


def _tuned(problem: ConvProblem, allow_tf32: bool, device: Device, timer) -> LaunchPlan:
    """choose_plan's plan where memory has none: from the cache file, else tuned now (NotTimed where
    nothing can be timed)."""
    key = _key(problem, allow_tf32, device)
    entry = tuning_cache.load().get(key)
    if entry is not None:
        try:
            return _described(Choice.from_json(entry).plan(problem, allow_tf32, device.compute_capability), entry,
                              device, cached=True)
        except (KeyError, TypeError, AttributeError, ValueError):  # an entry this version cannot plan: tune again
            pass
    plans = candidates(problem, allow_tf32, device.compute_capability, device.sm_count)
    if problem.n == 0 or len(plans) == 1:
        why = "an empty batch: nothing to time" if problem.n == 0 else "the fixed rules' plan is the only candidate"
        return dataclasses.replace(plans[0][1], tuning=f"no ({why})")
    entry = tune(plans, timer(problem, device))
    tuning_cache.store(key, entry)
    return _described(Choice.from_json(entry).plan(problem, allow_tf32, device.compute_capability), entry, device,
                      cached=False)


def tuned_plan(problem: ConvProblem, allow_tf32: bool, device_id: int) -> LaunchPlan:
    """The tuned plan for ``problem`` on GPU ``device_id`` (choose_plan, timed by GpuTimer): what
    executor.executable and cupyconv.plan ask for with autotuning on."""
    return choose_plan(problem, allow_tf32, gpu(device_id))


def _capturing() -> bool:
    """Whether a CUDA-graph capture is under way on CuPy's current stream or, where torch is loaded,
    on torch's (cupyconv.torch runs on torch's stream, which CuPy does not know; a tuning launch,
    allocation or synchronisation would break the capture)."""
    import cupy

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing():
        return True
    return bool(cupy.cuda.runtime.streamIsCapturing(cupy.cuda.get_current_stream().ptr))


def _scratch(random, shape: tuple[int, ...], dtype: str):
    """A CuPy array of ``shape`` with standard normal values from ``random`` (a cupy.random.RandomState:
    the caller's global one is left alone) in ``dtype`` (bfloat16 as its uint16 bits, which the
    kernels read as bfloat16: CuPy has no bfloat16)."""
    import cupy

    values = random.standard_normal(shape, dtype=cupy.float32)
    if dtype == "bfloat16":
        return (values.view(cupy.uint32) >> 16).astype(cupy.uint16)
    return values.astype(dtype)


class GpuTimer:
    """``measure(plan, best_ms)`` for tune on a GPU (the module docstring's timing): scratch operands
    of ``problem``'s shapes on ``device`` and the candidates' workspace, from a memory pool of its own
    (returned to the driver with it, not kept in CuPy's pool, where torch could not use it), on
    CuPy's current stream.

    Raises:
        NotTimed: inside a CUDA-graph capture, or no GPU memory for the scratch operands.
    """

    def __init__(self, problem: ConvProblem, device: Device):
        import cupy

        from .compiler import get_kernel
        from .executor import Workspaces
        from .launch import allocate

        self.problem, self.device, self.pool = problem, device, cupy.cuda.MemoryPool()
        p, runtime = problem, cupy.cuda.runtime
        with self._on_device():
            if _capturing():
                raise NotTimed("inside a CUDA-graph capture, where nothing can be timed: call once before capturing")
            try:
                random = cupy.random.RandomState(0)
                self.x, self.weight, self.out = (_scratch(random, shape, p.dtype) for shape in
                                                 (p.x_array_shape, p.weight_array_shape, p.out_array_shape))
                self.bias = _scratch(random, (p.k,), p.dtype) if p.has_bias else None
                self.residual = _scratch(random, p.out_array_shape, p.dtype) if p.has_residual else None
                self.input_scale = _scratch(random, (p.n, p.c), p.dtype) if p.has_input_scale else None
            except cupy.cuda.memory.OutOfMemoryError:
                raise NotTimed("no GPU memory for scratch operands to time the candidates on") from None
            self.spin = get_kernel("spin", "cupyconv::spin", "", device.id)
            self.spin_cycles = runtime.deviceGetAttribute(runtime.cudaDevAttrClockRate, device.id) * SPIN_US // 1000
        self.workspaces = Workspaces(allocate)  # allocates in _on_device(): from self.pool

    def _on_device(self):
        """A context: the device current, allocations from self.pool."""
        import cupy

        stack = contextlib.ExitStack()
        stack.enter_context(cupy.cuda.Device(self.device.id))
        stack.enter_context(cupy.cuda.using_allocator(self.pool.malloc))
        return stack

    def __call__(self, plan: LaunchPlan, best_ms: float | None) -> float:
        import cupy

        from .executor import executable_for_plan

        errors = (cupy.cuda.memory.OutOfMemoryError, cupy.cuda.driver.CUDADriverError,
                  cupy.cuda.runtime.CUDARuntimeError, cupy.cuda.compiler.CompileException)
        with self._on_device():
            try:
                exe = executable_for_plan(plan, self.problem, self.device.id)
                stream = cupy.cuda.get_current_stream()
                for _ in range(WARMUP):
                    self._run(exe, stream)
                times = [self._timed(exe, stream)]
                if best_ms is None or times[0] <= PRUNE_RATIO * best_ms:
                    times += [self._timed(exe, stream) for _ in range(REPEATS - 1)]
            except errors as error:
                raise CannotRun(f"{label(plan)} cannot run on {self.device.name}: {error}") from error
        return statistics.median(times)

    def _run(self, exe, stream) -> None:
        """One call of ``exe`` on the scratch operands, its weight prepared in the workspace as a
        plain-weight conv2d call does."""
        self.workspaces.launch(exe, self.x.data.ptr, self.weight.data.ptr, 0,
                               0 if self.bias is None else self.bias.data.ptr, self.out.data.ptr, stream.ptr, False,
                               0 if self.residual is None else self.residual.data.ptr,
                               0 if self.input_scale is None else self.input_scale.data.ptr)

    def _timed(self, exe, stream) -> float:
        """One call's GPU time in ms, between events queued behind a spin."""
        import cupy

        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        self.spin((1,), (1,), (np.int64(self.spin_cycles),))  # RawKernel: on the current stream, ``stream``
        start.record(stream)
        self._run(exe, stream)
        end.record(stream)
        end.synchronize()
        return cupy.cuda.get_elapsed_time(start, end)
