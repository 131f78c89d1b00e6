"""What only the Redis backend promises, on private ``redis-server`` processes.

Durability across a SIGKILLed server, atomicity under racing processes, ``check()`` on
real server settings, connection URLs and authentication, and the cost of a commit in
round trips. Every server here is started by the test (AOF, ``appendfsync always``, a
free port); none of them is the shared Redis on 6379.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import itertools
import multiprocessing as mp
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis
from redis.connection import AbstractConnection

from agentq.errors import LeaseHeld, StaleToken, StepConflict, StoreConfigError
from agentq.records import Checkpoint, Effect, Status
from agentq.store.contract import Renewal
from agentq.store.redis.base import SOCKET_TIMEOUT
from agentq.store.redis.checkpoints import INLINE_SNAPSHOT_BYTES
from agentq.store.redis.store import RedisStore
from tests.store.raw import snapshot
from tests.support.redis_server import RedisServer, free_port, wait_until

if TYPE_CHECKING:
    from multiprocessing.queues import Queue

TTL = 30.0
PROCESS_DEADLINE = 60.0
"""Seconds a spawned process may take to start, race and report (imports included)."""

StartRedis = Callable[..., RedisServer]


# -- helpers -----------------------------------------------------------------------------


def checkpoint(step: int, token: int, **extra: Any) -> Checkpoint:
    """A deterministic, step-dependent checkpoint using every type the codec carries."""
    state: dict[Any, Any] = {
        "n": step,
        "messages": [{"role": "user", "content": f"m{step}.{i}"} for i in range(step % 4)],
        "when": dt.datetime(2026, 1, 2, tzinfo=dt.UTC) + dt.timedelta(seconds=step),
        "day": dt.date(2026, 1, 1) + dt.timedelta(days=step),
        "blob": bytes([step % 256]) * 3,
        "pair": (step, str(step)),
        "tags": {f"t{step % 3}", "x"},
        7: "int key",
        **extra,
    }
    return Checkpoint(
        step=step,
        node=f"node{step}",
        state=state,
        pending=[{"id": f"call-{step}"}],
        cursors={"page": step},
        task="agent",
        token=token,
        created_at=1000.0 + step,
    )


@pytest.fixture
def start_redis(tmp_path: Path) -> Iterator[StartRedis]:
    """Start private servers (``RedisServer`` arguments); every one is killed at teardown."""
    started: list[RedisServer] = []

    def start(*extra: str, directory: Path | None = None, port: int | None = None) -> RedisServer:
        server = RedisServer(directory or tmp_path / f"redis{len(started)}", *extra, port=port)
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()


def restart(start_redis: StartRedis, server: RedisServer) -> RedisServer:
    """A new ``redis-server`` on a stopped one's directory, port and arguments."""
    assert server.process is not None and server.process.poll() is not None, "still running"
    return start_redis(*server.extra, directory=server.directory, port=server.port)


@contextlib.contextmanager
def redis_store(url: str, **options: Any) -> Iterator[RedisStore]:
    store = RedisStore.from_url(url, **options)
    try:
        yield store
    finally:
        store.close()


@contextlib.contextmanager
def admin_client(server: RedisServer, **options: Any) -> Iterator[redis.Redis]:
    client = redis.Redis(port=server.port, **options)
    try:
        yield client
    finally:
        client.close()


def config(server: RedisServer, *names: str) -> dict[str, str]:
    """The server's own view of ``names`` (``CONFIG GET``), as text."""
    with admin_client(server, decode_responses=True) as client:
        return {name: str(client.config_get(name)[name]) for name in names}


def read_acknowledged(path: Path) -> list[int]:
    """The steps a writer reported, complete lines only (a killed writer may leave half)."""
    if not path.exists():
        return []
    text = path.read_text()
    return [int(line) for line in text[: text.rfind("\n") + 1].splitlines()]


def store_commands(admin: redis.Redis, client_name: str) -> list[list[bytes]]:
    """The top-level commands one named client sent since ``SLOWLOG RESET``, oldest first.

    With ``slowlog-log-slower-than 0`` the server logs every command; commands a script
    runs are logged under the script's own fake client, so they are not counted here.
    """
    entries = admin.slowlog_get(100_000)
    return [
        bytes(entry["command"]).split()
        for entry in reversed(entries)
        if entry["client_name"] == client_name.encode()
    ]


def command_calls(admin: redis.Redis) -> dict[str, int]:
    stats: dict[str, dict[str, int]] = admin.info("commandstats")
    return {name.removeprefix("cmdstat_"): row["calls"] for name, row in stats.items()}


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path: Unix socket paths are limited to about 100 bytes."""
    path = Path(tempfile.mkdtemp(prefix="aq-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


# -- processes ---------------------------------------------------------------------------
# Top-level functions, so the spawn start method can import them in the child.

Report = tuple[str, int, str, int]
"""(process name, step or thread index, outcome, value); outcome "error" aborts the run."""


def _commit_forever(url: str, thread_id: str, token: int, keep_last: int, acked: str) -> None:
    """Commit steps 0, 1, 2, ... and append each step to ``acked`` once commit() returned."""
    with redis_store(url, keep_last=keep_last) as store, open(acked, "a") as out:
        for step in itertools.count():
            store.commit(thread_id, token, checkpoint(step, token))
            out.write(f"{step}\n")
            out.flush()


def _race_commits(
    name: str,
    url: str,
    thread_id: str,
    token: int,
    steps: int,
    barrier: Barrier,
    reports: Queue[Report],
) -> None:
    """For each step: meet the other racer at the barrier, then commit that step."""
    try:
        with redis_store(url, keep_last=steps) as store:
            for step in range(steps):
                barrier.wait(PROCESS_DEADLINE)
                try:
                    store.commit(thread_id, token, checkpoint(step, token, writer=name))
                except StepConflict as conflict:
                    reports.put((name, step, "conflict", conflict.latest))
                else:
                    reports.put((name, step, "won", step))
    except BaseException as exc:
        barrier.abort()
        reports.put((name, -1, "error", 0))
        raise RuntimeError(f"racer {name} failed") from exc


def _race_acquires(
    name: str, url: str, thread_ids: list[str], barrier: Barrier, reports: Queue[Report]
) -> None:
    """For each thread: meet the other racer at the barrier, then acquire its lease."""
    try:
        with redis_store(url) as store:
            for index, thread_id in enumerate(thread_ids):
                barrier.wait(PROCESS_DEADLINE)
                try:
                    token = store.acquire(thread_id, name, TTL)
                except LeaseHeld as held:
                    reports.put((name, index, "held", held.ttl_ms))
                else:
                    reports.put((name, index, "token", token))
    except BaseException as exc:
        barrier.abort()
        reports.put((name, -1, "error", 0))
        raise RuntimeError(f"racer {name} failed") from exc


def run_racers(
    target: Callable[..., None], args: dict[str, tuple[Any, ...]], rounds: int
) -> dict[int, dict[str, tuple[str, int]]]:
    """Run ``target(name, *args[name], barrier, reports)`` in one spawned process per name
    and gather ``{round: {name: (outcome, value)}}``."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(len(args))
    reports: Queue[Report] = ctx.Queue()
    processes = [
        ctx.Process(target=target, args=(name, *extra, barrier, reports), name=name)
        for name, extra in args.items()
    ]
    for process in processes:
        process.start()
    gathered: dict[int, dict[str, tuple[str, int]]] = {}
    try:
        for _ in range(rounds * len(args)):
            name, index, outcome, value = reports.get(timeout=PROCESS_DEADLINE)
            assert outcome != "error", f"racer {name} failed; see its traceback above"
            gathered.setdefault(index, {})[name] = (outcome, value)
    finally:
        for process in processes:
            process.join(PROCESS_DEADLINE)
            if process.is_alive():
                process.kill()
                process.join()
        reports.close()
        reports.join_thread()
    assert [p.exitcode for p in processes] == [0] * len(processes)
    return gathered


# -- durability --------------------------------------------------------------------------


def test_acknowledged_checkpoints_and_effects_survive_sigkill_of_redis(
    start_redis: StartRedis,
) -> None:
    server = start_redis()
    with redis_store(server.url) as store:
        store.open_thread("durable", task="agent", input={"q": "hi"})
        token = store.acquire("durable", "w1", TTL)
        for step in range(49):
            store.commit("durable", token, checkpoint(step, token))
        assert store.claim_effect("durable", "charge", token).outcome == "claimed"
        store.complete_effect("durable", "charge", token, {"id": "ch_1", "cents": 1250})
        store.commit(
            "durable",
            token,
            checkpoint(49, token),
            status=Status.DONE,
            result={"answer": 42},
            release_owner="w1",
        )
        keep_last = store.keep_last
        before = snapshot(store)
    assert (server.directory / "appendonlydir").is_dir()

    server.kill()
    server = restart(start_redis, server)

    with redis_store(server.url) as store:
        assert snapshot(store) == before
        kept = range(49, 49 - keep_last, -1)
        assert store.history("durable", limit=100) == [checkpoint(s, token) for s in kept]
        assert store.latest("durable") == checkpoint(49, token)
        meta = store.meta("durable")
        assert meta is not None
        assert (meta.step, meta.status, meta.fence, meta.node) == (49, Status.DONE, token, "node49")
        assert (meta.input, meta.result) == ({"q": "hi"}, {"answer": 42})
        effect = store.effect("durable", "charge")
        assert effect is not None and effect.claimed_at is not None
        assert effect == Effect(
            "charge",
            "done",
            token,
            {"id": "ch_1", "cents": 1250},
            claimed_at=effect.claimed_at,
            claimed_by="durable",
        )
        # The fence survived too: the next token is still greater than every earlier one.
        assert store.acquire("durable", "w2", TTL) == token + 1


@pytest.mark.parametrize("keep_last", [5, 1_000_000], ids=["pruning", "keeping-all"])
def test_every_step_a_killed_writer_saw_acknowledged_survives_sigkill_of_redis(
    start_redis: StartRedis, tmp_path: Path, keep_last: int
) -> None:
    server = start_redis()
    with redis_store(server.url) as store:
        store.open_thread("t1", task="agent")
        token = store.acquire("t1", "w1", 3600)
    acked_path = tmp_path / "acked.txt"
    writer = mp.get_context("spawn").Process(
        target=_commit_forever, args=(server.url, "t1", token, keep_last, str(acked_path))
    )

    def enough_acknowledged() -> bool:
        assert writer.is_alive(), f"the writer exited early with {writer.exitcode}"
        return len(read_acknowledged(acked_path)) >= 20

    writer.start()
    try:
        wait_until(enough_acknowledged, timeout=PROCESS_DEADLINE, what="20 acknowledged steps")
        server.kill()
    finally:
        writer.kill()
        writer.join()
    acknowledged = read_acknowledged(acked_path)
    assert acknowledged == list(range(len(acknowledged)))

    server = restart(start_redis, server)

    with redis_store(server.url, keep_last=keep_last) as store:
        latest = store.latest("t1")
        assert latest is not None and latest.step >= acknowledged[-1]
        assert latest == checkpoint(latest.step, token)
        window = range(latest.step, max(-1, latest.step - keep_last), -1)
        assert store.history("t1", limit=len(window) + 1) == [checkpoint(s, token) for s in window]
        for step in acknowledged:
            if step in window:
                assert store.checkpoint("t1", step) == checkpoint(step, token)
        meta = store.meta("t1")
        assert meta is not None and (meta.step, meta.fence) == (latest.step, token)
        # The meta, the latest pointer and the retention bookkeeping agree: the chain goes on.
        store.commit("t1", token, checkpoint(latest.step + 1, token))
        assert [c.step for c in store.history("t1", limit=2)] == [latest.step + 1, latest.step]


# -- concurrency -------------------------------------------------------------------------


def test_racing_commits_of_one_step_with_the_same_token_have_exactly_one_winner(
    start_redis: StartRedis,
) -> None:
    server = start_redis()
    steps = 50
    with redis_store(server.url, keep_last=steps) as store:
        store.open_thread("t1", task="agent")
        token = store.acquire("t1", "w1", 3600)
        args = {name: (server.url, "t1", token, steps) for name in ("a", "b")}

        rounds = run_racers(_race_commits, args, steps)

        winners: dict[int, str] = {}
        for step in range(steps):
            outcomes = rounds[step]
            assert sorted(outcome for outcome, _ in outcomes.values()) == ["conflict", "won"]
            # The loser was told the step is already written, by the winner.
            assert all(latest == step for _, latest in outcomes.values())
            (winners[step],) = [name for name, (o, _) in outcomes.items() if o == "won"]
        history = store.history("t1", limit=steps + 1)
        assert [c.step for c in history] == list(range(steps - 1, -1, -1))
        assert [c.state["writer"] for c in reversed(history)] == [winners[s] for s in range(steps)]
        meta = store.meta("t1")
        assert meta is not None and (meta.step, meta.fence) == (steps - 1, token)


def test_racing_acquires_of_a_free_thread_hand_out_exactly_one_token(
    start_redis: StartRedis,
) -> None:
    server = start_redis()
    threads = [f"t{i}" for i in range(20)]
    with redis_store(server.url) as store:
        for thread_id in threads:
            store.open_thread(thread_id, task="agent")
        args = {name: (server.url, threads) for name in ("a", "b")}

        rounds = run_racers(_race_acquires, args, len(threads))

        for index, thread_id in enumerate(threads):
            outcomes = rounds[index]
            assert sorted(outcome for outcome, _ in outcomes.values()) == ["held", "token"]
            (winner,) = [name for name, (o, _) in outcomes.items() if o == "token"]
            assert outcomes[winner] == ("token", 1)
            meta = store.meta(thread_id)
            assert meta is not None and (meta.fence, meta.status) == (1, Status.RUNNING)
            assert store.client.get(store.keys.lock(thread_id)) == f"1:{winner}".encode()


# -- check() -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "settings", "expected"),
    [
        pytest.param(
            (),
            {"appendonly": "yes", "appendfsync": "always", "maxmemory-policy": "noeviction"},
            [],
            id="durable-defaults",
        ),
        pytest.param(
            ("--maxmemory-policy", "allkeys-lru"),
            {"maxmemory-policy": "allkeys-lru"},
            [("maxmemory-policy", "allkeys-lru", "evict", "noeviction")],
            id="evicting",
        ),
        pytest.param(
            ("--appendonly", "no", "--save", ""),
            {"appendonly": "no", "save": ""},
            [("appendonly", "no", "no persistence", "--appendonly yes")],
            id="no-persistence",
        ),
        pytest.param(
            ("--appendonly", "no", "--save", "3600 1"),
            {"appendonly": "no", "save": "3600 1"},
            [("appendonly", "no", "only RDB snapshots", "--appendonly yes")],
            id="rdb-only",
        ),
        pytest.param(
            ("--appendonly", "yes", "--appendfsync", "no"),
            {"appendfsync": "no"},
            [("appendfsync", "no", "power loss", "appendfsync always")],
            id="appendfsync-no",
        ),
    ],
)
def test_check_reports_what_the_server_is_configured_with(
    start_redis: StartRedis,
    args: tuple[str, ...],
    settings: dict[str, str],
    expected: list[tuple[str, str, str, str]],
) -> None:
    server = start_redis(*args)
    assert config(server, *settings) == settings  # later arguments win in redis-server
    with redis_store(server.url) as store:
        findings = store.check()
    assert [(f.setting, f.value) for f in findings] == [(s, v) for s, v, _, _ in expected]
    for finding, (_, _, problem, fix) in zip(findings, expected, strict=True):
        assert problem in finding.problem and fix in finding.fix


def test_check_refuses_a_replica_whose_writes_would_be_waited_out_as_an_outage(
    start_redis: StartRedis,
) -> None:
    primary = start_redis()
    replica = start_redis("--replicaof", "127.0.0.1", str(primary.port))
    with redis_store(replica.url) as store:
        with pytest.raises(redis.ReadOnlyError) as refused:
            store.open_thread("t1", task="agent")
        assert store.is_transient(refused.value)  # as when a failover demotes the primary
        (finding,) = store.check()
    assert (finding.setting, finding.value) == ("replicaof", f"127.0.0.1 {primary.port}")
    assert finding.fatal and "primary" in finding.fix
    with redis_store(primary.url) as store:
        assert store.check() == []


# -- connecting --------------------------------------------------------------------------

ACL_USER, ACL_PASSWORD = "agent-worker", "w0rker-pass"


@pytest.fixture
def acl_server(start_redis: StartRedis) -> RedisServer:
    """A server with a user that may run everything but @dangerous, on ``agentq:*`` only."""
    server = start_redis()
    with admin_client(server) as admin:
        admin.acl_setuser(
            ACL_USER,
            enabled=True,
            reset=True,
            passwords=[f"+{ACL_PASSWORD}"],
            keys=["agentq:*"],
            categories=["+@all", "-@dangerous"],
        )
    return server


@pytest.fixture
def unix_server(short_dir: Path, start_redis: StartRedis) -> tuple[RedisServer, Path]:
    """A server that also listens on a Unix socket, with ``requirepass s3cret``."""
    socket = short_dir / "r.sock"
    server = start_redis("--unixsocket", str(socket), "--unixsocketperm", "700")
    # Set after start: RedisServer's readiness probe does not authenticate.
    with admin_client(server) as admin:
        admin.config_set("requirepass", "s3cret")
    return server, socket


def test_from_url_connects_over_a_unix_socket_with_a_password(
    unix_server: tuple[RedisServer, Path],
) -> None:
    _, socket = unix_server
    with redis_store(f"unix://:s3cret@{socket}?db=0") as store:
        assert "U" in str(store.client.client_info()["flags"])  # a Unix-socket connection
        store.open_thread("t1", task="agent")
        token = store.acquire("t1", "w1", TTL)
        store.commit("t1", token, checkpoint(0, token))
        assert store.latest("t1") == checkpoint(0, token)


def test_acl_user_confined_to_the_prefix_can_drive_a_whole_thread(
    acl_server: RedisServer,
) -> None:
    url = f"redis://{ACL_USER}:{ACL_PASSWORD}@127.0.0.1:{acl_server.port}/0"
    with redis_store(url, keep_last=2) as store:
        assert store.client.acl_whoami() == ACL_USER
        store.open_thread("t1", task="agent", input=1, start_grace=0)
        assert store.claim_due(hold=60) == ["t1"]
        token = store.acquire("t1", "w1", TTL)
        store.renew("t1", "w1", token, TTL)
        for step in range(4):  # pruning deletes keys the script builds from ARGV
            store.commit("t1", token, checkpoint(step, token))
        assert store.claim_effect("t1", "mail", token).outcome == "claimed"
        store.complete_effect("t1", "mail", token, "sent")
        assert store.claim_effect("t1", "inv", token, shared=True).outcome == "claimed"
        store.complete_effect("t1", "inv", token, 9, shared=True)
        store.set_status("t1", token, Status.WAITING, interrupt={"ask": "ok?"})
        assert [c.step for c in store.history("t1")] == [3, 2]
        assert store.fork("t1", 3, "t1-fork").step == 3
        assert {m.thread_id for m in store.threads()} == {"t1", "t1-fork"}
        assert store.due() == []
        store.commit("t1", token, checkpoint(4, token), status=Status.DONE, release_owner="w1")
        assert store.gc(finished_ttl=0) == 1
        assert store.delete_thread("t1-fork")
        assert store.threads() == []
    with admin_client(acl_server) as admin:
        assert admin.acl_log() == []  # nothing was refused, not even silently
        # The shared record stays; the last claim of due threads expires with its hold.
        assert sorted(admin.keys("*")) == [b"agentq:effect:{inv}", b"agentq:index:{index}:claimed"]
        assert 0 < admin.pttl("agentq:index:{index}:claimed") <= 60_000


def test_check_without_config_permission_reports_that_it_cannot_tell(
    acl_server: RedisServer,
) -> None:
    url = f"redis://{ACL_USER}:{ACL_PASSWORD}@127.0.0.1:{acl_server.port}/0"
    with redis_store(url) as store:
        findings = store.check()
    (finding,) = findings
    assert (finding.setting, finding.value) == ("CONFIG", "unavailable")
    assert "no permissions" in finding.problem and "provider" in finding.fix


def test_check_refuses_a_replica_that_hides_its_config(start_redis: StartRedis) -> None:
    primary = start_redis()
    replica = start_redis("--replicaof", "127.0.0.1", str(primary.port))
    with admin_client(replica) as admin:
        # As a managed Redis gives it: every command but CONFIG and the @dangerous ones.
        admin.acl_setuser(
            ACL_USER,
            enabled=True,
            reset=True,
            passwords=[f"+{ACL_PASSWORD}"],
            keys=["agentq:*"],
            categories=["+@all", "-@dangerous"],
        )
    url = f"redis://{ACL_USER}:{ACL_PASSWORD}@127.0.0.1:{replica.port}/0"
    with redis_store(url) as store:
        findings = store.check()
    assert [(f.setting, f.fatal) for f in findings] == [("CONFIG", False), ("role", True)]
    assert "replica" in findings[1].problem and "primary" in findings[1].fix


def test_the_readmes_acl_rule_drives_a_thread_and_lets_check_read_the_settings(
    start_redis: StartRedis,
) -> None:
    server = start_redis()
    rule = "on >w0rker-pass ~agentq:* +@all -@dangerous +config|get"  # as in the README
    with admin_client(server) as admin:
        admin.execute_command("ACL", "SETUSER", "agentq", *rule.split())
    with redis_store(f"redis://agentq:w0rker-pass@127.0.0.1:{server.port}/0") as store:
        assert store.check() == []
        store.open_thread("t1", task="agent")
        token = store.acquire("t1", "w1", TTL)
        store.commit("t1", token, checkpoint(0, token), status=Status.DONE, release_owner="w1")
        assert store.delete_thread("t1")
    with admin_client(server) as admin:
        assert admin.acl_log() == []


@pytest.mark.parametrize(
    "url",
    [
        "unix://:wrong@{socket}?db=0",
        "unix://{socket}?db=0",
        "redis://127.0.0.1:{port}/0",
        "redis://nobody:s3cret@127.0.0.1:{port}/0",
    ],
    ids=["wrong-password", "no-password-unix", "no-password-tcp", "unknown-user"],
)
def test_wrong_credentials_raise_authentication_error(
    unix_server: tuple[RedisServer, Path], url: str
) -> None:
    server, socket = unix_server
    with redis_store(url.format(socket=socket, port=server.port)) as store:
        with pytest.raises(redis.AuthenticationError):
            store.meta("t1")
        # What a worker, the CLI and the UI run first: it names the fix, not HELLO or AUTH.
        with pytest.raises(StoreConfigError, match=r"credentials .*redis://user:password@"):
            store.check()
    with redis_store(f"unix://:s3cret@{socket}?db=0") as store:
        assert store.meta("t1") is None  # the server itself answers the right password


@dataclasses.dataclass(frozen=True)
class TlsServer:
    server: RedisServer
    tls_port: int
    ca: Path


def _openssl(directory: Path, command: str) -> None:
    subprocess.run(["openssl", *command.split()], cwd=directory, check=True, capture_output=True)


@pytest.fixture
def tls_server(tmp_path: Path, start_redis: StartRedis) -> TlsServer:
    """A server that also listens with TLS, its certificate (for localhost and 127.0.0.1)
    signed by a throwaway CA; clients need no certificate of their own."""
    certs = tmp_path / "certs"
    certs.mkdir()
    new_key = "-newkey rsa:2048 -nodes"
    _openssl(certs, f"req -x509 {new_key} -days 1 -keyout ca.key -out ca.crt -subj /CN=test-ca")
    _openssl(certs, f"req {new_key} -keyout server.key -out server.csr -subj /CN=localhost")
    (certs / "san.cnf").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    _openssl(
        certs,
        "x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 "
        "-extfile san.cnf -out server.crt",
    )
    tls_port = free_port()
    server = start_redis(
        *["--tls-port", str(tls_port), "--tls-auth-clients", "no"],
        *["--tls-ca-cert-file", str(certs / "ca.crt")],
        *["--tls-cert-file", str(certs / "server.crt")],
        *["--tls-key-file", str(certs / "server.key")],
    )
    return TlsServer(server, tls_port, certs / "ca.crt")


@pytest.mark.parametrize(
    "query", ["ssl_ca_certs={ca}", "ssl_ca_certs={ca}&ssl_cert_reqs=required", "ssl_cert_reqs=none"]
)
def test_a_rediss_url_drives_a_thread_over_tls(tls_server: TlsServer, query: str) -> None:
    url = f"rediss://localhost:{tls_server.tls_port}/2?{query.format(ca=tls_server.ca)}"
    with redis_store(url) as store:
        assert store.check() == []
        store.open_thread("t1", task="agent")
        token = store.acquire("t1", "w1", TTL)
        store.commit("t1", token, checkpoint(0, token))
        assert store.latest("t1") == checkpoint(0, token)
    with admin_client(tls_server.server, db=2) as admin:
        assert admin.exists("agentq:thread:{t1}:meta")


def test_an_untrusted_certificate_is_set_up_wrong_not_an_outage(tls_server: TlsServer) -> None:
    """Without ssl_ca_certs the system CAs are asked, which never signed this server's
    certificate: retried as an outage, every thread would be handed back forever."""
    with redis_store(f"rediss://localhost:{tls_server.tls_port}/0") as store:
        with pytest.raises(redis.ConnectionError, match="CERTIFICATE_VERIFY_FAILED") as failed:
            store.meta("t1")
        assert not store.is_transient(failed.value)
        with pytest.raises(StoreConfigError, match=r"not trusted .*\?ssl_ca_certs="):
            store.check()


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:6379/0", "https://127.0.0.1/0", "127.0.0.1:6379", "valkey://x"]
)
def test_from_url_refuses_other_schemes(url: str) -> None:
    with pytest.raises(StoreConfigError, match="unsupported Redis URL"):
        RedisStore.from_url(url)


@pytest.mark.parametrize(
    ("query", "option"),
    [("socket_timout=2", "socket_timout"), ("ssl_cert_reqs=none", "ssl_cert_reqs")],
    ids=["misspelt", "tls-option-without-rediss"],
)
def test_a_url_option_redis_py_does_not_take_is_refused_when_the_store_is_made(
    redis_server: RedisServer, query: str, option: str
) -> None:
    """redis-py passes it to the connection, which refuses it only on the first command:
    a worker's first step, or a caller's .delay()."""
    with pytest.raises(StoreConfigError, match=f"does not take .*'{option}'"):
        RedisStore.from_url(f"{redis_server.url}?{query}")


def test_a_urls_redis_py_options_reach_every_connection_resp3_included(
    redis_server: RedisServer,
) -> None:
    url = f"{redis_server.url[:-2]}/3?protocol=3&health_check_interval=1&client_name=agentq-w"
    with redis_store(url) as store:
        info = store.client.client_info()
        assert (info["name"], info["db"], str(info["resp"])) == ("agentq-w", 3, "3")
        store.open_thread("t1", task="agent")
        token = store.acquire("t1", "w1", TTL)
        store.commit("t1", token, checkpoint(0, token), status=Status.WAITING)
        assert store.latest("t1") == checkpoint(0, token)
        assert [m.status for m in store.threads()] == [Status.WAITING]
    with admin_client(redis_server, db=3) as admin:
        assert admin.exists("agentq:thread:{t1}:meta")


def test_a_client_that_decodes_responses_is_refused(start_redis: StartRedis) -> None:
    server = start_redis()
    with (
        admin_client(server, decode_responses=True) as client,
        pytest.raises(StoreConfigError, match="decode_responses=False"),
    ):
        RedisStore(client)
    with pytest.raises(StoreConfigError, match="decode_responses=False"):
        RedisStore.from_url(f"{server.url}?decode_responses=True")


# -- round trips -------------------------------------------------------------------------


@pytest.fixture
def logging_server(start_redis: StartRedis) -> RedisServer:
    """A server whose slow log records every top-level command."""
    return start_redis("--slowlog-log-slower-than", "0", "--slowlog-max-len", "100000")


COMMIT_VARIANTS: list[dict[str, Any]] = [
    {},
    {"status": Status.WAITING, "due_in": 60},
    {"status": Status.DONE, "result": {"answer": 42}, "release_owner": "w1"},
]


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], int]:
    """``writes(client_name)``: how many times connections of that name sent to the server.

    One write of commands followed by reading their replies is one network round trip,
    however many commands it carries (a pipeline, or MULTI ... EXEC); a second round trip
    would need a second write.
    """
    sent: list[str] = []
    original = AbstractConnection.send_packed_command

    def counting(self: AbstractConnection, command: Any, check_health: bool = True) -> None:
        sent.append(str(getattr(self, "client_name", None)))
        original(self, command, check_health)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counting)
    return lambda name: sent.count(name)


@pytest.mark.parametrize("staged", [False, True], ids=["small", "large"])
def test_one_commit_is_one_round_trip(
    logging_server: RedisServer, writes: Callable[[str], int], staged: bool
) -> None:
    """A small snapshot goes to commit.lua as an argument: one EVALSHA. A large one is
    staged: MULTI, SET of the snapshot to the staged key, EVALSHA, EXEC, in one write, so
    its bytes never pass through Lua and the commit is still atomic."""
    name = "store-under-test"
    extra = large(staged)
    with (
        redis_store(f"{logging_server.url}?client_name={name}") as store,
        admin_client(logging_server) as admin,
    ):
        store.open_thread("t1", task="agent")
        token = store.acquire("t1", "w1", TTL)
        store.commit("t1", token, checkpoint(0, token, **extra))  # loads the script
        sha = store._scripts["commit"].sha.encode()
        staged_key = store.keys.staged("t1").encode()
        # The slow log leaves out EXEC itself and shows the commands it ran.
        expected = (
            [[b"MULTI"], [b"SET", staged_key], [b"EVALSHA", sha]] if staged else [[b"EVALSHA", sha]]
        )
        framing = {"exec": 1} if staged else {"exec": 0}

        for step, options in enumerate(COMMIT_VARIANTS, start=1):
            admin.slowlog_reset()
            before, sent = command_calls(admin), writes(name)
            store.commit("t1", token, checkpoint(step, token, **extra), **options)
            after = command_calls(admin)

            assert writes(name) - sent == 1
            assert [command[:2] for command in store_commands(admin, name)] == expected
            delta = {
                c: after.get(c, 0) - before.get(c, 0)
                for c in ("exec", "evalsha", "script|load", "script|exists")
            }
            assert delta == {**framing, "evalsha": 1, "script|load": 0, "script|exists": 0}
        last = len(COMMIT_VARIANTS)
        assert store.latest("t1") == checkpoint(last, token, **extra)
        assert not admin.exists(staged_key)

        # A server that lost its scripts costs the commit two more round trips, once.
        admin.script_flush()
        admin.slowlog_reset()
        sent = writes(name)
        store.commit("t1", token, checkpoint(last + 1, token, **extra))
        assert writes(name) - sent == 3
        assert [command[:2] for command in store_commands(admin, name)] == [
            *expected,
            [b"SCRIPT", b"LOAD"],
            *expected,
        ]
        assert store.latest("t1") == checkpoint(last + 1, token, **extra)
        assert not admin.exists(staged_key)


def large(staged: bool) -> dict[str, bytes]:
    """State that makes a snapshot go staged rather than as the script's argument."""
    return {"big": b"y" * (INLINE_SNAPSHOT_BYTES + 1)} if staged else {}


@contextlib.contextmanager
def committed_once(
    start_redis: StartRedis, first: Callable[[int], Checkpoint], logs: dict[str, int] | None
) -> Iterator[tuple[RedisStore, redis.Redis, int]]:
    """A store on a server of its own, thread t1 leased and ``first(token)`` committed."""
    server = start_redis()
    with redis_store(server.url) as store, admin_client(server) as admin:
        store.open_thread("t1", task="agent")
        token = store.acquire("t1", "w1", TTL)
        store.commit("t1", token, first(token), logs=logs)
        yield store, admin, token


@pytest.mark.parametrize("staged", [False, True], ids=["small", "large"])
def test_a_refused_or_resent_commit_changes_nothing(start_redis: StartRedis, staged: bool) -> None:
    """Whether the snapshot came as an argument or staged: a resent commit is recognised
    as done, a different one at the same step and a stale token's are refused, and none
    of them leaves a staged key or moves the thread."""
    extra = large(staged)
    with committed_once(start_redis, lambda t: checkpoint(0, t, **extra), None) as (
        store,
        admin,
        token,
    ):
        first = checkpoint(0, token, **extra)
        before = snapshot(store)
        store.commit("t1", token, first)
        with pytest.raises(StepConflict):
            store.commit("t1", token, checkpoint(0, token, other=1, **extra))
        with pytest.raises(StaleToken):
            store.commit("t1", token - 1, checkpoint(1, token - 1, **extra))
        assert snapshot(store) == before
        assert not admin.exists(store.keys.staged("t1"))
        assert store.latest("t1") == first


@pytest.mark.parametrize("staged", [False, True], ids=["small", "large"])
@pytest.mark.parametrize("appended", [["b0"], []], ids=["appended to", "unchanged"])
def test_a_log_of_another_type_refuses_the_commit_and_changes_nothing(
    start_redis: StartRedis, staged: bool, appended: list[str]
) -> None:
    extra = large(staged)
    with committed_once(start_redis, lambda t: checkpoint(0, t, a=["a0"], **extra), {"a": 0}) as (
        store,
        admin,
        token,
    ):
        admin.set(store.keys.log("t1", "b"), "not a list")
        before = snapshot(store)
        with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
            store.commit(
                "t1",
                token,
                checkpoint(1, token, a=["a0", "a1"], b=appended, **extra),
                logs={"a": 1, "b": 0},
            )
        assert snapshot(store) == before


def test_a_lease_whose_keys_cannot_be_read_loses_only_itself(start_redis: StartRedis) -> None:
    """One thread's meta overwritten with a key of another type makes its renewal an
    error reply: that lease is lost, the others in the same batch are renewed."""
    server = start_redis()
    with redis_store(server.url) as store, admin_client(server) as admin:
        tokens = {}
        for thread_id in ("t1", "t2", "t3"):
            store.open_thread(thread_id, task="agent")
            tokens[thread_id] = store.acquire(thread_id, "w1", TTL)
        admin.delete(store.keys.meta("t2"))
        admin.set(store.keys.meta("t2"), "not a hash")
        admin.pexpire(store.keys.lock("t1"), 1000)
        renewed = store.renew_many([Renewal(t, "w1", token, TTL) for t, token in tokens.items()])
        assert renewed == [True, False, True]
        assert admin.pttl(store.keys.lock("t1")) > 1000  # renewed, not only answered


@pytest.mark.parametrize("staged", [False, True], ids=["small", "large"])
def test_a_checkpoint_already_there_is_not_overwritten(
    start_redis: StartRedis, staged: bool
) -> None:
    """A checkpoint n the store holds while its latest step is n-1 (written by hand, or
    left by an older version) refuses commit n rather than be replaced, or deleted by a
    refusal."""
    extra = large(staged)
    with committed_once(start_redis, lambda t: checkpoint(0, t, a=["a0"], **extra), {"a": 0}) as (
        store,
        admin,
        token,
    ):
        admin.set(store.keys.checkpoint("t1", 1), b"already here")
        before = snapshot(store)
        with pytest.raises(StepConflict):
            store.commit("t1", token, checkpoint(1, token, a=["a0", "a1"], **extra), logs={"a": 1})
        assert snapshot(store) == before


def test_latest_is_one_round_trip(
    logging_server: RedisServer, writes: Callable[[str], int]
) -> None:
    """One MGET of the pointer and the snapshot the store expects it to name; latest.lua
    when the store has not seen the thread yet, or saw an older step."""
    name, other = "store-under-test", "other-store"
    with (
        redis_store(f"{logging_server.url}?client_name={name}") as store,
        redis_store(logging_server.url) as elsewhere,
        admin_client(logging_server) as admin,
    ):
        store.open_thread("t1", task="agent")
        token = store.acquire("t1", "w1", TTL)
        store.commit("t1", token, checkpoint(0, token))
        latest_key = store.keys.latest("t1").encode()
        mget = [b"MGET", latest_key]
        sha = store._scripts["latest"].sha.encode()

        def costs(
            call: Callable[[], object],
            commands: list[list[bytes]],
            trips: int = 1,
        ) -> object:
            admin.slowlog_reset()
            sent = writes(name)
            value = call()
            assert [c[:2] for c in store_commands(admin, name)] == commands
            assert writes(name) - sent == trips
            return value

        assert costs(lambda: store.latest("t1"), [mget]) == checkpoint(0, token)
        assert store.latest("warm-up") is None  # loads latest.lua on first use
        # An unknown thread: the script first, then the store knows there is nothing.
        assert costs(lambda: store.latest("nobody"), [[b"EVALSHA", sha]]) is None
        nobody = [b"MGET", store.keys.latest("nobody").encode()]
        assert costs(lambda: store.latest("nobody"), [nobody]) is None

        # Another worker moved the thread on: the MGET finds another step, the script reads
        # it (a second round trip), and the next read is one MGET again.
        elsewhere.commit("t1", token, checkpoint(1, token))
        assert costs(lambda: store.latest("t1"), [mget, [b"EVALSHA", sha]], trips=2) == (
            checkpoint(1, token)
        )
        assert costs(lambda: store.latest("t1"), [mget]) == checkpoint(1, token)

        # meta() tells the latest step too, and so does acquire_to_run(), as a driver takes
        # its lease just before latest().
        elsewhere.commit("t1", token, checkpoint(2, token))
        store.meta("t1")
        assert costs(lambda: store.latest("t1"), [mget]) == checkpoint(2, token)
        elsewhere.commit("t1", token, checkpoint(3, token))
        store.acquire_to_run("t1", "w1", TTL)
        assert costs(lambda: store.latest("t1"), [mget]) == checkpoint(3, token)

        # Append-only logs come in the same round trip, in a MULTI.
        store.open_thread("t2", task="agent")
        token2 = store.acquire("t2", "w1", TTL)
        messages = ["a", ("b", 1)]
        store.commit("t2", token2, checkpoint(0, token2, messages=messages), logs={"messages": 0})
        log = store.keys.log("t2", "messages").encode()
        read = [[b"MULTI"], [b"MGET", store.keys.latest("t2").encode()], [b"LRANGE", log]]
        want = checkpoint(0, token2, messages=messages)
        assert costs(lambda: store.latest("t2"), read) == want
        # A store that has not seen the thread uses latest.lua, logs included; after meta(),
        # which names the append-only fields too, one MULTI again.
        with redis_store(f"{logging_server.url}?client_name={other}") as cold:
            cold.client.ping()  # connects (and names the connection) first
            admin.slowlog_reset()
            sent = writes(other)
            assert cold.latest("t2") == want
            assert cold.meta("t2") is not None
            assert cold.latest("t2") == want
            meta = store.keys.meta("t2").encode()
            assert [c[:2] for c in store_commands(admin, other)] == [
                [b"EVALSHA", sha],
                [b"HGETALL", meta],
                *read,
            ]
            assert writes(other) - sent == 3


def test_from_url_pools_block_at_max_connections(redis_server: RedisServer) -> None:
    with RedisStore.from_url(redis_server.url, max_connections=3) as store:
        pool = store.client.connection_pool
        assert isinstance(pool, redis.BlockingConnectionPool) and pool.max_connections == 3
        taken = [pool.get_connection() for _ in range(3)]
        pool.timeout = 0.1
        with pytest.raises(redis.ConnectionError):  # waited, then refused: not MaxConnections
            pool.get_connection()
        for connection in taken:
            pool.release(connection)
        assert store.meta("absent") is None


@pytest.mark.cluster
def test_from_url_cluster_pools_block_per_node(redis_cluster: list[RedisServer]) -> None:
    url = f"redis://127.0.0.1:{redis_cluster[0].port}/0"
    with RedisStore.from_url(url, cluster=True, max_connections=2) as store:
        store.open_thread("t1", task="agent")
        token = store.acquire("t1", "w1", TTL)
        assert store.renew_many([Renewal("t1", "w1", token, TTL)]) == [True]
        nodes = store.client.get_nodes()  # type: ignore[union-attr]
        assert len(nodes) == len(redis_cluster)
        for node in nodes:
            pool = node.redis_connection.connection_pool
            assert isinstance(pool, redis.BlockingConnectionPool) and pool.max_connections == 2
    for node in nodes:  # closing the store closed every node's pool
        assert all(c._sock is None for c in node.redis_connection.connection_pool._connections)


@pytest.mark.slow
def test_a_frozen_server_times_a_call_out_rather_than_hang_it(
    start_redis: StartRedis,
) -> None:
    """A server that stops answering (SIGSTOP here; a lost network path alike) raises
    ``redis.TimeoutError``, which agentq retries within the lease, instead of holding the
    call, and every lease renewal behind it, until TCP gives up minutes later."""
    server = start_redis()
    assert server.process is not None
    with RedisStore.from_url(server.url) as store:
        assert store.meta("t1") is None  # connected before the server froze
        outcome: list[BaseException | None] = []

        def call() -> None:
            try:
                store.meta("t1")
            except BaseException as exc:
                outcome.append(exc)
            else:
                outcome.append(None)

        caller = threading.Thread(target=call, daemon=True)
        server.process.send_signal(signal.SIGSTOP)
        try:
            caller.start()
            caller.join(timeout=20 * SOCKET_TIMEOUT)  # liveness: a hang fails, not a delay
        finally:
            server.process.send_signal(signal.SIGCONT)
        caller.join(timeout=PROCESS_DEADLINE)
        assert outcome and isinstance(outcome[0], redis.TimeoutError), outcome
        assert store.is_transient(outcome[0])


def test_a_urls_socket_timeout_wins_over_the_default(redis_server: RedisServer) -> None:
    with (
        RedisStore.from_url(redis_server.url) as default,
        RedisStore.from_url(f"{redis_server.url}?socket_timeout=2.5") as chosen,
    ):
        for store, seconds in ((default, SOCKET_TIMEOUT), (chosen, 2.5)):
            pool = store.client.connection_pool
            assert pool.connection_kwargs["socket_timeout"] == seconds


def test_a_wrong_password_is_not_waited_out_as_an_outage(redis_server: RedisServer) -> None:
    """redis-py makes it a ConnectionError; retried, every thread would be handed back for
    good with no word of why."""
    with admin_client(redis_server) as admin:
        admin.acl_setuser("agentq-worker", enabled=True, passwords=["+right"], commands=["+@all"])
    url = f"redis://agentq-worker:wrong@127.0.0.1:{redis_server.port}/0"
    with RedisStore.from_url(url) as store:
        with pytest.raises(redis.AuthenticationError) as refused:
            store.meta("t1")
        assert not store.is_transient(refused.value)


def test_writes_stopped_while_the_server_cannot_persist_are_a_passing_error(
    start_redis: StartRedis, tmp_path: Path
) -> None:
    """A failed snapshot (here its directory is gone; a full disk alike) stops every write
    with MISCONF until the disk is fixed: a passing error that a worker waits out within
    its lease, as SQLite's disk errors are, not one that fails the thread."""
    snapshots = tmp_path / "snapshots"
    snapshots.mkdir()
    # Protected configs on: the test moves the server back into its directory.
    server = start_redis(
        "--save", "3600 1", "--dir", str(snapshots), "--enable-protected-configs", "yes"
    )
    with RedisStore.from_url(server.url) as store, admin_client(server) as admin:
        store.open_thread("t1", task="agent")
        shutil.rmtree(snapshots)
        admin.bgsave()
        wait_until(
            lambda: admin.info("persistence")["rdb_last_bgsave_status"] == "err",
            timeout=PROCESS_DEADLINE,
            what="the snapshot failing",
        )
        with pytest.raises(redis.ResponseError, match=r"^MISCONF") as stopped:
            store.acquire("t1", "w1", 30)
        assert store.is_transient(stopped.value)
        snapshots.mkdir()
        admin.config_set("dir", str(snapshots))  # the server's own cwd was the removed one
        admin.bgsave()
        wait_until(
            lambda: admin.info("persistence")["rdb_last_bgsave_status"] == "ok",
            timeout=PROCESS_DEADLINE,
            what="the snapshot working again",
        )
        assert store.acquire("t1", "w1", 30) == 1


@pytest.mark.cluster
def test_a_limited_gc_gets_past_index_entries_their_threads_do_not_match(
    redis_cluster: list[RedisServer],
) -> None:
    """On Cluster a thread's index entries follow its meta in a second call, which a lost
    reply can leave unsent: entries of the finished index for threads that run again.
    Oldest first, they would be all a gc looking at 100 at a time ever found; it puts
    them right, and reaches the real finished thread behind them."""
    url = f"redis://127.0.0.1:{redis_cluster[0].port}/0"
    with RedisStore.from_url(url, cluster=True, prefix="gcstale:") as store:
        store.open_thread("real", task="agent")
        store.request_cancel("real")
        index = store.keys.status_index("cancelled")
        for n in range(100):
            store.open_thread(f"again-{n}", task="agent")
        store.client.zadd(index, {f"again-{n}": n for n in range(100)})  # older than real
        collected = [store.gc(0.0, limit=100) for _ in range(2)]
        assert sum(collected) == 1 and store.meta("real") is None
        assert store.client.zcard(index) == 0
        assert all(store.meta(f"again-{n}") is not None for n in range(100))


def test_a_zombie_s_refused_langgraph_write_leaves_its_new_driver_indexed(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes, neither of which indexed the thread before: the zombie adds the
    LangGraph index entry, the new driver finds it there and writes its checkpoint, then
    the zombie's write is refused. The entry names a thread holding that data: it stays."""
    from agentq.store.graph_records import StoredCheckpoint, encode_refs

    def stored(checkpoint_id: str) -> StoredCheckpoint:
        field = b"channel:"
        return StoredCheckpoint(
            checkpoint_id=checkpoint_id,
            record=b"record",
            refs=encode_refs([field]),
            run_id="run1",
            blobs={field: b"value"},
        )

    prefix = "zombie-index:"
    with (
        redis_store(redis_server.url, prefix=prefix) as zombie,
        redis_store(redis_server.url, prefix=prefix) as driver,
    ):
        zombie.open_thread("t1", task="agent")
        old = zombie.acquire("t1", "w1", 30)
        assert zombie.release("t1", "w1", old)
        new = driver.acquire("t1", "w2", 30)
        refused = zombie.graph()._fenced

        def driver_writes_first(*args: Any, **kwargs: Any) -> Any:
            driver.graph().put("t1", "", stored("c2"), new)
            return refused(*args, **kwargs)

        monkeypatch.setattr(zombie.graph(), "_fenced", driver_writes_first)
        with pytest.raises(StaleToken):
            zombie.graph().put("t1", "", stored("c1"), old)
        assert driver.graph().threads() == ["t1"]
