"""The demo's live timeline, read from the store (checkpoints, status) and the ledger
(what the workers did), printed in the order things happened."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from agentq.demo.agent import euros
from agentq.demo.ledger import Event, Ledger
from agentq.records import Checkpoint, Status, ThreadMeta
from agentq.store.contract import Store

POLL_INTERVAL: Final = 0.05
_WHO_STYLES: Final = {"worker A": "cyan", "worker B": "magenta", "demo": "bold red", "you": "green"}


class DemoFailed(Exception):
    """The demo could not show what it set out to (a worker did not start, a deadline
    passed); the message says what did not happen."""


@dataclass(order=True)
class _Line:
    at: float
    who: str = field(compare=False)
    text: str = field(compare=False)


class Timeline:
    """Prints ``+seconds  who  what`` lines, relative to the demo's start."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.started = time.time()

    def say(self, who: str, text: str, at: float | None = None) -> None:
        offset = (time.time() if at is None else at) - self.started
        style = _WHO_STYLES.get(who, "")
        line = Text(f"{max(0.0, offset):6.2f}s  ", style="dim")
        line.append(f"{who:<9} ", style=style)
        line.append_text(Text.from_markup(text))
        self.console.print(line, soft_wrap=True)


@dataclass
class Observed:
    """What the watcher has seen so far; the summary is built from it."""

    ready: set[int] = field(default_factory=set)
    committed: dict[int, Checkpoint] = field(default_factory=dict)
    drivers: list[tuple[str, int]] = field(default_factory=list)
    model_calls: int = 0
    refund_runs: int = 0
    refunds_issued: int = 0
    paused: bool = False
    meta: ThreadMeta | None = None


class Watcher:
    """Polls the store and the ledger and turns each change into timeline lines.

    The store is read before the ledger: a worker logs a node before committing it, so
    every checkpoint seen has its node's log entry in the same poll.
    """

    def __init__(
        self,
        store: Store,
        ledger: Ledger,
        thread_id: str,
        timeline: Timeline,
        workers: dict[int, str],
        *,
        budget: float = 60.0,
    ) -> None:
        self.store = store
        # Every wait also ends with the run's whole budget: the demo never hangs for long.
        self.ends = time.monotonic() + budget
        self.ledger = ledger
        self.thread_id = thread_id
        self.timeline = timeline
        self.workers = workers
        self.seen = Observed()
        self._seq = 0
        self._node_runs: dict[int, tuple[str, str]] = {}

    # -- polling -------------------------------------------------------------------------

    def wait_for(
        self,
        condition: Callable[[Observed], bool],
        *,
        timeout: float,
        what: str,
        alive: Callable[[], None] | None = None,
    ) -> None:
        """Poll until ``condition`` holds; :class:`DemoFailed` after ``timeout`` seconds.
        ``alive`` raises if a process the wait depends on has died."""
        started = time.monotonic()
        deadline = min(started + timeout, self.ends)
        while True:
            self.poll()
            if condition(self.seen):
                return
            if alive is not None:
                alive()
            if time.monotonic() > deadline:
                raise DemoFailed(f"{what} did not happen within {time.monotonic() - started:.0f} s")
            time.sleep(POLL_INTERVAL)

    def poll(self) -> None:
        lines: list[_Line] = []
        meta = self.store.meta(self.thread_id)
        checkpoints = self.store.history(self.thread_id, limit=10) if meta else []
        for event in self.ledger.events_after(self._seq):
            self._seq = event.seq
            lines.extend(self._from_event(event))
        for checkpoint in sorted(checkpoints, key=lambda c: c.step):
            if checkpoint.step not in self.seen.committed:
                self.seen.committed[checkpoint.step] = checkpoint
                lines.append(self._commit_line(checkpoint))
        if meta is not None:
            previous, self.seen.meta = self.seen.meta, meta
            if not meta.status.is_live and (previous is None or previous.status != meta.status):
                lines.append(self._stopped_line(meta))
        for line in sorted(lines):
            self.timeline.say(line.who, line.text, line.at)

    # -- turning observations into lines ---------------------------------------------------

    def _worker(self, event: Event) -> str:
        for key in ("ppid", "pid"):
            label = self.workers.get(int(event.data.get(key, -1)))
            if label is not None:
                return f"worker {label}"
        return f"pid {event.data.get('pid')}"

    def _from_event(self, event: Event) -> list[_Line]:
        who, data, at = self._worker(event), event.data, event.at
        if event.kind == "worker_ready":
            self.seen.ready.add(int(data["pid"]))
            return [_Line(at, who, f"ready (pid {data['pid']}), waiting for work")]
        if event.kind == "node":
            self._node_runs[int(data["step"])] = (who, str(data["node"]))
            return self._driver_lines(who, int(data["token"]), at)
        if event.kind == "model_call":
            self.seen.model_calls += 1
            calls = data["tool_calls"]
            if calls:
                args = calls[0]["args"]
                decision = (
                    f"decides to call [bold]refund[/](order #{args['order']}, "
                    f"{euros(args['cents'])})"
                )
            else:
                decision = "writes the answer"
            return [_Line(at, who, f"model call {self.seen.model_calls}: {decision}")]
        if event.kind == "refund":
            self.seen.refund_runs += 1
            if data["issued"]:
                self.seen.refunds_issued += 1
                return [
                    _Line(
                        at,
                        who,
                        f"[bold]refund {data['refund_id']} issued[/]: "
                        f"{euros(data['cents'])} back on order #{data['order']} "
                        f"(idempotency key {escape(data['key'])})",
                    )
                ]
            return [
                _Line(
                    at,
                    who,
                    "refund tool re-run with the same idempotency key: the "
                    f"payment service returned {data['refund_id']}, no money moved",
                )
            ]
        if event.kind == "paused":
            self.seen.paused = True
            return [
                _Line(
                    at,
                    who,
                    "[yellow]pauses inside the refund tool: refund issued, its "
                    "result not recorded yet[/]",
                )
            ]
        return []

    def _driver_lines(self, who: str, token: int, at: float) -> list[_Line]:
        drivers = self.seen.drivers
        if drivers and drivers[-1][0] == who:
            return []
        drivers.append((who, token))
        if len(drivers) == 1:
            text = f"takes the thread's lease (fencing token {token})"
        else:
            before, old_token = drivers[-2]
            text = (
                f"[bold]takes the thread over[/]: {before}'s lease expired and a "
                f"sweeper re-sent it (fencing token {old_token} → {token}: writes under "
                f"{old_token} are now refused)"
            )
        # Just before the node's own lines: the lease is taken before the node runs.
        return [_Line(at - 1e-6, who, text)]

    def _commit_line(self, checkpoint: Checkpoint) -> _Line:
        who, node = self._node_runs.get(checkpoint.step, ("store", "?"))
        after = checkpoint.node or "done"
        pending = len(checkpoint.pending)
        extra = f", {pending} pending tool call{'s' if pending != 1 else ''}" if pending else ""
        text = (
            f"[green]step {checkpoint.step} committed[/] ({node} → {after}{extra}, "
            f"token {checkpoint.token})"
        )
        return _Line(checkpoint.created_at, who, text)

    def _stopped_line(self, meta: ThreadMeta) -> _Line:
        who = self._node_runs.get(meta.step, ("store", ""))[0]
        if meta.status == Status.DONE:
            return _Line(
                meta.updated_at, who, f"[bold green]thread done[/]: {escape(str(meta.result))}"
            )
        return _Line(
            meta.updated_at,
            who,
            f"[bold red]thread {meta.status.value}[/]: "
            f"{escape((meta.error or '').splitlines()[0] if meta.error else '')}",
        )
