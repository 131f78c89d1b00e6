"""``agentq ui`` and ``celery -A proj agentq ui`` as real processes: what they print, the
token off loopback, and the store they serve."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from agentq.store.redis.store import RedisStore
from agentq.store.sqlite.store import SQLiteStore
from tests.support.redis_server import RedisServer
from tests.ui.population import populate

BIN = Path(sys.executable).parent


@contextmanager
def running(args: list[str], env: dict[str, str] | None = None) -> Iterator[tuple[str, str]]:
    """Start the command; yield the line it printed and the base URL it listens on."""
    process = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # the per-test timeout bounds the wait
        assert line.startswith("agentq ui on http://"), line + process.stderr.read()  # type: ignore[union-attr]
        port = line.split("http://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1]
        yield line, f"http://127.0.0.1:{port}"
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=20)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def redis_store(redis_server: RedisServer) -> Iterator[tuple[list[str], RedisStore]]:
    prefix = f"uicli{uuid.uuid4().hex[:8]}:"
    with RedisStore.from_url(redis_server.url, prefix=prefix) as store:
        populate(store)
        yield [str(BIN / "agentq"), "--store", redis_server.url, "--prefix", prefix], store


def test_off_loopback_it_prints_a_link_with_a_token_and_refuses_without(
    redis_store: tuple[list[str], RedisStore],
) -> None:
    agentq, _ = redis_store
    with running([*agentq, "ui", "--host", "0.0.0.0", "--port", "0"]) as (line, base):
        assert "?token=" in line
        link = line.split()[3]
        assert httpx.get(base + "/threads").status_code == 401
        assert httpx.get(base + "/thread?id=t-done").status_code == 401
        token = link.split("?token=", 1)[1]
        with httpx.Client(follow_redirects=True) as client:
            page = client.get(base + "/threads?token=" + token)
            assert page.status_code == 200 and "t-done" in page.text
            assert client.get(base + "/thread?id=t-done").status_code == 200  # the cookie


def test_the_token_can_come_from_the_environment(
    redis_store: tuple[list[str], RedisStore],
) -> None:
    agentq, _ = redis_store
    env = {"AGENTQ_UI_TOKEN": "from-the-env"}
    with running([*agentq, "ui", "--host", "0.0.0.0", "--port", "0"], env) as (line, base):
        assert "from-the-env" not in line and "token from AGENTQ_UI_TOKEN" in line
        assert httpx.get(base + "/threads").status_code == 401
        bearer = {"authorization": "Bearer from-the-env"}
        assert httpx.get(base + "/threads", headers=bearer).status_code == 200


def test_a_token_from_the_environment_is_asked_for_on_loopback_too(
    redis_store: tuple[list[str], RedisStore],
) -> None:
    agentq, _ = redis_store
    env = {"AGENTQ_UI_TOKEN": "from-the-env"}
    with running([*agentq, "ui", "--port", "0"], env) as (line, base):
        assert "token from AGENTQ_UI_TOKEN" in line
        bearer = {"authorization": "Bearer from-the-env"}
        for path in ("/threads", "/metrics"):
            assert httpx.get(base + path).status_code == 401, path
            assert httpx.get(base + path, headers=bearer).status_code == 200, path


def test_on_loopback_it_needs_no_token_and_read_only_offers_nothing(
    redis_store: tuple[list[str], RedisStore],
) -> None:
    agentq, _ = redis_store
    with running([*agentq, "ui", "--port", "0", "--read-only"]) as (line, base):
        assert "token" not in line and "read-only" in line
        page = httpx.get(base + "/thread?id=t-waiting")
        assert page.status_code == 200 and 'id="read-only"' in page.text
        assert 'method="post"' not in page.text


def test_under_celery_it_serves_the_apps_store(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "agentq.db") as store:
        populate(store)
    env = {
        "AGENTQ_DEMO_WORKDIR": str(tmp_path),
        "AGENTQ_DEMO_STORE": f"sqlite:///{tmp_path / 'agentq.db'}",
        "AGENTQ_DEMO_NAMESPACE": "ui",
        "AGENTQ_DEMO_BROKER": "filesystem://",
        "AGENTQ_DEMO_LEDGER": str(tmp_path / "payments.db"),
    }
    for folder in ("messages", "processed", "control"):
        (tmp_path / "broker" / folder).mkdir(parents=True)
    celery = [str(BIN / "celery"), "-A", "agentq.demo.app", "agentq", "ui", "--port", "0"]
    with running(celery, env) as (_, base):
        page = httpx.get(base + "/threads?status=waiting")
        assert page.status_code == 200 and 'data-thread="t-waiting"' in page.text


def test_an_ipv6_host_given_in_brackets_prints_a_link_that_opens(
    redis_store: tuple[list[str], RedisStore],
) -> None:
    # --host takes [::1] as it takes ::1 (it listens on the address inside the brackets):
    # the link it prints must be one a browser opens, not http://[[::1]]:PORT/.
    agentq, _ = redis_store
    with running([*agentq, "ui", "--host", "[::1]", "--port", "0"]) as (line, _):
        link = line.split()[3]
        assert link.startswith("http://[::1]:"), line
        assert httpx.get(link + "threads").status_code == 200
