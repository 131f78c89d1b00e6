"""Mistakes in a node's tool calls that the engine can see before or right after the tool,
refused with an error that names the thread, the step and the fix, and recorded so that
the next run neither stops for a person over a call that never ran nor runs one twice.
Each runs on both stores."""

from __future__ import annotations

import functools
import inspect
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from agentq import Done, Run, Status
from agentq.engine.driver import Driver
from agentq.errors import InvalidArgument, InvalidEffectKey, InvalidInput, UnserializableState
from agentq.records import ThreadMeta
from agentq.settings import Settings
from agentq.store.contract import Store
from agentq.store.redis.store import RedisStore
from agentq.store.sqlite.store import SQLiteStore
from tests.support.redis_server import RedisServer


@pytest.fixture(params=["redis", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    made: Store
    if request.param == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        made = RedisStore.from_url(server.url, prefix=f"tm{uuid.uuid4().hex[:8]}:")
    else:
        made = SQLiteStore(tmp_path / "agentq.db")
    with made:
        yield made


class Agent:
    """One node, ``node(agent, run)``; the calls its tools make are kept in ``calls``."""

    name = "tests.tool_call_mistakes"
    entry_node = "go"
    append_only: tuple[str, ...] = ()

    def __init__(self, node: Callable[[Agent, Run], Any]) -> None:
        self.node = node
        if inspect.iscoroutinefunction(node):
            self.entry_node = "ago"
        self.calls: list[Any] = []

    def go(self, run: Run) -> Any:
        return self.node(self, run)

    async def ago(self, run: Run) -> Any:
        return await self.node(self, run)

    def should_retry(self, exc: BaseException) -> bool:
        return False

    def on_step(
        self,
        thread_id: str,
        step: int,
        node: str,
        next_node: str | None,
        *,
        limit_waits: Sequence[dict[str, Any]] = (),
    ) -> None:
        pass

    def on_limit_wait(
        self, thread_id: str, step: int, node: str, limit_waits: Sequence[dict[str, Any]]
    ) -> None:
        pass

    def resend(self, meta: ThreadMeta) -> None:
        pass

    def find_node(self, name: str) -> Callable[..., Any] | None:
        return {"go": self.go, "ago": self.ago}.get(name)


def drive(agent: Agent, store: Store, thread_id: str = "t1") -> Any:
    return Driver(agent, thread_id, store, Settings(store=store), lambda: False).drive()


def _meta(store: Store, thread_id: str = "t1") -> ThreadMeta:
    meta = store.meta(thread_id)
    assert meta is not None
    return meta


@pytest.mark.parametrize("asynchronous", [False, True], ids=["tool", "atool"])
def test_arguments_the_tool_does_not_take_are_refused_before_the_call_is_claimed(
    store: Store, asynchronous: bool
) -> None:
    """A model's tool call naming an argument the tool does not have: the tool cannot have
    run, so no claim may say it might have. Fixed and retried, the thread makes the call
    (rather than stop in needs_attention), once."""

    def send(to: str) -> str:
        agent.calls.append(to)
        return f"sent to {to}"

    async def asend(to: str) -> str:
        return send(to)

    def go(agent: Agent, run: Run) -> Done:
        return Done(run.tool(send, key="call-1", **arguments))

    async def ago(agent: Agent, run: Run) -> Done:
        return Done(await run.atool(asend, key="call-1", **arguments))

    arguments: dict[str, Any] = {"too": "a@example.com"}  # the model misspelt it
    agent = Agent(ago if asynchronous else go)
    store.open_thread("t1", task=agent.name)
    with pytest.raises(InvalidInput) as refused:
        drive(agent, store)
    assert (refused.value.thread_id, refused.value.step) == ("t1", 0)
    assert "'too'" in str(refused.value) and "send" in str(refused.value)
    assert isinstance(refused.value, TypeError)  # a node catching TypeError still does
    assert store.effect("t1", "call-1") is None
    assert _meta(store).status == Status.FAILED
    arguments = {"to": "a@example.com"}
    store.reopen("t1", from_statuses={Status.FAILED}, start_grace=0)
    assert drive(agent, store) == "sent to a@example.com"
    assert agent.calls == ["a@example.com"]


def _with_client(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A decorator that gives the tool its client, as session or connection decorators
    do: ``functools.wraps`` makes its signature read as the tool's, client included."""
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def awrapper(*args: Any, **kwargs: Any) -> Any:
            return await fn("the-client", *args, **kwargs)

        return awrapper

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn("the-client", *args, **kwargs)

    return wrapper


@pytest.mark.parametrize("asynchronous", [False, True], ids=["tool", "atool"])
def test_a_tool_whose_decorator_supplies_an_argument_is_called_with_the_rest(
    store: Store, asynchronous: bool
) -> None:
    """The signature inspect reports follows ``__wrapped__`` to the function inside, which
    takes an argument the wrapper itself supplies: that is no reason to refuse the call."""

    @_with_client
    def send(client: str, to: str) -> str:
        agent.calls.append((client, to))
        return f"sent to {to}"

    @_with_client
    async def asend(client: str, to: str) -> str:
        agent.calls.append((client, to))
        return f"sent to {to}"

    def go(agent: Agent, run: Run) -> Done:
        return Done(run.tool(send, to="a@example.com"))

    async def ago(agent: Agent, run: Run) -> Done:
        return Done(await run.atool(asend, to="a@example.com"))

    agent = Agent(ago if asynchronous else go)
    store.open_thread("t1", task=agent.name)
    assert drive(agent, store) == "sent to a@example.com"
    assert agent.calls == [("the-client", "a@example.com")]


class _Receipt:
    """What a client library returns: not plain data."""


def test_a_result_that_cannot_be_stored_names_the_step_and_how_to_settle_the_call(
    store: Store,
) -> None:
    """The tool ran, so its call stays claimed with no outcome (running it again could
    repeat it), and the error says so: where, what to return instead, how to settle it."""

    def charge(amount: int) -> _Receipt:
        agent.calls.append(amount)
        return _Receipt()

    def go(agent: Agent, run: Run) -> Done:
        return Done(run.tool(charge, 12, key="charge-1"))

    agent = Agent(go)
    store.open_thread("t1", task=agent.name)
    with pytest.raises(UnserializableState) as refused:
        drive(agent, store)
    assert (refused.value.thread_id, refused.value.step) == ("t1", 0)
    message = str(refused.value)
    assert "_Receipt cannot be stored" in message and "charge" in message
    assert "agentq resolve t1 charge-1 --result JSON" in message
    assert agent.calls == [12]
    effect = store.effect("t1", "charge-1")
    assert effect is not None and effect.state == "pending"
    assert _meta(store).status == Status.FAILED


class _AsyncClient:
    """A tool object whose call is a coroutine: ``async def __call__``."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    async def __call__(self, to: str) -> str:
        self.agent.calls.append(to)
        return f"sent to {to}"


@pytest.mark.parametrize("made", ["lambda", "object"])
def test_a_plain_call_of_a_coroutine_is_refused_and_leaves_no_claim(
    store: Store, made: str
) -> None:
    """``run.tool`` on something whose call gives a coroutine (a lambda around an async
    client, an object with ``async def __call__``) never runs it: its claim is not left
    to say it may have, nor is a coroutine left never awaited, and the error says to
    await ``run.atool``. Fixed, the call is made once."""
    client = _AsyncClient(agent := Agent(lambda agent, run: None))
    tool: Any = (lambda to: client(to)) if made == "lambda" else client

    def go(agent: Agent, run: Run) -> Done:
        return Done(run.tool(tool, "a@example.com", key="mail-1"))

    async def ago(agent: Agent, run: Run) -> Done:
        return Done(await run.atool(tool, "a@example.com", key="mail-1"))

    agent.node = go
    store.open_thread("t1", task=agent.name)
    with pytest.raises(InvalidArgument, match=r"await run\.atool") as refused:
        drive(agent, store)
    assert (refused.value.thread_id, refused.value.step) == ("t1", 0)
    assert store.effect("t1", "mail-1") is None
    assert agent.calls == []
    agent.node, agent.entry_node = ago, "ago"
    store.reopen("t1", from_statuses={Status.FAILED}, start_grace=0)
    assert drive(agent, store) == "sent to a@example.com"
    assert agent.calls == ["a@example.com"]


class _OtherThreadRecordsFirst:
    """A store on which thread ``a``, whose claim on the shared key ``invoice-1`` a call
    of thread ``t1`` just found pending, records its result before ``t1`` takes the claim
    over: the moment between the two claims, made to happen every time."""

    a_token = 0

    def claim_effect(self, *args: Any, **kwargs: Any) -> Any:
        claim = super().claim_effect(*args, **kwargs)  # type: ignore[misc]
        if args[0] == "t1" and claim.outcome == "unknown":
            self.complete_effect(  # type: ignore[attr-defined]
                "a", "invoice-1", self.a_token, {"id": "in_a"}, shared=True
            )
        return claim


class _RedisRecordsFirst(_OtherThreadRecordsFirst, RedisStore):
    pass


class _SQLiteRecordsFirst(_OtherThreadRecordsFirst, SQLiteStore):
    pass


@pytest.mark.parametrize("backend", ["redis", "sqlite"])
def test_a_shared_call_recorded_by_another_thread_before_the_takeover_is_replayed(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """An idempotent tool's shared key found pending (thread ``a`` runs the call), then
    recorded by ``a`` before this thread's takeover: the takeover answers with ``a``'s
    result, which the call returns, rather than run the tool again and have its record
    refused (the record is ``a``'s) as if the thread had lost its lease."""
    made: _OtherThreadRecordsFirst
    if backend == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        made = _RedisRecordsFirst.from_url(server.url, prefix=f"tm{uuid.uuid4().hex[:8]}:")
    else:
        made = _SQLiteRecordsFirst(tmp_path / "agentq.db")

    def invoice(customer: str) -> dict[str, str]:
        agent.calls.append(customer)
        return {"id": f"in_{customer}"}

    def go(agent: Agent, run: Run) -> Done:
        return Done(run.tool(invoice, "t1", key="invoice-1", shared=True, idempotent=True))

    agent = Agent(go)
    with made as store:
        assert isinstance(store, Store)
        store.open_thread("a", task=agent.name)
        made.a_token = store.acquire("a", "w-a", 60)
        store.claim_effect("a", "invoice-1", made.a_token, shared=True, claim_id="by-a")
        store.open_thread("t1", task=agent.name)
        assert drive(agent, store) == {"id": "in_a"}
        assert agent.calls == []
        assert _meta(store).status == Status.DONE


def test_one_key_for_two_different_calls_in_a_node_is_refused(store: Store) -> None:
    """The second call under a key the node already used would get the first one's
    recorded result back, its own effect never made: a mail to b reported as sent. The
    same call again (a retried branch of the node) still gets its result back."""

    def send(to: str) -> str:
        agent.calls.append(to)
        return f"sent to {to}"

    def go(agent: Agent, run: Run) -> Done:
        first = run.tool(send, "a", key="mail")
        again = run.tool(send, "a", key="mail")
        return Done([first, again, run.tool(send, "b", key=second_key)])

    second_key = "mail"  # e.g. a model that numbers its tool calls afresh in each reply
    agent = Agent(go)
    store.open_thread("t1", task=agent.name)
    with pytest.raises(InvalidArgument, match=r"key 'mail'.*own key") as refused:
        drive(agent, store)
    assert (refused.value.thread_id, refused.value.step) == ("t1", 0)
    assert agent.calls == ["a"]
    second_key = "mail-2"
    store.reopen("t1", from_statuses={Status.FAILED}, start_grace=0)
    assert drive(agent, store) == ["sent to a", "sent to a", "sent to b"]
    assert agent.calls == ["a", "b"]


@pytest.mark.parametrize("form", ["partial", "lambda"])
def test_one_key_for_two_partials_or_lambdas_of_a_tool_is_refused(store: Store, form: str) -> None:
    """They share the tool's name and the arguments at the call, and differ in what they
    bind: the second would get the first one's result back, its mail never sent."""

    def send(to: str) -> str:
        agent.calls.append(to)
        return f"sent to {to}"

    def make(to: str) -> Callable[[], str]:
        return functools.partial(send, to) if form == "partial" else (lambda: send(to))

    def go(agent: Agent, run: Run) -> Done:
        return Done([run.tool(make(to), key="mail") for to in ("a", "a", "b")])

    agent = Agent(go)
    store.open_thread("t1", task=agent.name)
    with pytest.raises(InvalidArgument, match="another function or partial") as refused:
        drive(agent, store)
    assert (refused.value.thread_id, refused.value.step) == ("t1", 0)
    assert agent.calls == ["a"]  # the same call made again got its result back


def test_a_tool_that_keeps_state_in_its_closure_is_the_same_call_again(store: Store) -> None:
    """A tool that makes its client on first use changes what it closes over when it
    runs: called again under its key (a retried branch of the node, a graph node its
    retry policy runs again), it is the same call, and gets its recorded result back."""
    made: list[str] = []

    def searcher() -> Callable[[str], str]:
        client: str | None = None

        def search(query: str) -> str:
            nonlocal client
            if client is None:
                client = "client"
                made.append(client)
            agent.calls.append(query)
            return f"hits for {query}"

        return search

    search = searcher()

    def go(agent: Agent, run: Run) -> Done:
        return Done([run.tool(search, "refunds", key="search-1") for _ in range(2)])

    agent = Agent(go)
    store.open_thread("t1", task=agent.name)
    assert drive(agent, store) == ["hits for refunds", "hits for refunds"]
    assert agent.calls == ["refunds"] and made == ["client"]
    assert _meta(store).status == Status.DONE


def test_pending_set_to_none_by_a_model_with_no_tool_call_is_none_pending(
    store: Store,
) -> None:
    """A chat client's reply names no tool call as ``tool_calls: None``: a node that keeps
    it as its pending calls (``run.pending = reply["tool_calls"]``) has none, in the step
    it commits and in the node after it, and the thread goes on."""
    seen: list[Any] = []

    def go(agent: Agent, run: Run) -> Any:
        if run.step == 0:
            run.pending = None  # type: ignore[assignment]  # what the reply held
            return "go"
        seen.append(run.pending)
        return Done(list(run.pending))

    agent = Agent(go)
    store.open_thread("t1", task=agent.name)
    assert drive(agent, store) == []
    assert seen == [[]]
    assert _meta(store).status == Status.DONE
    latest = store.latest("t1")
    assert latest is not None and latest.pending == []


@pytest.mark.parametrize(
    ("key", "problem"),
    [("mail{1}", "brace"), ("", "empty"), ("mail\n1", r"U\+000A"), (7, "must be a str")],
    ids=["brace", "empty", "newline", "int"],
)
def test_a_key_that_cannot_name_a_record_is_refused_naming_the_call(
    store: Store, key: Any, problem: str
) -> None:
    def send(to: str) -> str:
        agent.calls.append(to)
        return f"sent to {to}"

    def go(agent: Agent, run: Run) -> Done:
        return Done(run.tool(send, "a", key=key))

    agent = Agent(go)
    store.open_thread("t1", task=agent.name)
    with pytest.raises(InvalidEffectKey, match=problem) as refused:
        drive(agent, store)
    assert (refused.value.thread_id, refused.value.step) == ("t1", 0)
    assert "send" in str(refused.value)
    assert agent.calls == [] and store.effects("t1") == []


class CardDeclined(Exception):
    pass


def test_a_key_called_again_after_its_call_raised_in_the_node_says_so(store: Store) -> None:
    """The first call raised after its claim, so whether it took effect is unknown, and the
    thread stops for a person: the error tells what happened in this very node, not of a
    worker that died, and how to go on."""

    def charge(card: str) -> str:
        agent.calls.append(card)
        if card == "card-1":
            raise CardDeclined("card-1 declined")
        return f"charged {card}"

    def go(agent: Agent, run: Run) -> Done:
        try:
            return Done(run.tool(charge, "card-1", key="charge-1"))
        except CardDeclined:
            return Done(run.tool(charge, "card-2", key="charge-1"))

    agent = Agent(go)
    store.open_thread("t1", task=agent.name)
    assert drive(agent, store) is None
    meta = _meta(store)
    assert meta.status == Status.NEEDS_ATTENTION
    assert meta.error is not None
    assert "raised CardDeclined('card-1 declined') earlier in this step" in meta.error
    assert "died" not in meta.error
    assert "its own key" in meta.error and "agentq resolve t1 charge-1" in meta.error
    assert agent.calls == ["card-1"]


class Mailer:
    """A client whose instances are the tool: their repr names a memory address."""

    def __call__(self, to: str) -> str:
        return f"sent to {to}"


def test_a_tool_that_is_an_object_or_a_partial_is_recorded_under_its_class_name(
    store: Store,
) -> None:
    """The record names the tool as every process would, not by an address in one."""

    def go(agent: Agent, run: Run) -> Done:
        sent = run.tool(Mailer(), "a@example.com", key="call-1")
        return Done([sent, run.tool(functools.partial(Mailer(), "b@example.com"), key="call-2")])

    store.open_thread("t1", task="tests.tool_call_mistakes")
    assert drive(Agent(go), store) == ["sent to a@example.com", "sent to b@example.com"]
    tools = [effect.tool for effect in store.effects("t1")]
    assert tools == ["Mailer", "Mailer"]


def test_a_builtin_tool_without_a_signature_is_called_and_recorded(store: Store) -> None:
    """``run.tool(time.time)`` is how a node records a value that must not change on a
    replay (the clock, a max of inputs): C functions without a text signature have no
    ``inspect.signature``, which is no mistake of the call's, so the call is made and
    recorded, and the replay gets the same value back."""
    import operator
    import time

    def go(agent: Agent, run: Run) -> Done:
        now = run.tool(time.time, key="now")
        biggest = run.tool(max, 3, 7, key="max")
        upper = run.tool(operator.methodcaller("upper"), "mail", key="upper")
        return Done([now, biggest, upper])

    store.open_thread("t1", task="tests.tool_call_mistakes")
    now, biggest, upper = drive(Agent(go), store)
    assert isinstance(now, float) and biggest == 7 and upper == "MAIL"
    assert {effect.key for effect in store.effects("t1")} == {"now", "max", "upper"}
    recorded = store.effect("t1", "now")
    assert recorded is not None and recorded.result == now


@pytest.mark.parametrize("where", ["call", "declared"])
def test_a_reconcile_that_is_not_a_function_is_refused_before_the_call_is_claimed(
    store: Store, where: str
) -> None:
    """``reconcile=True`` (read as a flag, beside ``idempotent=True``) is only called once a
    worker died mid-call: taken then, the recovery that needs it fails with a bare
    ``TypeError: 'bool' object is not callable``, the claim taken over and still unknown.
    Refused at the first call instead, naming the step, with nothing claimed nor run."""
    import agentq

    def send(to: str) -> str:
        agent.calls.append(to)
        return f"sent to {to}"

    flag: Any = True  # what a type checker would refuse
    declared = agentq.tool(reconcile=flag)(send)

    def go(agent: Agent, run: Run) -> Done:
        if where == "call":
            return Done(run.tool(send, "a@example.com", key="mail", reconcile=flag))
        return Done(run.tool(declared, "a@example.com", key="mail"))

    agent = Agent(go)
    store.open_thread("t1", task=agent.name)
    with pytest.raises(InvalidArgument, match="reconcile=True is not a function") as info:
        drive(agent, store)
    assert (info.value.thread_id, info.value.step) == ("t1", 0)
    assert store.effect("t1", "mail") is None
    assert agent.calls == []


def test_a_declared_tool_called_through_a_partial_keeps_its_policy(store: Store) -> None:
    """``functools.partial(charge, customer)`` is the same tool, bound to an argument: its
    declared ``shared=True`` makes the key one record across threads, so the invoice is
    charged once whichever thread calls it first, and the other gets that result."""
    import agentq

    @agentq.tool(shared=True)
    def charge(customer: str, invoice: str) -> str:
        agent.calls.append(invoice)
        return f"charged {customer} for {invoice}"

    def go(agent: Agent, run: Run) -> Done:
        return Done(run.tool(functools.partial(charge, "acme"), "inv-7", key="invoice-7"))

    agent = Agent(go)
    for thread_id in ("t1", "t2"):
        store.open_thread(thread_id, task=agent.name)
        assert drive(agent, store, thread_id) == "charged acme for inv-7"
    assert agent.calls == ["inv-7"]
    recorded = store.effect("t1", "invoice-7", shared=True)
    assert recorded is not None and recorded.result == "charged acme for inv-7"


def test_an_object_whose_call_is_a_declared_tool_keeps_its_policy(store: Store) -> None:
    """A client object whose class declares ``__call__`` with ``shared=True``: its key is
    one record across threads, as for the function itself."""
    import agentq

    class Charger:
        @agentq.tool(shared=True)
        def __call__(self, invoice: str) -> str:
            agent.calls.append(invoice)
            return f"charged {invoice}"

    def go(agent: Agent, run: Run) -> Done:
        return Done(run.tool(Charger(), "inv-8", key="invoice-8"))

    agent = Agent(go)
    for thread_id in ("t1", "t2"):
        store.open_thread(thread_id, task=agent.name)
        assert drive(agent, store, thread_id) == "charged inv-8"
    assert agent.calls == ["inv-8"]


def test_a_shared_call_without_a_key_is_refused_before_it_is_claimed(store: Store) -> None:
    """A shared key is one record across threads; the default key (the step and the
    call's place in the node, ``step0.call1``) is the same in every thread, so thread
    t2's call of a ``shared=True`` tool got t1's result back ("charged inv-1") and
    inv-2 was never charged. The call must name its key."""
    import agentq

    @agentq.tool(shared=True)
    def charge(invoice: str) -> str:
        agent.calls.append(invoice)
        return f"charged {invoice}"

    invoices = {"t1": "inv-1", "t2": "inv-2"}

    def go(agent: Agent, run: Run) -> Done:
        return Done(run.tool(charge, invoices[run.thread_id]))

    agent = Agent(go)
    for thread_id in invoices:
        store.open_thread(thread_id, task=agent.name)
        with pytest.raises(InvalidArgument, match="shared") as info:
            drive(agent, store, thread_id)
        assert (info.value.thread_id, info.value.step) == (thread_id, 0)
    assert agent.calls == []


class RateLimited(Exception):
    """A provider's 429, with the Retry-After of a step that may go again at once."""

    retry_after = 0.0


class RetryingAgent(Agent):
    def should_retry(self, exc: BaseException) -> bool:
        return isinstance(exc, RateLimited)


def test_a_gathered_call_still_running_when_its_node_raises_is_recorded_first(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """``asyncio.gather(run.atool(a), run.atool(b))``: ``a`` is refused with a 429, and
    gather raises at once while ``b`` still runs. Had the step ended as retrying (due
    now) with ``b`` unrecorded, its retry would find ``b``'s claim pending as if a worker
    had died, and stop the thread for a person. The step ends once ``b`` is recorded,
    and its retry gets ``b``'s result back."""
    import asyncio
    import logging
    import threading

    from tests.support.redis_server import wait_until

    caplog.set_level(logging.INFO, logger="agentq")
    started, released = threading.Event(), threading.Event()

    async def refused() -> str:
        await asyncio.to_thread(started.wait)  # once b runs
        raise RateLimited("429")

    async def slow(item: str) -> str:
        agent.calls.append(item)
        started.set()
        await asyncio.to_thread(released.wait)
        return f"done {item}"

    async def go(agent: Agent, run: Run) -> Done:
        if run.retries == 0:
            calls = run.atool(refused, key="a"), run.atool(slow, "b", key="b")
            return Done(await asyncio.gather(*calls))
        return Done([await run.atool(slow, "b", key="b")])

    def waits_for_b() -> bool:
        return any("still running" in record.getMessage() for record in caplog.records)

    agent = RetryingAgent(go)
    store.open_thread("t1", task=agent.name)
    first = threading.Thread(target=drive, args=(agent, store))
    first.start()
    try:
        # Either the step ended with b still running, or it waits for b.
        wait_until(
            lambda: _meta(store).status == Status.RETRYING or waits_for_b(),
            timeout=20,
            what="the step to end or wait for b",
        )
        if waits_for_b():
            released.set()
        first.join()
        assert _meta(store).status == Status.RETRYING
        retried = drive(agent, store)
    finally:
        released.set()
        first.join()
    assert retried == ["done b"]
    assert agent.calls == ["b"]


@pytest.mark.parametrize("inner", ["direct", "gather", "wait_for"])
def test_a_call_a_gathered_task_makes_after_the_node_raised_is_never_left_pending(
    store: Store, caplog: pytest.LogCaptureFixture, inner: str
) -> None:
    """As above, but the task still running makes a second call once its first ends,
    after the node raised. Made while the step waits (the task went on at once), it is
    waited for too; made later (through an inner gather or ``wait_for``, a turn of the
    loop later), it is refused before its claim. Either way the retry finds no claim
    pending and makes the calls not recorded."""
    import asyncio
    import logging
    import threading

    from tests.support.redis_server import wait_until

    caplog.set_level(logging.INFO, logger="agentq")
    started = {item: threading.Event() for item in ("b", "c")}
    released = {item: threading.Event() for item in ("b", "c")}

    async def refused() -> str:
        await asyncio.to_thread(started["b"].wait)
        raise RateLimited("429")

    async def slow(item: str) -> str:
        agent.calls.append(item)
        started[item].set()
        await asyncio.to_thread(released[item].wait)
        return f"done {item}"

    async def first_call(run: Run) -> str:
        call = run.atool(slow, "b", key="b")
        if inner == "gather" and run.retries == 0:
            return (await asyncio.gather(call))[0]
        if inner == "wait_for" and run.retries == 0:
            return await asyncio.wait_for(call, 60)
        return await call

    async def two_calls(run: Run) -> list[str]:
        return [await first_call(run), await run.atool(slow, "c", key="c")]

    async def go(agent: Agent, run: Run) -> Done:
        if run.retries == 0:
            return Done(await asyncio.gather(run.atool(refused, key="a"), two_calls(run)))
        return Done(await two_calls(run))

    def waits(n: int) -> bool:
        return sum("still running" in record.getMessage() for record in caplog.records) >= n

    agent = RetryingAgent(go)
    store.open_thread("t1", task=agent.name)
    first = threading.Thread(target=drive, args=(agent, store))
    first.start()
    try:
        wait_until(lambda: waits(1), timeout=20, what="the step to wait for b")
        released["b"].set()
        wait_until(
            lambda: _meta(store).status == Status.RETRYING or waits(2),
            timeout=20,
            what="the step to end or wait for c",
        )
        if waits(2):
            assert _meta(store).status == Status.RUNNING
            released["c"].set()
        first.join()
        assert _meta(store).status == Status.RETRYING
        released["c"].set()
        retried = drive(agent, store)
    finally:
        for event in released.values():
            event.set()
        first.join()
    assert retried == ["done b", "done c"]
    # c ran once: recorded before the step ended, or refused before it ran and made by
    # the retry.
    assert agent.calls.count("c") == 1 and agent.calls.count("b") == 1


def test_a_call_in_a_thread_still_running_when_its_node_raises_is_recorded_first(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """A sync node that hands its calls to a thread pool and raises at the first failed
    one (``next(pool.map(...))``, ``future.result()`` outside a ``with`` block) leaves
    the others running: the step ends once they are recorded, not with their claims
    pending for its retry to take for a dead worker's."""
    import concurrent.futures
    import logging
    import threading

    from tests.support.redis_server import wait_until

    caplog.set_level(logging.INFO, logger="agentq")
    started, released = threading.Event(), threading.Event()
    pool = concurrent.futures.ThreadPoolExecutor(2)

    def refused() -> str:
        started.wait()  # once b runs
        raise RateLimited("429")

    def slow(item: str) -> str:
        agent.calls.append(item)
        started.set()
        released.wait()
        return f"done {item}"

    def go(agent: Agent, run: Run) -> Done:
        if run.retries == 0:
            a = pool.submit(lambda: run.tool(refused, key="a"))
            b = pool.submit(lambda: run.tool(slow, "b", key="b"))
            return Done([a.result(), b.result()])
        return Done([run.tool(slow, "b", key="b")])

    def waits_for_b() -> bool:
        return any("still running" in record.getMessage() for record in caplog.records)

    agent = RetryingAgent(go)
    store.open_thread("t1", task=agent.name)
    first = threading.Thread(target=drive, args=(agent, store))
    first.start()
    try:
        wait_until(
            lambda: _meta(store).status == Status.RETRYING or waits_for_b(),
            timeout=20,
            what="the step to end or wait for b",
        )
        if waits_for_b():
            released.set()
        first.join()
        assert _meta(store).status == Status.RETRYING
        retried = drive(agent, store)
    finally:
        released.set()
        first.join()
        pool.shutdown()
    assert retried == ["done b"]
    assert agent.calls == ["b"]
