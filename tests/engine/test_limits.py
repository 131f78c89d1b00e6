"""Taking limits in place: waiters on the rate queue behind each other once, not poll."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import agentq
from agentq.engine.limits import Held, take
from agentq.limits import Limits
from agentq.store.contract.limits import Grant, Take
from agentq.store.sqlite.store import SQLiteStore


class CountingStore(SQLiteStore):
    """The embedded store, counting the takes asked of it."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.asked = 0
        self._lock = threading.Lock()

    def take_limits(self, takes: list[Take], holder: str, ttl: float, *args: Any) -> Grant:
        with self._lock:
            self.asked += 1
        return super().take_limits(takes, holder, ttl, *args)


def test_callers_waiting_on_the_rate_each_take_once_and_queue_behind_each_other(
    tmp_path: Path,
) -> None:
    limits = Limits([agentq.limit("api", requests_per_minute=600, burst=1)])
    with CountingStore(tmp_path / "agentq.db") as store:
        held: list[Held] = []

        def call(i: int) -> None:
            held.append(take(store, limits, "api", 0, ttl=30, wait=5, thread_id=f"t{i}", step=0))

        callers = [threading.Thread(target=call, args=(i,)) for i in range(5)]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join()
        assert store.asked == 5  # one take each: the four behind the first were reserved
        waits = sorted(h.waited for h in held)
        assert waits[0] == 0
        assert waits[-1] <= 0.4 + 1e-6, waits  # the last of five, four intervals of 0.1 s
