"""``agentq demo`` as a newcomer runs it: a real process that starts real workers.

Each run must exit 0 with the guarantees in its summary, and leave nothing behind: no
worker process, no directory, no Redis key of its namespace.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.support.redis_server import RedisServer, wait_until

pytestmark = pytest.mark.slow

AGENTQ = str(Path(sys.executable).parent / "agentq")
DEMO_DEADLINE = 60.0  # the demo promises well under a minute
NAMESPACE = re.compile(r"(agentq-demo-[A-Za-z0-9_]+)")


def demo_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTQ_")}
    return {**env, "PYTHONUNBUFFERED": "1"}


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line contains ``text`` (a run's namespace)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline:
            found.append(int(entry.name))
    return found


def assert_summary(output: str) -> None:
    assert re.search(r"^\s+steps committed\s+4 \(0, 1, 2, 3\)$", output, re.M), output
    assert re.search(r"^\s+model calls\s+2\b", output, re.M), output
    assert re.search(r"^\s+refunds issued\s+1$", output, re.M), output
    assert "SIGKILL worker A" in output
    assert "takes the thread over" in output
    assert "no money moved" in output  # the idempotent re-run reached the payment service
    assert "✗" not in output
    assert output.rstrip().endswith("All guarantees held.")


def run_demo(*args: str, env: dict[str, str] | None = None) -> tuple[str, str]:
    done = subprocess.run(
        [AGENTQ, "demo", *args],
        env={**demo_env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=DEMO_DEADLINE,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    match = NAMESPACE.search(done.stdout)
    assert match, done.stdout
    return done.stdout, match.group(1)


def test_demo_on_the_embedded_default() -> None:
    # A broker in the user's environment must not capture the demo's messages.
    output, namespace = run_demo(env={"CELERY_BROKER_URL": "redis://127.0.0.1:1/0"})
    workdir = re.search(r"filesystem broker in (\S+)", output)
    assert workdir and Path(workdir.group(1)).name == namespace, output
    assert_summary(output)
    assert not processes_mentioning(namespace)
    assert not Path(workdir.group(1)).exists()


def test_demo_on_redis(redis_server: RedisServer) -> None:
    output, namespace = run_demo("--redis", redis_server.url)
    assert f"Redis at {redis_server.url}" in output
    assert_summary(output)
    assert not processes_mentioning(namespace)
    client = redis_server.client()
    try:
        assert list(client.scan_iter(match=f"{namespace}:*")) == []
    finally:
        client.close()


def test_demo_interrupted_stops_its_workers_and_cleans_up(tmp_path: Path) -> None:
    lines: list[str] = []
    with (
        open(tmp_path / "stderr", "w+") as stderr,
        subprocess.Popen(
            [AGENTQ, "demo"], env=demo_env(), stdout=subprocess.PIPE, stderr=stderr, text=True
        ) as demo,
    ):
        assert demo.stdout is not None
        reader = threading.Thread(target=lambda: lines.extend(demo.stdout), daemon=True)
        reader.start()
        try:
            # Interrupt once worker A runs, as a user pressing Ctrl-C would.
            wait_until(
                lambda: any("ready (pid" in line for line in lines),
                timeout=30,
                what="worker A ready",
            )
            found = NAMESPACE.search("".join(lines))
            assert found
            namespace = found.group(1)
            assert processes_mentioning(namespace)
            demo.send_signal(signal.SIGINT)
            assert demo.wait(timeout=30) == 130
        finally:
            if demo.poll() is None:
                demo.kill()
        reader.join(timeout=10)
        stderr.seek(0)
        assert "Traceback" not in stderr.read()
    output = "".join(lines)
    assert "interrupted; every worker was stopped" in output
    assert not processes_mentioning(namespace)
    workdir = re.search(r"filesystem broker in (\S+)", output)
    assert workdir and not Path(workdir.group(1)).exists()


def test_demo_refuses_an_unreachable_redis() -> None:
    done = subprocess.run(
        [AGENTQ, "demo", "--redis", "redis://127.0.0.1:1/0"],
        env=demo_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "cannot reach the store" in done.stderr


def test_demo_redis_url_from_the_environment(redis_server: RedisServer) -> None:
    done = subprocess.run(
        [AGENTQ, "demo"],
        env={**demo_env(), "AGENTQ_REDIS_URL": redis_server.url},
        capture_output=True,
        text=True,
        timeout=DEMO_DEADLINE,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"Redis at {redis_server.url}" in done.stdout
