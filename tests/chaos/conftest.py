"""Options for the chaos test: its size. CI runs the default (30 threads x 10 steps);
``pytest tests/chaos --chaos-threads 100 --chaos-steps 12`` (or the environment variables
``AGENTQ_CHAOS_THREADS`` / ``AGENTQ_CHAOS_STEPS``) runs a larger one."""

from __future__ import annotations

import os

import pytest

DEFAULT_THREADS = 30
DEFAULT_STEPS = 10


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("chaos", "agentq chaos test")
    group.addoption("--chaos-threads", type=int, default=None,
                    help=f"threads in the chaos test (default {DEFAULT_THREADS}, at least 30 "
                    "in CI)")
    group.addoption("--chaos-steps", type=int, default=None,
                    help=f"steps per thread in the chaos test (default {DEFAULT_STEPS}, at "
                    "least 8)")


def _size(config: pytest.Config, option: str, env: str, default: int) -> int:
    # getoption's default covers a run where this conftest was not loaded at startup (then
    # the option is unknown to the command line and only the environment variable works).
    value = config.getoption(option, default=None)
    if value is None:
        value = int(os.environ.get(env, default))
    return int(value)


@pytest.fixture
def chaos_size(request: pytest.FixtureRequest) -> tuple[int, int]:
    """``(threads, steps)`` for this run."""
    return (
        _size(request.config, "--chaos-threads", "AGENTQ_CHAOS_THREADS", DEFAULT_THREADS),
        _size(request.config, "--chaos-steps", "AGENTQ_CHAOS_STEPS", DEFAULT_STEPS),
    )
