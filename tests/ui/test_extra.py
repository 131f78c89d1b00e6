"""Without the ``ui`` extra, importing ``agentq.ui`` (or ``agentq ui``) says how to install
it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("missing", "statement"),
    [
        ("starlette", "from agentq.ui import create_app"),
        ("jinja2", "import agentq.ui.app"),
        ("markupsafe", "import agentq.ui.rows"),
    ],
)
def test_a_missing_extra_names_the_pip_command(missing: str, statement: str) -> None:
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules[{missing!r}] = None  # as if not installed: importing it fails
        try:
            {statement}
        except ModuleNotFoundError as exc:
            print(exc.name)
            print(exc)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    name, message = done.stdout.splitlines()
    assert name.partition(".")[0] == missing
    assert "pip install 'agentq[ui]'" in message
    assert missing in message


def test_the_command_names_the_extra_once(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import sys
        sys.modules["starlette"] = None
        from agentq.cli import main
        main()
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script, "--store", f"sqlite:///{tmp_path / 'a.db'}", "ui"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert "pip install 'agentq[ui]' (starlette is not installed)" in done.stderr
    assert done.stderr.count("agentq[ui]") == 1, done.stderr
