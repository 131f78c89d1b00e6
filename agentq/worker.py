"""agentq inside a Celery worker: the sweeper, and handing threads over on shutdown.

On a warm shutdown (SIGTERM) Celery waits for running tasks, but only the main process
knows it is shutting down; prefork children do not. The worker step below relays it to
them with SIGUSR2, and each running agent then commits its current node, releases its
lease, re-sends itself and returns, so the worker exits within one step.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from types import FrameType
from typing import Any

from celery import bootsteps
from celery.signals import worker_process_init, worker_shutdown, worker_shutting_down

from agentq.sweeper import Sweeper

logger = logging.getLogger("agentq.worker")

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


def _relay_drain(worker: Any) -> int:
    """Ask this process's running agents and the pool's processes to hand over."""
    draining.set()
    processes = (worker.pool.info or {}).get("processes", []) if worker.pool else []
    for pid in processes:
        if pid != os.getpid():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, DRAIN_SIGNAL)
    return len(processes)


class AgentqWorkerStep(bootsteps.StartStopStep):  # type: ignore[misc]
    """Runs the sweeper in the worker's main process and relays shutdown to the pool."""

    requires = ("celery.worker.components:Pool",)

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.sweeper: Sweeper | None = None
        self._on_signal: Any = None

    def start(self, worker: Any) -> None:
        draining.clear()  # a worker started again in the same process works normally
        self.sweeper = Sweeper(worker.app)
        self.sweeper.start()

        # Sent from inside the SIGTERM handler: relaying here rather than in close(),
        # which waits for the event loop to wake, lets no agent start another step.
        def on_signal(sender: Any = None, **_: Any) -> None:
            if sender == worker.hostname:
                _relay_drain(worker)

        self._on_signal = on_signal
        worker_shutting_down.connect(on_signal, weak=False)

    def close(self, worker: Any) -> None:
        # Every shutdown passes here (also one not started by a signal), before the pool
        # waits for running tasks.
        relayed = _relay_drain(worker)
        logger.info("worker shutting down: asked %d pool processes to hand over their "
                    "threads", relayed)

    def stop(self, worker: Any) -> None:
        if self._on_signal is not None:
            worker_shutting_down.disconnect(self._on_signal)
        if self.sweeper is not None:
            self.sweeper.stop()

    def terminate(self, worker: Any) -> None:
        # A cold shutdown sends no worker_shutdown: clear the hand-over here instead.
        self.stop(worker)
        draining.clear()
