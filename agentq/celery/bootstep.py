"""agentq inside a Celery worker: the sweeper, handing threads over on shutdown, and
cancelling the threads of revoked messages."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from celery import bootsteps
from celery.concurrency.thread import TaskPool as ThreadPool
from celery.signals import worker_shutting_down

from agentq.celery import revoke
from agentq.celery.drain import draining, relay_drain
from agentq.celery.recovery import Sweeper
from agentq.celery.runtime import runtime_of
from agentq.celery.store_guard import refuse_unsafe_store
from agentq.celery.task import refuse_autoretry_at_start
from agentq.engine import metrics

logger = logging.getLogger("agentq.worker")


def tasks_per_process(worker: Any) -> int:
    """Tasks one process of this worker runs at once: all of them in a threads, gevent or
    eventlet pool, one in each prefork child (and under solo)."""
    pool = worker.pool_cls
    in_process = getattr(pool, "is_green", False) or (
        isinstance(pool, type) and issubclass(pool, ThreadPool)
    )
    return int(worker.concurrency) if in_process else 1


def counts_in_children(worker: Any) -> bool:
    """Whether the worker's tasks, and so their counters, run in forked pool children
    that its main process, which serves /metrics, sees only through prometheus_client's
    multiprocess mode."""
    # Imported here, as Celery does: a gevent worker patches before the pool is imported.
    from celery.concurrency.prefork import TaskPool as PreforkPool

    pool = worker.pool_cls
    return isinstance(pool, type) and issubclass(pool, PreforkPool)


def check_store_at_start(app: Any) -> None:
    """Refuse to start on a store that would lose checkpoints (Celery stops the worker
    on the raised :class:`~agentq.errors.UnsafeStore`). A store that cannot be reached
    yet does not stop it: the sweeper checks it again once it answers."""
    runtime = runtime_of(app)
    store = runtime.store
    try:
        refuse_unsafe_store(store, runtime.settings)
    except Exception as exc:
        if not store.is_transient(exc):
            raise
        logger.warning("cannot check the store's settings yet (%s); the sweeper will", exc)


class AgentqWorkerStep(bootsteps.StartStopStep):  # type: ignore[misc]
    """Runs the sweeper in the worker's main process, relays shutdown to the pool, and
    cancels the thread of a revoked agent message (:mod:`agentq.celery.revoke`)."""

    requires = ("celery.worker.components:Pool",)

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        # Before the pool starts, so that prefork children inherit it.
        runtime_of(worker.app).tasks_at_once = tasks_per_process(worker)
        if worker.task_events:
            # -E gives the worker task events but leaves the app's setting as it was,
            # which is all a task (in a prefork child, too) can read: agentq's events
            # (task-progress, task-waiting, ...) follow the flag as Celery's own do.
            worker.app.conf.worker_send_task_events = True
        # Before any step starts: the first message the consumer reads may be revoked.
        revoke.connect()
        self.sweeper: Sweeper | None = None
        self._on_signal: Any = None
        self._stop_metrics: Callable[[], None] | None = None
        self._soft_wait: Any = None

    def start(self, worker: Any) -> None:
        draining.clear()  # a worker started again in the same process works normally
        refuse_autoretry_at_start(worker.app)
        check_store_at_start(worker.app)
        self.sweeper = Sweeper(worker.app)
        self.sweeper.start()
        runtime = runtime_of(worker.app)
        if runtime.settings.metrics_port is not None:
            self._stop_metrics = metrics.serve(runtime.store, int(runtime.settings.metrics_port))
            if counts_in_children(worker) and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
                # Else its counters would read 0 however many steps its children commit.
                logger.warning(
                    "metrics: this prefork worker's tasks count steps, retries and "
                    "takeovers in its pool's children, which /metrics cannot see: set "
                    "PROMETHEUS_MULTIPROC_DIR to an empty directory for this worker before "
                    "it starts (prometheus_client's multiprocess mode)"
                )

        # Sent from inside the SIGTERM handler: relaying here rather than in close(),
        # which waits for the event loop to wake, lets no agent start another step.
        def on_signal(sender: Any = None, **_: Any) -> None:
            if sender == worker.hostname:
                relay_drain(worker)

        self._on_signal = on_signal
        worker_shutting_down.connect(on_signal, weak=False)
        self._relay_on_soft_shutdown(worker)

    def _relay_on_soft_shutdown(self, worker: Any) -> None:
        """A cold shutdown (SIGQUIT) sends ``worker_shutting_down`` only after its soft
        shutdown's wait (``worker_soft_shutdown_timeout``), the time Celery gives running
        tasks before it cancels them: relayed as that wait begins, the hand-over lets each
        agent hand its thread over in it, rather than run on until it is cut off mid-step
        and taken for a lost worker."""
        waiting = getattr(worker, "wait_for_soft_shutdown", None)
        if waiting is None:  # a Celery without soft shutdowns
            return

        def wait_for_soft_shutdown() -> Any:
            relay_drain(worker)
            return waiting()

        worker.wait_for_soft_shutdown = wait_for_soft_shutdown
        self._soft_wait = wait_for_soft_shutdown

    def close(self, worker: Any) -> None:
        # Every shutdown passes here (also one not started by a signal), before the pool
        # waits for running tasks.
        relayed = relay_drain(worker)
        logger.info(
            "worker shutting down: asked %d pool processes to hand over their threads", relayed
        )

    def stop(self, worker: Any) -> None:
        if self._on_signal is not None:
            worker_shutting_down.disconnect(self._on_signal)
        if self._soft_wait is not None and vars(worker).get("wait_for_soft_shutdown") is (
            self._soft_wait
        ):
            del worker.wait_for_soft_shutdown  # a worker started again wraps Celery's own
        if self.sweeper is not None:
            self.sweeper.stop()
        if self._stop_metrics is not None:
            self._stop_metrics()
            self._stop_metrics = None

    def terminate(self, worker: Any) -> None:
        # A cold shutdown sends no worker_shutdown: clear the hand-over here instead.
        self.stop(worker)
        draining.clear()
