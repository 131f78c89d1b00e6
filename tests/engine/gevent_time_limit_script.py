"""Run as ``python -m tests.engine.gevent_time_limit_script STORE_URL PREFIX``: under
gevent, a hard time limit is ``gevent.Timeout`` raised in the task's greenlet (Celery's
gevent pool); here it hits while an ``atool`` waits for its limit. Prints how many tasks
are left on agentq's loop afterwards."""

from gevent import monkey

monkey.patch_all()

import asyncio  # noqa: E402
import sys  # noqa: E402
from typing import Any  # noqa: E402

import gevent  # noqa: E402

from agentq.engine import aio  # noqa: E402
from agentq.settings import Settings  # noqa: E402
from agentq.store.redis.store import RedisStore  # noqa: E402
from tests.support.mailer import ONE_EVERY_2S, Mailer, drive  # noqa: E402


async def others() -> int:
    return sum(1 for task in asyncio.all_tasks() if task is not asyncio.current_task())


class QuietMailer(Mailer):
    """Its tool touches no socket: under gevent the loop's thread must not use the hub's."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.done: list[str] = []

    async def amail(self, to: str) -> str:
        self.done.append(to)
        return f"sent to {to}"


def main(url: str, prefix: str) -> None:
    with RedisStore.from_url(url, prefix=prefix) as store:
        agent = QuietMailer(store, mails=2, limit="api", asynchronous=True)
        store.open_thread("t1", task=agent.name)
        settings = Settings(store=store, limits=(ONE_EVERY_2S,), limit_wait=10)

        def task() -> None:
            try:
                with gevent.Timeout(1.0):  # the second mail waits about 2 s for its limit
                    drive(agent, "t1", store, settings)
            except gevent.Timeout:
                print("timed out after", agent.done, flush=True)

        gevent.spawn(task).join()
        future = asyncio.run_coroutine_threadsafe(others(), aio._process_loop())
        deadline = 10.0
        while (left := future.result(5)) and deadline > 0:
            gevent.sleep(0.1)  # the cancelled coroutine ends as soon as its calls answer
            deadline -= 0.1
            future = asyncio.run_coroutine_threadsafe(others(), aio._process_loop())
        print("LEFT", left, flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
