"""How long the inspector's threads page takes on a large store: server time per page
over 100 000 threads, against one ``ZREVRANGE`` page of the status index.

Run from the repository root::

    python -m bench.ui [--quick]

A private ``redis-server`` gets 100 000 threads (``--quick``: 5000), one in ten cancelled,
the rest queued, through ``Store.open_thread``. The inspector's ASGI app is then called
in process, without a socket or an HTTP client, so each sample is the server's own time:
routing, the page's one store call (``Store.listing``: the status counts, a page of the
index and each row's fields, in one script) and rendering 50 rows. Samples alternate with
the baseline, one ``ZREVRANGE ... WITHSCORES`` of the same 50 entries, so both see the same
machine load.
Targets: the page under 50 ms, and at most 3 times the baseline. Both sides read their
replies with the client's parser: hiredis when it is installed, redis-py's own Python
parser otherwise; the rows say which.

Three more rows, in the same rotation, take the page apart, each ÷ the same baseline: the
page's store call alone (``Store.listing``, decoded rows included); the least any page of
50 threads' fields costs, one pipeline of 50 ``HMGET`` of the nine fields a row shows,
without the index read before it; and rendering the page from rows already read.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from bench._redis import PrivateRedis
from bench._report import Result, Target, exit_with, median, micros, millis, standalone

THREADS = {False: 100_000, True: 5000}
SAMPLES = {False: 300, True: 50}
PAGE = 50
PAGE_TARGET = Target(50.0)
RATIO_TARGET = Target(3.0)


async def get(app: Any, path: str, query: str = "") -> float:
    """Serve one GET through ``app``; return its seconds (refusing anything but a 200)."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "headers": [(b"host", b"127.0.0.1")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 8765),
    }
    status: list[int] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])

    started = time.perf_counter()
    await app(scope, receive, send)
    elapsed = time.perf_counter() - started
    if status != [200]:
        raise RuntimeError(f"GET {path}?{query} answered {status}")
    return elapsed


FIELDS = ("status", "step", "node", "task", "attempts", "crashes", "updated_at", "error", "cancel")
"""What a row of the page shows of a thread's meta."""


def timed(call: Callable[[], Any]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


async def measure(
    app: Any, client: Any, index: str, samples: int, parts: dict[str, Callable[[], Any]]
) -> dict[str, list[float]]:
    """Seconds of each sample: both pages, the baseline and each of ``parts``."""
    times: dict[str, list[float]] = {"all": [], "queued": [], "zrevrange": []}
    times.update({name: [] for name in parts})
    for warmup in (True, False):
        for _ in range(max(5, samples // 10) if warmup else samples):
            taken = {
                "all": await get(app, "/threads"),
                "queued": await get(app, "/threads", "status=queued"),
                "zrevrange": timed(lambda: client.zrevrange(index, 0, PAGE - 1, withscores=True)),
            }
            taken.update({name: timed(part) for name, part in parts.items()})
            if not warmup:
                for name, seconds in taken.items():
                    times[name].append(seconds)
    return times


def run(quick: bool) -> list[Result]:
    from redis.utils import HIREDIS_AVAILABLE

    from agentq.records import Status
    from agentq.store.redis import wire
    from agentq.store.redis.store import RedisStore
    from agentq.ui import create_app
    from agentq.ui.views import Filter, threads_page

    count = THREADS[quick]
    # Filling the store is not what is measured: no fsync per thread for it.
    with PrivateRedis("--appendfsync", "no") as server:
        client = server.client()
        store = RedisStore(client)
        try:
            for n in range(count):
                store.open_thread(f"bench-{n:06d}", task="bench.agent", start_grace=86400)
                if n % 10 == 0:
                    store.request_cancel(f"bench-{n:06d}")
            app = create_app(store)
            index = store.keys.status_index("queued")
            metas = [store.keys.meta(t.decode()) for t in client.zrevrange(index, 0, PAGE - 1)]
            wanted = Filter(Status.QUEUED)
            page = threads_page(store, wanted, None)
            template = app.state.inspector.templates.get_template("threads.html")
            context = {
                "page": page,
                "wanted": wanted,
                "query": "status=queued",
                "live_query": "status=queued",
                "next_query": f"status=queued&after={page.next_after}",
                "first_query": None,
                "read_only": False,
                "csrf": "-",
            }
            parts: dict[str, Callable[[], Any]] = {
                "store": lambda: store.listing(Status.QUEUED, limit=PAGE + 1),
                "fields": lambda: wire.send(
                    client, [("HMGET", meta, *FIELDS) for meta in metas], transaction=False
                ),
                "render": lambda: template.render(context),
            }
            times = asyncio.run(measure(app, client, index, SAMPLES[quick], parts))
        finally:
            client.close()
    base = median(times["zrevrange"])
    queued, every = median(times["queued"]), median(times["all"])
    parser = "hiredis" if HIREDIS_AVAILABLE else "redis-py's parser"
    what = f"over {count} threads, {parser}"
    return [
        Result(
            "figure",
            "ui_threads_page_ms",
            every * 1000,
            f"inspector threads page, every status, {what}",
            millis(every),
            target=PAGE_TARGET,
        ),
        Result(
            "ratio",
            "ui_threads_page_over_zrevrange",
            queued / base,
            f"inspector page of queued threads ÷ one ZREVRANGE page, {what}",
            millis(queued),
            micros(base),
            RATIO_TARGET,
        ),
        *(
            Result(
                "ratio",
                f"ui_{name}_over_zrevrange",
                median(times[name]) / base,
                what_part,
                micros(median(times[name])),
                micros(base),
            )
            for name, what_part in (
                (
                    "store",
                    f"its store call (Store.listing, rows decoded) ÷ one ZREVRANGE page, {what}",
                ),
                (
                    "fields",
                    f"floor: 50 rows' fields, one pipeline of HMGETs ÷ one ZREVRANGE page, {what}",
                ),
                ("render", "its rendering from rows already read ÷ one ZREVRANGE page"),
            )
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    return standalone("python -m bench.ui", __doc__, run, argv)


if __name__ == "__main__":
    exit_with(main)
