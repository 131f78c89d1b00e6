"""How long the store takes to answer: every step of every agent pays one commit."""

from __future__ import annotations

import contextlib
import statistics
import time
import uuid
from dataclasses import dataclass, field
from typing import Final

from agentq.records import Checkpoint, Status
from agentq.store.contract import Store

PROBE_TASK: Final = "agentq.ops.doctor.probe"
ROUNDS: Final = 5
_LEASE: Final = 60.0
_NEVER_DUE: Final = 24 * 3600.0


@dataclass(frozen=True)
class RoundTrips:
    """Milliseconds taken by each of several identical operations."""

    operation: str
    samples_ms: list[float] = field(default_factory=list)

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples_ms)

    @property
    def worst_ms(self) -> float:
        return max(self.samples_ms)


def _timed(samples: list[float], start: float) -> None:
    samples.append((time.perf_counter() - start) * 1000)


def measure(store: Store, rounds: int = ROUNDS) -> list[RoundTrips]:
    """Time ``rounds`` reads and ``rounds`` checkpoint commits on a scratch thread, which
    is deleted afterwards (it never becomes due, so no sweeper sends it meanwhile)."""
    thread_id = f"agentq-doctor-{uuid.uuid4().hex[:12]}"
    owner = f"agentq-doctor:{uuid.uuid4().hex[:8]}"
    reads: list[float] = []
    commits: list[float] = []
    for _ in range(rounds):
        start = time.perf_counter()
        store.meta(thread_id)
        _timed(reads, start)
    store.open_thread(thread_id, task=PROBE_TASK, start_grace=_NEVER_DUE)
    try:
        token = store.acquire(thread_id, owner, _LEASE)
        for step in range(rounds):
            last = step == rounds - 1
            checkpoint = Checkpoint(
                step=step,
                node=None if last else "probe",
                state={"probe": step},
                task=PROBE_TASK,
                token=token,
                created_at=time.time(),
            )
            start = time.perf_counter()
            store.commit(
                thread_id,
                token,
                checkpoint,
                status=Status.DONE if last else Status.RUNNING,
                due_in=None,
                release_owner=owner if last else None,
            )
            _timed(commits, start)
    except BaseException:
        # The measurement's own error is the one to see; cleaning up is best effort then.
        with contextlib.suppress(Exception):
            store.delete_thread(thread_id)
        raise
    store.delete_thread(thread_id)
    return [RoundTrips("read", reads), RoundTrips("commit", commits)]
