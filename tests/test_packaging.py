"""A non-editable install carries the kernel sources inside the package: build the wheel, list it,
install it into a temporary directory and import cupyconv from elsewhere."""
import pathlib
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(out), str(ROOT)], check=True)
    (built,) = out.glob("cupyconv-*.whl")
    return built


def test_wheel_holds_every_kernel_source(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = {p.name for p in (ROOT / "kernels").iterdir() if p.suffix in (".cu", ".cuh")}
    assert sources and {f"cupyconv/kernels/{s}" for s in sources} <= names
    assert not any(n.startswith("tests/") or n.startswith("kernels/") for n in names)


def test_installed_package_finds_its_kernels(wheel, tmp_path):
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                   check=True)
    code = ("import cupyconv, pathlib; from cupyconv.compiler import kernels_dir, kernel_source; "
            "d = kernels_dir(); assert d.parent == pathlib.Path(cupyconv.__file__).parent, d; "
            "assert '#include' not in kernel_source('direct_conv2d.cu'); print(d)")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env={"PYTHONPATH": str(site)},
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert str(site) in result.stdout
