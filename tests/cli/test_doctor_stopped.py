"""``agentq doctor`` stopped while its probe thread runs (``timeout``, a container
stopping): it must not leave that thread behind, running, for sweepers to send to workers
that have no task of its name."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import redis

from agentq.records import Status
from agentq.store.redis.store import RedisStore
from tests.chaos.flaky_proxy import FlakyProxy
from tests.support.redis_server import running_redis, wait_until

AGENTQ = Path(sys.executable).parent / "agentq"


def test_sigterm_during_the_probe_deletes_its_thread(tmp_path: Path) -> None:
    with running_redis(tmp_path) as server, RedisStore.from_url(server.url) as store:
        proxy = FlakyProxy(server.port)
        # The first probe commit's reply comes late: the probe is caught running.
        proxy.delay_reply_to, proxy.reply_delay = b"\xa5probe", 30.0
        doctor = subprocess.Popen(
            [str(AGENTQ), "--store", f"redis://127.0.0.1:{proxy.port}/0", "doctor"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            probing = wait_until(
                lambda: store.threads(Status.RUNNING), timeout=30, what="the probe running"
            )
            assert probing[0].thread_id.startswith("agentq-doctor-")
            doctor.send_signal(signal.SIGTERM)
            doctor.wait(timeout=30)
        finally:
            doctor.kill()
            proxy.close()
        assert doctor.returncode != 0
        assert store.threads() == []
        with redis.Redis.from_url(server.url) as client:
            assert client.keys("*doctor*") == []
