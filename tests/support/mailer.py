"""An agent the engine drives without Celery, whose tool calls send mails and log each one
in Redis; run as ``python -m tests.support.mailer STORE_URL PREFIX THREAD`` it drives one
thread of two mails under the limit :data:`ONE_EVERY_2S` (a process to kill mid-call).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any, cast

import agentq
from agentq import Done, Run
from agentq.engine.driver import Driver
from agentq.records import ThreadMeta
from agentq.settings import Settings
from agentq.store.redis.store import RedisStore

ONE_EVERY_2S = agentq.limit("api", requests_per_minute=30, burst=1)
"""A limit whose second call in a row waits about 2 s in place for its turn."""


class Mailer:
    """Sends ``mails`` mails (keys ``mail-1``, ``mail-2``, …) in its one node, each under
    ``limit`` if one is named and at ``cost`` tokens, after calling ``before``;
    ``asynchronous`` sends them from an ``async def`` node with ``run.atool``. Each mail
    sent is pushed onto ``<prefix>sent`` in ``store``'s Redis."""

    name = "tests.mailer"
    append_only: tuple[str, ...] = ()

    def __init__(
        self,
        store: RedisStore,
        *,
        mails: int = 1,
        limit: str | None = None,
        cost: float = 0,
        asynchronous: bool = False,
        before: Callable[[], None] = lambda: None,
    ) -> None:
        self.ledger = store.client
        self.sent_key = f"{store.keys.prefix}sent"
        self.mails = mails
        self.limit = limit
        self.cost = cost
        self.entry_node = "send_async" if asynchronous else "send"
        self.before = before

    def sent(self) -> list[str]:
        return [to.decode() for to in cast(list[bytes], self.ledger.lrange(self.sent_key, 0, -1))]

    def mail(self, to: str) -> str:
        self.ledger.rpush(self.sent_key, to)
        return f"sent to {to}"

    async def amail(self, to: str) -> str:
        return self.mail(to)

    def send(self, run: Run) -> Done:
        self.before()
        sent = [
            run.tool(self.mail, f"to-{n}", key=f"mail-{n}", limit=self.limit, cost=self.cost)
            for n in range(1, self.mails + 1)
        ]
        return Done(sent)

    async def send_async(self, run: Run) -> Done:
        self.before()
        sent = [
            await run.atool(
                self.amail, f"to-{n}", key=f"mail-{n}", limit=self.limit, cost=self.cost
            )
            for n in range(1, self.mails + 1)
        ]
        return Done(sent)

    def should_retry(self, exc: BaseException) -> bool:
        return False

    def on_step(
        self,
        thread_id: str,
        step: int,
        node: str,
        next_node: str | None,
        *,
        limit_waits: Sequence[dict[str, Any]] = (),
    ) -> None:
        pass

    def on_limit_wait(
        self, thread_id: str, step: int, node: str, limit_waits: Sequence[dict[str, Any]]
    ) -> None:
        pass

    def resend(self, meta: ThreadMeta) -> None:
        pass

    def find_node(self, name: str) -> Callable[..., Any] | None:
        node = getattr(self, name, None) if not name.startswith("_") else None
        return node if callable(node) else None


def drive(agent: Mailer, thread_id: str, store: RedisStore, settings: Settings) -> Any:
    """One driver's run of the thread, as one task would make it."""
    return Driver(agent, thread_id, store, settings, lambda: False).drive()


if __name__ == "__main__":
    url, prefix, thread_id = sys.argv[1:]
    with RedisStore.from_url(url, prefix=prefix) as store:
        agent = Mailer(store, mails=2, limit="api")
        settings = Settings(store=store, lease_ttl=1, limits=(ONE_EVERY_2S,), limit_wait=10)
        drive(agent, thread_id, store, settings)
