"""The SQLite store shared by processes as a prefork worker shares it: no connection crosses
``fork()``, and a process that opens the database while another holds its write lock
reads at once and meets a write that waits too long as a passing outage."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import IO

import pytest

from agentq.records import Status
from agentq.store.sqlite import connection
from agentq.store.sqlite.store import SQLiteStore

# A prefork worker: the main process opens the store (startup checks, the sweeper), then
# forks a pool child that drives a thread.
PREFORK_WORKER = """
import os, sys
from agentq.records import Checkpoint
from agentq.store.sqlite.store import SQLiteStore

path, fifo = sys.argv[1], sys.argv[2]
store = SQLiteStore(path)
store.open_thread("t1", task="agent")
token = store.acquire("t1", "w1", 3600)
store.commit("t1", token, Checkpoint(step=0, node="main", token=token))
pid = os.fork()
if pid == 0:
    store.commit("t1", token, Checkpoint(step=1, node="child", token=token))
    print("child", os.getpid(), flush=True)
    with open(fifo) as go:
        go.readline()
    store.commit("t1", token, Checkpoint(step=2, node="child", token=token))
    print("acked", store.latest("t1").step, flush=True)  # commit() returned
    os._exit(0)
print("main", flush=True)
sys.stdin.read()  # idles, as the main process does between sweeps, until killed
"""


def _line(stream: IO[str] | None) -> str:
    assert stream is not None
    line = stream.readline()
    assert line, "the process exited early"
    return line.strip()


def test_a_pool_child_keeps_its_commits_when_the_main_process_dies(tmp_path: Path) -> None:
    """The worker's main process is SIGKILLed (the OOM killer, an eviction) while its pool
    child drives a thread, and an operator's `agentq ls` opens and closes the database.
    A connection the child had inherited would take no file lock of its own: that close
    would find no other user and delete the WAL the child goes on committing to, and the
    child's acknowledged step would be gone."""
    path, fifo = tmp_path / "agentq.db", tmp_path / "go"
    os.mkfifo(fifo)
    main = subprocess.Popen(
        [sys.executable, "-c", PREFORK_WORKER, str(path), str(fifo)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    child_pid = None
    try:
        started = dict(_line(main.stdout).partition(" ")[::2] for _ in range(2))
        assert started.keys() == {"main", "child"}
        child_pid = int(started["child"])
        main.kill()  # the main process alone: the pool child runs on
        main.wait(timeout=30)
        with SQLiteStore(path) as operator:
            latest = operator.latest("t1")
            assert latest is not None and latest.step == 1
        with open(fifo, "w") as go:
            go.write("go\n")
        assert _line(main.stdout) == "acked 2"
    finally:
        if child_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child_pid, signal.SIGKILL)
        for stream in (main.stdout, main.stdin):
            assert stream is not None
            stream.close()
    with SQLiteStore(path) as store:
        latest = store.latest("t1")
        assert latest is not None and latest.step == 2, "an acknowledged step was lost"


def test_a_store_opened_while_another_process_holds_the_write_lock_reads_and_passes_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backup or a long manual session holds the write lock. A store opened meanwhile (a
    new pool child's first call, `agentq ls`) reads at once, and a write that waits out
    the busy timeout fails as a passing outage the task retries, not as a database it
    cannot use."""
    path = tmp_path / "agentq.db"
    with SQLiteStore(path) as made:
        made.open_thread("t1", task="agent")
    monkeypatch.setattr(connection, "BUSY_TIMEOUT", 0.2)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with SQLiteStore(path) as store:
            meta = store.meta("t1")
            assert meta is not None and meta.status == Status.QUEUED
            with pytest.raises(sqlite3.OperationalError, match="locked") as locked:
                store.open_thread("t2", task="agent")
            assert store.is_transient(locked.value)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
