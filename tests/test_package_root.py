"""What ``import agentq`` gives: its public names and its modules, loaded on first use."""

from __future__ import annotations

import subprocess
import sys


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )


def test_the_package_s_modules_are_reached_from_the_package_alone() -> None:
    done = run(
        "import agentq\n"
        "assert issubclass(agentq.errors.LeaseLost, Exception)\n"
        "assert agentq.records.Status.DONE.value == 'done'\n"
        "assert agentq.AgentTask.__name__ == 'AgentTask'\n"
    )
    assert done.returncode == 0, done.stderr


def test_a_name_the_package_lacks_is_an_attribute_error() -> None:
    done = run(
        "import agentq\n"
        "for name in ('no_such_thing', '__wrapped__'):\n"
        "    try:\n"
        "        getattr(agentq, name)\n"
        "    except AttributeError:\n"
        "        continue\n"
        "    raise SystemExit(name)\n"
        "assert not hasattr(agentq, 'no_such_thing')\n"
    )
    assert done.returncode == 0, done.stderr
