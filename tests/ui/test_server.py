"""The inspector's server without a browser: what it answers when the store does not."""

from __future__ import annotations

from pathlib import Path

import httpx

from agentq.store.redis.store import RedisStore
from agentq.ui import create_app
from tests.support.redis_server import running_redis
from tests.ui.conftest import serving
from tests.ui.population import populate


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
