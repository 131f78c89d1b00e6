"""``agentq demo``: run a thread, SIGKILL its worker at the worst moment, watch a fresh
worker finish it, and check that the refund was issued exactly once."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any, Final

from kombu.utils.url import maybe_sanitize_url
from rich.console import Console
from rich.markup import escape

from agentq.celery.runtime import runtime_of
from agentq.demo.agent import (
    AMOUNT_CENTS,
    PAUSE_AFTER_REFUND,
    QUESTION,
    DemoSupportAgent,
    expected_answer,
)
from agentq.demo.config import DemoConfig
from agentq.demo.ledger import Ledger, open_ledger
from agentq.demo.timeline import DemoFailed, Observed, Timeline, Watcher
from agentq.demo.wiring import build_app
from agentq.demo.workers import DemoWorker
from agentq.ops.console import console as make_console
from agentq.records import Status
from agentq.store.contract import Store

THREAD_ID: Final = "ticket-1042"
BUDGET: Final = 50.0
"""Seconds the whole run may take before it gives up; a normal run takes under ten."""
WORKER_START_TIMEOUT: Final = 30.0
PAUSE_TIMEOUT: Final = 20.0
FINISH_TIMEOUT: Final = 30.0
EXPECTED_STEPS: Final = [0, 1, 2, 3]
"""start → model, model → tools, tools → model, model → done."""
EXPECTED_MODEL_CALLS: Final = 2

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_INTERRUPTED: Final = 130


class _Stopped(BaseException):
    """SIGTERM (or SIGHUP) to the demo: unwind through the clean-up, like Ctrl-C."""


def _raise_stopped(signum: int, frame: FrameType | None) -> None:
    raise _Stopped(signal.Signals(signum).name)


@contextlib.contextmanager
def _stop_on_termination() -> Iterator[None]:
    previous = {sig: signal.signal(sig, _raise_stopped) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def _without_celery_environment() -> Iterator[None]:
    """Hide CELERY_* variables while the demo runs: CELERY_BROKER_URL, for one, overrides
    any app's broker, and would send the demo's messages to the user's own broker. The
    workers inherit the cleaned environment."""
    hidden = {name: os.environ.pop(name) for name in list(os.environ) if name.startswith("CELERY_")}
    try:
        yield
    finally:
        os.environ.update(hidden)


@dataclass
class Stage:
    """Everything one run owns, created by :func:`_stage` and removed by it on exit."""

    config: DemoConfig
    app: Any
    store: Store
    ledger: Ledger
    workers: list[DemoWorker]
    location: str


def _config(workdir: str, redis_url: str | None, lifeline: int) -> tuple[DemoConfig, str]:
    # Unique per run, and the same name as the run's directory: one name to look for.
    namespace = os.path.basename(workdir)
    if redis_url:
        config = DemoConfig(
            workdir=workdir,
            store=redis_url,
            broker=redis_url,
            ledger=redis_url,
            namespace=namespace,
            lifeline_fd=lifeline,
        )
        return config, (
            f"Redis at {maybe_sanitize_url(redis_url, mask='***')} (store and "
            f"broker), keys under "
            f"{namespace}:"
        )
    config = DemoConfig(
        workdir=workdir,
        store=f"sqlite:///{os.path.join(workdir, 'agentq.db')}",
        broker="filesystem://",
        ledger=os.path.join(workdir, "payments.db"),
        namespace=namespace,
        lifeline_fd=lifeline,
    )
    for folder in ("messages", "processed", "control"):
        os.makedirs(config.broker_folder(folder))
    return config, f"embedded: SQLite store and filesystem broker in {workdir}"


def _check_reachable(url: str) -> None:
    """Fail before starting anything: a wrong URL is the likeliest mistake."""
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=5)
    try:
        client.ping()
    finally:
        client.close()


def _remove_redis_keys(url: str, namespace: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    try:
        # The store, the broker (global_keyprefix) and the ledger all live under it.
        for batch in _batched(client.scan_iter(match=f"{namespace}:*", count=500), 500):
            client.unlink(*batch)
    finally:
        client.close()


def _batched(items: Iterator[Any], size: int) -> Iterator[list[Any]]:
    batch: list[Any] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


@contextlib.contextmanager
def _stage(redis_url: str | None, keep: bool) -> Iterator[Stage]:
    """Create the run's directory, data and app; on the way out, whatever happened, kill
    every worker, then remove the data unless ``keep``."""
    if redis_url:
        _check_reachable(redis_url)
    workdir = tempfile.mkdtemp(prefix="agentq-demo-")
    # The workers hold the read end; when this process is gone, they see it close.
    lifeline_read, lifeline_write = os.pipe()
    workers: list[DemoWorker] = []
    config: DemoConfig | None = None
    app: Any = None
    ledger: Ledger | None = None
    try:
        config, location = _config(workdir, redis_url, lifeline_read)
        app = build_app(config)
        ledger = open_ledger(config.ledger, config.namespace)
        store = runtime_of(app).store
        yield Stage(config, app, store, ledger, workers, location)
    finally:
        for worker in workers:
            worker.kill()
        os.close(lifeline_write)
        os.close(lifeline_read)
        if ledger is not None:
            ledger.close()
        if app is not None:
            runtime_of(app).store.close()
            app.close()
        if not keep:
            if config is not None and redis_url:
                _remove_redis_keys(redis_url, config.namespace)
            shutil.rmtree(workdir, ignore_errors=True)


def _start_worker(stage: Stage, watcher: Watcher, timeline: Timeline, label: str) -> DemoWorker:
    worker = DemoWorker(label, stage.config)
    stage.workers.append(worker)
    watcher.workers[worker.start()] = label
    timeline.say("demo", f"starting worker {label} (celery worker, prefork, 1 process)")

    def still_running() -> None:
        code = worker.exited()
        if code is not None:
            raise DemoFailed(f"worker {label} exited with status {code}:\n{worker.log_tail()}")

    watcher.wait_for(
        lambda seen: worker.pid in seen.ready,
        timeout=WORKER_START_TIMEOUT,
        what=f"worker {label} getting ready",
        alive=still_running,
    )
    return worker


def _stopped(seen: Observed) -> bool:
    return seen.meta is not None and not seen.meta.status.is_live


def _not_stopped_early(seen: Observed) -> None:
    if _stopped(seen):
        assert seen.meta is not None
        raise DemoFailed(
            f"the thread stopped before the refund ({seen.meta.status.value}): "
            f"{seen.meta.error or 'no error recorded'}"
        )


def _play(stage: Stage, timeline: Timeline) -> tuple[Watcher, int]:
    """The story: returns the watcher's observations and the step committed at the kill."""
    agent = stage.app.tasks[DemoSupportAgent.name]
    watcher = Watcher(stage.store, stage.ledger, THREAD_ID, timeline, {}, budget=BUDGET)
    first = _start_worker(stage, watcher, timeline, "A")
    stage.ledger.arm(PAUSE_AFTER_REFUND)
    agent.delay(THREAD_ID, question=QUESTION)
    timeline.say("you", f"ask: [italic]{escape(QUESTION)}[/] (thread {THREAD_ID})")
    watcher.wait_for(
        lambda seen: seen.paused,
        timeout=PAUSE_TIMEOUT,
        what="the refund tool pausing after the refund",
        alive=lambda: _not_stopped_early(watcher.seen),
    )
    first.kill()
    # Read after the kill: nothing can commit now, so this is the checkpoint to resume from.
    meta = stage.store.meta(THREAD_ID)
    step_at_kill = meta.step if meta else -1
    timeline.say(
        "demo",
        f"[bold]SIGKILL worker A[/] (pid {first.pid} and its pool process), "
        f"between the refund and its record; the thread's last checkpoint is step "
        f"{step_at_kill}",
    )
    _start_worker(stage, watcher, timeline, "B")
    watcher.wait_for(_stopped, timeout=FINISH_TIMEOUT, what="the thread finishing")
    return watcher, step_at_kill


def _verdict(stage: Stage, watcher: Watcher) -> list[tuple[str, bool]]:
    meta = stage.store.meta(THREAD_ID)
    refunds = stage.ledger.refunds()
    steps = sorted(c.step for c in stage.store.history(THREAD_ID, limit=100))
    answer_ok = (
        meta is not None
        and meta.status == Status.DONE
        and len(refunds) == 1
        and meta.result == expected_answer(refunds[0].refund_id)
    )
    return [
        ("refund issued exactly once", len(refunds) == 1 and refunds[0].cents == AMOUNT_CENTS),
        ("thread done with the expected answer", answer_ok),
        ("every step committed exactly once, in order", steps == EXPECTED_STEPS),
        (
            "no model call repeated after the crash",
            watcher.seen.model_calls == EXPECTED_MODEL_CALLS,
        ),
        ("a fresh worker took the thread over", len(watcher.seen.drivers) >= 2),
    ]


def _summary(
    out: Console, stage: Stage, watcher: Watcher, step_at_kill: int, seconds: float
) -> bool:
    seen = watcher.seen
    refunds = stage.ledger.refunds()
    meta = stage.store.meta(THREAD_ID)
    steps = sorted(seen.committed)
    out.print()
    out.print("[bold]Summary[/]")
    rows = [
        ("steps committed", f"{len(steps)} ({', '.join(map(str, steps))})"),
        (
            "model calls",
            f"{seen.model_calls} (a run without the crash makes {EXPECTED_MODEL_CALLS})",
        ),
        (
            "refund tool runs",
            f"{seen.refund_runs}"
            + (
                " (killed once mid-call, then re-run with the same idempotency key)"
                if seen.refund_runs == 2
                else ""
            ),
        ),
        ("refunds issued", f"{len(refunds)}"),
        (
            "takeover",
            f"worker A killed after step {step_at_kill}; worker B resumed from that checkpoint",
        ),
        ("answer", escape(str(meta.result if meta else None))),
        ("time", f"{seconds:.1f} s"),
    ]
    for name, value in rows:
        out.print(f"  {name:<17} {value}", soft_wrap=True)
    verdict = _verdict(stage, watcher)
    for claim, held in verdict:
        out.print(f"  [green]✓[/] {claim}" if held else f"  [red]✗ {claim}[/]")
    return all(held for _, held in verdict)


def _explore_hint(out: Console, stage: Stage) -> None:
    config = stage.config
    prefix = "" if config.embedded else f" --prefix {config.prefix}"
    base = f"agentq --store {config.store}{prefix}"
    where = (
        f"in {config.workdir}"
        if config.embedded
        else f"in Redis under {config.prefix} (worker logs in {config.workdir})"
    )
    out.print(f"\nThe demo's data is kept {where}. Explore it:")
    for command in (
        "threads",
        f"history {THREAD_ID}",
        f"diff {THREAD_ID} 1 2",
        f"show {THREAD_ID}",
    ):
        out.print(f"  {base} {command}", soft_wrap=True)


def run_demo(*, redis_url: str | None = None, keep: bool = False) -> int:
    """Run the demo; the exit status: 0 only if every guarantee held."""
    out = make_console()
    started = time.monotonic()
    try:
        with (
            _stop_on_termination(),
            _without_celery_environment(),
            _stage(redis_url, keep) as stage,
        ):
            out.print(f"[bold]agentq demo[/] — {escape(stage.location)}")
            out.print(
                "A support agent refunds a duplicate charge. Its worker is killed "
                "right after the refund, before the refund is recorded; a fresh "
                "worker resumes the thread from its last checkpoint.\n"
            )
            for finding in stage.store.check():
                out.print(f"[yellow]note:[/] {escape(str(finding))}")
            timeline = Timeline(out)
            try:
                watcher, step_at_kill = _play(stage, timeline)
            except DemoFailed as failed:
                out.print(f"[bold red]demo failed:[/] {escape(str(failed))}")
                for worker in stage.workers:
                    out.print(f"[dim]--- last lines of worker {worker.label}'s log ---[/]")
                    out.print(escape(worker.log_tail()), style="dim", soft_wrap=True)
                return EXIT_FAILED
            held = _summary(out, stage, watcher, step_at_kill, time.monotonic() - started)
            if held:
                out.print("[bold green]All guarantees held.[/]")
            else:
                out.print("[bold red]A guarantee did not hold.[/]")
            if keep:
                _explore_hint(out, stage)
            return EXIT_OK if held else EXIT_FAILED
    except (KeyboardInterrupt, _Stopped):
        out.print("\n[yellow]interrupted; every worker was stopped and the demo's data removed.[/]")
        return EXIT_INTERRUPTED
