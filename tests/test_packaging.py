"""The source distribution, built with the project's own build backend as a release is."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

# Fetching the backend from the index and two builds take longer than the suite's minute a
# test on a loaded machine or a slow network.
pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[1]


def checkout_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    )
    return [name for name in listed.stdout.decode().split("\0") if (ROOT / name).is_file()]


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The backend named in pyproject, installed once for every build of the module into a
    directory of its own, as `python -m build` would install it (the test environment's
    setuptools may be older than it requires). A slow index is bounded by pip's own timeout
    and retries, which tell what went wrong, not by a deadline cutting pip off."""
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    target = tmp_path_factory.mktemp("backend")
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(target), *requires],
        capture_output=True,
        text=True,
        check=False,
    )
    assert installed.returncode == 0, installed.stderr
    return target


def build(backend: Path, tmp_path: Path, hook: str) -> Path:
    """The sdist or wheel (``hook`` is ``build_sdist`` or ``build_wheel``) of the checkout,
    built by ``backend``."""
    source = tmp_path / "source"  # a copy: building writes agentq.egg-info beside the code
    for name in checkout_files():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes((ROOT / name).read_bytes())
    built = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import sys; from setuptools import build_meta; print(build_meta.{hook}(sys.argv[1]))",
            str(tmp_path),
        ],
        cwd=source,
        env={"PYTHONPATH": str(backend), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    return tmp_path / built.stdout.splitlines()[-1]


def test_the_sdist_holds_the_package_and_no_partial_test_suite(
    backend: Path, tmp_path: Path
) -> None:
    sdist_path = build(backend, tmp_path, "build_sdist")
    files = checkout_files()
    with tarfile.open(sdist_path) as sdist:
        names = {name.partition("/")[2] for name in sdist.getnames()}
    package = {name for name in files if name.startswith("agentq/")}
    assert package <= names, sorted(package - names)
    assert "LICENSE" in names, sorted(names)
    # The tests need their fixtures, the examples and the services script: the sdist holds
    # none of the suite rather than a few files of it that cannot run.
    assert not {name for name in names if name.split("/")[0] == "tests"}, sorted(names)


def test_the_wheel_carries_the_license(backend: Path, tmp_path: Path) -> None:
    with zipfile.ZipFile(build(backend, tmp_path, "build_wheel")) as wheel:
        names = wheel.namelist()
        licenses = [name for name in names if name.endswith(".dist-info/licenses/LICENSE")]
        assert len(licenses) == 1, names
        assert wheel.read(licenses[0]) == (ROOT / "LICENSE").read_bytes()
        metadata = next(name for name in names if name.endswith(".dist-info/METADATA"))
        headers = wheel.read(metadata).decode().partition("\n\n")[0].splitlines()
    assert "License-Expression: MIT" in headers
    assert "License-File: LICENSE" in headers
