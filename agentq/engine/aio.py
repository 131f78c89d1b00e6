"""One event loop per worker process for ``async def`` nodes and tools.

The loop runs forever on a daemon OS thread of its own, started on first use and started
again in a forked child (the parent's thread does not survive a fork). Every pool slot
(a prefork child's main thread, one of ``-P threads``' threads, one of ``-P gevent``'s
greenlets) submits its node's coroutine to that loop and waits for it, so the async nodes of
all slots interleave on the one loop, and an async client created inside a node stays bound
to a loop that is still running at the next step, whichever slot runs it.

While it waits, the slot also runs the blocking calls its coroutine hands back with
:func:`blocking` (the store's round trips of ``run.atool`` and of the LangGraph saver): they
never stall the other nodes on the loop, they run where the store's connections belong (under
gevent a socket is the hub's and must not be used from another OS thread), and there are at
most as many at once as there are pool slots.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextvars
import functools
import os
import queue
import sys
import threading
import warnings
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from agentq.errors import BlockingOnLoop, ReentrantRunCoroutine, UnsupportedPool

_P = ParamSpec("_P")
_T = TypeVar("_T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_executor: _SlotExecutor | None = None
"""Under gevent, the loop's default executor, which hands calls to the hub's thread."""

_Job = tuple[Callable[[], Any], concurrent.futures.Future[Any]]
_slot: contextvars.ContextVar[_Slot | None] = contextvars.ContextVar("agentq_slot", default=None)


def run_coroutine(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coro`` on this process's loop and return its result, waiting in the calling
    thread (or greenlet) meanwhile; if the wait is interrupted (a time limit, a shutdown),
    the coroutine is cancelled and the interruption propagates."""
    try:
        loop = _process_loop()
    except BaseException:
        coro.close()  # it will never run: no warning that it was never awaited
        raise
    if asyncio._get_running_loop() is loop:
        coro.close()  # never awaited, on purpose: no warning about it
        raise ReentrantRunCoroutine(
            "run_coroutine was called from a coroutine already running on agentq's loop, "
            "which would wait for itself; await the coroutine instead"
        )
    slot = _Slot()
    future = asyncio.run_coroutine_threadsafe(_in_slot(slot, coro), loop)
    future.add_done_callback(lambda _: slot.wake())
    try:
        slot.serve(future)
        return future.result()
    except BaseException:
        future.cancel()
        slot.abandon()
        raise


def on_loop() -> bool:
    """Whether the caller runs on this process's loop, where a blocking call would stall
    every async node of the process (and, under gevent, use the hub from another thread)."""
    return _loop is not None and asyncio._get_running_loop() is _loop


def warn_blocking(message: str) -> None:
    """Warn, once per calling line as ``warnings`` does, of a blocking call made on the
    loop: it works, and stalls every other async node of the process meanwhile."""
    warnings.warn(message, BlockingOnLoop, stacklevel=4)


def blocking_on_loop(call: Callable[[], _T]) -> _T:
    """Make ``call``, a blocking call a node makes on the loop (which waits for it, as
    :func:`warn_blocking` warned), where it can run. Under gevent that is a greenlet of
    the hub's thread, as :func:`blocking`'s calls: the store's sockets, gevent's locks
    and a gevent-patched tool's waits belong to the hub, and on the loop's thread they
    raise "Cannot switch to a different thread". Elsewhere, right here."""
    if not _gevent_patched():
        return call()
    from gevent.monkey import get_original

    done = _off_loop(call)
    # A real lock: a gevent one would wait for the loop thread's own hub.
    finished = get_original("_thread", "allocate_lock")()
    finished.acquire()
    done.add_done_callback(lambda _: finished.release())
    finished.acquire()
    result: _T = done.result()
    return result


async def blocking(fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """Run the blocking call ``fn(*args, **kwargs)`` off the loop: in the pool slot waiting
    for this coroutine when there is one, else in a thread (under gevent, in a greenlet of
    its own)."""
    slot = _slot.get()
    done = slot.submit(lambda: fn(*args, **kwargs)) if slot is not None else None
    if done is None:
        return await asyncio.to_thread(fn, *args, **kwargs)
    result: _T = await asyncio.wrap_future(done)
    return result


async def _in_slot(slot: _Slot, coro: Coroutine[Any, Any, Any]) -> Any:
    # Tasks the coroutine starts copy this context, so their blocking calls find the slot too.
    _slot.set(slot)
    return await coro


class _Slot:
    """The calling side of one :func:`run_coroutine`: the jobs handed to it, and a way to
    sleep until there is one or the coroutine is done that suits the pool."""

    def __init__(self) -> None:
        self._jobs: collections.deque[_Job] = collections.deque()
        self._running: concurrent.futures.Future[Any] | None = None
        self._closed = False
        self._gevent = _gevent_patched()
        if not self._gevent:
            self._bell: queue.SimpleQueue[None] = queue.SimpleQueue()
        else:
            from gevent import get_hub
            from gevent.event import Event

            # The watcher's callback runs in the hub, where setting a gevent Event is safe;
            # started before anything can send to it, so no send is lost.
            self._ready = Event()
            self._watcher = get_hub().loop.async_()
            self._watcher.start(self._ready.set)

    def submit(self, call: Callable[[], Any]) -> concurrent.futures.Future[Any] | None:
        """Hand ``call`` to the waiting slot; ``None`` once it has stopped waiting (a task
        that outlived the coroutine), when the call must run elsewhere."""
        job: _Job = (call, concurrent.futures.Future())
        self._jobs.append(job)
        if self._closed:
            # Taken back unless the slot's last look at its jobs found it first.
            try:
                self._jobs.remove(job)
            except ValueError:
                return job[1]
            return None
        self.wake()
        return job[1]

    def wake(self) -> None:
        if self._gevent:
            self._watcher.send()
        else:
            self._bell.put(None)

    def serve(self, future: concurrent.futures.Future[Any]) -> None:
        """Run the jobs handed over until ``future`` is done."""
        try:
            while True:
                if self._gevent:
                    self._ready.clear()  # before looking: a send from now on sets it again
                while self._jobs:
                    self._run_next()
                if future.done():
                    self._closed = True
                    while self._jobs:  # handed over before the close was seen: still ours
                        _run_job(*self._jobs.popleft())
                    return
                self._sleep()
        finally:
            self._closed = True
            while self._jobs:  # interrupted: the coroutine is being cancelled
                self._jobs.popleft()[1].cancel()
            if self._gevent:
                # Stopped, not closed: the loop's thread may still send to it once.
                self._watcher.stop()

    def _run_next(self) -> None:
        call, done = self._jobs[0]
        self._running = done  # before it leaves the queue: an interruption finds it either way
        self._jobs.popleft()
        _run_job(call, done)
        self._running = None

    def abandon(self) -> None:
        """Fail the job the slot ran when its wait was interrupted, after the coroutine's
        cancel was sent: the coroutine hears of the cancel first, and a wait for that job
        to end (a store call run to its end despite a cancel) ends."""
        done = self._running
        if done is not None and not done.done():
            done.set_exception(RuntimeError("the pool slot running this call was interrupted"))

    def _sleep(self) -> None:
        if self._gevent:
            # Parks this greenlet only: the hub runs the others until the loop thread sends.
            self._ready.wait()
        else:
            self._bell.get()


def _run_job(call: Callable[[], Any], done: concurrent.futures.Future[Any]) -> None:
    if not done.set_running_or_notify_cancel():
        return  # the coroutine stopped waiting for it
    try:
        result = call()
    except Exception as exc:
        done.set_exception(exc)
    else:
        done.set_result(result)
    # A time limit or a shutdown goes on up through the slot's wait, which cancels the
    # coroutine; handed to the coroutine it would end the loop's thread instead.


class _HubCalls:
    """Under gevent, the blocking calls no pool slot waits for: those of a task that outlived
    its node, or of a node's cleanup once its slot was interrupted (a time limit, a
    shutdown). Each runs in a greenlet of the hub's thread, where the store's sockets and
    gevent's locks belong; on the loop's thread it would stall every async node meanwhile,
    and a wait on a gevent lock there (a full connection pool) would never be woken."""

    def __init__(self) -> None:
        from gevent import get_hub

        self._jobs: collections.deque[_Job] = collections.deque()
        self._watcher = get_hub().loop.async_()
        self._watcher.start(self._spawn_jobs)

    def submit(self, call: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        job: _Job = (call, concurrent.futures.Future())
        self._jobs.append(job)
        self._watcher.send()
        return job[1]

    def _spawn_jobs(self) -> None:
        import gevent

        while self._jobs:
            gevent.spawn(_run_job, *self._jobs.popleft())


class _SlotExecutor(concurrent.futures.ThreadPoolExecutor):
    """The loop's default executor under gevent, where ``threading`` makes greenlets of a
    hub that never runs in the loop's thread: ``run_in_executor(None, ...)`` (the loop's
    own ``getaddrinfo`` among them) runs in the waiting greenlet, as :func:`blocking` does;
    with no slot waiting, in a greenlet of its own (:class:`_HubCalls`). A
    ``ThreadPoolExecutor`` because asyncio accepts no other; it starts no thread."""

    def __init__(self, unwaited: _HubCalls) -> None:
        super().__init__()
        self._unwaited = unwaited

    def submit(
        self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[Any]:
        slot, call = _slot.get(), functools.partial(fn, *args, **kwargs)
        handed = slot.submit(call) if slot is not None else None
        return handed if handed is not None else self._unwaited.submit(call)


def _off_loop(call: Callable[[], Any]) -> concurrent.futures.Future[Any]:
    """Under gevent, ``call`` handed from the loop's thread to the hub's, as the loop's
    default executor hands its calls."""
    executor = _executor
    assert executor is not None  # set with the loop, which is running the caller
    return executor.submit(call)


def _process_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _lock:
        if _loop is None:
            _loop = _start_loop()
        return _loop


def _start_loop() -> asyncio.AbstractEventLoop:
    global _executor
    if _eventlet_patched():
        # Its hub has no way for another OS thread to wake one green thread: a slot
        # waiting for the loop would block every green thread of the process.
        raise UnsupportedPool(
            "async def nodes cannot run under -P eventlet (eventlet is deprecated and its "
            "hub cannot wait on another thread); run the worker with -P gevent or -P threads"
        )
    if _gevent_patched():
        from gevent.monkey import get_original

        # A real OS thread and a real selector: gevent's would need the hub to run them.
        selector = get_original("selectors", "DefaultSelector")()
        loop: asyncio.AbstractEventLoop = asyncio.SelectorEventLoop(selector)
        _executor = _SlotExecutor(_HubCalls())
        loop.set_default_executor(_executor)
        get_original("_thread", "start_new_thread")(_serve, (loop,))
    else:
        loop = asyncio.new_event_loop()
        threading.Thread(target=_serve, args=(loop,), name="agentq-asyncio", daemon=True).start()
    return loop


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    """Runs ``loop`` for the life of the process. asyncio lets a node's ``SystemExit`` or
    ``KeyboardInterrupt`` out of the loop: it goes on, so that the node's slot gets it as
    a sync node's caller would, and every other node keeps its loop."""
    while True:
        try:
            loop.run_forever()
            return
        except (SystemExit, KeyboardInterrupt):
            continue


def _gevent_patched() -> bool:
    monkey = sys.modules.get("gevent.monkey")
    return monkey is not None and bool(monkey.is_module_patched("threading"))


def _eventlet_patched() -> bool:
    patcher = sys.modules.get("eventlet.patcher")
    return patcher is not None and bool(patcher.is_monkey_patched("thread"))


def _forget_loop() -> None:
    global _lock, _loop, _executor
    # The parent's loop thread is not in the child, and its lock may have been held.
    _lock = threading.Lock()
    _loop = _executor = None


os.register_at_fork(after_in_child=_forget_loop)
