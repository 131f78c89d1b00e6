"""The source distribution, built with the project's own build backend as a release is."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def checkout_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    )
    return [name for name in listed.stdout.decode().split("\0") if (ROOT / name).is_file()]


def build(tmp_path: Path, hook: str) -> Path:
    """The sdist or wheel (``hook`` is ``build_sdist`` or ``build_wheel``) of the checkout,
    built by the backend named in pyproject, in a directory of its own as `python -m build`
    would install it (the test environment's setuptools may be older than it requires)."""
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    backend = tmp_path / "backend"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(backend), *requires],
        check=True,
        timeout=120,
    )
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
        timeout=120,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    return tmp_path / built.stdout.splitlines()[-1]


def test_the_sdist_holds_the_package_and_no_partial_test_suite(tmp_path: Path) -> None:
    sdist_path = build(tmp_path, "build_sdist")
    files = checkout_files()
    with tarfile.open(sdist_path) as sdist:
        names = {name.partition("/")[2] for name in sdist.getnames()}
    package = {name for name in files if name.startswith("agentq/")}
    assert package <= names, sorted(package - names)
    assert "LICENSE" in names, sorted(names)
    # The tests need their fixtures, the examples and the services script: the sdist holds
    # none of the suite rather than a few files of it that cannot run.
    assert not {name for name in names if name.split("/")[0] == "tests"}, sorted(names)


def test_the_wheel_carries_the_license(tmp_path: Path) -> None:
    with zipfile.ZipFile(build(tmp_path, "build_wheel")) as wheel:
        names = wheel.namelist()
        licenses = [name for name in names if name.endswith(".dist-info/licenses/LICENSE")]
        assert len(licenses) == 1, names
        assert wheel.read(licenses[0]) == (ROOT / "LICENSE").read_bytes()
        metadata = next(name for name in names if name.endswith(".dist-info/METADATA"))
        headers = wheel.read(metadata).decode().partition("\n\n")[0].splitlines()
    assert "License-Expression: MIT" in headers
    assert "License-File: LICENSE" in headers
