"""Side effects inside LangGraph tools, at most once per tool call."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ParamSpec, TypeVar, TypeVarTuple, Unpack, overload

from langchain_core.runnables import RunnableConfig
from langgraph.config import get_config

from agentq.engine.run import Run
from agentq.engine.tool_calls import tool_name
from agentq.engine.tool_types import PolicyOptions, TakesKey, TakesKeyAndToken, TakesToken
from agentq.errors import InvalidArgument

logger = logging.getLogger("agentq.langgraph")

R = TypeVar("R")
P = ParamSpec("P")
Ts = TypeVarTuple("Ts")


class ToolCallOptions(PolicyOptions, total=False):
    """The keyword options of :func:`tool_call` beside the tool's arguments."""

    config: RunnableConfig | None


def _in_graph_run() -> bool:
    try:
        get_config()
    except RuntimeError:
        return False
    return True


def current_run(config: RunnableConfig | None = None) -> Run | None:
    """The agentq run of the graph task executing this node or tool, or ``None`` when the
    graph runs outside one (a plain ``graph.invoke``)."""
    from agentq.langgraph.task import RUN_KEY

    if config is None:
        try:
            config = get_config()
        except RuntimeError:  # not inside a LangGraph run at all
            return None
    run = (config.get("configurable") or {}).get(RUN_KEY)
    return run if isinstance(run, Run) else None


# Matched as Run.tool's, but the tool_call_id is always the call's key: a call passing
# its arguments by keyword only is checked when it is made.
@overload
def tool_call(
    tool_call_id: str,
    fn: Callable[[*Ts], R] | TakesKey[*Ts, R],
    /,
    *args: *Ts,
    **options: Unpack[ToolCallOptions],
) -> R: ...


@overload
def tool_call(
    tool_call_id: str,
    fn: Callable[[*Ts], R] | TakesToken[*Ts, R],
    /,
    *args: *Ts,
    **options: Unpack[ToolCallOptions],
) -> R: ...


@overload
def tool_call(
    tool_call_id: str,
    fn: Callable[[*Ts], R] | TakesKeyAndToken[*Ts, R],
    /,
    *args: *Ts,
    **options: Unpack[ToolCallOptions],
) -> R: ...


@overload
def tool_call(tool_call_id: str, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R: ...


@overload
def tool_call(  # type: ignore[overload-cannot-match]  # P above takes no options
    tool_call_id: str,
    fn: Callable[..., R],
    /,
    *,
    idempotent: bool | None = None,
    reconcile: Callable[..., Any] | None = None,
    shared: bool | None = None,
    limit: str | Sequence[str] | None = None,
    cost: float = 0,
    actual_cost: Callable[[Any], float] | None = None,
    config: RunnableConfig | None = None,
    **kwargs: Any,
) -> R: ...


# The tool's own parameters named as the options cannot be passed by keyword.
def tool_call(  # type: ignore[misc]
    tool_call_id: str,
    fn: Callable[..., Any],
    *args: object,
    idempotent: bool | None = None,
    reconcile: Callable[..., Any] | None = None,
    shared: bool | None = None,
    limit: str | Sequence[str] | None = None,
    cost: float = 0,
    actual_cost: Callable[[Any], float] | None = None,
    config: RunnableConfig | None = None,
    **kwargs: Any,
) -> Any:
    """Call ``fn(*args, **kwargs)`` under an agentq idempotency claim keyed by the model's
    ``tool_call_id``: once per thread, a replay (after a crash, a retry, a resume) gets the
    recorded result back, typed as ``fn``'s. When an earlier worker died between the
    effect and its record, ``idempotent``/``reconcile`` settle it or the thread stops as
    ``needs_attention``, exactly as :meth:`agentq.Run.tool` (whose policies
    ``@agentq.tool`` declares), which also takes ``limit``/``cost``/``actual_cost`` from
    the app's fleet-wide limits.

    A type checker checks the arguments passed positionally against ``fn``; those passed
    by keyword only (the model's ``**call["args"]``) are checked when the call is made.

    Use it inside a tool or node of a graph run by a graph task; ``fn`` receives the key as
    ``idempotency_key`` if it takes that parameter. Outside a graph task there is no lease
    to fence a claim with, so ``fn`` simply runs (as in a notebook with ``MemorySaver``).
    """
    run = current_run(config)
    if run is None:
        if inspect.iscoroutinefunction(fn):  # refused as run.tool refuses it in a graph task
            raise InvalidArgument(
                f"tool call {tool_call_id}: {tool_name(fn)} is a coroutine function; call it "
                "with await agentq.langgraph.atool_call(...) from an async def tool or node"
            )
        return _without_claim(tool_call_id, fn, args, kwargs, config)
    return run.tool(
        fn,
        *args,
        key=tool_call_id,
        idempotent=idempotent,
        reconcile=reconcile,
        shared=shared,
        limit=limit,
        cost=cost,
        actual_cost=actual_cost,
        **kwargs,
    )


# As tool_call's, with the awaitable forms of Run.atool first.
@overload
async def atool_call(
    tool_call_id: str,
    fn: Callable[[*Ts], Awaitable[R]] | TakesKey[*Ts, Awaitable[R]],
    /,
    *args: *Ts,
    **options: Unpack[ToolCallOptions],
) -> R: ...


@overload
async def atool_call(
    tool_call_id: str,
    fn: Callable[[*Ts], Awaitable[R]] | TakesToken[*Ts, Awaitable[R]],
    /,
    *args: *Ts,
    **options: Unpack[ToolCallOptions],
) -> R: ...


@overload
async def atool_call(
    tool_call_id: str,
    fn: Callable[[*Ts], Awaitable[R]] | TakesKeyAndToken[*Ts, Awaitable[R]],
    /,
    *args: *Ts,
    **options: Unpack[ToolCallOptions],
) -> R: ...


@overload
async def atool_call(
    tool_call_id: str,
    fn: Callable[[*Ts], R] | TakesKey[*Ts, R],
    /,
    *args: *Ts,
    **options: Unpack[ToolCallOptions],
) -> R: ...


@overload
async def atool_call(
    tool_call_id: str,
    fn: Callable[[*Ts], R] | TakesToken[*Ts, R],
    /,
    *args: *Ts,
    **options: Unpack[ToolCallOptions],
) -> R: ...


@overload
async def atool_call(
    tool_call_id: str,
    fn: Callable[[*Ts], R] | TakesKeyAndToken[*Ts, R],
    /,
    *args: *Ts,
    **options: Unpack[ToolCallOptions],
) -> R: ...


@overload
async def atool_call(
    tool_call_id: str, fn: Callable[P, Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs
) -> R: ...


@overload
async def atool_call(
    tool_call_id: str, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs
) -> R: ...


# Options stay in **kwargs here, as in Run.atool's last two.
@overload
async def atool_call(  # type: ignore[overload-cannot-match]  # P above takes no options
    tool_call_id: str, fn: Callable[..., Awaitable[R]], /, **kwargs: Any
) -> R: ...


@overload
async def atool_call(  # type: ignore[overload-cannot-match]  # P above takes no options
    tool_call_id: str, fn: Callable[..., R], /, **kwargs: Any
) -> R: ...


async def atool_call(  # type: ignore[misc]  # as tool_call's
    tool_call_id: str,
    fn: Callable[..., Any],
    *args: object,
    idempotent: bool | None = None,
    reconcile: Callable[..., Any] | None = None,
    shared: bool | None = None,
    limit: str | Sequence[str] | None = None,
    cost: float = 0,
    actual_cost: Callable[[Any], float] | None = None,
    config: RunnableConfig | None = None,
    **kwargs: Any,
) -> Any:
    """:func:`tool_call` for an ``async def`` tool or node, as :meth:`agentq.Run.atool`:
    an ``async def`` ``fn`` is awaited on the graph's event loop (a plain one runs there,
    holding the loop while it runs), and the claim's store round trips run off it. The
    graph task runs the graph with ``astream`` when a node is an ``async def``; set
    ``run_async=True`` on it when only a ``ToolNode``'s tools are."""
    run = current_run(config)
    if run is None:
        result = _without_claim(tool_call_id, fn, args, kwargs, config)
        return await result if inspect.isawaitable(result) else result
    return await run.atool(
        fn,
        *args,
        key=tool_call_id,
        idempotent=idempotent,
        reconcile=reconcile,
        shared=shared,
        limit=limit,
        cost=cost,
        actual_cost=actual_cost,
        **kwargs,
    )


def _without_claim(
    tool_call_id: str,
    fn: Callable[..., Any],
    args: tuple[object, ...],
    kwargs: dict[str, Any],
    config: RunnableConfig | None,
) -> Any:
    """Outside a graph task there is no lease to fence a claim with: ``fn`` simply runs."""
    if config is None and not _in_graph_run():
        # A graph run by a plain invoke knows it has no claims; a call outside any graph
        # run is most often a node's, made from a thread that did not get its context.
        logger.warning(
            "tool call %s runs without a claim, so a retry or a lost worker can run it "
            "again: it was made outside any LangGraph run. From a thread a node starts, "
            "pass the node's config (tool_call(..., config=config)) or start the thread "
            "in the node's context (contextvars.copy_context().run)",
            tool_call_id,
        )
    else:
        logger.debug("tool call %s runs without a claim: no graph task", tool_call_id)
    parameters = inspect.signature(fn).parameters
    if "idempotency_key" in parameters:
        kwargs["idempotency_key"] = tool_call_id
    token = parameters.get("fencing_token")
    if token is not None and token.default is token.empty and "fencing_token" not in kwargs:
        raise InvalidArgument(
            f"tool call {tool_call_id}: {tool_name(fn)} takes a fencing_token, which only "
            "a graph task's lease gives; for runs outside one, give the parameter a "
            "default (fencing_token: int | None = None) or pass fencing_token="
        )
    return fn(*args, **kwargs)
