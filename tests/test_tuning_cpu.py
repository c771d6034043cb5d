"""Autotuning without a GPU (cupyconv/tuning.py, cupyconv/tuning_cache.py): the mode and its
environment variable, the candidate plans (each a valid program, the fixed rules' first), the choice
among faked timings, the printed plan, and the cache file (round trip, keys, a corrupt or unwritable
file, concurrent writers)."""
import dataclasses
import json
import multiprocessing
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import cupyconv
from cases import GRID, Case
from cupyconv import conv, planner, tuning, tuning_cache
from cupyconv.compiler import compile_offline
from test_programs import check_program, problem_of

H100 = tuning.Device(0, "NVIDIA H100 80GB HBM3", 90, 132)
OTHER = tuning.Device(0, "NVIDIA L4", 89, 58)


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch, tmp_path):
    """Each test: autotuning as it was found, an empty in-memory cache and a cache file of its own."""
    monkeypatch.setattr(tuning, "_PLANS", {})
    monkeypatch.setenv(tuning_cache.DIRECTORY_VARIABLE, str(tmp_path / "cache"))
    previous = cupyconv.autotune()
    yield
    cupyconv.autotune(previous)


class FakeTimer:
    """A timer for choose_plan: ``ms(plan)`` gives each plan's time; counts the timers made and plans timed."""

    def __init__(self, ms):
        self.ms, self.made, self.timed = ms, 0, []

    def __call__(self, problem, device):
        self.made += 1

        def measure(plan, best_ms):
            self.timed.append((plan, best_ms))
            return self.ms(plan)
        return measure


def fastest(target):
    """Times: 0.5 ms for the plan ``target`` (however it was reached), 1 ms for the others."""
    return lambda plan: 0.5 if tuning._identity(plan) == tuning._identity(target) else 1.0


# --- the mode ----------------------------------------------------------------------------------------

def test_autotune_switches_and_returns_the_previous_mode():
    cupyconv.autotune(False)
    assert cupyconv.autotune() is False and tuning.enabled() is False
    assert cupyconv.autotune(True) is False and cupyconv.autotune() is True and tuning.enabled()
    assert cupyconv.autotune(False) is True and not tuning.enabled()
    for bad in (1, "yes", 0.0):
        with pytest.raises(TypeError, match="autotune's enabled must be True, False or None"):
            cupyconv.autotune(bad)


def test_switching_the_mode_forgets_checked_signatures():
    """The fronts' signature caches hold executables planned under one mode: a switch empties them
    (and only a switch: asking, or setting the mode it has, keeps them)."""
    cupyconv.autotune(False)
    conv._CUPY_CALLS["signature"] = "call"
    cupyconv.autotune()
    cupyconv.autotune(False)
    assert conv._CUPY_CALLS == {"signature": "call"}
    cupyconv.autotune(True)
    assert conv._CUPY_CALLS == {}
    torch_module = pytest.importorskip("cupyconv.torch")
    torch_module._CALLS["signature"] = "call"
    cupyconv.autotune(False)
    assert torch_module._CALLS == {}


@pytest.mark.parametrize("value,on", [("1", True), ("true", True), ("TRUE", True), ("0", False), ("", False),
                                      ("false", False)])
def test_environment_variable_sets_the_mode_at_import(value, on):
    code = "import cupyconv; print(cupyconv.autotune())"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            env={**os.environ, tuning.ENVIRONMENT_VARIABLE: value})
    assert result.stdout.strip() == str(on)


def test_a_bad_environment_variable_is_an_error_naming_it():
    result = subprocess.run([sys.executable, "-c", "import cupyconv"], capture_output=True, text=True,
                            env={**os.environ, tuning.ENVIRONMENT_VARIABLE: "sometimes"})
    assert result.returncode != 0 and "CUPYCONV_AUTOTUNE must be 1 or 0" in result.stderr


def test_off_by_default():
    result = subprocess.run([sys.executable, "-c", "import cupyconv; print(cupyconv.autotune())"],
                            capture_output=True, text=True, check=True,
                            env={k: v for k, v in os.environ.items() if k != tuning.ENVIRONMENT_VARIABLE})
    assert result.stdout.strip() == "False"


# --- the candidates ----------------------------------------------------------------------------------

#: (case, dtype, TF32 allowed, compute capability, layouts): every family's problems.
PROBLEMS = [
    (Case(1, 64, 64, 7, 7, 3, 3, padding=1), "float16", False, 90, ("NCHW", "KCHW")),  # wgmma, split-K
    (Case(1, 64, 64, 7, 7, 3, 3, padding=1), "bfloat16", False, 0, ("NHWC", "KHWC")),
    (Case(2, 64, 64, 9, 9, 3, 3, padding=1), "float32", False, 0, ("NCHW", "KCHW")),  # Winograd, FMA GEMM
    (Case(2, 64, 64, 9, 9, 3, 3, padding=1), "float32", True, 90, ("NHWC", "KHWC")),  # TF32: all GEMMs
    (Case(2, 40, 36, 7, 9, 1, 1), "float32", True, 0, ("NCHW", "KCHW")),  # 1x1 read in place
    (Case(2, 32, 64, 21, 27, 5, 9), "float32", False, 0, ("NCHW", "KCHW")),  # phase channels
    (Case(2, 3, 96, 35, 35, 11, 11, stride=4, padding=2), "float16", False, 90, ("NCHW", "KCHW")),
    (Case(2, 8, 8, 14, 15, 3, 3, padding=1, groups=8), "float32", False, 0, ("NCHW", "KCHW")),  # depthwise
    (Case(2, 8, 8, 14, 15, 3, 3, padding=1, groups=8), "float16", False, 0, ("NHWC", "KHWC")),
    (Case(1, 4, 12, 11, 10, 3, 3, padding=1, groups=4), "float32", False, 0, ("NCHW", "KCHW")),  # multiplier
    (Case(1, 4, 5, 16, 13, 3, 5, stride=2, padding=(1, 2)), "float64", False, 0, ("NCHW", "KCHW")),  # direct
    (Case(2, 8, 12, 9, 9, 3, 3, stride=2, padding=1, groups=2), "float16", False, 0, ("NCHW", "KCHW")),
]


@pytest.mark.parametrize("case,dtype,tf32,cc,layouts", PROBLEMS, ids=lambda v: getattr(v, "id", None))
def test_candidates_are_valid_distinct_plans_the_fixed_rules_first(case, dtype, tf32, cc, layouts):
    problem = problem_of(case, dtype, *layouts)
    found = tuning.candidates(problem, tf32, cc)
    (first_choice, first), *others = found
    assert first_choice == tuning.Choice() and first == planner.make_plan(problem, allow_tf32=tf32,
                                                                          compute_capability=cc)
    assert 2 <= len(found) <= 80  # (TF32's ping-pong tiles, 128 and 64 pixels tall, their runs, the 64 x 64 mma.sync tiles: 77)
    identities = [tuning._identity(plan) for _, plan in found]
    assert len(set(identities)) == len(identities), "a plan is timed twice"
    for choice, plan in found:
        check_program(plan, problem)
        assert (plan.layout, plan.weight_layout) == layouts
        assert choice.plan(problem, tf32, cc) == plan  # what the cache file's entry rebuilds
        assert tuning.Choice.from_json(json.loads(json.dumps(choice.to_json()))) == choice
        if dtype == "float32" and not tf32:  # strict float32 never rounds to TF32
            assert plan.kernel not in (planner.GEMM_KERNEL, planner.NHWC_KERNEL)
        if plan.arch:
            assert cc == 90
        if plan.kernel == planner.WINOGRAD_KERNEL and plan.winograd_tile == 4:  # within F(4x4)'s accuracy
            assert planner.winograd_conv2d.winograd_channels(problem) <= 512
    kernels = {plan.kernel for _, plan in found}
    assert planner.DIRECT_KERNEL in kernels  # every problem's fallback
    if problem.k // problem.groups < 8:  # a GEMM tile would be mostly padding, but the 32-channel one's
        assert not kernels & {planner.SIMT_KERNEL, planner.WINOGRAD_KERNEL, planner.GEMM_KERNEL}


def test_candidates_cover_tiles_split_k_and_winograd():
    fp16 = problem_of(Case(1, 64, 64, 7, 7, 3, 3, padding=1), "float16")
    plans = [plan for _, plan in tuning.candidates(fp16, False, 90)]
    nhwc = {plan.config.name for plan in plans if plan.kernel == planner.NHWC_KERNEL}
    narrow = {c.name for c in planner.implicit_gemm_nhwc.NHWC_CONFIGS["float16"] if c.bn == 32}
    pairs = {c.name for c in planner.implicit_gemm_nhwc.NHWC_CONFIGS["float16"] if c.cluster > 1}
    # wgmma too on sm_90; the 32-channel tiles only for outputs of at most 32 channels, the pairs of
    # producer tiles for an even number of channel tiles, the ping-pong tiles for NHWC layers
    # (tests/test_pingpong_cpu.py)
    pingpong = {c.name for c in planner.implicit_gemm_nhwc.NHWC_CONFIGS["float16"]
                if c.wgmma == planner.implicit_gemm_nhwc.WGMMA_PINGPONG}
    assert nhwc == {c.name for c in planner.implicit_gemm_nhwc.NHWC_CONFIGS["float16"]} - narrow - pairs - pingpong
    two_tiles = problem_of(Case(1, 64, 256, 7, 7, 3, 3, padding=1), "float16")
    assert pairs and pairs <= {plan.config.name for _, plan in tuning.candidates(two_tiles, False, 90)}
    few = problem_of(Case(1, 64, 24, 7, 7, 3, 3, padding=1), "float16")
    assert narrow <= {plan.config.name for _, plan in tuning.candidates(few, False, 90)}
    assert {plan.splits for plan in plans if plan.kernel == planner.NHWC_KERNEL} >= {1, 2, 4}
    assert len({c.name for c in planner.implicit_gemm_nhwc.NHWC_CONFIGS["float16"] if c.wgmma}
               & {plan.config.name for _, plan in tuning.candidates(fp16, False, 0)}) == 0  # sm_90a only
    strict = problem_of(Case(2, 64, 64, 9, 9, 3, 3, padding=1), "float32")
    plans = [plan for _, plan in tuning.candidates(strict, False, 0)]
    assert {plan.winograd_tile for plan in plans if plan.kernel == planner.WINOGRAD_KERNEL} == {2, 4}
    assert {plan.config.name for plan in plans if plan.kernel == planner.SIMT_KERNEL} == \
        {c.name for c in planner.simt_gemm_conv2d.SIMT_CONFIGS}
    wide = problem_of(Case(2, 600, 64, 9, 9, 3, 3, padding=1), "float32")  # F(4x4) rounds too much here
    assert {plan.winograd_tile for _, plan in tuning.candidates(wide, False, 0) if plan.winograd_tile} == {2}
    pointwise = problem_of(Case(2, 64, 64, 9, 9, 1, 1), "float32")  # Winograd would multiply more
    assert planner.WINOGRAD_KERNEL not in {plan.kernel for _, plan in tuning.candidates(pointwise, False, 0)}


def test_split_k_candidates_only_below_a_wave():
    """Batch 16 of ResNet's 3x3 of 256: 100 blocks of 64 channels, split on 132 SMs, not on 58 (a wave
    already)."""
    problem = problem_of(Case(16, 256, 256, 14, 14, 3, 3, padding=1), "float16")

    def forced_splits(sm_count):
        return {dict(c.options)["splits"] for c, _ in tuning.candidates(problem, False, 0, sm_count) if c.options}

    # 1 run is the rules' own plan (timed once), 4 runs past two waves of 132.
    assert forced_splits(132) == {2} and forced_splits(58) == set()


def test_every_grid_case_has_candidates_in_every_dtype():
    for case in GRID:
        for dtype in ("float16", "bfloat16", "float32", "float64"):
            problem = problem_of(case, dtype)
            for tf32 in (False, True):
                found = tuning.candidates(problem, tf32, 90)
                assert 1 <= len(found) <= 55 and found[0][0] == tuning.Choice()


# --- the choice ---------------------------------------------------------------------------------------

STRICT = problem_of(Case(2, 64, 64, 9, 9, 3, 3, padding=1), "float32")
#: The plan the faked timings make fastest: the FMA GEMM's 64 x 64 tile, its reduction split by its rule.
FMA_64 = tuning.Choice(planner.SIMT_KERNEL, "simt_m64n64").plan(STRICT, False, 0)


def _plans():
    return tuning.candidates(STRICT, False, 0)


def test_tune_picks_the_fastest_and_passes_the_best_so_far():
    seen = []

    def measure(plan, best_ms):
        seen.append(best_ms)
        return {0: 2.0, 3: 1.0, 5: 1.5}.get(len(seen) - 1, 3.0)

    plans = _plans()
    entry = tuning.tune(plans, measure)
    assert seen[:5] == [None, 2.0, 2.0, 2.0, 1.0]
    choice, plan = plans[3]
    assert (entry["kernel"], entry["config"], entry["options"]) == tuple(choice.to_json().values())
    assert entry["label"] == tuning.label(plan) and (entry["ms"], entry["default_ms"]) == (1.0, 2.0)
    assert entry["candidates"] == len(plans) and entry["tuning_ms"] >= 0
    json.dumps(entry)  # the cache file holds it


def test_ties_go_to_the_fixed_rules():
    plans = _plans()
    close = 1.0 - tuning.TIE_MARGIN / 2
    entry = tuning.tune(plans, lambda plan, best: 1.0 if plan is plans[0][1] else close)
    assert entry["kernel"] is None and entry["ms"] == 1.0
    clear = 1.0 - 2 * tuning.TIE_MARGIN
    assert tuning.tune(plans, lambda plan, best: 1.0 if plan is plans[0][1] else clear)["kernel"] is not None
    # A 12 us row: 5 % faster is 0.6 us, within the noise TIE_MARGIN_MS allows; 20 % is not.
    for faster, picked in ((0.95, False), (0.80, True)):
        entry = tuning.tune(plans, lambda plan, best: 0.012 if plan is plans[0][1] else 0.012 * faster)
        assert (entry["kernel"] is not None) == picked, faster


def test_plans_that_cannot_run_are_left_out_but_the_rules_plan_must_run():
    plans = _plans()

    def measure(plan, best_ms):
        if plan is plans[1][1]:
            raise tuning.CannotRun("too much shared memory")
        return 1.0 if plan is plans[0][1] else 2.0
    assert tuning.tune(plans, measure)["kernel"] is None

    def broken(plan, best_ms):
        raise tuning.CannotRun("no such device")
    with pytest.raises(tuning.CannotRun):
        tuning.tune(plans, broken)


def test_choose_plan_tunes_once_then_reads_memory_then_the_file():
    timer = FakeTimer(fastest(FMA_64))
    plan = tuning.choose_plan(STRICT, False, H100, timer)
    assert timer.made == 1 and len(timer.timed) == len(_plans())
    assert tuning._identity(plan) == tuning._identity(FMA_64)
    assert plan.reason.startswith(f"autotuned: the fastest of {len(timer.timed)} candidate plans on {H100.name}")
    assert plan.tuning.startswith(f"picked {tuning.label(FMA_64)} (0.500 ms) over {len(timer.timed)} candidates in ")
    assert f"on {H100.name}; the fixed rules' plan 1.000 ms" in plan.tuning
    assert tuning.choose_plan(STRICT, False, H100, timer) is plan and timer.made == 1  # memory
    tuning._PLANS.clear()  # a fresh process
    again = tuning.choose_plan(STRICT, False, H100, timer)
    assert timer.made == 1 and tuning._identity(again) == tuning._identity(plan)
    assert again.tuning == plan.tuning + " (from the cache file)"
    entries = tuning_cache.load()
    assert len(entries) == 1 and json.loads(next(iter(entries)))["device"] == H100.name


def test_the_fixed_rules_win_ties_and_say_so():
    timer = FakeTimer(lambda plan: 1.0)
    plan = tuning.choose_plan(STRICT, False, H100, timer)
    default = planner.make_plan(STRICT, compute_capability=90)
    assert tuning._identity(plan) == tuning._identity(default)
    assert plan.reason.startswith(default.reason) and "autotuned: the fastest of" in plan.reason
    assert plan.tuning.startswith(f"picked the fixed rules' plan, {tuning.label(default)} (1.000 ms), over ")


def test_a_kept_fixed_plan_launches_what_the_fixed_rules_do():
    """What the benchmark's autotune rows rely on to time a kept fixed plan once: its program is the
    fixed rules' program (only the reason and the tuning line differ), and any other winner's is not."""
    kept = tuning.choose_plan(STRICT, False, H100, FakeTimer(lambda plan: 1.0))
    default = planner.make_plan(STRICT, compute_capability=90)
    assert kept != default and planner.program(kept, STRICT) == planner.program(default, STRICT)
    others = [plan for _, plan in tuning.candidates(STRICT, False, 90, H100.sm_count)[1:]]
    assert others and all(planner.program(plan, STRICT) != planner.program(default, STRICT) for plan in others)


def test_the_cache_keys_on_device_version_problem_and_precision(monkeypatch):
    timer = FakeTimer(fastest(FMA_64))
    tuning.choose_plan(STRICT, False, H100, timer)
    tuning._PLANS.clear()
    tuning.choose_plan(STRICT, False, OTHER, timer)  # another GPU
    assert timer.made == 2
    tuning._PLANS.clear()
    monkeypatch.setattr(cupyconv, "__version__", "99.0")  # another cupyconv
    tuning.choose_plan(STRICT, False, H100, timer)
    assert timer.made == 3
    tuning.choose_plan(STRICT, True, H100, timer)  # TF32 allowed: other candidates
    tuning.choose_plan(dataclasses.replace(STRICT, layout="NHWC"), False, H100, timer)  # another layout
    tuning.choose_plan(dataclasses.replace(STRICT, activation="relu"), False, H100, timer)  # an epilogue
    assert timer.made == 6 and len(tuning_cache.load()) == 6
    half = dataclasses.replace(STRICT, dtype="float16")
    tuning.choose_plan(half, False, H100, timer)
    tuning.choose_plan(half, True, H100, timer)  # allow_tf32 means nothing in float16: the same problem
    assert timer.made == 7


def test_an_entry_that_no_longer_plans_is_tuned_again():
    timer = FakeTimer(fastest(FMA_64))
    tuning.choose_plan(STRICT, False, H100, timer)
    (key, entry), = tuning_cache.load().items()
    tuning_cache.store(key, {**entry, "config": "a_tile_since_removed"})
    tuning._PLANS.clear()
    plan = tuning.choose_plan(STRICT, False, H100, timer)
    assert timer.made == 2 and tuning._identity(plan) == tuning._identity(FMA_64)
    assert tuning_cache.load()[key]["config"] == "simt_m64n64"


def test_nothing_timed_runs_the_rules_plan_and_keeps_nothing():
    def capturing(problem, device):
        raise tuning.NotTimed("inside a CUDA-graph capture")
    plan = tuning.choose_plan(STRICT, False, H100, capturing)
    assert tuning._identity(plan) == tuning._identity(planner.make_plan(STRICT, compute_capability=90))
    assert plan.tuning == "no (inside a CUDA-graph capture)" and "tuned: no (inside" in str(plan)
    assert tuning._PLANS == {} and tuning_cache.load() == {}
    timer = FakeTimer(fastest(FMA_64))
    assert tuning._identity(tuning.choose_plan(STRICT, False, H100, timer)) == tuning._identity(FMA_64)  # next call


def test_an_empty_batch_is_not_timed():
    timer = FakeTimer(lambda plan: 1.0)
    plan = tuning.choose_plan(dataclasses.replace(STRICT, n=0), False, H100, timer)
    assert timer.made == 0 and plan.tuning == "no (an empty batch: nothing to time)"


def test_a_single_candidate_is_not_timed(monkeypatch):
    only = _plans()[:1]
    monkeypatch.setattr(tuning, "candidates", lambda *args: only)
    timer = FakeTimer(lambda plan: 1.0)
    plan = tuning.choose_plan(STRICT, False, H100, timer)
    assert timer.made == 0 and plan.tuning == "no (the fixed rules' plan is the only candidate)"


# --- the printed plan ---------------------------------------------------------------------------------

def test_plan_says_whether_it_was_tuned():
    x, w = np.ones((2, 64, 9, 9), np.float32), np.ones((64, 64, 3, 3), np.float32)
    cupyconv.autotune(False)
    text = str(cupyconv.plan(x, w, padding=1))
    assert text.splitlines()[-1] == "  tuned: no (autotune off)"
    cupyconv.autotune(True)
    assert "tuned: no (NumPy arrays: plans are tuned on the GPU that runs them)" in str(cupyconv.plan(x, w, padding=1))
    tuned = tuning.choose_plan(STRICT, False, H100, FakeTimer(fastest(FMA_64)))
    lines = str(tuned).splitlines()
    assert lines[-1].startswith(f"  tuned: picked {tuning.label(FMA_64)} (0.500 ms) over ")
    assert any(line.startswith("  why: autotuned: the fastest of ") for line in lines)
    assert "tuned:" not in str(planner.make_plan(STRICT))  # plans nobody asked to tune print as before


def test_bad_arguments_raise_before_anything_is_tuned(monkeypatch):
    cupyconv.autotune(True)
    monkeypatch.setattr(tuning, "choose_plan", lambda *args: pytest.fail("tuned before checking"))
    with pytest.raises(ValueError, match="channels"):
        cupyconv.plan(np.ones((1, 3, 9, 9), np.float32), np.ones((8, 4, 3, 3), np.float32))


# --- the cache file -----------------------------------------------------------------------------------

def test_cache_location(monkeypatch, tmp_path):
    assert tuning_cache.path() == tmp_path / "cache" / "autotune.json"
    monkeypatch.delenv(tuning_cache.DIRECTORY_VARIABLE)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert tuning_cache.path() == tmp_path / "xdg" / "cupyconv" / "autotune.json"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert tuning_cache.path() == tmp_path / "home" / ".cache" / "cupyconv" / "autotune.json"


def test_cache_round_trip_keeps_every_entry():
    assert tuning_cache.load() == {}
    tuning_cache.store("a", {"ms": 1.0})
    tuning_cache.store("b", {"ms": 2.0})
    tuning_cache.store("a", {"ms": 0.5})
    assert tuning_cache.load() == {"a": {"ms": 0.5}, "b": {"ms": 2.0}}
    data = json.loads(tuning_cache.path().read_text())
    assert data["format"] == tuning_cache.FORMAT
    assert sorted(p.name for p in tuning_cache.path().parent.iterdir()) == ["autotune.json", "autotune.json.lock"]


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"format": 0, "entries": {}}', '{"format": 1}', ""])
def test_a_corrupt_cache_is_ignored_with_a_warning_and_rewritten(text):
    tuning_cache.path().parent.mkdir(parents=True)
    tuning_cache.path().write_text(text)
    with pytest.warns(UserWarning, match="autotune cache .* is corrupt"):
        assert tuning_cache.load() == {}
    timer = FakeTimer(fastest(FMA_64))
    with pytest.warns(UserWarning, match="is corrupt"):
        plan = tuning.choose_plan(STRICT, False, H100, timer)
    assert tuning._identity(plan) == tuning._identity(FMA_64) and timer.made == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(tuning_cache.load()) == 1  # whole again


def test_an_unwritable_cache_is_ignored_with_a_warning(monkeypatch, tmp_path):
    (tmp_path / "a_file").write_text("")
    monkeypatch.setenv(tuning_cache.DIRECTORY_VARIABLE, str(tmp_path / "a_file" / "cache"))  # root or not
    timer = FakeTimer(fastest(FMA_64))
    with pytest.warns(UserWarning) as caught:
        plan = tuning.choose_plan(STRICT, False, H100, timer)
    messages = [str(warning.message) for warning in caught]
    assert any("cannot be read" in message for message in messages)  # its "directory" is a file
    assert any("cannot be written" in message and "kept in memory only" in message for message in messages)
    assert tuning._identity(plan) == tuning._identity(FMA_64)
    assert tuning.choose_plan(STRICT, False, H100, timer) is plan and timer.made == 1  # memory still serves


def test_an_unreadable_cache_is_ignored_with_a_warning(monkeypatch, tmp_path):
    monkeypatch.setenv(tuning_cache.DIRECTORY_VARIABLE, str(tmp_path))
    (tmp_path / "autotune.json").mkdir()  # a directory where the file should be
    with pytest.warns(UserWarning, match="cannot be read"):
        assert tuning_cache.load() == {}


def _write_entries(directory: str, writer: int, count: int) -> None:
    os.environ[tuning_cache.DIRECTORY_VARIABLE] = directory
    for i in range(count):
        tuning_cache.store(f"writer {writer} entry {i}", {"writer": writer, "i": i, "padding": "x" * 2000})


def test_concurrent_writers_keep_each_others_entries(tmp_path):
    """Processes storing at once: every entry of every one survives, and the file is never torn
    (a reader alongside always finds whole JSON)."""
    try:
        context = multiprocessing.get_context("fork")
    except ValueError:
        pytest.skip("needs fork")
    writers, count = 4, 25
    processes = [context.Process(target=_write_entries, args=(str(tmp_path), w, count)) for w in range(writers)]
    for p in processes:
        p.start()
    file = tmp_path / "autotune.json"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a torn file would warn
        while any(p.is_alive() for p in processes):
            tuning_cache.load(file)
    for p in processes:
        p.join()
        assert p.exitcode == 0
    entries = tuning_cache.load(file)
    assert set(entries) == {f"writer {w} entry {i}" for w in range(writers) for i in range(count)}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["autotune.json", "autotune.json.lock"]  # no temporaries


# --- the spin kernel timing runs behind -----------------------------------------------------------------

@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_spin_kernel_compiles(arch):
    report = compile_offline("spin", ("cupyconv::spin",), arch)
    assert report["cupyconv::spin"]["spill_stores"] == 0 and report["cupyconv::spin"]["registers"] > 0
