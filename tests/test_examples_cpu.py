"""Every example runs to its end without a GPU (NumPy, and torch's CPU where it uses torch), so that
the examples keep up with the API; their GPU halves run by hand on a GPU machine
(`python examples/<name>.py`). CUDA_VISIBLE_DEVICES is emptied so that this stays a CPU test there too."""
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


def test_there_are_examples():
    assert len(EXAMPLES) >= 9


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.name)
def test_example_runs_on_the_cpu(example):
    path = os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))
    env = {**os.environ, "PYTHONPATH": path, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, str(example)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip(), "the example printed nothing"
