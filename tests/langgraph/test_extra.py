"""Without the ``langgraph`` extra, importing ``agentq.langgraph`` says how to install it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("missing", "statement"),
    [
        ("langchain_core", "from agentq.langgraph import AgentqSaver"),
        ("langgraph", "from agentq.langgraph import graph_task"),
        ("langgraph", "import agentq.langgraph.saver"),
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
    assert "pip install 'agentq[langgraph]'" in message
    assert missing in message


def test_an_error_of_its_own_is_not_taken_for_the_extra() -> None:
    script = textwrap.dedent(
        """
        import sys
        sys.modules["agentq.langgraph.serde"] = None
        try:
            import agentq.langgraph
        except ModuleNotFoundError as exc:
            print(exc)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "agentq.langgraph.serde" in done.stdout and "pip install" not in done.stdout
