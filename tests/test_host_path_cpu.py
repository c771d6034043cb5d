"""The host path without a GPU: the operand order the executor packs, the workspaces it keeps per
stream, the output-size check of the NumPy path, what prepare_weight accepts, and the torch module's
weight cache across copies and its forms kept for CUDA graphs."""
import copy
import weakref

import numpy as np
import pytest

import cupyconv
from cupyconv import executor, program


def test_executor_addresses_follow_program_operand_order():
    named = dict(zip(program.OPERANDS, executor.addresses(1, 2, 3, 4, 5, 6, 7, 8, 9, 10)))
    assert named == {program.X: 1, program.WEIGHT: 2, program.PREPARED: 3, program.BIAS: 4, program.OUT: 5,
                     program.WORKSPACE: 6, program.RESIDUAL: 7, program.GRAD_OUTPUT: 8, program.FLAGS: 9,
                     program.INPUT_SCALE: 10}
    assert executor.addresses(1, 2, 3, 0, 5, 6)[program.OPERANDS.index(program.BIAS)] == 2  # no bias: the weight
    assert executor.addresses(1, 2, 3, 4, 5, 6)[program.OPERANDS.index(program.RESIDUAL)] == 5  # none: the output
    assert executor.addresses(1, 2, 3, 4, 5, 6)[program.OPERANDS.index(program.INPUT_SCALE)] == 1  # none: x


class FakeProgram:
    """An Executable's face to Workspaces: its workspace need, and the operands each run was given."""

    def __init__(self, workspace_bytes: int, device_id: int = 0, uses_flags: bool = False):
        self.workspace_bytes, self.device_id, self.runs = workspace_bytes, device_id, []
        self.uses_flags = uses_flags

    def run(self, operands, stream):
        self.runs.append((operands, stream))


def test_workspaces_are_kept_per_stream_grown_and_fresh_inside_a_capture():
    made = []

    def allocate(nbytes):
        made.append(nbytes)
        return object(), 1000 * len(made)

    kept = executor.Workspaces(allocate)
    small, large, none = FakeProgram(256), FakeProgram(1024), FakeProgram(0)
    named = lambda runs, i: dict(zip(program.OPERANDS, runs[i][0]))
    kept.run(small, 7, False, x=1, grad_output=2, out=3)
    kept.run(small, 7, False, x=1, grad_output=2, out=3)
    assert made == [256] and named(small.runs, 0)[program.WORKSPACE] == named(small.runs, 1)[program.WORKSPACE] == 1000
    assert named(small.runs, 0)[program.GRAD_OUTPUT] == 2 and small.runs[0][1] == 7
    kept.run(large, 7, False, x=1)  # grows: a new, larger workspace for the stream
    kept.run(small, 8, False, x=1)  # another stream: its own
    assert made == [256, 1024, 256]
    kept.run(small, 7, False, x=1)  # the grown one serves the smaller need
    assert named(small.runs, -1)[program.WORKSPACE] == 2000 and made == [256, 1024, 256]
    kept.run(small, 7, True, x=1)  # inside a capture: a workspace of its own, not kept
    kept.run(small, 7, True, x=1)
    assert made == [256, 1024, 256, 256, 256]
    kept.run(none, 7, False, x=1)
    assert named(none.runs, 0)[program.WORKSPACE] == 0 and len(made) == 5
    kept.clear()
    kept.run(small, 7, False, x=1)
    assert made[-1] == 256 and len(made) == 6


def test_flags_are_zeroed_once_per_stream_and_fresh_inside_a_capture(monkeypatch):
    """Stream-K's FLAGS operand: allocated and zeroed on first use per (device, stream) and kept (its
    launches leave it zero); inside a capture a new one, zeroed in the capture; none for a program
    without stream-K."""
    made, zeroed, alive = [], [], []

    class Buffer:  # weakly referable, as the fronts' allocations are
        pass

    def allocate(nbytes):
        made.append(nbytes)
        buffer = Buffer()
        alive.append(weakref.ref(buffer))
        return buffer, 1000 * len(made)

    class Watched(FakeProgram):  # every buffer allocated so far must still be held while launches queue
        def run(self, operands, stream):
            assert all(ref() is not None for ref in alive), "a buffer was freed before its launches were queued"
            super().run(operands, stream)

    monkeypatch.setattr(executor, "_zero", lambda address, nbytes, stream: zeroed.append((address, nbytes, stream)))
    kept = executor.Workspaces(allocate)
    flagged, plain = Watched(256, uses_flags=True), FakeProgram(0)
    flags = lambda runs, i: dict(zip(program.OPERANDS, runs[i][0]))[program.FLAGS]
    kept.run(plain, 7, False, x=1)
    assert made == [] and flags(plain.runs, 0) == 0
    kept.run(flagged, 7, False, x=1)
    kept.run(flagged, 7, False, x=1)
    assert made == [4 * program.FLAG_COUNT, 256] and zeroed == [(1000, 4 * program.FLAG_COUNT, 7)]
    assert flags(flagged.runs, 0) == flags(flagged.runs, 1) == 1000
    kept.run(flagged, 8, False, x=1)  # another stream: its own
    assert [address for address, _, _ in zeroed] == [1000, 3000]
    kept.run(flagged, 7, True, x=1)  # inside a capture: its own, zeroed in the capture, not kept
    assert zeroed[-1] == (5000, 4 * program.FLAG_COUNT, 7) and flags(flagged.runs, -1) == 5000
    alive[-2:] = []  # the capture's flags and workspace: the graph's now, not the Workspaces'
    kept.run(flagged, 7, False, x=1)
    assert flags(flagged.runs, -1) == 1000 and len(made) == 6


def test_huge_numpy_output_raises_before_allocating():
    x, w = np.ones((1, 3, 5, 5), np.float32), np.ones((2, 3, 3, 3), np.float32)
    with pytest.raises(ValueError, match=r"output of shape \(1, 2, 2000000003, 2000000003\)"):
        cupyconv.conv2d(x, w, padding=10**9)


def test_prepare_weight_needs_a_cupy_array():
    with pytest.raises(TypeError, match="prepare_weight needs a CuPy array, got ndarray"):
        cupyconv.prepare_weight(np.ones((2, 3, 3, 3), np.float32))
    with pytest.raises(TypeError, match="got list"):
        cupyconv.prepare_weight([[1.0]])


def test_module_weight_cache_is_not_copied_or_saved():
    torch = pytest.importorskip("torch")
    from cupyconv.torch import Conv2d, WeightCache, convert

    layer = Conv2d(3, 4, 3)
    cache = layer._weight_cache()
    cache._stamp, cache._forms = ("stamp",), {"key": "form"}
    clone = copy.deepcopy(layer)
    assert clone._weight_cache()._forms == {} and clone._weight_cache() is not cache
    assert "_cupyconv_weights" not in layer.state_dict()
    assert isinstance(cache, WeightCache)
    convert(layer, inverse=True)
    assert type(layer) is torch.nn.Conv2d and "_cupyconv_weights" not in layer.__dict__


def test_weight_cache_kept_in_graphs_refreshes_its_forms_in_place(monkeypatch):
    """The cache's logic with a stand-in executable on CPU tensors (the stream a number): a plain cache
    is never read inside a capture and drops its forms when the weight changes; a cache kept in graphs
    is read inside a capture while its forms are current, and rewrites them in their own buffers when
    the weight changes in place (refresh, or a version bump seen by address), so a graph holding their
    addresses reads the new values."""
    torch = pytest.importorskip("torch")
    from types import SimpleNamespace

    from cupyconv.torch import WeightCache

    class Exe:
        weight = SimpleNamespace(key="form", nbytes=64)

        def __init__(self):
            self.prepared = []  # (weight address, buffer address, stream)

        def prepare_weight(self, weight, buffer, stream):
            self.prepared.append((weight, buffer, stream))

    capturing = [False]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    weight = torch.randn(4, 3, 3, 3)
    plain, kept = WeightCache(), WeightCache(kept_in_graphs=True)
    for cache in (plain, kept):
        exe = Exe()
        assert cache.address(weight, exe, 7, capturing=True) is None, "nothing made before the capture"
        first = cache.address(weight, exe, 7)
        assert exe.prepared == [(weight.data_ptr(), first, 7)]
        assert cache.address(weight, exe, 7) == first and len(exe.prepared) == 1, "made once"
        in_capture = cache.address(weight, exe, 7, capturing=True)
        assert in_capture == (first if cache.kept_in_graphs else None)
        assert len(exe.prepared) == 1, "nothing launched inside a capture"
        with torch.no_grad():
            weight.mul_(2)  # in place: a new version
        if cache.kept_in_graphs:
            assert cache.address(weight, exe, 7, capturing=True) is None, "stale forms are not read"
            assert cache.address(weight, exe, 7) == first, "rewritten in its own buffer"
            assert exe.prepared[-1] == (weight.data_ptr(), first, 7) and len(exe.prepared) == 2
            with torch.no_grad():
                weight.add_(1)
            cache.refresh(weight, 7)  # what a refold does right after it
            assert exe.prepared[-1] == (weight.data_ptr(), first, 7) and len(exe.prepared) == 3
            assert cache.address(weight, exe, 7, capturing=True) == first
            capturing[0] = True
            cache.refresh(weight, 7)  # inside a capture: nothing launched, the forms marked stale
            assert len(exe.prepared) == 3 and cache.address(weight, exe, 7, capturing=True) is None
            capturing[0] = False
            assert cache.address(weight, exe, 7) == first, "the stale forms rewritten in their buffers"
            assert exe.prepared[-1] == (weight.data_ptr(), first, 7) and len(exe.prepared) == 4
            cache.clear()  # clear_weight_caches: the buffers stay for graphs, rewritten by the refold
            cache.refresh(weight, 7)
            assert cache.address(weight, exe, 7) == first and len(exe.prepared) == 5
            cache.clear()  # and, without a refold, by the next call
            assert cache.address(weight, exe, 7, capturing=True) is None
            assert cache.address(weight, exe, 7) == first and len(exe.prepared) == 6
        else:
            cache.address(weight, exe, 7)
            assert len(exe.prepared) == 2 and exe.prepared[-1][0] == weight.data_ptr(), "made again"
