"""The classes a graph declares, which are the only ones its checkpoints may bring back.

Stored bytes name the class of each object in them, and LangGraph revives an object by
importing that name and calling it. A name read from a shared store decides nothing here:
the list of classes comes from the graph's code. It is LangGraph's own rule under
``LANGGRAPH_STRICT_MSGPACK``: the pydantic models, dataclasses and enums reachable from
the state, input, output and context schemas, the nodes' and branches' input schemas, and
the channels' value types (through ``list[...]``, ``Optional``, ``Annotated``, TypedDicts
and nested models), in the graph and in every subgraph. Named tuples too, which LangGraph's
walk passes by: the process that wrote one revives it, so a worker resuming the thread
after a crash must as well, or a node reading ``state["point"].x`` fails there only.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, get_args, get_type_hints, is_typeddict

from langgraph._internal._serde import build_serde_allowlist
from langgraph.graph import StateGraph
from langgraph.pregel import Pregel


def graph_types(graph: StateGraph[Any] | Pregel[Any, Any, Any, Any]) -> frozenset[tuple[str, ...]]:
    """``(module, name)`` of every class ``graph`` (compiled or a builder) declares."""
    compiled = graph.compile() if isinstance(graph, StateGraph) else graph
    allowed: set[tuple[str, ...]] = set()
    for pregel in (compiled, *(sub for _, sub in compiled.get_subgraphs(recurse=True))):
        channels = getattr(pregel, "channels", None)  # a remote graph has none
        schemas = _schemas(pregel)
        allowed |= build_serde_allowlist(schemas=schemas, channels=channels)
        for channel in (channels or {}).values():
            schemas += [getattr(channel, "ValueType", None), getattr(channel, "UpdateType", None)]
        for named in _named_tuples(schemas):
            allowed.add((named.__module__, named.__name__))
            # What a named tuple holds: its models, dataclasses and enums.
            allowed |= build_serde_allowlist(schemas=list(_hints(named)))
    return frozenset(allowed)


def _named_tuples(types: list[Any]) -> set[type]:
    """The named tuple classes reachable from ``types``, the way LangGraph's walk reaches
    classes: through generics, unions, ``Annotated``, TypedDicts, models and dataclasses."""
    found: set[type] = set()
    seen: set[int] = set()
    todo = list(types)
    while todo:
        typ = todo.pop()
        if typ is None or id(typ) in seen:
            continue
        seen.add(id(typ))
        if isinstance(typ, type) and issubclass(typ, tuple) and hasattr(typ, "_fields"):
            found.add(typ)
        if isinstance(typ, type) and (
            is_typeddict(typ)
            or dataclasses.is_dataclass(typ)
            or hasattr(typ, "model_fields")
            or typ in found
        ):
            todo.extend(_hints(typ))
        else:
            todo.extend(get_args(typ))
            todo.append(getattr(typ, "__supertype__", None))  # a NewType
    return found


def _hints(cls: type) -> list[Any]:
    with contextlib.suppress(Exception):  # a hint its module cannot resolve is no type
        return list(get_type_hints(cls).values())
    return []


def _schemas(pregel: Any) -> list[Any]:
    # The same schemas StateGraph.compile hands LangGraph's strict serde, and the nodes'
    # own annotations: an @entrypoint's channels hold them as the strings
    # ``from __future__ import annotations`` leaves, which only the function resolves.
    schemas: list[Any] = []
    for node in getattr(pregel, "nodes", {}).values():
        function = getattr(node.bound, "func", None) or getattr(node.bound, "afunc", None)
        with contextlib.suppress(Exception):  # a hint its module cannot resolve is no type
            schemas.extend(get_type_hints(function).values())
    builder = getattr(pregel, "builder", None)
    if not isinstance(builder, StateGraph):
        return schemas
    schemas += [builder.state_schema, builder.input_schema, builder.output_schema]
    if builder.context_schema is not None:
        schemas.append(builder.context_schema)
    schemas.extend(node.input_schema for node in builder.nodes.values())
    for branches in builder.branches.values():
        schemas.extend(b.input_schema for b in branches.values() if b.input_schema is not None)
    return schemas
