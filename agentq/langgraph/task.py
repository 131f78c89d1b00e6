"""``graph_task``: a compiled LangGraph graph run as a durable agentq task.

The graph is one agentq node, ``run_graph``, driven by agentq's own driver, so the lease, its
heartbeats, the sweeper, crash counting, cancellation, rate-limit retries and the deploy
handoff apply unchanged. Inside that node LangGraph runs the graph with an
:class:`~agentq.langgraph.AgentqSaver` bound to the lease's fencing token, saving a
checkpoint after every super-step (``durability="sync"``), so:

- a worker that dies loses at most the super-step in flight: the next one invokes the graph
  with ``None``, which is how LangGraph resumes from the thread's latest checkpoint;
- a worker that lost its lease (paused, partitioned) has its next LangGraph write refused
  with :class:`~agentq.errors.StaleToken`, and stops;
- LangGraph's ``interrupt()`` ends the node as agentq's ``Interrupt``: the thread is
  ``waiting`` with the interrupts as payload, and ``.resume(thread_id, value)`` continues
  with ``Command(resume=value)``;
- on a warm shutdown, or when the thread is cancelled, the node stops between two
  super-steps and the driver hands the thread over (or cancels it) at that boundary.

A thread runs its graph once: ``delay`` on a finished thread returns its result.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import enum
import inspect
import threading
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any, ClassVar, Never, cast

from celery.result import AsyncResult
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langgraph._internal._runnable import RunnableCallable
from langgraph.graph import StateGraph
from langgraph.pregel import Pregel
from langgraph.types import Command, StateSnapshot

from agentq.celery.drain import draining
from agentq.celery.task import AgentTask
from agentq.engine import aio
from agentq.engine.aio import run_coroutine
from agentq.engine.run import NO_VALUE, Run
from agentq.errors import ConfigError, InvalidArgument
from agentq.ids import validate_thread_id
from agentq.langgraph.saver import AgentqSaver
from agentq.langgraph.serde import AgentqSerializer
from agentq.outcomes import Done, Interrupt

AnyGraph = Pregel[Any, Any, Any, Any]

RUN_KEY = "__agentq_run__"
"""Where a graph task puts its :class:`~agentq.Run` in the graph's ``configurable``; the
double underscore keeps it out of checkpoint metadata."""


class GraphTask(AgentTask):
    """An :class:`~agentq.AgentTask` whose one node runs a LangGraph graph.

    Set ``graph`` to a compiled graph, a ``StateGraph`` builder, or a function returning
    either (called once per worker process, so models and clients are created there). Its
    own checkpointer is replaced by the task's saver, which revives the classes the graph
    declares (:meth:`AgentqSaver.for_graph`); ``allowed_types`` adds classes it does not
    declare, such as those only a ``Send`` or an interrupt carries.

    ``task.delay(thread_id, input)`` starts a thread; the input and resume values go
    through LangGraph's serde, so messages and models are fine there.
    """

    graph: ClassVar[Any] = None
    allowed_types: ClassVar[tuple[tuple[str, ...] | type, ...]] = ()
    recursion_limit: ClassVar[int | None] = None
    entry_node: ClassVar[str] = "run_graph"
    run_async: ClassVar[bool | None] = None
    """Whether the graph runs with ``astream`` on the worker's event loop rather than with
    ``stream``. ``None``: when one of its nodes or routing functions (in subgraphs too) is
    an ``async def``, which LangGraph can only run through its async API. Set ``True``
    when the async code is deeper than a node, such as async-only tools in a
    ``ToolNode``."""

    _set_up: tuple[AgentqSaver, AnyGraph] | None = None
    """The saver and the graph compiled with it, replaced together: a thread reading them
    while another sets them up never pairs one's saver with the other's graph."""
    _setting_up: ClassVar[threading.Lock] = threading.Lock()
    """Held while the graph is set up. The threads of a -P threads worker may all start
    with this task: the factory (models, clients) runs in one of them, and the others
    take what it made."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # One per task class (each registered as one instance), made here rather than in
        # __init__: Celery's Task has none, and task classes that define their own without
        # calling super().__init__() (as Celery's documentation shows) must still run.
        cls._setting_up = threading.Lock()

    # -- setup, once per process ----------------------------------------------------------

    @property
    def saver(self) -> AgentqSaver:
        """The task's (unbound) saver on the app's agentq store, reviving the graph's
        types (see :meth:`AgentqSaver.for_graph`)."""
        return self._setup()[0]

    def compiled(self) -> AnyGraph:
        """The graph, compiled, with the task's saver as its checkpointer."""
        return self._setup()[1]

    def _setup(self) -> tuple[AgentqSaver, AnyGraph]:
        store = self.agentq.store
        set_up = self._set_up
        if set_up is not None and set_up[0].store is store:
            return set_up
        with self._setting_up:
            set_up = self._set_up
            if set_up is None or set_up[0].store is not store:
                graph = self._load_graph()
                serde = AgentqSerializer(allowed_types=self.allowed_types)
                saver = AgentqSaver(store, serde=serde).for_graph(graph)
                set_up = self._set_up = (saver, graph.copy(update={"checkpointer": saver}))
            return set_up

    def _load_graph(self) -> AnyGraph:
        # Read statically: a factory set as a class attribute is not a method.
        source = inspect.getattr_static(type(self), "graph")
        if isinstance(source, staticmethod):
            source = source.__func__
        if callable(source) and not isinstance(source, (Pregel, StateGraph)):
            source = source()
        if isinstance(source, StateGraph):
            source = source.compile()
        if not isinstance(source, Pregel):
            raise ConfigError(
                f"{self.name}: graph must be a compiled LangGraph graph, a StateGraph or "
                f"a function returning one, not {type(source).__name__}"
            )
        return source

    # -- sending ---------------------------------------------------------------------------

    def delay(  # type: ignore[override]  # a graph's input is one value, not keywords
        self, thread_id: str, input: Any = None, /, *misplaced: Never
    ) -> AsyncResult:
        """Start (or re-send) thread ``thread_id`` with ``input`` for the graph."""
        return self.apply_async((thread_id, input, *misplaced))

    def apply_async(self, args: Any = None, kwargs: Any = None, **options: Any) -> AsyncResult:
        """Start thread ``args[0]`` with ``args[1]`` (optional) as the graph's input."""
        if not args or len(args) > 2 or kwargs:
            raise InvalidArgument(
                f"{self.name} takes the thread id and the graph's input: "
                "task.delay(thread_id, input)"
            )
        thread_id = validate_thread_id(args[0])
        packed = self._pack(args[1] if len(args) == 2 else None)
        return super().apply_async((thread_id,), {"input": packed}, **options)

    def resume(self, thread_id: str, value: Any = None, **options: Any) -> AsyncResult:
        """Continue a ``waiting`` thread with ``Command(resume=value)``; for several
        pending interrupts pass ``{interrupt_id: value}``, as LangGraph expects."""
        meta = self.thread(thread_id)
        asked = _interrupt_ids(meta.interrupt)
        if len(asked) > 1 and not (
            isinstance(value, Mapping) and value and set(value) <= set(asked)
        ):
            # LangGraph would refuse it only on the worker, failing the thread.
            raise InvalidArgument(
                f"{len(asked)} interrupts wait for an answer ({', '.join(asked)}): pass "
                "{interrupt_id: value} for each one answered, as LangGraph expects; "
                "task.state(thread_id).interrupts shows what each asks",
                thread_id=thread_id,
                step=meta.step,
            )
        return super().resume(thread_id, self._pack(value), **options)

    def state(self, thread_id: str) -> StateSnapshot:
        """The thread's LangGraph state, as ``graph.get_state`` returns it."""
        config: RunnableConfig = {"configurable": {"thread_id": validate_thread_id(thread_id)}}
        return self.compiled().get_state(config)

    def _pack(self, value: Any) -> tuple[str, bytes]:
        # Writing needs no allow-list: the sender need not load the graph.
        return AgentqSerializer().dumps_typed(value)

    def _unpack(self, packed: Any) -> Any:
        if not _is_packed(packed):
            # Stored as it was given, by a sender that does not load the graph: the CLI's
            # or the inspector's ``resume --value JSON``. JSON holds no bytes, so no plain
            # value is taken for a packed one.
            return packed
        type_, data = packed
        return self.saver.serde.loads_typed((type_, data))

    # -- the node --------------------------------------------------------------------------

    def result(self, values: Any) -> Any:
        """What ``wait()`` returns: the final state as plain data (messages as dicts). The
        exact state stays in the checkpointer: see :meth:`state`."""
        return to_plain(values)

    def run_graph(self, run: Run, input: Any = None) -> Any:
        """The node: run the graph from where the thread's checkpoints say it is."""
        # A run after a failure or a lost worker clears them once past a super-step: each
        # super-step counts its own, as each node of an agent does.
        again = run.retries > 0 or run.lost_workers > 0
        saver = self.saver.bound(run.thread_id, run.token, got_past=run.got_past if again else None)
        graph = self.compiled().copy(update={"checkpointer": saver})
        config: RunnableConfig = {"configurable": {"thread_id": run.thread_id, RUN_KEY: run}}
        if self.recursion_limit is not None:
            config["recursion_limit"] = self.recursion_limit
        first = self._first_input(graph, saver, config, run, input)
        run_async = self.run_async if self.run_async is not None else has_async_nodes(graph)
        try:
            if run_async:
                stopped = run_coroutine(self._astream(graph, first, config, run))
            else:
                stopped = self._stream(graph, first, config, run)
        finally:
            # A cancelled branch's sync tool still runs in the loop's executor: it ends
            # (recorded) before the next run could find its claim pending and run it again.
            run.wait_for_tools()
        if stopped:
            return self.entry_node  # commit here: the driver hands over or cancels
        snapshot = graph.get_state(config)
        if snapshot.interrupts or snapshot.next:
            # A static breakpoint (interrupt_before/after) stops with no Interrupt object.
            run.state["interrupts"] = [i.id for i in snapshot.interrupts]
            run.state["interrupted_at"] = snapshot.config["configurable"].get("checkpoint_id")
            payload = [{"id": i.id, "value": i.value} for i in snapshot.interrupts]
            return Interrupt(
                to_plain(payload or {"next": list(snapshot.next)}), resume_at=self.entry_node
            )
        return Done(self.result(snapshot.values))

    def _stream(self, graph: AnyGraph, first: Any, config: RunnableConfig, run: Run) -> bool:
        """Run the graph; whether it stopped early, between two super-steps."""
        for _ in graph.stream(first, config, stream_mode="updates", durability="sync"):
            if draining.is_set() or self._cancel_requested(run.thread_id):
                return True
        return False

    async def _astream(self, graph: AnyGraph, first: Any, config: RunnableConfig, run: Run) -> bool:
        """:meth:`_stream` with ``astream``. Closed before it returns, so that the graph's
        branches still running end first (their tools recorded), not after the next driver
        ran them again."""
        # An async generator, typed as an iterator by LangGraph.
        updates = cast(
            AsyncGenerator[Any, None],
            graph.astream(first, config, stream_mode="updates", durability="sync"),
        )
        async with contextlib.aclosing(updates) as stream:
            async for _ in stream:
                if draining.is_set() or await aio.blocking(self._cancel_requested, run.thread_id):
                    return True
        return False

    def _first_input(
        self, graph: AnyGraph, saver: AgentqSaver, config: RunnableConfig, run: Run, input: Any
    ) -> Any:
        if run.resume_value is not NO_VALUE:
            pending = [i.id for i in graph.get_state(config).interrupts]
            # After a crash the resume may already be applied: never answer a newer
            # interrupt with a value meant for an older one. A state edited meanwhile
            # (update_state) leaves none pending, and the graph has not gone on: LangGraph
            # answers the interrupt then, and so does this.
            asked = run.state.get("interrupts")
            if (pending and pending == asked) or (
                not pending and asked and not self._went_on(saver, run)
            ):
                return Command(resume=self._unpack(run.resume_value))
            return None
        if input is not None and saver.get_tuple(config) is None:
            return self._unpack(input)
        return None  # LangGraph resumes from the latest checkpoint

    def _went_on(self, saver: AgentqSaver, run: Run) -> bool:
        """Whether the graph's own loop saved a checkpoint since it stopped to ask, as it
        does once an answer is applied; ``update_state``'s checkpoints are not its."""
        asked_at = run.state.get("interrupted_at")
        config: RunnableConfig = {"configurable": {"thread_id": run.thread_id, "checkpoint_ns": ""}}
        for saved in saver.list(config):
            if saved.config["configurable"]["checkpoint_id"] == asked_at:
                return False
            if (saved.metadata or {}).get("source") == "loop":
                return True
        return True  # the checkpoint it stopped at is gone: take it as gone on

    def _cancel_requested(self, thread_id: str) -> bool:
        meta = self.agentq.store.meta(thread_id)
        return meta is not None and meta.cancel_requested


def _interrupt_ids(payload: Any) -> list[str]:
    """The ids of the interrupts a waiting graph thread asks (its payload, as stored)."""
    if not isinstance(payload, list):
        return []
    return [str(item["id"]) for item in payload if isinstance(item, dict) and "id" in item]


def _is_packed(value: Any) -> bool:
    """Whether ``value`` is a ``(type, bytes)`` pair of LangGraph's serializer."""
    return (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and isinstance(value[0], str)
        and isinstance(value[1], bytes)
    )


def graph_task(
    app: Any,
    graph: Any,
    *,
    name: str,
    base: type[GraphTask] = GraphTask,
    **attributes: Any,
) -> GraphTask:
    """Register ``graph`` (compiled, a ``StateGraph``, or a factory) as durable task
    ``name`` of the Celery ``app``; ``attributes`` set class attributes such as
    ``retry_on=(RateLimitError,)``, ``allowed_types`` or ``recursion_limit``."""
    task_class = type(
        f"GraphTask[{name}]", (base,), {"name": name, "graph": _as_attribute(graph), **attributes}
    )
    return cast(GraphTask, app.register_task(task_class()))


def has_async_nodes(graph: AnyGraph) -> bool:
    """Whether a node or routing function of ``graph`` or of a subgraph in it is an
    ``async def``, which only LangGraph's async API runs ("No synchronous function
    provided" from ``stream``)."""
    for node in graph.nodes.values():
        bound = node.bound
        if isinstance(bound, Pregel):
            if has_async_nodes(bound):
                return True
        elif _async_only(bound):
            return True
    # A StateGraph's conditional edges run inside their source node, not as nodes.
    builder = getattr(graph, "builder", None)
    if isinstance(builder, StateGraph):
        return any(
            _async_only(spec.path) for specs in builder.branches.values() for spec in specs.values()
        )
    return False


def _async_only(runnable: Any) -> bool:
    """Whether ``runnable`` wraps only an ``async def``: LangGraph's wrapper of a function,
    or a ``RunnableLambda`` given one (which sets no ``func`` then)."""
    if isinstance(runnable, RunnableCallable):
        return runnable.func is None
    return isinstance(runnable, RunnableLambda) and not hasattr(runnable, "func")


def _as_attribute(graph: Any) -> Any:
    # A plain function stored on a class would become a method: wrap it.
    return staticmethod(graph) if callable(graph) and not isinstance(graph, Pregel) else graph


def to_plain(value: Any) -> Any:
    """``value`` as data agentq's codec stores: pydantic models (LangChain messages among
    them) as their JSON dump (their fields, when that cannot hold them), dataclasses and
    named tuples as dicts, other objects as their ``str``."""
    if isinstance(value, enum.Enum):
        # Its value, as a model's JSON dump has it: the codec refuses enum members.
        return to_plain(value.value)
    if value is None or isinstance(value, (str, bytes, int, float, bool, dt.date)):
        return value
    if isinstance(value, Mapping):
        return {_plain_key(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_plain(v) for v in value]
    if isinstance(value, tuple) and hasattr(value, "_asdict"):  # a NamedTuple, as a dataclass
        return to_plain(value._asdict())
    if isinstance(value, tuple):
        return tuple(to_plain(v) for v in value)  # not a subclass: its constructor may differ
    if isinstance(value, (set, frozenset)):
        items = [to_plain(v) for v in value]
        try:
            return set(items) if isinstance(value, set) else frozenset(items)
        except TypeError:  # named tuples or models, as dicts now: unhashable
            return items
    dump: Callable[..., Any] | None = getattr(value, "model_dump", None)
    if callable(dump):
        try:
            return to_plain(dump(mode="json"))
        except ValueError:
            # Bytes that are not UTF-8, or a type only LangGraph's serde knows (a model
            # allowing arbitrary types): a JSON dump has no room for them, and the graph
            # has already ended. Its fields as they are, made plain here.
            return to_plain(dump())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return str(value)


def _plain_key(key: Any) -> str | int:
    plain = to_plain(key) if isinstance(key, enum.Enum) else key
    return plain if isinstance(plain, (str, int)) else str(plain)
