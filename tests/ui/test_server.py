"""The inspector's server without a browser: what it answers when the store does not."""

from __future__ import annotations

from pathlib import Path

import httpx

from agentq.records import Status
from agentq.store.redis.store import RedisStore
from agentq.ui import create_app
from tests.support.redis_server import running_redis, wait_until
from tests.ui.conftest import serving
from tests.ui.population import OWNER, drive, populate


def test_a_store_that_stops_answering_gets_a_page_saying_so(tmp_path: Path) -> None:
    with running_redis(tmp_path) as server:
        store = RedisStore.from_url(server.url)
        with store, serving(create_app(store)) as base:
            populate(store)
            assert httpx.get(base + "/threads").status_code == 200
            server.kill()
            down = httpx.get(base + "/threads")
            assert down.status_code == 503 and "the store did not answer" in down.text
            server.start()
            assert httpx.get(base + "/threads").status_code == 200


def test_a_thread_page_says_when_a_wait_times_out_and_that_it_did(tmp_path: Path) -> None:
    with running_redis(tmp_path) as server:
        store = RedisStore.from_url(server.url)
        with store, serving(create_app(store)) as base:
            token = drive(store, "t-deadline", [{"amount": 10}])
            store.set_status("t-deadline", token, Status.WAITING, due_in=3600, release_owner=OWNER)
            page = httpx.get(base + "/thread", params={"id": "t-deadline"}).text
            assert "times out" in page and "after 1h of waiting" in page
            assert "timed out" not in page

            store.set_status("t-deadline", token, Status.WAITING, due_in=0, release_owner=OWNER)
            wait_until(lambda: store.due(), timeout=5, what="the timeout due")
            store.acquire("t-deadline", OWNER, 30)
            page = httpx.get(base + "/thread", params={"id": "t-deadline"}).text
            assert "nobody answered within 0s" in page
