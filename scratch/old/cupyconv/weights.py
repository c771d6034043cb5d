"""Prepared weights for CuPy callers: a weight whose transformed forms (transposed, channels-last,
rounded to TF32, Winograd-transformed: whatever the chosen kernel reads) are made once and kept.

torch tensors carry a version counter, so the torch adapter can tell by itself when a weight has
changed (cupyconv.torch keeps its cache per module). CuPy arrays carry none: here the caller says
so, by passing a :class:`PreparedWeight` and calling :meth:`PreparedWeight.refresh` after changing
the weight in place.
"""
from __future__ import annotations

import threading

from .arguments import array_backend, dtype_name
from .program import OPERAND_ALIGNMENT


class PreparedWeight:
    """A conv2d weight with its prepared forms cached, accepted wherever ``conv2d`` takes ``weight``.

    Made by :func:`prepare_weight`. The forms are made on first use by each kernel that reads one,
    on that call's stream, and kept until :meth:`refresh`. The weight's memory is read in place (a
    non-contiguous weight is copied once, here), so an in-place change of it is seen only after
    :meth:`refresh`.

    Attributes:
        array: the C-contiguous CuPy weight, (K, C // groups, kh, kw).
    """

    def __init__(self, array):
        import cupy

        if array_backend(array, "weight") != "cupy":
            raise TypeError(f"prepare_weight needs a CuPy array, got {type(array).__name__} (NumPy weights "
                            "need no preparation: pass them to conv2d as they are)")
        dtype_name(array.dtype)
        if array.ndim != 4:
            raise ValueError(f"weight must be 4-D (K, C/groups, kh, kw), got shape {tuple(array.shape)}")
        with cupy.cuda.Device(array.device.id):
            self.array = cupy.ascontiguousarray(array)
            if self.array.data.ptr % OPERAND_ALIGNMENT:  # some kernels read the weight in place
                self.array = self.array.copy()
        self._forms: dict = {}  # WeightPreparation.key -> (CuPy buffer, stream it was written on)
        self._lock = threading.Lock()
        self._crossed_streams = False

    shape = property(lambda self: self.array.shape)
    dtype = property(lambda self: self.array.dtype)
    ndim = property(lambda self: self.array.ndim)
    device = property(lambda self: self.array.device)

    def refresh(self) -> None:
        """Forget the prepared forms: call after changing the weight in place."""
        import cupy

        with self._lock:
            if self._crossed_streams:
                # The pool reuses a buffer in its own stream's order only: wait for other streams' reads.
                cupy.cuda.Device(self.array.device.id).synchronize()
            self._forms.clear()
            self._crossed_streams = False

    def address(self, exe, stream: int) -> int:
        """The address of the form ``exe`` (an executor.Executable) reads, made on ``stream`` if new."""
        import cupy

        preparation = exe.weight
        with self._lock:
            form = self._forms.get(preparation.key)
            if form is None:
                buffer = cupy.empty(preparation.nbytes, dtype=cupy.uint8)
                exe.prepare_weight(self.array.data.ptr, buffer.data.ptr, stream)
                form = self._forms[preparation.key] = (buffer, stream)
            elif form[1] != stream:
                # Written on another stream: this one waits for it once, then both may read it.
                runtime = cupy.cuda.runtime
                event = runtime.eventCreateWithFlags(runtime.eventDisableTiming)
                runtime.eventRecord(event, form[1])
                runtime.streamWaitEvent(stream, event)
                runtime.eventDestroy(event)  # released once the wait has happened
                form = self._forms[preparation.key] = (form[0], stream)
                self._crossed_streams = True
            return form[0].data.ptr

    def __repr__(self) -> str:
        return (f"PreparedWeight(shape={tuple(self.shape)}, dtype={self.dtype}, device={self.array.device.id}, "
                f"{len(self._forms)} prepared form(s))")


def prepare_weight(weight) -> PreparedWeight:
    """Wrap a CuPy weight so that the forms kernels read are made once instead of on every call.

    Pass the result as ``weight`` to :func:`cupyconv.conv2d` (any number of calls, any input shapes).
    Call ``.refresh()`` on it after changing the weight in place (an optimizer step, say): CuPy
    arrays have no version counter, so cupyconv cannot see such a change by itself.

    Args:
        weight: CuPy array (K, C // groups, kh, kw), float16, bfloat16, float32 or float64.

    Returns:
        a :class:`PreparedWeight`.
    """
    return PreparedWeight(weight)
