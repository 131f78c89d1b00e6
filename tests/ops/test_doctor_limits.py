"""``agentq doctor`` names the declared limits no call has taken from, in the store the app
uses, with the fix; they do not fail the check, since a fresh fleet has taken from none."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from agentq.cli.entry import cli
from agentq.limits import Limits
from agentq.store.contract.limits import Take
from agentq.store.redis.store import RedisStore
from tests.support.redis_server import RedisServer

APP = """
from celery import Celery
import agentq

app = Celery("doctor-limits", broker="memory://", set_as_current=False)
app.conf.worker_prefetch_multiplier = 1
LIMITS = [
    agentq.limit("openai", requests_per_minute=60, tokens_per_minute=1000),
    agentq.limit("tenant:{{tenant}}", requests_per_minute=6),
    agentq.limit("tenant:acme", requests_per_minute=18),
    agentq.limit("unused", concurrency=3),
    agentq.limit("seat:{{tenant}}", threads=3),
    agentq.limit("seat-unused", threads=1),
]
agentq.init_app(app, store="{url}", prefix="{prefix}", limits=LIMITS)
"""


def test_doctor_lists_the_limits_no_call_took_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_server: RedisServer
) -> None:
    monkeypatch.delenv("REMAP_SIGTERM", raising=False)
    prefix = f"doc{uuid.uuid4().hex[:6]}:"
    module = f"doctor_limits_{uuid.uuid4().hex[:6]}"
    (tmp_path / f"{module}.py").write_text(APP.format(url=redis_server.url, prefix=prefix))
    monkeypatch.syspath_prepend(str(tmp_path))
    limits = Limits(__import__(module).LIMITS)
    with RedisStore.from_url(redis_server.url, prefix=prefix) as store:
        takes = [
            Take("openai", limits.of("openai"), 10),
            Take("tenant:7", limits.of("tenant:7"), 0),
        ]
        assert store.take_limits(takes, "call-1", 60).taken
        # A thread ran under a threads-only limit: it is used, though no call takes from it.
        store.open_thread("keyed", task="t")
        token = store.acquire("keyed", "worker", 60)
        assert store.enter_key("keyed", "worker", token, "seat:7", 3) == 0

    result = CliRunner().invoke(cli, ["-A", f"{module}:app", "doctor", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    unused = {f["setting"]: f for f in report["unused_limits"]}
    # tenant:7 is the family's; the override for acme caps nothing yet.
    assert set(unused) == {"limit 'tenant:acme'", "limit 'unused'", "limit 'seat-unused'"}
    assert "limit='unused'" in unused["limit 'unused'"]["fix"]
    seat = unused["limit 'seat-unused'"]
    assert "concurrency_key='seat-unused'" in seat["fix"] and "limit=" not in seat["fix"]

    text = CliRunner().invoke(cli, ["-A", f"{module}:app", "doctor"])
    assert "limit 'unused'" in text.stdout and "caps nothing" in text.stdout
