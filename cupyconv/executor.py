"""Ready-to-launch convolutions: a CallProgram bound to one device, its kernels resolved and its
arguments packed once, so that a call only writes its operands' addresses and launches.

The executor knows addresses and streams, not arrays: the CuPy front (launch.py) and the torch
adapter (torch.py) allocate the output, the workspace and the prepared weight from their own
allocators and pass the addresses in ``program.OPERANDS`` order. Each launch goes to the CUDA driver
directly (cuLaunchKernel on a packed parameter block) instead of through CuPy's per-call argument
conversion, which costs several microseconds per launch.
"""
from __future__ import annotations

import ctypes
import functools
import threading

from . import tensor_map, tuning
from .arguments import ConvProblem
from .compiler import compute_capability, get_kernel
from .program import FLAG_COUNT, FLAGS, MAP_TYPES, OPERANDS, CallProgram, Launch, Pointer, Table, align

_SLOT = ctypes.sizeof(ctypes.c_uint64)
#: Workspaces.flags' (buffer, address) for a program without stream-K.
_NO_FLAGS = (None, 0)
_INT32_MASK = 0xFFFFFFFF
#: Tensor maps kept per map parameter, one per operand address it was encoded for (the oldest dropped
#: past this many): layers of one shape share an Executable and alternate their operands.
MAPS_KEPT = 64


class MapSlot:
    """A tensor map parameter (program.MAP_TYPES) of a PackedLaunch: the MAP_BYTES at host address ``at`` that its
    slot of the argument block points to, written for the address of its operand (index ``operand`` of
    OPERANDS, + ``offset``) before each launch. The driver encodes a map once per address (building its
    ctypes arguments costs several microseconds); later calls with that address copy the encoded bytes
    back in, so that ResNet-50's repeated blocks, whose calls share one launch and alternate their weights
    and inputs, do not encode every call. (cuLaunchKernel copies the map with the parameters: rewriting it
    between launches is safe.)"""

    __slots__ = ("operand", "offset", "arg", "at", "made_for", "encoded")

    def __init__(self, operand: int, offset: int, arg, at: int):
        self.operand, self.offset, self.arg, self.at = operand, offset, arg, at
        self.made_for, self.encoded = None, {}  # the address the bytes at `at` are for; address -> bytes

    def write(self, addresses) -> None:
        """The map at ``at`` for its operand's address in ``addresses`` (OPERANDS order)."""
        address = addresses[self.operand] + self.offset
        if address == self.made_for:
            return
        encoded = self.encoded.get(address)
        if encoded is None:
            tensor_map.encode(self.arg, self.at, address)
            if len(self.encoded) >= MAPS_KEPT:
                del self.encoded[next(iter(self.encoded))]
            self.encoded[address] = ctypes.string_at(self.at, tensor_map.MAP_BYTES)
        else:
            ctypes.memmove(self.at, encoded, tensor_map.MAP_BYTES)
        self.made_for = address


class PackedLaunch:
    """One Launch on one device: the CUfunction, the launch shape and an argument block whose int
    slots are filled once and whose pointer slots each call fills (``pointers``: (slot, index of
    the operand in OPERANDS, byte offset))."""

    __slots__ = ("function", "launch_shape", "values", "params_address", "pointers", "_params", "_tables",
                 "_launch_kernel", "_maps")

    def __init__(self, launch: Launch, device_id: int):
        from cupy.cuda import driver

        self._launch_kernel = driver.launchKernel
        kernel = get_kernel(launch.kernel, launch.name_expression, launch.arch, device_id, launch.epilogue)
        self.function = kernel.kernel.ptr  # compiles on first use (CuPy's disk cache makes later processes fast)
        self.launch_shape = (*launch.grid, *launch.block, launch.shared_bytes)
        # Every parameter gets an 8-byte slot: a pointer fills it, an int its low 4 bytes (x86-64 and
        # aarch64 are little-endian), which is where cuLaunchKernel reads a 4-byte parameter.
        self.values = (ctypes.c_uint64 * max(1, len(launch.args)))()
        self._params = (ctypes.c_void_p * max(1, len(launch.args)))(
            *(ctypes.addressof(self.values) + _SLOT * i for i in range(len(launch.args))))
        self.params_address = ctypes.addressof(self._params)
        self._tables = []  # a Table's ints (a TensorMap's bytes), which its slot of _params points to instead
        pointers, maps = [], []
        for slot, arg in enumerate(launch.args):
            if isinstance(arg, Pointer):
                pointers.append((slot, OPERANDS.index(arg.operand), arg.offset))
            elif isinstance(arg, Table):
                self._tables.append((ctypes.c_int32 * len(arg.values))(*arg.values))
                self._params[slot] = ctypes.addressof(self._tables[-1])
            elif isinstance(arg, MAP_TYPES):  # made at the call for its operand's address (tensor_map.py)
                buffer = (ctypes.c_uint8 * (tensor_map.MAP_BYTES + tensor_map.MAP_ALIGNMENT))()
                self._tables.append(buffer)
                at = -(-ctypes.addressof(buffer) // tensor_map.MAP_ALIGNMENT) * tensor_map.MAP_ALIGNMENT
                self._params[slot] = at
                maps.append(MapSlot(OPERANDS.index(arg.pointer.operand), arg.pointer.offset, arg, at))
            else:
                self.values[slot] = int(arg) & _INT32_MASK
        self.pointers = tuple(pointers)
        self._maps = tuple(maps)

    def __call__(self, addresses, stream: int) -> None:
        values = self.values
        for slot, operand, offset in self.pointers:
            values[slot] = addresses[operand] + offset
        for map_slot in self._maps:
            map_slot.write(addresses)
        self._launch_kernel(self.function, *self.launch_shape, stream, self.params_address, 0)


class Executable:
    """A CallProgram ready to run on one device.

    ``workspace_bytes`` of temporaries, where ``weight`` is set ``weight.nbytes`` of prepared weight,
    and where ``uses_flags`` the FLAGS operand are the caller's to provide (Workspaces does it for
    the fronts). ``launch`` launches the
    call, with the weight preparation first where asked; ``prepare_weight`` the preparation alone,
    for a caller that keeps the prepared weight.
    """

    def __init__(self, program: CallProgram, problem: ConvProblem, plan, device_id: int):
        self.problem, self.plan, self.device_id = problem, plan, device_id
        self.workspace_bytes = program.workspace_bytes
        self.weight = program.weight
        self.uses_flags = any(isinstance(arg, Pointer) and arg.operand == FLAGS
                              for launch in program.launches for arg in launch.args)
        self._launches = tuple(PackedLaunch(launch, device_id) for launch in program.launches)
        self._weight_launches = tuple(PackedLaunch(launch, device_id) for launch in
                                      (program.weight.launches if program.weight else ()))
        # The argument blocks are shared: one thread at a time fills and launches them
        # (cuLaunchKernel copies the parameters before it returns).
        self._lock = threading.Lock()

    def launch(self, x: int, weight: int, prepared: int, bias: int, out: int, workspace: int, prepare_weight: bool,
               stream: int, residual: int = 0, flags: int = 0, input_scale: int = 0) -> None:
        """The call on ``stream`` given its operands' addresses (bias, residual, input_scale 0: none). Where
        ``prepare_weight``, the weight is prepared first at the workspace's start (which then holds
        align(weight.nbytes) more bytes) and ``prepared`` is ignored."""
        if prepare_weight:
            prepared, workspace = workspace, workspace + align(self.weight.nbytes)
        operands = addresses(x, weight, prepared, bias, out, workspace, residual, flags=flags, input_scale=input_scale)
        with self._lock:
            for launch in (self._weight_launches + self._launches if prepare_weight else self._launches):
                launch(operands, stream)

    def run(self, operands: tuple[int, ...], stream: int) -> None:
        """The program's launches on ``stream`` given every operand's address (``addresses``), the
        workspace's included; no weight preparation (the gradients' programs have none)."""
        with self._lock:
            for launch in self._launches:
                launch(operands, stream)

    def workspace_bytes_for(self, prepare_weight: bool) -> int:
        """Workspace a call needs: its temporaries, and the prepared weight where it makes it itself."""
        return self.workspace_bytes + (align(self.weight.nbytes) if prepare_weight else 0)

    def prepare_weight(self, weight: int, prepared: int, stream: int) -> None:
        """Write the PREPARED operand at ``prepared`` from the weight at ``weight`` on ``stream``."""
        operands = addresses(0, weight, prepared, 0, 0, 0, 0)
        with self._lock:
            for launch in self._weight_launches:
                launch(operands, stream)


class Workspaces:
    """The workspace kept per (device, stream) for calls outside a stream capture, grown as needed (as
    torch keeps cuBLAS's per stream), so that such a call allocates only its output; calls inside a
    capture allocate their own, which the capture keeps. Calls on one stream use it in the stream's
    order; the lock keeps two threads' launches on one stream from interleaving. ``allocate(nbytes)``
    returns (buffer, address) from the front's allocator (CuPy's pool, torch's caching allocator).
    The FLAGS operand (program.FLAGS) is kept likewise, zeroed once when allocated: its launches
    leave it zero."""

    def __init__(self, allocate):
        self._allocate, self._kept, self._lock = allocate, {}, threading.Lock()
        # Its own lock: flags are asked for while the workspace's lock is held.
        self._flags, self._flags_lock = {}, threading.Lock()

    def clear(self) -> None:
        """Give the kept workspaces and flags back to the allocator."""
        with self._lock:
            self._kept.clear()
        with self._flags_lock:
            self._flags.clear()

    def launch(self, exe: Executable, x: int, weight: int, prepared: int, bias: int, out: int, stream: int,
               capturing: bool, residual: int = 0, input_scale: int = 0) -> None:
        """``exe``'s call on ``stream``. ``prepared`` 0 where ``exe`` reads a prepared weight that the
        caller does not keep: it is then made in the workspace first."""
        prepare_here = exe.weight is not None and not prepared
        # (buffer, address): the buffer held until the launches are queued (in a capture, a new one).
        flags = self.flags(exe.device_id, stream, capturing) if exe.uses_flags else _NO_FLAGS
        self._queue(exe.device_id, exe.workspace_bytes_for(prepare_here), stream, capturing,
                    lambda workspace: exe.launch(x, weight, prepared, bias, out, workspace, prepare_here, stream,
                                                 residual, flags[1], input_scale))

    def run(self, exe: Executable, stream: int, capturing: bool, **operands: int) -> None:
        """``exe``'s launches on ``stream`` (a program without weight preparation: the gradients'),
        its operands' addresses by name (``addresses``' keywords), the workspace from here."""
        flags = self.flags(exe.device_id, stream, capturing) if exe.uses_flags else _NO_FLAGS
        self._queue(exe.device_id, exe.workspace_bytes, stream, capturing,
                    lambda workspace: exe.run(addresses(**operands, workspace=workspace, flags=flags[1]), stream))

    def _queue(self, device_id: int, nbytes: int, stream: int, capturing: bool, queue) -> None:
        """``queue(address)``, queuing launches on ``stream`` that use ``nbytes`` of workspace at that
        address (0 for none): the one kept for the stream, under the lock, or inside a capture a new
        one. (A plain call, not a context manager: this is on every call's path.)"""
        if nbytes and not capturing:
            with self._lock:
                key = (device_id, stream)
                kept = self._kept.get(key)
                if kept is None or kept[2] < nbytes:
                    kept = self._kept[key] = (*self._allocate(nbytes), nbytes)
                queue(kept[1])
        elif nbytes:
            buffer, address = self._allocate(nbytes)  # held until the launches are queued
            queue(address)
            del buffer
        else:
            queue(0)

    def flags(self, device_id: int, stream: int, capturing: bool):
        """(buffer, address) of the FLAGS operand for launches on ``stream``: the stream's, or inside a
        capture a new one, zeroed in the capture (a graph's launches may run beside this stream's).
        The caller holds the buffer until its launches are queued."""
        kept = None if capturing else self._flags.get((device_id, stream))
        if kept is None:
            with self._flags_lock:
                kept = self._allocate(4 * FLAG_COUNT)
                _zero(kept[1], 4 * FLAG_COUNT, stream)
                if not capturing:
                    kept = self._flags.setdefault((device_id, stream), kept)
        return kept


def executable(problem: ConvProblem, allow_tf32: bool, device_id: int) -> Executable:
    """The planner's choice for ``problem`` on device ``device_id``, ready to launch: the fixed rules'
    plan, or with autotuning on (tuning.autotune) the fastest the tuner found, timed on first sight
    of the problem. The fronts ask once per call signature. One-pixel NCHW planes run as the NHWC
    problem of the same memory where that reads them in place (planner.as_planned)."""
    from .planner import as_planned

    problem = as_planned(problem, allow_tf32, compute_capability(device_id))
    if tuning.enabled():
        return executable_for_plan(tuning.tuned_plan(problem, allow_tf32, device_id), problem, device_id)
    return _fixed_rules_executable(problem, allow_tf32, device_id)


@functools.lru_cache(maxsize=4096)
def _fixed_rules_executable(problem: ConvProblem, allow_tf32: bool, device_id: int) -> Executable:
    # Made once per (problem, precision, device): a model calls the same few shapes over and over
    # (and the gradients' and transposed convolution's phases ask on every call).
    from .planner import make_plan

    plan = make_plan(problem, allow_tf32=allow_tf32, compute_capability=compute_capability(device_id))
    return executable_for_plan(plan, problem, device_id)


@functools.lru_cache(maxsize=4096)
def executable_for_plan(plan, problem: ConvProblem, device_id: int) -> Executable:
    """``plan`` (any plan make_plan can make for ``problem``, forced tiles included) ready to launch."""
    from .planner import program

    return Executable(program(plan, problem), problem, plan, device_id)


@functools.lru_cache(maxsize=4096)
def program_executable(make_program, plan, problem: ConvProblem, device_id: int) -> Executable:
    """``make_program(plan, problem)`` (a family's ``program``: the gradients' families) ready to launch."""
    return Executable(make_program(plan, problem), problem, plan, device_id)


def addresses(x: int = 0, weight: int = 0, prepared: int = 0, bias: int = 0, out: int = 0, workspace: int = 0,
              residual: int = 0, grad_output: int = 0, flags: int = 0, input_scale: int = 0) -> tuple[int, ...]:
    """The operand addresses in OPERANDS order (X, WEIGHT, PREPARED, BIAS, OUT, WORKSPACE, RESIDUAL,
    GRAD_OUTPUT, FLAGS, INPUT_SCALE; a test checks the two agree); a missing bias (0) reads as the
    weight's address, a missing residual as the output's and a missing input scale as x's: the kernels
    read them only when has_bias, has_residual, has_input_scale."""
    return x, weight, prepared, bias or weight, out, workspace, residual or out, grad_output, flags, input_scale or x


def _zero(address: int, nbytes: int, stream: int) -> None:
    """``nbytes`` at ``address`` set to zero on ``stream`` (in a capture: a memset node of the graph)."""
    from cupy.cuda import runtime

    runtime.memsetAsync(address, 0, nbytes, stream)

