"""The hand-over flag: set in a process whose worker is shutting down.

On a warm shutdown (SIGTERM) Celery waits for running tasks, but only the main process
knows it is shutting down; prefork children do not. The worker's bootstep relays it to
them with SIGUSR2, and each running agent then commits its current node, releases its
lease, re-sends itself and returns, so the worker exits within one step.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from types import FrameType
from typing import Any

from celery.signals import worker_process_init, worker_shutdown

draining = threading.Event()
"""Set in a process whose worker is shutting down: agents hand their threads over."""

DRAIN_SIGNAL = signal.SIGUSR2


def _on_drain_signal(signum: int, frame: FrameType | None) -> None:
    draining.set()


@worker_process_init.connect  # type: ignore[untyped-decorator]
def _install_drain_handler(**_: Any) -> None:
    draining.clear()
    signal.signal(DRAIN_SIGNAL, _on_drain_signal)


@worker_shutdown.connect  # type: ignore[untyped-decorator]
def _drained(**_: Any) -> None:
    # The worker is gone; another one started in this process (tests, embedded use) must
    # not inherit the hand-over.
    draining.clear()


def relay_drain(worker: Any) -> int:
    """Ask this process's running agents and the pool's processes to hand over."""
    draining.set()
    processes = _pool_processes(worker)
    for pid in processes:
        if pid != os.getpid():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, DRAIN_SIGNAL)
    return len(processes)


def _pool_processes(worker: Any) -> list[int]:
    """The pool's processes; none once the pool is stopped: a cold shutdown stops it
    before it sends ``worker_shutting_down`` and closes the bootsteps, and a prefork
    pool's ``info`` then raises, which would break off the rest of the shutdown."""
    if not worker.pool:
        return []
    try:
        info = worker.pool.info
    except AttributeError:  # prefork's, its processes gone with it
        return []
    return list((info or {}).get("processes", []))
