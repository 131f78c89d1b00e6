"""agentq's public API as a type checker sees it from a user's app: tool calls are typed
as the tool's result, and a wrong use fails to type-check."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from mypy import api

APP = Path(__file__).with_name("checked_app.py")
ROOT = Path(__file__).resolve().parents[2]


def test_the_checked_app_fails_exactly_where_it_must(tmp_path: Path) -> None:
    expected = {
        (number, code)
        for number, line in enumerate(APP.read_text().splitlines(), start=1)
        if (match := re.search(r"# expect: ([\w -]+)$", line))
        for code in match.group(1).split()
    }
    assert expected
    stdout, stderr, _ = api.run(
        [
            "--strict",
            "--no-incremental",
            "--cache-dir",
            str(tmp_path),
            "--config-file",
            str(ROOT / "pyproject.toml"),
            str(APP),
        ]
    )
    reported = {
        (int(match.group(1)), match.group(2))
        for match in re.finditer(r"checked_app\.py:(\d+): error: .*\[([\w-]+)\]$", stdout, re.M)
    }
    assert reported == expected, stdout + stderr


def test_an_app_outside_the_checkout_sees_the_installed_agentq(tmp_path: Path) -> None:
    # The development install must be one a type checker can follow (no import hook).
    app = tmp_path / "app.py"
    app.write_text(
        "from typing import assert_type\nimport agentq\nassert_type(agentq.Done(1), agentq.Done)\n"
    )
    stdout, stderr, status = api.run(
        [
            "--strict",
            "--no-incremental",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--python-executable",
            sys.executable,
            str(app),
        ]
    )
    assert status == 0, stdout + stderr
