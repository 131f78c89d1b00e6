"""The source distribution, built with the project's own build backend as a release is."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tomllib
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


def test_the_sdist_holds_the_package_and_no_partial_test_suite(tmp_path: Path) -> None:
    # The backend named in pyproject, in a directory of its own as `python -m build` would
    # install it (the test environment's setuptools may be older than it requires).
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    backend = tmp_path / "backend"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(backend), *requires],
        check=True,
        timeout=120,
    )
    source = tmp_path / "source"  # a copy: building writes agentq.egg-info beside the code
    files = checkout_files()
    for name in files:
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes((ROOT / name).read_bytes())
    built = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from setuptools import build_meta; "
            "print(build_meta.build_sdist(sys.argv[1]))",
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
    with tarfile.open(tmp_path / built.stdout.splitlines()[-1]) as sdist:
        names = {name.partition("/")[2] for name in sdist.getnames()}
    package = {name for name in files if name.startswith("agentq/")}
    assert package <= names, sorted(package - names)
    # The tests need their fixtures, the examples and the services script: the sdist holds
    # none of the suite rather than a few files of it that cannot run.
    assert not {name for name in names if name.split("/")[0] == "tests"}, sorted(names)
