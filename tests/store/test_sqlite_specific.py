"""What only the SQLite backend has to prove: durability across SIGKILL, cross-process
serialisation of commits, forking after open, and how it is configured."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
from contextlib import closing
from pathlib import Path
from typing import IO

import pytest

from agentq.errors import RetryNotDue, StoreConfigError
from agentq.records import Checkpoint, Status
from agentq.store.graph_records import StoredCheckpoint
from agentq.store.meta_fields import META_FIELDS
from agentq.store.sqlite.store import SQLiteStore

PAD = "x" * 2000  # big enough that a torn write would show in the data

COMMITTER = """
import sys
from agentq.records import Checkpoint
from agentq.store.sqlite.store import SQLiteStore

store = SQLiteStore(sys.argv[1], keep_last=100_000)
token = int(sys.argv[2])
latest = store.latest("t1")
step = 0 if latest is None else latest.step + 1
while True:
    state = {"n": step, "pad": sys.argv[3]}
    store.commit("t1", token, Checkpoint(step=step, node="n", state=state, token=token))
    print(step, flush=True)  # acknowledged only once commit() has returned
    step += 1
"""

RACER = """
import sys
from agentq.errors import StepConflict
from agentq.records import Checkpoint
from agentq.store.sqlite.store import SQLiteStore

path, token, name = sys.argv[1], int(sys.argv[2]), sys.argv[3]
store = SQLiteStore(path)
print("ready", flush=True)
for line in sys.stdin:
    step = int(line)
    try:
        store.commit("t1", token, Checkpoint(step=step, node=name, token=token))
        print("won", step, flush=True)
    except StepConflict as exc:
        print("lost", step, exc.latest, flush=True)
"""

FORKER = """
import os, sys
from agentq.records import Checkpoint
from agentq.store.sqlite.store import SQLiteStore

store = SQLiteStore(sys.argv[1])
store.open_thread("t1", task="agent")
token = store.acquire("t1", "w1", 60)
store.commit("t1", token, Checkpoint(step=0, node="parent", token=token))
pid = os.fork()
if pid == 0:
    store.commit("t1", token, Checkpoint(step=1, node="child", token=token))
    os._exit(0)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
store.commit("t1", token, Checkpoint(step=2, node="parent-again", token=token))
print(store.latest("t1").step, store.checkpoint("t1", 1).node, flush=True)
"""


FORK_WHILE_WRITING = """
import os, sys, threading, time
from agentq.records import Checkpoint
from agentq.store.sqlite.store import SQLiteStore

store = SQLiteStore(sys.argv[1])
store.open_thread("t1", task="agent")
token = store.acquire("t1", "w1", 60)
inside, done = threading.Event(), threading.Event()

def write():
    with store._conn.write() as db:
        db.execute("SELECT 1")
        inside.set()
        time.sleep(0.3)
    done.set()

threading.Thread(target=write).start()
inside.wait()
pid = os.fork()
if pid == 0:
    started = time.monotonic()
    store.commit("t1", token, Checkpoint(step=0, node="child", token=token))
    print(f"child wrote after {time.monotonic() - started:.1f} s", flush=True)
    os._exit(0)
_, status = os.waitpid(pid, 0)
print("parent saw", os.waitstatus_to_exitcode(status), done.is_set(), flush=True)
"""


GEVENT_WRITER = """
from gevent import monkey

monkey.patch_all()

import sys

import gevent

from agentq.store.sqlite.store import SQLiteStore

store = SQLiteStore(sys.argv[1])
print("ready", flush=True)
assert sys.stdin.readline() == "locked\\n"
writing = gevent.spawn(store.open_thread, "t1", task="agent")
gevent.sleep(0)  # the write starts and meets the other process's lock
for _ in range(3):
    gevent.sleep(0.001)
assert not writing.ready()
print("other greenlets ran while the write waited", flush=True)
writing.join(timeout=60)
print("wrote" if writing.successful() else f"failed: {writing.exception!r}", flush=True)
"""


INTERRUPTED = """
import signal, sqlite3, sys, time
from agentq.store.sqlite.store import SQLiteStore

class Interrupted(Exception):  # as Celery's SoftTimeLimitExceeded, raised by a signal
    pass

armed = False

def interrupt(signum, frame):
    if armed:  # a signal handled only after the call ended is not for it
        raise Interrupted

def by_signal(exc):
    return isinstance(exc, Interrupted) or isinstance(exc.__cause__, Interrupted)

store = SQLiteStore(sys.argv[1])
other = sqlite3.connect(sys.argv[1], timeout=0, isolation_level=None)
store.open_thread("t0", task="agent")
signal.signal(signal.SIGALRM, interrupt)
deadline = time.monotonic() + float(sys.argv[2])
calls = interrupted = 0
while time.monotonic() < deadline:
    calls += 1
    try:
        try:
            armed = True
            signal.setitimer(signal.ITIMER_REAL, 0.00002 * (1 + calls % 7))
            if calls % 2:
                store.open_thread(f"t{calls}", task="agent")
            else:
                store.latest("t0")
        finally:
            armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)
    except Exception as exc:
        if not by_signal(exc):
            raise
        interrupted += 1
    other.execute("BEGIN IMMEDIATE")  # "database is locked" if the write lock was kept
    other.execute("ROLLBACK")
    store.open_thread("t0", task="agent")  # fails if its connection was left in a transaction
print(calls, interrupted, flush=True)
"""


READ_ONLY = """
import sys
from agentq.errors import StoreConfigError
from agentq.store.sqlite.store import SQLiteStore

try:
    store = SQLiteStore(sys.argv[1])
    store.meta("t1")
    print("opened", flush=True)
    store.open_thread("t2", task="agent")
    print("wrote", flush=True)
except StoreConfigError as exc:
    print(exc, flush=True)
"""


def _python(script: str, *args: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", script, *map(str, args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _line(stream: IO[str] | None) -> str:
    assert stream is not None
    line = stream.readline()
    assert line, "the child process exited early"
    return line.strip()


def test_acknowledged_checkpoints_survive_sigkill(tmp_path: Path) -> None:
    path = tmp_path / "agentq.db"
    with SQLiteStore(path) as store:
        store.open_thread("t1", task="agent")
    acked: list[int] = []
    for _ in range(3):  # each round resumes where the killed one left off
        with SQLiteStore(path) as store:
            token = store.acquire("t1", "w1", 3600)
        start = len(acked)
        with _python(COMMITTER, path, token, PAD) as child:  # closes the pipes, then waits
            while len(acked) < start + 40:
                acked.append(int(_line(child.stdout)))
            child.send_signal(signal.SIGKILL)
            # Read through the same buffered stream: communicate() reads the raw pipe and would
            # skip lines readline() has already pulled into the buffer.
            assert child.stdout is not None
            acked += [int(line) for line in child.stdout.read().split()]
        assert child.returncode == -signal.SIGKILL

        with SQLiteStore(path, keep_last=100_000) as store:
            latest = store.latest("t1")
            meta = store.meta("t1")
            assert latest is not None and meta is not None
            # One more step may have committed with the kill landing before its print.
            assert latest.step in (acked[-1], acked[-1] + 1)
            assert meta.step == latest.step and meta.fence == token
            assert acked == list(range(len(acked)))
            for step in acked:
                assert store.checkpoint("t1", step).state == {"n": step, "pad": PAD}
            if latest.step > acked[-1]:
                acked.append(latest.step)
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_processes_racing_for_one_step_get_one_winner(tmp_path: Path) -> None:
    path = tmp_path / "agentq.db"
    with SQLiteStore(path) as store:
        store.open_thread("t1", task="agent")
        token = store.acquire("t1", "w1", 3600)
    racers = {name: _python(RACER, path, token, name) for name in ("a", "b")}
    try:
        for racer in racers.values():
            assert _line(racer.stdout) == "ready"
        rounds = 30
        for step in range(rounds):
            for racer in racers.values():
                assert racer.stdin is not None
                racer.stdin.write(f"{step}\n")
                racer.stdin.flush()
            answers = {name: _line(racer.stdout) for name, racer in racers.items()}
            winners = [name for name, answer in answers.items() if answer == f"won {step}"]
            assert len(winners) == 1, answers
            loser = "b" if winners == ["a"] else "a"
            assert answers[loser] == f"lost {step} {step}"
            with SQLiteStore(path) as store:
                assert store.checkpoint("t1", step).node == winners[0]
    finally:
        for racer in racers.values():
            racer.communicate("")  # closing stdin ends the racer's loop
    with SQLiteStore(path) as store:
        assert store.meta("t1").step == rounds - 1  # type: ignore[union-attr]


def test_under_gevent_a_write_waits_for_the_lock_without_blocking_the_hub(
    tmp_path: Path,
) -> None:
    """A gevent worker's write that waits for another process's write lock must let the
    process's other greenlets run: a wait inside SQLite would stop its model calls, its
    lease keeper and its broker heartbeats for as long as the other process writes."""
    pytest.importorskip("gevent")
    path = tmp_path / "agentq.db"
    with _python(GEVENT_WRITER, path) as writer:
        assert _line(writer.stdout) == "ready"
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            assert writer.stdin is not None
            writer.stdin.write("locked\n")
            writer.stdin.flush()
            assert _line(writer.stdout) == "other greenlets ran while the write waited"
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert _line(writer.stdout) == "wrote"
        assert writer.wait(timeout=30) == 0
    with SQLiteStore(path) as store:
        assert store.meta("t1").status == Status.QUEUED


def test_a_call_interrupted_by_a_signal_leaves_no_transaction_open(tmp_path: Path) -> None:
    """An exception a signal handler raises (Celery's soft time limit) may land just after
    BEGIN returned: the transaction is rolled back, not left open on the process's shared
    connection, where it would keep the write lock from every process and make each
    later call of this one fail with "cannot start a transaction within a transaction"."""
    out = subprocess.run(
        [sys.executable, "-c", INTERRUPTED, str(tmp_path / "agentq.db"), "8"],
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert out.returncode == 0, out.stderr
    calls, interrupted = map(int, out.stdout.split())
    assert interrupted > calls // 4  # the signal did land in most calls


def test_fork_after_open_uses_a_fresh_connection(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", FORKER, str(tmp_path / "agentq.db")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.split() == ["2", "child"]


def test_a_fork_while_a_thread_writes_leaves_the_child_a_usable_store(tmp_path: Path) -> None:
    """Celery's prefork pool forks a new child while the sweeper thread may be writing:
    the fork waits for that transaction, so the child is not left believing it holds
    the database's write lock (every write would wait out the busy timeout)."""
    out = subprocess.run(
        [sys.executable, "-c", FORK_WHILE_WRITING, str(tmp_path / "agentq.db")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("child wrote after 0.")
    assert lines[1] == "parent saw 0 True"
    with SQLiteStore(tmp_path / "agentq.db") as store:
        assert store.checkpoint("t1", 0).node == "child"  # type: ignore[union-attr]


def test_heartbeat_thread_shares_the_store(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "agentq.db") as store:
        store.open_thread("t1", task="agent")
        token = store.acquire("t1", "w1", 60)
        errors: list[BaseException] = []
        stop = threading.Event()

        def heartbeat() -> None:
            try:
                while not stop.is_set():
                    store.renew("t1", "w1", token, 60)
            except BaseException as exc:
                errors.append(exc)

        beat = threading.Thread(target=heartbeat)
        beat.start()
        try:
            for step in range(100):
                store.commit("t1", token, Checkpoint(step=step, node="n", token=token))
        finally:
            stop.set()
            beat.join()
        assert errors == []
        assert store.latest("t1").step == 99  # type: ignore[union-attr]


def test_store_runs_in_wal_with_full_sync(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "agentq.db") as store:
        assert store.check() == []
    with closing(sqlite3.connect(tmp_path / "agentq.db")) as db:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_thread_columns_are_the_shared_meta_fields(tmp_path: Path) -> None:
    SQLiteStore(tmp_path / "agentq.db").close()
    with closing(sqlite3.connect(tmp_path / "agentq.db")) as db:
        columns = [row[1] for row in db.execute("PRAGMA table_info(threads)")]
    lease = ["lock_owner", "lock_token", "lock_expires", "lock_lost", "due_at", "retry_at"]
    lease.append("canvas_taker")
    assert columns == ["thread_id", *META_FIELDS, *lease]


def test_from_url_relative_and_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    store = SQLiteStore.from_url("sqlite:///relative.db", keep_last=3)
    store.close()
    assert store.path == str(tmp_path / "relative.db") and store.keep_last == 3
    assert (tmp_path / "relative.db").is_file()
    absolute = tmp_path / "sub" / "absolute.db"
    absolute.parent.mkdir()
    store = SQLiteStore.from_url(f"sqlite:///{absolute}")  # four slashes
    store.close()
    assert store.path == str(absolute)
    assert absolute.is_file()


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:///:memory:",
        "sqlite://",
        "sqlite:///",
        "sqlite://host/x.db",
        "redis://localhost/0",
        "sqlite:///x.db?mode=ro",
    ],
)
def test_from_url_refuses_what_it_cannot_share(url: str, tmp_path: Path) -> None:
    with pytest.raises(StoreConfigError):
        SQLiteStore.from_url(url)


def test_missing_directory_is_named_and_not_created(tmp_path: Path) -> None:
    path = tmp_path / "missing" / "agentq.db"
    with pytest.raises(StoreConfigError, match="does not exist") as info:
        SQLiteStore(path)
    assert str(path) in str(info.value)
    with pytest.raises(StoreConfigError, match="missing"):
        SQLiteStore.from_url(f"sqlite:///{path}")
    assert not path.parent.exists()


def test_a_file_that_is_not_a_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"not a database, " * 100)
    with pytest.raises(StoreConfigError, match=r"notes\.txt"):
        SQLiteStore(path)
    assert path.read_bytes() == b"not a database, " * 100


def test_a_version_2_database_is_upgraded_in_place(tmp_path: Path) -> None:
    path = tmp_path / "agentq.db"
    with SQLiteStore(path) as store:
        store.open_thread("t1", task="agent")
        token = store.acquire("t1", "w1", 60)
        store.commit("t1", token, Checkpoint(step=0, node="n", token=token))
        store.claim_effect("t1", "invoice-1", token, shared=True)
    with closing(sqlite3.connect(path)) as db, db:  # what agentq wrote before retry times were kept
        db.execute("ALTER TABLE threads DROP COLUMN retry_at")
        db.execute("ALTER TABLE threads DROP COLUMN options")
        db.execute("ALTER TABLE threads DROP COLUMN origin")
        db.execute("ALTER TABLE effects DROP COLUMN tool")
        db.execute("ALTER TABLE effects DROP COLUMN claimed_at")
        db.execute("ALTER TABLE effects DROP COLUMN claimed_by")
        for column in (
            "timeout",
            "timeout_at",
            "timed_out",
            "lock_lost",
            "canvas_taker",
            "incarnation",
            "reopened",
        ):
            db.execute(f"ALTER TABLE threads DROP COLUMN {column}")
        db.execute("PRAGMA user_version = 2")
    with SQLiteStore(path) as store:
        assert store.latest("t1") == Checkpoint(step=0, node="n", token=token)
        store.set_status("t1", token, Status.RETRYING, due_in=30, release_owner="w1")
        with pytest.raises(RetryNotDue):
            store.acquire("t1", "w2", 60)
        store.open_thread("t2", task="agent", options={"queue": "gpu"}, origin="task-1")
        meta = store.meta("t2")
        assert meta is not None and (meta.options, meta.origin) == ({"queue": "gpu"}, "task-1")
        token = store.acquire("t2", "w1", 60)
        store.set_status("t2", token, Status.WAITING, due_in=30, release_owner="w1")
        assert store.meta("t2").timeout == 30  # type: ignore[union-attr]
        store.open_thread("t3", task="agent")
        store.acquire("t3", "lost", 60)
        store.release("t3", "lost", store.meta("t3").fence)  # type: ignore[union-attr]
        assert store.acquire_to_run("t3", "w1", 60).lost_worker
        assert store.acquire_to_run("t3", "w1", 60).lost_worker  # asked again
        # A thread from before incarnations keeps the keys it sent; a new one gets one.
        assert store.meta("t1").incarnation is None  # type: ignore[union-attr]
        assert store.meta("t3").incarnation is not None  # type: ignore[union-attr]
        assert not store.meta("t1").reopened  # type: ignore[union-attr]
        store.set_status("t1", token, Status.FAILED, error="boom", release_owner="w1")
        assert store.reopen("t1", from_statuses={Status.FAILED}).reopened
        # Who claimed a shared key before agentq kept it is not known.
        assert store.effect("t1", "invoice-1", shared=True).claimed_by is None  # type: ignore[union-attr]
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA user_version").fetchone() == (9,)


@pytest.mark.parametrize(
    ("version", "lacking"),
    [
        # Version 4 as first released held the origin alone; its tool and claimed_at came later.
        (4, ("tool", "claimed_at", "claimed_by", "lock_lost", "canvas_taker", "incarnation")),
        # Version 6 as first released held lock_lost alone; canvas_taker came later.
        (6, ("canvas_taker", "incarnation", "claimed_by")),
        # Such a version 4 file, upgraded since by a release that trusted its number.
        (9, ("tool", "claimed_at")),
    ],
)
def test_a_database_missing_columns_its_version_names_is_completed(
    tmp_path: Path, version: int, lacking: tuple[str, ...]
) -> None:
    """A schema version gained columns after it first shipped: a file written then says it
    is at that version and lacks them. Opening it adds what is missing, keeping its data,
    instead of every claim or canvas failing with "no such column"."""
    path = tmp_path / "agentq.db"
    with SQLiteStore(path) as store:
        store.open_thread("t1", task="agent")
        token = store.acquire("t1", "w1", 60)
        store.commit("t1", token, Checkpoint(step=0, node="n", token=token))
        store.claim_effect("t1", "invoice-1", token)
    with closing(sqlite3.connect(path)) as db, db:
        for column in lacking:
            table = "effects" if column in ("tool", "claimed_at", "claimed_by") else "threads"
            db.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
        db.execute(f"PRAGMA user_version = {version}")
    with SQLiteStore(path) as store:
        assert store.latest("t1") == Checkpoint(step=0, node="n", token=token)
        found = store.effect("t1", "invoice-1")
        assert found is not None and found.token == token
        store.claim_effect("t1", "invoice-2", token, tool="send_invoice")
        assert store.effect("t1", "invoice-2").tool == "send_invoice"  # type: ignore[union-attr]
        store.set_status("t1", token, Status.DONE, result=1, release_owner="w1")
        assert store.take_canvas("t1", "task-1")
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA user_version").fetchone() == (9,)


def test_langgraph_writes_of_a_file_made_before_they_named_their_run_are_kept(
    tmp_path: Path,
) -> None:
    """The LangGraph writes table gained a run column: a file made before has none, and
    opening it adds it, keeping the writes stored there, which name no run."""
    path = tmp_path / "agentq.db"
    stored = StoredCheckpoint(checkpoint_id="c1", record=b"record", refs=b"", run_id="run1")
    with SQLiteStore(path) as store:
        store.graph().put("t1", "", stored, None)
        store.graph().put_writes("t1", "", "c1", [(b"old", b"kept", False)], None, None)
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("DROP INDEX lg_writes_run")
        db.execute("ALTER TABLE lg_writes DROP COLUMN run_id")
    with SQLiteStore(path) as store:
        graph = store.graph()
        graph.put_writes("t1", "", "c1", [(b"new", b"gone", False)], None, "run2")
        graph.delete_runs(["run2"])
        row = graph.get("t1", "", "c1")
        assert row is not None and row.writes == [(b"old", b"kept")]


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "agentq.db"
    SQLiteStore(path).close()
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("PRAGMA user_version = 99")
    with pytest.raises(StoreConfigError, match="upgrade agentq"):
        SQLiteStore(path)


def test_close_then_use_reconnects(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "agentq.db")
    store.close()
    store.close()
    store.open_thread("t1", task="agent")
    assert store.meta("t1") is not None
    store.close()
    assert os.path.exists(tmp_path / "agentq.db")


@pytest.mark.parametrize("beside_a_writer", [False, True], ids=["alone", "beside a writer"])
def test_a_store_on_a_read_only_mount_is_refused_naming_the_fix(
    tmp_path: Path, beside_a_writer: bool
) -> None:
    """A worker whose volume is mounted read-only: opening the store alone fails, and
    beside a process that has it open (its -shm file exists) opening works but each write
    fails. Either way the error says to mount it read-write, not to look for a lock."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) to mount the directory read-only for one process")
    directory = tmp_path / "volume"
    directory.mkdir()
    path = directory / "agentq.db"
    with SQLiteStore(path) as store:
        store.open_thread("t1", task="agent")
        if not beside_a_writer:
            store.close()  # the last connection: the -wal and -shm files go with it
        where = shlex.quote(str(directory))
        mount = f"mount --bind {where} {where} && mount -o remount,bind,ro {where}"
        # The read-only mount exists in the child's own mount namespace alone.
        child = [sys.executable, "-c", READ_ONLY, str(path)]
        out = subprocess.run(
            ["unshare", "--mount", "sh", "-c", f'{mount} && exec "$@"', "sh", *child],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if out.returncode != 0 and out.stderr.startswith(("unshare:", "mount:")):
            pytest.skip(f"cannot mount read-only here: {out.stderr.strip()}")
        assert out.returncode == 0, out.stderr
        *before, error = out.stdout.splitlines()
        assert before == (["opened"] if beside_a_writer else [])
        assert str(path) in error and "read-only" in error and "read-write" in error


def test_a_locked_database_is_transient_and_a_read_only_one_is_not(tmp_path: Path) -> None:
    """A write that waited out another process's lock is retried; one the file refuses
    every time fails the thread with its error instead of being retried for ever."""
    path = tmp_path / "agentq.db"
    store = SQLiteStore(path)
    store.open_thread("t1", task="agent")
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    waiting = sqlite3.connect(path, timeout=0, isolation_level=None)
    with pytest.raises(sqlite3.OperationalError) as locked:
        waiting.execute("BEGIN IMMEDIATE")
    assert store.is_transient(locked.value)
    holder.execute("ROLLBACK")
    holder.close()
    waiting.close()
    read_only = sqlite3.connect(path)
    read_only.execute("PRAGMA query_only=ON")
    with pytest.raises(sqlite3.OperationalError, match="readonly") as refused:
        read_only.execute("DELETE FROM threads")
    assert not store.is_transient(refused.value)
    with pytest.raises(sqlite3.OperationalError, match="no such table") as missing:
        read_only.execute("SELECT * FROM nothing_here")
    assert not store.is_transient(missing.value)
    read_only.close()
    store.close()


@pytest.mark.parametrize("read", ["latest", "checkpoint", "history"])
def test_a_checkpoint_is_read_with_its_logs_as_one_moment(tmp_path: Path, read: str) -> None:
    """Another process deletes the thread between the read of a checkpoint and the read
    of its append-only logs: the reader sees the thread as it was, whole, rather than a
    checkpoint missing its log items (reported as corrupt)."""
    path = tmp_path / "agentq.db"
    with SQLiteStore(path) as store, SQLiteStore(path) as other:
        store.open_thread("t1", task="agent")
        token = store.acquire("t1", "w1", 30)
        messages = [f"m{i}" for i in range(3)]
        store.commit(
            "t1",
            token,
            Checkpoint(step=0, node="next", state={"messages": messages}),
            logs={"messages": 0},
        )
        deleted = []

        def delete_between(statement: str) -> None:
            if statement.startswith("SELECT item FROM logs") and not deleted:
                deleted.append(other.delete_thread("t1"))

        with store._conn.locked() as db:
            db.set_trace_callback(delete_between)
        try:
            if read == "latest":
                found = store.latest("t1")
            elif read == "checkpoint":
                found = store.checkpoint("t1", 0)
            else:
                (found,) = store.history("t1")
        finally:
            with store._conn.locked() as db:
                db.set_trace_callback(None)
        assert deleted == [True]
        assert found is not None and found.state["messages"] == messages
        assert store.meta("t1") is None


def test_a_commit_appending_to_a_long_log_does_not_read_the_whole_log(tmp_path: Path) -> None:
    """Appending to an append-only field (a conversation's messages) checks the stored
    log's length under the database's write lock, which every worker process waits for:
    that check must not read every item, or each step of a long conversation grows slower
    and holds up every other thread's commits with it."""
    steps: list[int] = []

    def count_steps() -> int:
        steps[-1] += 1
        return 0  # go on

    with SQLiteStore(tmp_path / "agentq.db") as store:
        for thread_id, length in (("short", 10), ("long", 20_000)):
            store.open_thread(thread_id, task="agent")
            token = store.acquire(thread_id, "w1", 60)
            messages = [f"message {i}" for i in range(length)]
            store.commit(
                thread_id,
                token,
                Checkpoint(step=0, node="n", state={"messages": messages}, token=token),
                logs={"messages": 0},
            )
            with store._conn.locked() as db:
                db.set_progress_handler(count_steps, 10)  # called every 10 VM steps
            steps.append(0)
            try:
                store.commit(
                    thread_id,
                    token,
                    Checkpoint(
                        step=1, node="n", state={"messages": [*messages, "one more"]}, token=token
                    ),
                    logs={"messages": length},
                )
            finally:
                with store._conn.locked() as db:
                    db.set_progress_handler(None, 0)
        short, long = steps
        assert long < 2 * short + 10, steps
