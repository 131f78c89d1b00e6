"""Drives one thread for one task execution: lease, resume, node loop, commit per step."""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, NoReturn

from agentq.codec import encode_value
from agentq.engine import instrument, metrics
from agentq.engine.agent import Agent
from agentq.engine.aio import run_coroutine
from agentq.engine.append_only import AppendOnlyFields
from agentq.engine.backoff import retry_delay
from agentq.engine.lease import Lease, confirm, keeper_for
from agentq.engine.limits import limiter
from agentq.engine.run import NO_VALUE, Run, TimedOut
from agentq.engine.signatures import misfit
from agentq.engine.store_retry import RetriedCalls, give_back, raised_in_store
from agentq.engine.thread_keys import KeyRefused, KeySeat, KeyWait, leave, seated
from agentq.engine.transition import checkpoint_after, checkpoint_lost, error_text, meta_after
from agentq.errors import (
    AgentqError,
    AppendOnlyViolation,
    CheckpointNotFound,
    CodecError,
    FencingError,
    InvalidArgument,
    InvalidInput,
    LeaseHeld,
    LogConflict,
    NeedsAttention,
    RetryNotDue,
    ThreadNotFound,
    UnknownNode,
)
from agentq.ids import owner_id
from agentq.outcomes import Interrupted, LimitWait
from agentq.records import Checkpoint, Status, ThreadMeta
from agentq.settings import Settings
from agentq.store.contract import Store, Taken

logger = logging.getLogger("agentq")


@dataclass
class _Position:
    """Where a thread stands between two steps: what the next node starts from."""

    step: int
    node: str
    state: dict[str, Any]
    pending: list[Any]
    cursors: dict[str, Any]
    resume_value: Any
    attempts: int
    crashes: int
    """The workers lost running this step, as the take counted them."""


_CONTINUE: Final = object()
"""Returned by a step whose thread goes on to the next node."""


class Driver:
    """Runs a thread's nodes until it finishes, pauses, fails, retries, is cancelled,
    is handed over (``should_stop``), loses its lease, or finds its concurrency key full.

    Every state change goes through the store under the lease's fencing token, so the
    driver holds nothing that a crash could lose beyond the node in flight.
    """

    def __init__(
        self,
        task: Agent,
        thread_id: str,
        store: Store,
        settings: Settings,
        should_stop: Callable[[], bool],
        *,
        may_open: bool = True,
        seat_of: Callable[[ThreadMeta], KeySeat | None] = lambda meta: None,
        first_revoked: bool = False,
        interruptions: tuple[type[BaseException], ...] = (),
    ) -> None:
        self.task = task
        self.thread_id = thread_id
        self.store = store
        self.settings = settings
        self.should_stop = should_stop
        self.may_open = may_open  # else a thread the store lacks was deleted since its message
        self.owner = owner_id()
        self._calls = RetriedCalls(store, thread_id, settings.lease_ttl)
        self._commit = instrument.commit(thread_id, store.commit)
        self.seat_of = seat_of  # the thread's concurrency key, if it has one
        # Its first task was revoked (Celery's word for "do not run this"), which this
        # later message does not show: a thread that has committed no step stops, unless
        # a person answered it since (their resume outranks the revoke).
        self.first_revoked = first_revoked
        # Raised into the drive from outside (the task's soft time limit, by a signal),
        # wherever it happens to be: not a failed report to swallow while the thread has
        # steps left for it to stop.
        self.interruptions = interruptions
        self.retrying: tuple[Exception, float] | None = None
        """The error and the delay of the retry this drive scheduled, if it did."""
        self.ended: ThreadMeta | None = None
        """The meta the commit that ended this drive's run (done or waiting) wrote."""
        self.waiting_for: KeyWait | None = None
        """The concurrency key this drive found full, parking the thread, if it did."""
        self.requeued = False
        """Whether the store, back after an outage that ended this drive, queued the
        thread again at once (else recovery resumes it once its lease runs out)."""
        self._settled = False  # the thread's status was set and its lease given up

    def drive(self) -> Any:
        thread_id, store = self.thread_id, self.store
        try:
            taken = self._take()
        except LeaseHeld:
            logger.info("thread %s is driven by another worker; leaving it", thread_id)
            return None
        except RetryNotDue as exc:
            logger.info("thread %s is due in %.1f s; leaving it until then", thread_id, exc.seconds)
            return None
        if taken is None:
            return None
        meta, token = taken.meta, taken.token
        if token is None:
            if meta.status == Status.DONE:
                return meta.result
            logger.info("thread %s is %s: nothing to run", thread_id, meta.status.value)
            return None
        keeper = keeper_for(store)
        try:
            with keeper.hold(thread_id, self.owner, token, self.settings.lease_ttl) as lease:
                self._calls.lease = lease
                return self._resume(token, meta, taken.lost_worker, lease)
        except FencingError as exc:
            metrics.lease_lost()
            logger.warning(
                "thread %s: stopped, another worker drives it now or may soon (%s)", thread_id, exc
            )
            self._give_back(token)  # unless another worker has it
            return None
        except Exception as exc:
            if isinstance(exc, ThreadNotFound) and exc.thread_id == thread_id:
                # Its keys were removed under it (delete_thread, or FLUSHDB, DEL, an
                # eviction): no status to set, no lease to give back, nothing resumes it.
                raise ThreadNotFound(
                    "deleted from the store while a worker drove it (delete_thread, or its "
                    "keys removed: FLUSHDB, DEL, eviction); its progress is gone, start it "
                    "again with .delay()",
                    thread_id=thread_id,
                    step=exc.step,
                ) from exc
            if self.store_unreachable(exc):
                # The task says what became of the thread, in one line.
                self.requeued = give_back(store, thread_id, token, self.owner)
            elif not self._settled and self.ended is None:
                self._fail_outside_nodes(token, exc)
            raise

    def _fail_outside_nodes(self, token: int, exc: Exception) -> None:
        """Fail a thread whose drive broke outside its nodes (a checkpoint it cannot read, a
        question it cannot store, a concurrency key it cannot name). Left running under its
        lease, it would come back through recovery with the same error until its lost
        workers failed it, that error no longer said."""
        try:
            self._settle("failing the thread", token, Status.FAILED, error=error_text(exc))
        except Exception:
            logger.exception(
                "thread %s: could not mark it failed after %s; recovery resumes it once its "
                "lease runs out",
                self.thread_id,
                type(exc).__name__,
            )
        else:
            logger.error("thread %s: failed: %s", self.thread_id, exc)

    def _give_back(self, token: int) -> None:
        if not give_back(self.store, self.thread_id, token, self.owner):
            logger.warning(
                "thread %s: the store is unreachable; recovery resumes the thread once its "
                "lease runs out",
                self.thread_id,
            )

    def _take(self) -> Taken | None:
        """The thread, leased if it runs by itself; ``None`` if it was deleted since this
        message was sent."""
        take = (
            "taking the lease",
            self.store.acquire_to_run,
            self.thread_id,
            self.owner,
            self.settings.lease_ttl,
        )
        try:
            return self._calls(*take)
        except ThreadNotFound:
            if not self.may_open:
                logger.warning(
                    "thread %s is not in this worker's store: dropped (deleted since this "
                    "message was sent, or sent by a caller whose agentq_store is another one)",
                    self.thread_id,
                )
                return None
        # Sent by name (send_task) rather than through apply_async.
        self._calls(
            "opening the thread",
            self.store.open_thread,
            self.thread_id,
            task=self.task.name,
            node=self.task.entry_node,
        )
        return self._calls(*take)

    def store_unreachable(self, exc: BaseException) -> bool:
        """Whether ``exc`` ended the drive because the store stayed out for longer than
        its calls could wait: the thread is given back, not failed."""
        return self.store.is_transient(exc) and raised_in_store(exc)

    def _resume(self, token: int, meta: ThreadMeta, lost_worker: bool, lease: Lease) -> Any:
        """Run from ``meta``, as taking the lease (``token``) left it."""
        if lost_worker:
            metrics.taken_over()
        if meta.cancel_requested:
            return self._cancel_early(token, self.seat_of(meta))
        if self.first_revoked and meta.step < 0 and not meta.reopened:
            self._cancel_early(token, self.seat_of(meta))
            logger.info(
                "thread %s: cancelled, its first task revoked before its first step", self.thread_id
            )
            return None
        # Only when this take counted one: a count above a lowered max_crashes, or kept
        # from a version whose retries did not clear it, fails no thread that lost none
        # now.
        if lost_worker and meta.crashes >= self.settings.max_crashes:
            return self._fail_for_crashes(token, meta)
        # Only now the key: a thread it parks is queued when woken, its lost worker counted.
        seat = self.seat_of(meta)
        with seated(self._calls, self.owner, token, seat) as entry:
            if entry is KeyRefused.CANCEL_REQUESTED:
                return self._cancel_early(token, seat)
            self.waiting_for = entry
            return None if entry else self._steps(token, meta, lease)

    def _steps(self, token: int, meta: ThreadMeta, lease: Lease) -> Any:
        latest = self._latest(token, meta)
        if latest is not None and latest.node is None:
            # Finished at its latest checkpoint but not marked so (a fork of a final step
            # made before those were refused): settling it is all that is left to do.
            self._settle("finishing", token, Status.DONE)
            return meta.result
        pos = self._start_from(latest, meta)
        logs = AppendOnlyFields(
            self.thread_id,
            self.task.append_only,
            pos.state,
            logged=latest.logs if latest is not None else (),
        )
        while True:
            if lease.lost.is_set():
                metrics.lease_lost()
                logger.warning(
                    "thread %s: lease lost before step %d; stopping", self.thread_id, pos.step
                )
                self._give_back(token)
                return None
            if self.should_stop():
                return self._hand_over(token, meta, pos.step)
            result = self._step(token, meta, pos, logs)
            if result is not _CONTINUE:
                return result

    def _latest(self, token: int, meta: ThreadMeta) -> Checkpoint | None:
        """The latest checkpoint; one the store lost stops the thread in needs_attention
        (:class:`~agentq.errors.CheckpointLost`) rather than start it again from step 0.
        A thread whose meta (read under this lease) names no step has none to read."""
        if meta.step < 0:
            return None
        try:
            latest = self._calls("reading the checkpoint", self.store.latest, self.thread_id)
        except CheckpointNotFound as exc:
            self._report_loss(token, meta, f"its latest checkpoint is gone ({exc})")
        if latest is None:
            self._report_loss(token, meta, "the store holds no checkpoint of it")
        return latest

    def _report_loss(self, token: int, meta: ThreadMeta, what: str) -> NoReturn:
        lost = checkpoint_lost(self.thread_id, meta.step, what)
        self._settle("reporting data loss", token, Status.NEEDS_ATTENTION, error=str(lost))
        logger.error("%s", lost)
        raise lost

    def _fail_for_crashes(self, token: int, meta: ThreadMeta) -> None:
        """Fail a thread whose workers were lost ``max_crashes`` times at its step (taking
        the lease counted the last one)."""
        self._settle(
            "failing the thread",
            token,
            Status.FAILED,
            error=f"worker lost {meta.crashes} times at step {meta.step + 1}; the step "
            "may crash its worker (out of memory?): fix it, then 'agentq retry "
            f"{self.thread_id}' (task.retry_thread in code)",
        )
        logger.error("thread %s: failed after %d lost workers", self.thread_id, meta.crashes)

    @instrument.settle
    def _settle(self, what: str, token: int, status: Status, **fields: Any) -> None:
        """Set the thread's status (and ``fields``) and give its lease up."""
        self._releasing()
        self._calls(
            what,
            self.store.set_status,
            self.thread_id,
            token,
            status,
            release_owner=self.owner,
            **fields,
        )
        self._settled = True

    def _releasing(self) -> None:
        # Before the write: the keeper's renewal may reach the store after it.
        if self._calls.lease is not None:
            self._calls.lease.releasing = True

    def _start_from(self, latest: Checkpoint | None, meta: ThreadMeta) -> _Position:
        resume_value = meta.resume_value if meta.resumed else NO_VALUE
        if meta.timed_out:
            resume_value = TimedOut(meta.interrupt, meta.timeout)
        if latest is None:
            return _Position(
                0, self.task.entry_node, {}, [], {}, resume_value, meta.attempts, meta.crashes
            )
        assert latest.node is not None
        return _Position(
            latest.step + 1,
            latest.node,
            latest.state,
            latest.pending,
            latest.cursors,
            resume_value,
            meta.attempts,
            meta.crashes,
        )

    def _hand_over(self, token: int, meta: ThreadMeta, step: int) -> None:
        self._settle("handing over", token, Status.QUEUED, due_in=0)
        try:
            self.task.resend(meta)
        except Exception:
            # Queued and due now in the store, the thread is not lost: a failed task
            # would say it failed and run its errbacks (and a soft time limit has no
            # step left to stop).
            logger.warning(
                "thread %s: handed over before step %d (worker stopping), but its message "
                "was not sent; a worker's sweeper sends it, due now",
                self.thread_id,
                step,
                exc_info=True,
            )
            return
        logger.info("thread %s: handed over before step %d (worker stopping)", self.thread_id, step)

    def _run(self, token: int, meta: ThreadMeta, pos: _Position) -> Run:
        store, settings, lease = self.store, self.settings, self._calls.lease
        assert lease is not None  # steps run only under a lease
        return Run(
            store=store,
            thread_id=self.thread_id,
            incarnation=meta.incarnation,
            step=pos.step,
            node=pos.node,
            token=token,
            state=pos.state,
            pending=pos.pending,
            cursors=pos.cursors,
            resume_value=pos.resume_value,
            retries=pos.attempts,
            lost_workers=pos.crashes,
            max_artifact_bytes=settings.max_artifact_bytes,
            calls=self._calls,
            confirm_lease=functools.partial(
                self._calls, "confirming the lease", confirm, store, lease
            ),
            retryable=self.task.should_retry,
            take_limits=limiter(self._calls, settings, pos.step, lease),
        )

    @instrument.step
    def _step(self, token: int, meta: ThreadMeta, pos: _Position, logs: AppendOnlyFields) -> Any:
        """Run one node and commit what it did; ``_CONTINUE`` if the thread goes on, else
        what the task returns."""
        thread_id, step = self.thread_id, pos.step
        run = self._run(token, meta, pos)
        try:
            try:
                outcome = self._call(pos.node, run, meta.input if step == 0 else None)
            finally:
                run.end()
                # A call the node handed to a thread it stopped waiting for (it raised at
                # the first that failed) ends, recorded, before the step does: left
                # pending, its claim would stop the step's retry as a dead worker's.
                run.wait_for_tools()
        except Interrupted as pause:
            return self._pause(token, step, pause, run.retries)
        except LimitWait as wait:  # not a failure: no attempt is counted
            self._settle("waiting for a limit", token, Status.RETRYING, due_in=wait.seconds)
            report = functools.partial(
                self.task.on_limit_wait, thread_id, step, pos.node, run.limit_waits
            )
            self._report(report, step, "the thread waits for its limits", goes_on=False)
            self.retrying = (wait, wait.seconds)
            logger.info("thread %s: step %d waits %.1f s (limit)", thread_id, step, wait.seconds)
            return None
        except NeedsAttention as exc:
            self._settle("asking for attention", token, Status.NEEDS_ATTENTION, error=str(exc))
            logger.error("%s", exc)
            return None
        except FencingError:
            raise
        except Exception as exc:
            if self.store_unreachable(exc):
                logger.warning(
                    "thread %s: store unreachable at step %d; given back", thread_id, step
                )
                raise
            return self._fail_or_retry(token, step, run.retries, exc)
        try:
            checkpoint, status, extra = checkpoint_after(
                run, outcome, task=self.task.name, token=token
            )
            if status != Status.RUNNING:
                self._releasing()
            cancel = self._calls(
                "committing",
                self._commit,
                thread_id,
                token,
                checkpoint,
                status=status,
                release_owner=None if status == Status.RUNNING else self.owner,
                logs=logs.lengths(step, run.state),
                **extra,
            )
        # Not a race (fence and step were checked first): a log that does not match
        # the thread's declaration, e.g. a field made append-only again after it was
        # dropped. Failing says so, where leaving it would loop through recovery.
        except (CodecError, UnknownNode, InvalidArgument, AppendOnlyViolation, LogConflict) as exc:
            return self._fail_or_retry(token, step, run.retries, exc)  # output can't be kept
        logs.committed(run.state)
        self._report_step(step, pos.node, checkpoint.node, run.limit_waits, status)
        if status == Status.WAITING and cancel:
            return self._cancel_at_wait(token, step)
        if status != Status.RUNNING:
            self.ended = meta_after(meta, checkpoint, status, extra, cancel=bool(cancel))
            return extra.get("result")
        if cancel:
            self._settle("cancelling", token, Status.CANCELLED)
            logger.info("thread %s: cancelled after step %d", thread_id, step)
            return None
        assert checkpoint.node is not None
        pos.step, pos.node, pos.resume_value = step + 1, checkpoint.node, NO_VALUE
        pos.attempts = pos.crashes = 0  # as the commit left them in the store
        pos.state, pos.pending, pos.cursors = run.state, run.pending, run.cursors
        return _CONTINUE

    def _pause(self, token: int, step: int, pause: Interrupted, attempts: int) -> None:
        """Wait for a human, as the node asked with ``run.interrupt()``."""
        try:
            # Here, where the step is known; the store's write of the question knows none.
            encode_value(pause.payload, what="interrupt", thread_id=self.thread_id, step=step)
        except CodecError as exc:
            return self._fail_or_retry(token, step, attempts, exc)
        self._settle(
            "pausing", token, Status.WAITING, interrupt=pause.payload, due_in=pause.timeout
        )
        paused = self._calls("reading the thread", self.store.meta, self.thread_id)
        if paused is not None and paused.cancel_requested and paused.fence == token:
            return self._cancel_at_wait(token, step)
        logger.info("thread %s: waiting for a human at step %d", self.thread_id, step)
        return None

    def _report_step(
        self,
        step: int,
        node: str,
        next_node: str | None,
        limit_waits: list[dict[str, Any]],
        status: Status,
    ) -> None:
        """Tell the task a step committed, leaving the thread in ``status``."""
        report = functools.partial(
            self.task.on_step, self.thread_id, step, node, next_node, limit_waits=limit_waits
        )
        self._report(report, step, "the step is committed", goes_on=status == Status.RUNNING)

    def _report(self, report: Callable[[], None], step: int, stands: str, *, goes_on: bool) -> None:
        """``report()`` what became of ``step`` to the task (a result backend or broker
        call). The store holds it already (``stands`` says what): a report that fails is
        logged, and fails neither the thread nor its task. An interruption of the run (a
        soft time limit) goes on up if the thread ``goes_on`` to another step, which it
        stops; else the thread has ended or is parked, and there is nothing left to stop."""
        try:
            report()
        except Exception as exc:
            if goes_on and isinstance(exc, self.interruptions):
                raise
            logger.warning(
                "thread %s: reporting step %d failed; %s",
                self.thread_id,
                step,
                stands,
                exc_info=True,
            )

    def _cancel_at_wait(self, token: int, step: int) -> None:
        """Cancel a thread asked to stop while the node that asked a human ran: the wait
        is the node boundary a cancel stops it at, and a resume would clear the request."""
        self._settle("cancelling", token, Status.CANCELLED)
        logger.info("thread %s: cancelled at its wait after step %d", self.thread_id, step)

    def _cancel_early(self, token: int, seat: KeySeat | None) -> None:
        """Cancel a thread asked to stop before this drive ran a step of it."""
        self._settle("cancelling", token, Status.CANCELLED)
        if seat:  # the slot it may have been woken to is free
            leave(self._calls, token, seat)

    def _call(self, node: str, run: Run, input: Any) -> Any:
        fn = self.task.find_node(node)
        if fn is None:
            raise UnknownNode(
                f"node {node!r} is not a node of {type(self.task).__name__}; define it or "
                "return the name of an existing node",
                thread_id=self.thread_id,
                step=run.step,
            )
        kwargs = input if isinstance(input, dict) else {}
        try:
            result = fn(run, **kwargs)
        except TypeError as exc:
            unfit = self._unfit(node, fn, run, kwargs)
            if unfit is None:
                raise  # raised in the node's body
            raise unfit from exc
        if inspect.isawaitable(result):
            return run_coroutine(_awaited(result, run))
        return result

    def _unfit(
        self, node: str, fn: Callable[..., Any], run: Run, kwargs: dict[str, Any]
    ) -> InvalidInput | None:
        """Why ``fn`` cannot be called with its run (and at step 0 the thread's input),
        or ``None`` when it can: then the ``TypeError`` came from the node's body, and is
        the node's own. Asked only on that error, so a step pays nothing for it."""
        try:
            # The wrapper's own, not the function a decorator wraps, which may take an
            # argument the wrapper supplies.
            signature = inspect.signature(fn, follow_wrapped=False)
        except (TypeError, ValueError):
            return None
        try:
            signature.bind(run, **kwargs)
        except TypeError as exc:
            shown = signature.replace(return_annotation=inspect.Signature.empty)
            given = "its run and the thread's input" if kwargs else "its run"
            return InvalidInput(
                f"node {node}{shown} cannot be called with {given} "
                f"({misfit(signature, kwargs, exc)}); a node takes its run as its first "
                "argument (after self), and the entry node the keyword arguments of delay()",
                thread_id=self.thread_id,
                step=run.step,
            )
        return None

    @instrument.retry
    def _fail_or_retry(self, token: int, step: int, attempts: int, exc: Exception) -> None:
        thread_id, settings = self.thread_id, self.settings
        attempt = attempts + 1
        retryable = self.task.should_retry(exc) and not isinstance(exc, AgentqError)
        if retryable and attempt < settings.max_attempts:
            delay = retry_delay(exc, attempt, base=settings.backoff_base, cap=settings.backoff_max)
            self._settle(
                "scheduling a retry",
                token,
                Status.RETRYING,
                due_in=delay,
                attempts=attempt,
                error=error_text(exc),
            )
            self.retrying = (exc, delay)
            failed = f"{type(exc).__name__}; retrying in {delay:.1f} s"
            logger.warning(
                "thread %s: step %d attempt %d failed (%s)", thread_id, step, attempt, failed
            )
            return None
        gave_up = f"gave up after {attempt} attempts: " if retryable else ""
        error = gave_up + error_text(exc)
        self._settle("failing the thread", token, Status.FAILED, attempts=attempt, error=error)
        logger.error("thread %s: step %d failed: %s", thread_id, step, exc)
        raise exc


async def _awaited(awaitable: Any, run: Run) -> Any:
    """The node's result, once the tool calls it started have ended: a claim left pending
    by a call still running would stop the step's retry for a person (or run it twice)."""
    try:
        return await awaitable
    finally:
        await run.awaited_tools_ended()
