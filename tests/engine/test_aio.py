"""The worker process's event loop: shared by every pool slot, remade after a fork."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from types import FrameType

import pytest

from agentq.engine.aio import blocking, run_coroutine
from agentq.errors import ReentrantRunCoroutine
from tests.support.redis_server import RedisServer
from tests.support.workers import ROOT

SLOTS = 50


def test_coroutines_of_many_threads_wait_at_once_on_one_loop() -> None:
    inside = 0
    all_inside = asyncio.Event()  # made and set only on the loop's thread

    async def node() -> tuple[int, int]:
        nonlocal inside
        inside += 1
        if inside == SLOTS:
            all_inside.set()
        # Only returns if every slot's coroutine is waiting here at the same time.
        await asyncio.wait_for(all_inside.wait(), timeout=30)
        return id(asyncio.get_running_loop()), threading.get_ident()

    with ThreadPoolExecutor(SLOTS) as pool:
        seen = list(pool.map(lambda _: run_coroutine(node()), range(SLOTS)))
    loops, threads = {loop for loop, _ in seen}, {thread for _, thread in seen}
    assert len(loops) == 1 and len(threads) == 1
    (loop_thread,) = [t for t in threading.enumerate() if t.ident in threads]
    assert loop_thread.name == "agentq-asyncio" and loop_thread.daemon


def test_blocking_calls_run_in_the_waiting_thread() -> None:
    async def node() -> tuple[int, int]:
        return threading.get_ident(), await blocking(threading.get_ident)

    loop_thread, blocking_thread = run_coroutine(node())
    assert blocking_thread == threading.get_ident() != loop_thread


def test_a_task_outliving_its_node_runs_its_blocking_calls_in_a_thread() -> None:
    go = asyncio.Event()  # bound to the loop on first use there

    async def late() -> int:
        await go.wait()
        return await blocking(threading.get_ident)

    async def node() -> asyncio.Task[int]:
        return asyncio.get_running_loop().create_task(late())

    task = run_coroutine(node())  # the slot has stopped waiting when the task goes on

    async def release() -> int:
        go.set()
        return await task

    assert run_coroutine(release()) != threading.get_ident()


def test_blocking_errors_reach_the_coroutine() -> None:
    def refuse() -> None:
        raise LookupError("nope")

    async def node() -> str:
        try:
            await blocking(refuse)
        except LookupError as exc:
            return str(exc)
        return "not raised"

    assert run_coroutine(node()) == "nope"


def test_a_forked_child_gets_a_loop_of_its_own() -> None:
    async def loop_thread() -> int:
        return threading.get_native_id()

    parent = run_coroutine(loop_thread())
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its loop's thread and leave without cleanup
        try:
            os.write(write, str(run_coroutine(loop_thread())).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = int(pipe.read() or 0)
    assert os.waitpid(pid, 0)[1] == 0
    assert child and child != parent
    assert run_coroutine(loop_thread()) == parent  # the parent's loop is untouched


NODE_EXITS = """
import sys, threading
from agentq.engine.aio import run_coroutine

async def loop_thread():
    return threading.get_native_id()

async def leaves():
    sys.exit(3)

first = run_coroutine(loop_thread())
try:
    run_coroutine(leaves())
except SystemExit as exc:
    print("the node's slot got SystemExit", exc.code)
print("the next node runs on the same loop:", run_coroutine(loop_thread()) == first)
"""


def test_a_node_calling_sys_exit_ends_its_slot_not_the_loop() -> None:
    """asyncio lets SystemExit out of the loop's thread: the slot waiting for that node
    gets it, as a sync node's caller would, and later nodes still find their loop
    (before, both waited for ever)."""
    out = subprocess.run(
        [sys.executable, "-c", NODE_EXITS],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
    )
    assert out.stdout.splitlines() == [
        "the node's slot got SystemExit 3",
        "the next node runs on the same loop: True",
    ], out.stderr


def test_a_coroutine_on_the_loop_cannot_wait_for_the_loop() -> None:
    async def inner() -> None:
        pass

    async def node() -> None:
        run_coroutine(inner())

    with pytest.raises(ReentrantRunCoroutine, match="await the coroutine instead"):
        run_coroutine(node())


class Stop(BaseException):
    """What a time limit or a shutdown raises in the waiting thread."""


@pytest.fixture
def stop_on_alarm() -> Iterator[None]:
    def stop(signum: int, frame: FrameType | None) -> None:
        raise Stop

    previous = signal.signal(signal.SIGALRM, stop)
    yield
    signal.signal(signal.SIGALRM, previous)


def test_an_interrupted_wait_cancels_the_coroutine(stop_on_alarm: None) -> None:
    cancelled = threading.Event()

    async def node() -> None:
        try:
            # Signalled from the waiting thread, so the handler interrupts its wait.
            await blocking(os.kill, os.getpid(), signal.SIGALRM)
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(Stop):
        run_coroutine(node())
    assert cancelled.wait(timeout=10)
    assert run_coroutine(asyncio.sleep(0, "the loop runs on")) == "the loop runs on"


GEVENT_SCRIPT = """
from gevent import monkey

monkey.patch_all()

import asyncio
import threading

import gevent
from gevent.monkey import get_original

from agentq.engine.aio import blocking, run_coroutine

real_ident = get_original("threading", "get_ident")
hub_thread = real_ident()
inside = 0
all_inside = None

async def node(i):
    global inside, all_inside
    all_inside = all_inside or asyncio.Event()
    inside += 1
    if inside == {slots}:
        all_inside.set()
    await asyncio.wait_for(all_inside.wait(), timeout=30)
    infos = await asyncio.get_running_loop().getaddrinfo("localhost", 80)
    assert infos and real_ident() != hub_thread
    # gevent.sleep only returns if the hub runs: the greenlet waits without blocking it.
    return await blocking(lambda: (gevent.sleep(0), real_ident())[1])

greenlets = [gevent.spawn(run_coroutine, node(i)) for i in range({slots})]
gevent.joinall(greenlets, timeout=60, raise_error=True)
assert [g.value for g in greenlets] == [hub_thread] * {slots}, [g.value for g in greenlets]
print("ok")
"""


def test_under_gevent_greenlets_wait_on_a_real_thread_without_blocking_the_hub() -> None:
    pytest.importorskip("gevent")
    script = textwrap.dedent(GEVENT_SCRIPT).format(slots=SLOTS)
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


GEVENT_UNWAITED_SCRIPT = """
from gevent import monkey

monkey.patch_all()

import asyncio

import gevent
from gevent.event import Event
from gevent.monkey import get_original

from agentq.engine.aio import blocking, run_coroutine

real_ident = get_original("threading", "get_ident")
hub_thread = real_ident()
started = Event()  # set by the slot's greenlet, in the hub's thread
cleaned = None


class Stop(BaseException):
    pass


async def node():
    global cleaned
    cleaned = asyncio.get_running_loop().create_future()
    try:
        await blocking(started.set)
        await asyncio.Event().wait()
    finally:
        # After the slot was interrupted: no greenlet waits for this call any more.
        cleaned.set_result(await blocking(real_ident))


go = None


async def outliving():
    await go.wait()
    return await blocking(real_ident)


async def start_outliving():
    global go
    go = asyncio.Event()
    return asyncio.get_running_loop().create_task(outliving())


async def result_of(awaitable):
    return await asyncio.wait_for(awaitable, timeout=30)


async def release(task):
    go.set()  # once the slot that started the task has stopped waiting
    return await result_of(task)


slot = gevent.spawn(run_coroutine, node())
assert started.wait(timeout=30)
slot.kill(Stop)  # what a time limit or a shutdown does to the greenlet
assert isinstance(slot.exception, Stop), slot.exception
print("cleanup", "hub" if run_coroutine(result_of(cleaned)) == hub_thread else "loop")
task = run_coroutine(start_outliving())
print("outliving task", "hub" if run_coroutine(release(task)) == hub_thread else "loop")
"""


def test_under_gevent_calls_no_slot_waits_for_run_in_the_hubs_thread() -> None:
    """A node's cleanup after its greenlet was interrupted, and a task that outlived its
    node, make their store round trips in a greenlet of their own, where the store's
    sockets and gevent's locks belong, not on the loop's thread."""
    pytest.importorskip("gevent")
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(GEVENT_UNWAITED_SCRIPT)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.stdout.split("\n")[:2] == ["cleanup hub", "outliving task hub"], done.stderr
    assert done.returncode == 0, done.stderr


GEVENT_BLOCKING_ON_LOOP_SCRIPT = """
import sys
import warnings

from gevent import monkey

monkey.patch_all()

import gevent
from gevent.monkey import get_original

from agentq import Done
from agentq.engine.driver import Driver
from agentq.errors import BlockingOnLoop
from agentq.settings import Settings
from agentq.store.redis.store import RedisStore

real_ident = get_original("threading", "get_ident")
hub_thread = real_ident()


def send(to):
    gevent.sleep(0)  # a gevent-patched client's wait, which needs its hub
    return ("sent to " + to, "hub" if real_ident() == hub_thread else "loop")


class Agent:
    name = "tests.blocking_on_loop"
    append_only = ()
    entry_node = "start"

    def should_retry(self, exc):
        return False

    def on_step(self, *args, **kwargs):
        pass

    def on_limit_wait(self, *args, **kwargs):
        pass

    def resend(self, meta):
        pass

    def find_node(self, name):
        return self.start if name == "start" else None

    async def start(self, run):
        ref = run.artifacts.put(b"report")
        return Done({"sent": run.tool(send, "a@example.com"), "data": run.artifacts.get(ref)})


with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always", BlockingOnLoop)
    with RedisStore.from_url(sys.argv[1], prefix=sys.argv[2]) as store:
        store.open_thread("t1", task=Agent.name)
        settings = Settings(store=store, lease_ttl=5)
        driver = gevent.spawn(Driver(Agent(), "t1", store, settings, lambda: False).drive)
        driver.join(timeout=30)
        print(repr(driver.value if driver.successful() else driver.exception))
        print(store.meta("t1").status.value)
print(sorted({type(w.message).__name__ for w in caught}))
"""


def test_under_gevent_a_blocking_call_in_an_async_node_works_and_warns(
    redis_server: RedisServer,
) -> None:
    """``run.tool`` and ``run.artifacts.put``/``get`` in an ``async def`` node block the
    loop, as their warning says, but work, under gevent too, where the store's sockets
    and the tool's own gevent waits belong to the hub's thread, not the loop's."""
    pytest.importorskip("gevent")
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(GEVENT_BLOCKING_ON_LOOP_SCRIPT),
            redis_server.url,
            f"gb{os.getpid()}:",
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=90,
    )
    sent = {"sent": ("sent to a@example.com", "hub"), "data": b"report"}
    assert done.stdout.split("\n")[:3] == [repr(sent), "done", "['BlockingOnLoop']"], (
        done.stdout + done.stderr
    )


EVENTLET_SCRIPT = r"""
import warnings

warnings.simplefilter("error")
warnings.filterwarnings("ignore", message=r"\s*Eventlet is deprecated")  # its own notice
import eventlet

eventlet.monkey_patch()

import asyncio

from agentq.engine.aio import run_coroutine
from agentq.errors import UnsupportedPool

try:
    run_coroutine(asyncio.sleep(0))
except UnsupportedPool as exc:
    print(exc)
"""


def test_under_eventlet_an_async_node_is_refused_with_the_pools_that_work() -> None:
    pytest.importorskip("eventlet")
    done = subprocess.run(
        [sys.executable, "-c", EVENTLET_SCRIPT],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "-P gevent or -P threads" in done.stdout, done.stdout + done.stderr
