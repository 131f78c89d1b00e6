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
from celery.signals import worker_process_init

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


class AgentqWorkerStep(bootsteps.StartStopStep):  # type: ignore[misc]
    """Runs the sweeper in the worker's main process and relays shutdown to the pool."""

    requires = ("celery.worker.components:Pool",)

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.sweeper: Sweeper | None = None

    def start(self, worker: Any) -> None:
        draining.clear()  # a worker started again in the same process works normally
        self.sweeper = Sweeper(worker.app)
        self.sweeper.start()

    def close(self, worker: Any) -> None:
        # Called first on shutdown, before the pool waits for running tasks.
        draining.set()
        processes = (worker.pool.info or {}).get("processes", []) if worker.pool else []
        for pid in processes:
            if pid != os.getpid():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, DRAIN_SIGNAL)
        logger.info("worker shutting down: asked %d pool processes to hand over their "
                    "threads", len(processes))

    def stop(self, worker: Any) -> None:
        if self.sweeper is not None:
            self.sweeper.stop()

    terminate = stop
