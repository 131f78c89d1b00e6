"""The ``agentq`` command line against real stores: a SQLite file and the private Redis.

Threads are put in place through the store API (the states a worker would leave), then
every command is run as a user would: in process through click's runner, and as real
``agentq`` and ``celery -A ... agentq`` processes for the entry points and for commands
that send messages to a broker.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

from agentq.cli import cli
from agentq.records import Checkpoint, Status
from agentq.store.contract import Store
from agentq.store.redis.store import RedisStore
from agentq.store.sqlite.store import SQLiteStore
from tests.support.redis_server import RedisServer, free_port, wait_until

BIN = Path(sys.executable).parent
TASK = "tests.cli_agent"
OWNER = "cli-test-worker"


@dataclass
class Backend:
    """A store the CLI is pointed at with ``--store URL --prefix P``."""

    kind: str
    url: str
    prefix: str
    store: Store
    workdir: Path

    @property
    def args(self) -> list[str]:
        return ["--store", self.url, "--prefix", self.prefix]


@pytest.fixture(params=["sqlite", "redis"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    prefix = f"cli{uuid.uuid4().hex[:8]}:"
    store: Store
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'agentq.db'}"
        store = SQLiteStore(tmp_path / "agentq.db")
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        url = server.url
        store = RedisStore.from_url(url, prefix=prefix)
    with store:
        yield Backend(request.param, url, prefix, store, tmp_path)


def drive(
    store: Store, thread_id: str, states: list[dict[str, Any]], *, pending: list[Any] | None = None
) -> int:
    """Commit one checkpoint per state, as a worker would; return the lease token."""
    store.open_thread(thread_id, task=TASK, input={"question": "refund?"})
    token = store.acquire(thread_id, OWNER, 30)
    for step, state in enumerate(states):
        last = step == len(states) - 1
        checkpoint = Checkpoint(
            step=step,
            node=f"node{step + 1}",
            state=state,
            pending=pending if last and pending else [],
            cursors={"page": step},
            task=TASK,
            token=token,
        )
        store.commit(thread_id, token, checkpoint, due_in=30)
    return token


def finish(store: Store, thread_id: str, states: list[dict[str, Any]], result: Any) -> None:
    token = drive(store, thread_id, states[:-1])
    store.commit(
        thread_id,
        token,
        Checkpoint(step=len(states) - 1, node=None, state=states[-1], task=TASK, token=token),
        status=Status.DONE,
        result=result,
        release_owner=OWNER,
    )


@pytest.fixture
def threads(backend: Backend) -> Backend:
    """t-done (4 steps), t-wait (waiting for a human), t-failed, t-running, in that order."""
    store = backend.store
    messages = [{"role": "user", "content": "refund?"}]
    finish(
        store,
        "t-done",
        [
            {"messages": messages, "count": 0},
            {
                "messages": [*messages, {"role": "assistant", "content": "calling refund"}],
                "count": 1,
            },
            {
                "messages": [
                    *messages,
                    {"role": "assistant", "content": "calling refund"},
                    {"role": "tool", "content": {"refund_id": "re_1"}},
                ],
                "count": 2,
            },
            {"messages": [*messages, {"role": "assistant", "content": "refunded"}], "count": 3},
        ],
        result="Refunded 10 EUR.",
    )
    token = drive(store, "t-wait", [{"amount": 10}, {"amount": 10, "asked": True}])
    store.set_status(
        "t-wait", token, Status.WAITING, interrupt={"question": "refund 10?"}, release_owner=OWNER
    )
    token = drive(store, "t-failed", [{"n": 1}])
    store.set_status(
        "t-failed", token, Status.FAILED, error="KeyError: 'customer_id'\n...", release_owner=OWNER
    )
    drive(store, "t-running", [{"n": 1}], pending=[{"id": "call-1", "name": "refund"}])
    return backend


def run(backend: Backend, *args: str) -> Result:
    return CliRunner().invoke(cli, [*backend.args, *args], catch_exceptions=False)


def ok_json(backend: Backend, *args: str) -> Any:
    result = run(backend, *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def assert_one_line_error(result: Result, *fragments: str, code: int | None = None) -> None:
    assert result.exit_code != 0, result.output
    if code is not None:
        assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("agentq: "), lines[0]
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


# -- looking -----------------------------------------------------------------------------


def test_threads_lists_newest_first_and_filters(threads: Backend) -> None:
    listed = ok_json(threads, "threads")
    assert [t["thread_id"] for t in listed] == ["t-running", "t-failed", "t-wait", "t-done"]
    assert {t["thread_id"]: t["status"] for t in listed}["t-wait"] == "waiting"
    assert [t["thread_id"] for t in ok_json(threads, "threads", "--status", "failed")] == [
        "t-failed"
    ]
    assert len(ok_json(threads, "threads", "--limit", "2")) == 2

    table = run(threads, "threads")
    assert table.exit_code == 0
    lines = table.stdout.splitlines()
    assert lines[0].split()[:3] == ["THREAD", "STATUS", "STEP"]
    assert lines[1].split()[:3] == ["t-running", "running", "1"]  # after checkpoint 0
    assert "KeyError: 'customer_id'" in table.stdout  # a failed thread shows why
    assert all(line == line.rstrip() for line in lines)  # piped: no padding to grep around
    assert run(threads, "threads", "--status", "cancelled").stdout.strip() == (
        "No threads in status cancelled."
    )


def test_show_prints_meta_and_a_checkpoint(threads: Backend) -> None:
    shown = ok_json(threads, "show", "t-done")
    assert shown["meta"]["status"] == "done" and shown["meta"]["result"] == "Refunded 10 EUR."
    assert shown["checkpoint"]["step"] == 3 and shown["checkpoint"]["state"]["count"] == 3
    assert ok_json(threads, "show", "t-done", "--step", "1")["checkpoint"]["state"]["count"] == 1

    text = run(threads, "show", "t-running").stdout
    assert "checkpoint 0 (latest)" in text
    assert "pending (1 tool call)" in text and '"call-1"' in text
    assert '"page": 0' in text  # cursors
    assert "refund 10?" in run(threads, "show", "t-wait").stdout  # what the human is asked


def test_show_says_when_a_wait_times_out_and_that_it_did(backend: Backend) -> None:
    store = backend.store
    token = drive(store, "t-deadline", [{"amount": 10}])
    store.set_status("t-deadline", token, Status.WAITING, due_in=3600, release_owner=OWNER)
    at = store.meta("t-deadline").timeout_at  # type: ignore[union-attr]
    assert ok_json(backend, "show", "t-deadline")["meta"]["timeout_at"] == at
    assert "times out" in run(backend, "show", "t-deadline").stdout
    assert "(a wait of 1h)" in run(backend, "show", "t-deadline").stdout
    store.set_status("t-deadline", token, Status.WAITING, due_in=0, release_owner=OWNER)
    wait_until(lambda: store.due(), timeout=5, what="the timeout due")
    store.acquire("t-deadline", OWNER, 30)
    assert "nobody answered within 0s" in run(backend, "show", "t-deadline").stdout


def test_show_says_a_thread_waiting_in_its_first_node_has_no_checkpoint(
    backend: Backend,
) -> None:
    store = backend.store
    store.open_thread("t-first", task=TASK)
    token = store.acquire("t-first", OWNER, 30)
    store.set_status("t-first", token, Status.WAITING, interrupt="ok?", release_owner=OWNER)
    step = next(
        line for line in run(backend, "show", "t-first").stdout.splitlines() if "step" in line
    )
    assert step.split() == ["step", "0", "(node", "-;", "no", "checkpoint", "yet)"], step


def test_history_lists_steps_with_what_changed(threads: Backend) -> None:
    assert [c["step"] for c in ok_json(threads, "history", "t-done")] == [3, 2, 1, 0]
    assert [c["step"] for c in ok_json(threads, "history", "t-done", "--limit", "2")] == [3, 2]
    rows = {
        line.split()[0]: line for line in run(threads, "history", "t-done").stdout.splitlines()[1:]
    }
    assert "state.messages, state.count" in rows["1"]
    assert "(first step)" in rows["0"]


def test_diff_shows_changed_paths(threads: Backend) -> None:
    changes = ok_json(threads, "diff", "t-done", "1", "2")["changes"]
    assert {"path": "state.count", "kind": "changed", "before": 1, "after": 2} in changes
    assert {"path": "node", "kind": "changed", "before": "node2", "after": "node3"} in changes
    added = [c for c in changes if c["kind"] == "added"]
    assert [c["path"] for c in added] == ["state.messages[2]"]
    assert added[0]["after"]["content"] == {"refund_id": "re_1"}

    text = run(threads, "diff", "t-done", "2", "3").stdout
    assert "~ state.count  2 → 3" in text
    assert "- state.messages[2]" in text
    assert "No differences" in run(threads, "diff", "t-done", "2", "2").stdout


def strict_json(text: str) -> Any:
    """``text`` read as JSON readers other than Python's read it: no NaN, no Infinity."""

    def refuse(word: str) -> None:
        raise AssertionError(f"{word} is not JSON: {text}")

    return json.loads(text, parse_constant=refuse)


def test_json_of_a_state_holding_nan_is_strict_json(backend: Backend) -> None:
    drive(backend.store, "t-nan", [{"score": 1.0}, {"score": math.nan, "bound": -math.inf}])
    shown = strict_json(run(backend, "show", "t-nan", "--json").stdout)
    tagged = {"score": {"$float": "NaN"}, "bound": {"$float": "-Infinity"}}
    assert shown["checkpoint"]["state"] == tagged
    assert strict_json(run(backend, "history", "t-nan", "--json").stdout)[0]["state"] == tagged
    changes = strict_json(run(backend, "diff", "t-nan", "0", "1", "--json").stdout)["changes"]
    assert {"path": "state.score", "kind": "changed", "before": 1.0, "after": tagged["score"]} in (
        changes
    )
    assert '"score": NaN' in run(backend, "show", "t-nan").stdout  # people read it as it is


def test_diff_and_history_agree_on_what_a_step_changed(backend: Backend) -> None:
    before = {"score": math.nan, "scores": [math.nan], "flag": 1, "count": 1}
    drive(backend.store, "t-kinds", [before, {**before, "flag": True, "count": 1.0}])
    # NaN is still NaN; 1 became True, and 1 became 1.0: a change of what is stored.
    changes = ok_json(backend, "diff", "t-kinds", "0", "1")["changes"]
    assert [(c["path"], c["before"], c["after"]) for c in changes] == [
        ("node", "node1", "node2"),
        ("state.flag", 1, True),
        ("state.count", 1, 1.0),
        ("cursors.page", 0, 1),
    ]
    rows = run(backend, "history", "t-kinds").stdout.splitlines()
    assert rows[1].split()[0] == "1", rows
    assert rows[1].endswith("  node, state.flag, state.count, cursors"), rows


def test_a_missing_checkpoint_is_told_by_the_steps_the_thread_holds(backend: Backend) -> None:
    # Written by workers keeping 2 checkpoints; the command line's store keeps the default.
    writer: Store = (
        SQLiteStore(backend.workdir / "agentq.db", keep_last=2)
        if backend.kind == "sqlite"
        else RedisStore.from_url(backend.url, prefix=backend.prefix, keep_last=2)
    )
    with writer:
        drive(writer, "t-long", [{"n": n} for n in range(5)])
    pruned = run(backend, "show", "t-long", "--step", "1")
    assert_one_line_error(pruned, "step 1", "holds steps 3 to 4", "keep_last", "history", code=1)
    assert "20" not in pruned.stderr  # not the reader's own keep_last
    forked = run(backend, "fork", "t-long", "--from", "0")
    assert_one_line_error(forked, "cannot fork", "holds steps 3 to 4", code=1)
    ahead = run(backend, "diff", "t-long", "3", "9")
    assert_one_line_error(ahead, "step 9", "never written: the latest is 4", code=1)


def test_ids_and_errors_print_as_written(backend: Backend) -> None:
    # rich would read brackets as markup and :x: as an emoji code.
    token = drive(backend.store, "odd[/b]:x:", [{"key [1]": "[/red]"}])
    backend.store.set_status(
        "odd[/b]:x:", token, Status.FAILED, error="boom [/] :x:", release_owner=OWNER
    )
    table = run(backend, "threads").stdout
    assert "odd[/b]:x:" in table and "boom [/] :x:" in table
    assert '"key [1]": "[/red]"' in run(backend, "show", "odd[/b]:x:").stdout


# -- changing ----------------------------------------------------------------------------


def test_fork_copies_a_checkpoint_into_a_waiting_thread(threads: Backend) -> None:
    forked = ok_json(threads, "fork", "t-done", "--from", "1", "--to", "t-copy")
    assert forked["thread_id"] == "t-copy" and forked["status"] == "waiting"
    latest = threads.store.latest("t-copy")
    assert latest is not None and latest.step == 1 and latest.state["count"] == 1
    text = run(threads, "fork", "t-done", "--from", "2").stdout
    assert "Forked t-done at step 2 into t-done-fork-2-" in text
    forks = [t for t in threads.store.threads() if t.thread_id.startswith("t-done-fork-2-")]
    assert len(forks) == 1 and forks[0].status == Status.WAITING


def test_resume_without_an_app_leaves_sending_to_the_sweeper(threads: Backend) -> None:
    result = run(threads, "resume", "t-wait", "--value", '{"approved": true}')
    assert result.exit_code == 0, result.output
    assert "sweeper" in result.stdout
    meta = threads.store.meta("t-wait")
    assert meta is not None and meta.status == Status.QUEUED
    assert meta.resumed and meta.resume_value == {"approved": True}
    # Due now: the next sweep of any worker sends it.
    assert "t-wait" in [thread for thread, _ in threads.store.due()]


def test_retry_queues_a_failed_thread(threads: Backend) -> None:
    assert ok_json(threads, "retry", "t-failed")["status"] == "queued"
    meta = threads.store.meta("t-failed")
    assert meta is not None and meta.status == Status.QUEUED and meta.error is None


def stuck(store: Store, thread_id: str = "t-stuck") -> int:
    """A thread in needs_attention: its worker claimed two refunds, recorded one, died."""
    token = drive(store, thread_id, [{"n": 1}])
    store.claim_effect(thread_id, "call-1", token, tool="refund")
    store.complete_effect(thread_id, "call-1", token, {"refund_id": "re_1"})
    store.claim_effect(thread_id, "call-2", token, tool="refund")
    store.set_status(thread_id, token, Status.NEEDS_ATTENTION, error="unknown", release_owner=OWNER)
    return token


def hash_reads(backend: Backend) -> Callable[[], int | None]:
    """From now on, how many hashes (metas, effect records) the Redis store read whole
    (``None`` on SQLite)."""
    if backend.kind != "redis":
        return lambda: None
    client = redis.Redis.from_url(backend.url)
    client.config_resetstat()

    def reads() -> int:
        with client:
            stats: dict[str, dict[str, int]] = client.info("commandstats")
        return stats.get("cmdstat_hgetall", {}).get("calls", 0)

    return reads


def test_effects_lists_every_record_of_a_thread(threads: Backend) -> None:
    token = stuck(threads.store)
    sent = [threads.store.downstream_key("t-stuck", key) for key in ("call-1", "call-2")]
    reads = hash_reads(threads)
    listed = ok_json(threads, "effects", "t-stuck")
    # The meta once and each record: the keys sent downstream come from that one meta.
    assert reads() in (None, 1 + len(listed))
    claimed = [effect.pop("claimed_at") for effect in listed]
    assert all(isinstance(at, float) for at in claimed)
    assert listed == [
        {"key": "call-1", "state": "done", "token": token, "result": {"refund_id": "re_1"}}
        | {"tool": "refund", "claimed_by": "t-stuck", "sent_as": sent[0]},
        {"key": "call-2", "state": "pending", "token": token, "result": None}
        | {"tool": "refund", "claimed_by": "t-stuck", "sent_as": sent[1]},
    ]
    text = run(threads, "effects", "t-stuck").stdout
    assert "call-2" in text and "outcome unknown" in text and "re_1" in text
    assert sent[1] in text
    assert "agentq resolve t-stuck KEY --result JSON" in text
    assert "no effect records" in run(threads, "effects", "t-done").stdout


def test_resolve_settles_a_call_and_queues_the_thread(threads: Backend) -> None:
    token = stuck(threads.store)
    settled = ok_json(threads, "resolve", "t-stuck", "call-2", "--result", '{"refund_id": "x"}')
    assert settled == {
        "thread_id": "t-stuck",
        "key": "call-2",
        "status": "queued",
        "sent": None,
        "not_sent": None,
    }
    effect = threads.store.effect("t-stuck", "call-2")
    assert effect is not None and (effect.state, effect.result) == ("done", {"refund_id": "x"})
    assert effect.token == token + 1
    assert "t-stuck" in [thread for thread, _ in threads.store.due()]
    stuck(threads.store, "t-stuck-2")
    text = run(threads, "resolve", "t-stuck-2", "call-2", "--did-not-run").stdout
    assert "Settled call-2 of t-stuck-2: queued" in text and "sweeper" in text
    assert threads.store.effect("t-stuck-2", "call-2") is None


def test_a_shared_call_is_looked_up_and_settled_with_shared(threads: Backend) -> None:
    """A tool declared shared=True keeps its record apart from the thread's own: the
    thread's listing does not show it, --shared does, and settles it."""
    store = threads.store
    token = drive(store, "t-shared", [{"n": 1}])
    store.claim_effect("t-shared", "invoice-1", token, shared=True, tool="invoice")
    store.set_status("t-shared", token, Status.NEEDS_ATTENTION, error="?", release_owner=OWNER)
    assert "no effect records" in run(threads, "effects", "t-shared").stdout
    assert_one_line_error(
        run(threads, "resolve", "t-shared", "invoice-1", "--did-not-run"),
        "'invoice-1' has no record",
        "agentq resolve --shared",
        code=1,
    )
    [listed] = ok_json(threads, "effects", "t-shared", "--shared", "invoice-1")
    assert isinstance(listed.pop("claimed_at"), float)
    assert listed == {
        "key": "invoice-1",
        "state": "pending",
        "token": token,
        "result": None,
        "tool": "invoice",
        "claimed_by": "t-shared",
        "sent_as": store.downstream_key("t-shared", "invoice-1", shared=True),
    }
    text = " ".join(run(threads, "effects", "t-shared", "--shared", "invoice-1").stdout.split())
    assert "BY THREAD" in text and "outcome unknown" in text
    assert "agentq resolve t-shared invoice-1 --shared --result JSON" in text
    settled = ok_json(threads, "resolve", "t-shared", "invoice-1", "--shared", "--result", '"in_1"')
    assert (settled["key"], settled["status"]) == ("invoice-1", "queued")
    effect = store.effect("t-shared", "invoice-1", shared=True)
    assert effect is not None and (effect.state, effect.result) == ("done", "in_1")
    assert_one_line_error(
        run(threads, "resolve", "t-shared", "invoice-1", "--shared", "--did-not-run"),
        "'t-shared'",
        "queued",
        code=1,
    )
    missing = run(threads, "effects", "t-shared", "--shared", "invoice-2").stdout
    assert "No shared record 'invoice-2'" in missing


def test_cancel_idle_running_and_finished_threads(threads: Backend) -> None:
    idle = run(threads, "cancel", "t-wait").stdout
    # Without -A there is no result backend to mark the first task REVOKED in: it says so.
    assert "cancelled." in idle and "keeps its state: pass -A module:app" in idle
    assert threads.store.meta("t-wait").status == Status.CANCELLED  # type: ignore[union-attr]
    assert "next step boundary" in run(threads, "cancel", "t-running").stdout
    running = threads.store.meta("t-running")
    assert running is not None and running.status == Status.RUNNING
    assert running.cancel_requested
    assert ok_json(threads, "cancel", "t-done") == {
        "thread_id": "t-done",
        "status": "done",
        "was": "done",
        "task_revoked": False,
    }


def test_gc_deletes_only_finished_threads_past_the_cutoff(threads: Backend) -> None:
    assert ok_json(threads, "gc", "--older-than", "3600") == {"removed": 0, "older_than": 3600.0}
    # More than one chunk: deleted oldest first in several atomic gc calls.
    for index in range(120):
        finish(threads.store, f"old-{index}", [{"i": index}], result=index)
    result = run(threads, "gc", "--older-than", "0")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "Removed 121 finished threads older than 0s."
    left = {t.thread_id for t in threads.store.threads(limit=500)}
    assert left == {"t-wait", "t-failed", "t-running"}


def test_gc_keeps_failed_and_needs_attention_threads_unless_asked(threads: Backend) -> None:
    stuck(threads.store)
    before = {t.thread_id for t in threads.store.threads(limit=500)}
    preview = run(threads, "gc", "--older-than", "0", "--dry-run")
    assert preview.exit_code == 0, preview.output
    assert preview.stdout.splitlines()[0].split()[:2] == ["t-done", "done"]
    assert "Would remove 1 thread older than 0s (dry run: nothing deleted)." in preview.stdout
    asked = ["--include", "failed", "--include", "needs_attention"]
    assert ok_json(threads, "gc", "--older-than", "0", "--dry-run", *asked) == {
        "would_remove": ["t-done", "t-failed", "t-stuck"],
        "older_than": 0.0,
    }
    assert {t.thread_id for t in threads.store.threads(limit=500)} == before
    assert ok_json(threads, "gc", "--older-than", "0")["removed"] == 1
    assert ok_json(threads, "gc", "--older-than", "0", *asked)["removed"] == 2
    assert {t.thread_id for t in threads.store.threads(limit=500)} == {"t-wait", "t-running"}


def test_doctor_checks_the_store_and_cleans_up_its_probe(threads: Backend) -> None:
    report = ok_json(threads, "doctor")
    assert report["ok"] and report["store"]["findings"] == []
    assert report["celery"] is None
    for operation in ("read", "commit"):
        samples = report["latency_ms"][operation]["samples"]
        assert len(samples) == 5 and all(ms > 0 for ms in samples)
    text = run(threads, "doctor").stdout
    assert "nothing to fix" in text and "commit" in text and "pass -A" in text
    assert {t.thread_id for t in threads.store.threads(limit=500)} == {
        "t-done",
        "t-wait",
        "t-failed",
        "t-running",
    }


def test_doctor_fails_on_a_store_that_can_lose_checkpoints(redis_server: RedisServer) -> None:
    client = redis_server.client()
    client.config_set("maxmemory-policy", "allkeys-lru")
    try:
        result = CliRunner().invoke(cli, ["--store", redis_server.url, "doctor"])
    finally:
        client.config_set("maxmemory-policy", "noeviction")
        client.close()
    assert result.exit_code == 1
    assert "maxmemory-policy" in result.stdout and "noeviction" in result.stdout


def test_an_evicting_store_is_refused_unless_allowed(redis_server: RedisServer) -> None:
    client = redis_server.client()
    client.config_set("maxmemory-policy", "allkeys-lru")
    try:
        refused = CliRunner().invoke(cli, ["--store", redis_server.url, "threads"])
        allowed = CliRunner().invoke(
            cli, ["--store", redis_server.url, "--allow-unsafe-store", "threads"]
        )
    finally:
        client.config_set("maxmemory-policy", "noeviction")
        client.close()
    assert refused.exit_code == 1
    assert "maxmemory-policy=allkeys-lru" in refused.stderr
    assert "set maxmemory-policy noeviction" in refused.stderr
    assert "allow_unsafe_store" in refused.stderr
    assert allowed.exit_code == 0, allowed.stderr


# -- refusing ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["show", "nobody"],
        ["history", "nobody"],
        ["diff", "nobody", "0", "1"],
        ["fork", "nobody", "--from", "0"],
        ["resume", "nobody"],
        ["retry", "nobody"],
        ["cancel", "nobody"],
        ["effects", "nobody"],
        ["resolve", "nobody", "k", "--did-not-run"],
    ],
)
def test_unknown_thread_is_one_line(threads: Backend, args: list[str]) -> None:
    assert_one_line_error(run(threads, *args), "'nobody'", "no such thread", code=1)


@pytest.mark.parametrize(
    "args,fragments,code",
    [
        (["show", "t-done", "--step", "99"], ["step 99", "history"], 1),
        (["diff", "t-done", "0", "99"], ["step 99"], 1),
        (["show", "t-done", "--step", "-1"], ["--step"], 2),
        # Past any step: a usage error on both stores, not SQLite's OverflowError.
        (["show", "t-done", "--step", str(2**63)], ["--step", "0<=x<="], 2),
        (["diff", "t-done", "0", str(2**64)], ["'B'", "0<=x<="], 2),
        (["fork", "t-done", "--from", str(2**63)], ["--from", "0<=x<="], 2),
        (["history", "t-done", "--limit", str(2**64)], ["--limit", "1<=x<="], 2),
        (["threads", "--limit", str(2**64)], ["--limit", "1<=x<="], 2),
        (["resume", "t-wait", "--value", "{approved: true}"], ["--value", "not JSON"], 2),
        # Python's json reads these; no other JSON reader does.
        (["resume", "t-wait", "--value", "NaN"], ["--value", "NaN is not a JSON number"], 2),
        (["resume", "t-wait", "--value", '{"x": -Infinity}'], ["-Infinity is not a JSON"], 2),
        (["resolve", "t-failed", "k", "--result", "[1e999]"], ["--result", "too large"], 2),
        (["resume", "t-done"], ["'t-done'", "done"], 1),
        (["retry", "t-wait"], ["'t-wait'", "waiting"], 1),
        (["fork", "t-done", "--from", "1", "--to", "t-wait"], ["t-wait", "existing"], 1),
        (["fork", "t-done", "--from", "1", "--to", "bad{id}"], ["brace"], 1),
        (["fork", "t-done", "--from", "1", "--to", ""], ["thread id is empty"], 1),
        (["fork", "t-done", "--from", "3"], ["step 3", "finished", "fork step 2"], 1),
        (
            ["resolve", "t-running", "call-1", "--did-not-run"],
            ["lease", "once the thread stopped"],
            1,
        ),
        (["resolve", "t-failed", "call-9", "--did-not-run"], ["'call-9'", "no record"], 1),
        (["resolve", "t-wait", "k", "--result", "1"], ["'t-wait'", "waiting"], 1),
        (["resolve", "t-failed", "k"], ["--result", "--did-not-run"], 2),
        (["resolve", "t-failed", "k", "--result", "1", "--did-not-run"], ["exactly one"], 2),
        (["resolve", "t-failed", "k", "--result", "{x"], ["--result", "not JSON"], 2),
        (["threads", "--status", "lost"], ["--status", "lost"], 2),
        (["threads", "--limit", "0"], ["--limit"], 2),
        (["gc", "--older-than", "-5"], ["--older-than"], 2),
        (["gc", "--older-than", "nan"], ["--older-than", "'nan' is not a finite number"], 2),
        (["gc", "--older-than", "inf", "--dry-run"], ["--older-than", "'inf' is not a"], 2),
        (["sweep", "--interval", "NaN"], ["--interval", "'NaN' is not a finite number"], 2),
        (["sweep", "--once"], ["sweep needs your Celery app", "-A"], 1),
        (["nonsense"], ["No such command"], 2),
    ],
)
def test_bad_arguments_are_one_line(
    threads: Backend, args: list[str], fragments: list[str], code: int
) -> None:
    assert_one_line_error(run(threads, *args), *fragments, code=code)


@pytest.mark.parametrize(
    "args,fragments",
    [
        (["--store", "mysql://db/agentq", "threads"], ["unsupported store URL", "mysql://"]),
        (["--store", "redis://127.0.0.1:1/0", "threads"], ["cannot reach the store"]),
        (["--store", "sqlite:///no/such/dir/agentq.db", "threads"], ["no SQLite store at"]),
        (["threads"], ["no store given", "--store"]),
        (["-A", "no_such_module_xyz:app", "threads"], ["cannot load the Celery app"]),
        (["-A", "os:path", "threads"], ["'os:path' is a module, not a Celery app"]),
        (["--store", "redis://:pw@127.0.0.1:99999/0", "threads"], ["Redis URL", "Port"]),
        (["--store", "redis://127.0.0.1:6379/abc", "threads"], ["database 'abc'", "number"]),
        (["--store", "sqlite:///agentq.db?mode=ro", "threads"], ["query string (?mode=ro)"]),
        (["--store", "sqlite:///agentq.db#x", "doctor"], ["fragment (#x)", "sqlite:///agentq.db"]),
        (["--bogus"], ["No such option"]),
    ],
)
def test_bad_store_or_app_is_one_line(
    args: list[str], fragments: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AGENTQ_STORE", raising=False)
    monkeypatch.delenv("AGENTQ_APP", raising=False)
    assert_one_line_error(CliRunner().invoke(cli, args), *fragments)


def test_a_database_the_redis_server_lacks_is_one_line(redis_server: RedisServer) -> None:
    # The server refuses the URL's database when connecting: no finding about CONFIG.
    missing = redis_server.url.rsplit("/", 1)[0] + "/99"
    for command in ("threads", "doctor"):
        result = CliRunner().invoke(cli, ["--store", missing, command])
        assert_one_line_error(result, "DB index is out of range", "database number", code=1)
        assert "CONFIG" not in result.output


def test_store_and_prefix_come_from_the_environment(threads: Backend) -> None:
    result = CliRunner(env={"AGENTQ_STORE": threads.url, "AGENTQ_PREFIX": threads.prefix}).invoke(
        cli, ["threads", "--json"]
    )
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.stdout)) == 4


# -- the entry points, as real processes ---------------------------------------------------


def demo_app_env(backend: Backend) -> dict[str, str]:
    """Point ``agentq.demo.app`` (a real app module shipped with agentq) at the backend:
    SQLite with the filesystem broker, or Redis as store and broker."""
    namespace = backend.prefix.rstrip(":")
    env = {
        "AGENTQ_DEMO_WORKDIR": str(backend.workdir),
        "AGENTQ_DEMO_STORE": backend.url,
        "AGENTQ_DEMO_NAMESPACE": namespace,
        "AGENTQ_DEMO_BROKER": backend.url,
        "AGENTQ_DEMO_LEDGER": backend.url,
    }
    if backend.kind == "sqlite":
        for folder in ("messages", "processed", "control"):
            (backend.workdir / "broker" / folder).mkdir(parents=True, exist_ok=True)
        env.update(
            AGENTQ_DEMO_BROKER="filesystem://",
            AGENTQ_DEMO_LEDGER=str(backend.workdir / "payments.db"),
        )
    return env


def queued_messages(backend: Backend) -> int:
    """How many messages wait in the demo app's queue, read from the broker itself."""
    if backend.kind == "sqlite":
        return len(list((backend.workdir / "broker" / "messages").iterdir()))
    client = redis.Redis.from_url(backend.url)
    try:
        return int(client.llen(f"{backend.prefix}broker:{backend.prefix.rstrip(':')}"))
    finally:
        client.close()


def command(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AGENTQ_")}
    return subprocess.run(
        args, env={**clean, **(env or {})}, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize("agentq", [[str(BIN / "agentq")], [sys.executable, "-m", "agentq"]])
def test_console_script(threads: Backend, agentq: list[str]) -> None:
    listed = command([*agentq, *threads.args, "threads", "--json"])
    assert listed.returncode == 0, listed.stderr
    assert len(json.loads(listed.stdout)) == 4
    missing = command([*agentq, *threads.args, "show", "nobody"])
    assert missing.returncode == 1
    assert missing.stderr.count("\n") == 1 and "no such thread" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_no_command_prints_the_help_as_help(threads: Backend) -> None:
    # The first thing people type: the help on its lines, not folded into one error line.
    env = demo_app_env(threads)
    for args in ([str(BIN / "agentq")], [str(BIN / "celery"), "-A", "agentq.demo.app", "agentq"]):
        bare = command(args, env)
        assert bare.returncode == 2, bare.stderr
        lines = bare.stderr.splitlines()
        assert lines[0].startswith("Usage: ") and "agentq [OPTIONS] COMMAND" in lines[0], lines
        assert "Commands:" in lines and any(line.split()[:1] == ["threads"] for line in lines)
        assert not bare.stderr.startswith("agentq: ")


def test_celery_without_an_app_asks_for_one(threads: Backend) -> None:
    # Without -A, celery hands over its default app, which names no store: the command
    # must not go looking for ./agentq.db, the default SQLite file.
    celery = [str(BIN / "celery"), "agentq"]
    elsewhere = threads.workdir / "elsewhere"
    elsewhere.mkdir()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AGENTQ_")}
    bare = subprocess.run(
        [*celery, "threads"], cwd=elsewhere, env=clean, capture_output=True, text=True, timeout=60
    )
    assert bare.returncode == 1 and bare.stderr.count("\n") == 1, bare.stderr
    assert "no store given" in bare.stderr and "-A module:app" in bare.stderr
    assert "agentq.db" not in bare.stderr
    listed = command([*celery, "threads", "--json", *threads.args])
    assert listed.returncode == 0, listed.stderr
    assert len(json.loads(listed.stdout)) == 4


def test_celery_subcommand_uses_the_apps_settings(threads: Backend) -> None:
    env = demo_app_env(threads)
    celery = [str(BIN / "celery"), "-A", "agentq.demo.app", "agentq"]
    listed = command([*celery, "threads", "--json"], env)
    assert listed.returncode == 0, listed.stderr
    assert {t["thread_id"] for t in json.loads(listed.stdout)} == {
        "t-done",
        "t-wait",
        "t-failed",
        "t-running",
    }
    missing = command([*celery, "show", "nobody"], env)
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1, missing.stderr
    assert "no such thread" in missing.stderr and "Traceback" not in missing.stderr
    doctor = command([*celery, "doctor"], env)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "Celery app agentq-demo" in doctor.stdout


def test_resume_and_retry_with_an_app_send_a_message(threads: Backend) -> None:
    env = demo_app_env(threads)
    agentq = [str(BIN / "agentq"), "-A", "agentq.demo.app"]
    resumed = command([*agentq, "resume", "t-wait", "--value", '"yes"', "--json"], env)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["sent"]
    assert queued_messages(threads) == 1
    meta = threads.store.meta("t-wait")
    assert meta is not None and meta.status == Status.QUEUED and meta.resume_value == "yes"
    retried = command([*agentq, "retry", "t-failed"], env)
    assert retried.returncode == 0 and "message sent" in retried.stdout, retried.stderr
    assert queued_messages(threads) == 2
    stuck(threads.store)
    settled = command([*agentq, "resolve", "t-stuck", "call-2", "--did-not-run"], env)
    assert settled.returncode == 0 and "message sent" in settled.stdout, settled.stderr
    assert queued_messages(threads) == 3


def test_a_send_the_broker_refuses_says_the_thread_is_queued_all_the_same(
    threads: Backend,
) -> None:
    # Nothing listens on the broker's port: every send is refused.
    dead = f"redis://127.0.0.1:{free_port()}/0"
    env = {**demo_app_env(threads), "AGENTQ_DEMO_BROKER": dead, "AGENTQ_DEMO_START_GRACE": "1"}
    agentq = [str(BIN / "agentq"), "-A", "agentq.demo.app"]
    resumed = command([*agentq, "resume", "t-wait", "--value", '"yes"', "--json"], env)
    assert resumed.returncode == 1, resumed.stderr
    told = resumed.stderr.strip()
    assert told.count("\n") == 0 and "Traceback" not in told, told
    for fragment in ("'t-wait'", "queued again", "not sent", "sweeper", "1 s", "refused"):
        assert fragment in told, told
    outcome = json.loads(resumed.stdout)
    assert (outcome["status"], outcome["sent"]) == ("queued", None)
    assert outcome["not_sent"] in told
    meta = threads.store.meta("t-wait")
    assert meta is not None and meta.status == Status.QUEUED and meta.resume_value == "yes"

    retried = command([*agentq, "retry", "t-failed"], env)
    assert retried.returncode == 1 and retried.stdout == "", retried.stdout
    assert "'t-failed': queued again" in retried.stderr and "sweeper" in retried.stderr
    stuck(threads.store)
    settled = command([*agentq, "resolve", "t-stuck", "call-2", "--did-not-run"], env)
    assert settled.returncode == 1 and "'t-stuck': queued again" in settled.stderr
    # What the message said: once the start grace is over, a sweeper sends each of them.
    wait_until(
        lambda: {thread for thread, _ in threads.store.due()} >= {"t-wait", "t-failed", "t-stuck"},
        timeout=10,
        what="the three threads due for the sweeper",
    )


def test_sweep_once_resends_what_is_due(threads: Backend) -> None:
    threads.store.open_thread("t-lost", task=TASK, start_grace=0)  # its message never came
    # A grace longer than the two commands take, however slow the machine: the re-sent
    # thread is not due again before the second sweep.
    env = {**demo_app_env(threads), "AGENTQ_DEMO_START_GRACE": "60"}
    swept = command(
        [str(BIN / "agentq"), "-A", "agentq.demo.app", "sweep", "--once", "--json"], env
    )
    assert swept.returncode == 0, swept.stderr
    assert json.loads(swept.stdout) == {"sent": ["t-lost"]}
    assert queued_messages(threads) == 1
    again = command([str(BIN / "agentq"), "-A", "agentq.demo.app", "sweep", "--once"], env)
    assert again.stdout.strip() == "Nothing due."  # claimed: not sent twice


def test_sweep_loops_until_interrupted(threads: Backend) -> None:
    threads.store.open_thread("t-lost", task=TASK, start_grace=0)
    env = demo_app_env(threads)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AGENTQ_")}
    with subprocess.Popen(
        [str(BIN / "agentq"), "-A", "agentq.demo.app", "sweep", "--interval", "0.1", "--json"],
        env={**clean, **env, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as sweeper:
        assert sweeper.stdout is not None and sweeper.stderr is not None
        try:
            first = json.loads(sweeper.stdout.readline())  # blocks until the first re-send
            assert first["sent"] == "t-lost"
            sweeper.send_signal(signal.SIGINT)
            assert sweeper.wait(timeout=30) == 0
        finally:
            if sweeper.poll() is None:
                sweeper.kill()
        assert "Traceback" not in sweeper.stderr.read()
    assert queued_messages(threads) >= 1


def test_the_app_may_come_after_the_command(threads: Backend) -> None:
    env = demo_app_env(threads)
    agentq = str(BIN / "agentq")
    after = command([agentq, "retry", "t-failed", "-A", "agentq.demo.app"], env)
    assert after.returncode == 0 and "message sent" in after.stdout, after.stderr
    assert queued_messages(threads) == 1
    celery = [str(BIN / "celery"), "-A", "agentq.demo.app", "agentq"]
    twice = command([*celery, "threads", "-A", "agentq.demo.app"], env)
    assert twice.returncode == 1 and "write -A before 'agentq'" in twice.stderr, twice.stderr


def test_the_store_may_come_after_the_command(threads: Backend) -> None:
    # As the inspector's section writes it: `agentq ui --store URL`.
    agentq = str(BIN / "agentq")
    listed = command([agentq, "threads", "--json", *threads.args])
    assert listed.returncode == 0, listed.stderr
    assert len(json.loads(listed.stdout)) == 4
    # After the command it wins, as a command line wins over the environment.
    elsewhere = {"AGENTQ_STORE": "redis://127.0.0.1:1/0", "AGENTQ_PREFIX": "elsewhere:"}
    shown = command([agentq, "show", "t-done", "--json", *threads.args], elsewhere)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["meta"]["status"] == "done"
    env = demo_app_env(threads)
    celery = [str(BIN / "celery"), "-A", "agentq.demo.app", "agentq"]
    through_celery = command([*celery, "threads", "--json", *threads.args], env)
    assert through_celery.returncode == 0, through_celery.stderr
    assert len(json.loads(through_celery.stdout)) == 4


def test_an_unsafe_store_may_be_allowed_after_the_command(redis_server: RedisServer) -> None:
    client = redis_server.client()
    client.config_set("maxmemory-policy", "allkeys-lru")
    try:
        allowed = CliRunner().invoke(
            cli, ["threads", "--store", redis_server.url, "--allow-unsafe-store"]
        )
    finally:
        client.config_set("maxmemory-policy", "noeviction")
        client.close()
    assert allowed.exit_code == 0, allowed.stderr


def test_a_reader_that_goes_away_ends_the_listing_quietly(threads: Backend) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # as `agentq threads | head` once head has exited
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AGENTQ_")}
    try:
        listed = subprocess.run(
            [str(BIN / "agentq"), *threads.args, "threads"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            env=clean,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert listed.stderr == ""
    assert listed.returncode == 141


@pytest.mark.parametrize(
    "args,command_named",
    [
        (["retry", "t-wait"], "'agentq "),
        (["resume", "t-done"], "'agentq "),
        (["show", "t-done", "--step", "99"], "'agentq history t-done'"),
        (["fork", "t-done", "--from", "99"], "'agentq history t-done'"),
    ],
)
def test_errors_name_the_command_and_the_method(
    threads: Backend, args: list[str], command_named: str
) -> None:
    assert_one_line_error(run(threads, *args), command_named, " in code)", code=1)


def test_other_celery_commands_do_not_load_agentq() -> None:
    # celery loads every celery.commands entry point for each command it runs: the
    # 'agentq' group it names must not bring agentq's core, its commands or rich along.
    script = (
        "import atexit, sys\n"
        "atexit.register(lambda: print(sorted(m for m in sys.modules"
        " if m.startswith(('agentq', 'rich'))), file=sys.stderr))\n"
        "from celery.__main__ import main\n"
        "sys.argv = ['celery', '--help']\n"
        "main()\n"
    )
    listed = command([sys.executable, "-c", script])
    assert listed.returncode == 0, listed.stderr
    assert "agentq" in listed.stdout  # the group is there, its help one line
    loaded = listed.stderr.strip().splitlines()[-1]
    heavy = ("agentq.celery", "agentq.store", "agentq.engine", "agentq.cli.session", "rich")
    assert "agentq.cli" in loaded and not any(f"'{name}" in loaded for name in heavy), loaded
