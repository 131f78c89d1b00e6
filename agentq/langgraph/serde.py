"""LangGraph's serde, made safe to read back: never pickle, revive only allowed types.

LangGraph's :class:`JsonPlusSerializer` pickles what msgpack cannot hold when
``pickle_fallback`` is on, and by default revives *any* class named in stored bytes
(importing its module and calling it). A checkpoint store is shared by every worker, so
bytes read from it must not be able to run code: :class:`AgentqSerializer` never pickles
and, like LangGraph's strict mode, only revives the types in LangGraph's safe list plus the
ones you allow. A type that is not allowed comes back as its plain data (a dict), as in
LangGraph's strict mode.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from agentq.errors import CodecError

WRITTEN_TYPES: Final = frozenset({"null", "bytes", "bytearray", "msgpack"})
"""The type tags :class:`AgentqSerializer` writes; anything else is refused on read."""


def _refuse_pickle(type_: str, what: str) -> None:
    # EncryptedSerializer tags look like "pickle+aes": any pickle part is refused.
    if "pickle" in type_.split("+"):
        raise CodecError(
            f"refusing to {what} a value tagged {type_!r}: agentq never stores pickle, "
            "because unpickling bytes from a shared store can run code; store plain data "
            "or a type msgpack can hold (pydantic models, dataclasses, TypedDicts)"
        )


class AgentqSerializer(JsonPlusSerializer):
    """LangGraph's msgpack serializer with pickle off and strict reviving.

    ``allowed_types`` are extra ``(module, name)`` pairs or classes to revive (your
    pydantic models or dataclasses in the graph state); LangGraph's own safe list
    (messages, ``Send``, ``Interrupt``, datetimes, ...) is always allowed.
    """

    def __init__(self, *, allowed_types: Iterable[tuple[str, ...] | type] = ()) -> None:
        allowed = tuple(allowed_types)
        # None is LangGraph's strict mode: only its safe list is revived.
        super().__init__(pickle_fallback=False, allowed_msgpack_modules=allowed or None)

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        type_, data = super().dumps_typed(obj)
        _refuse_pickle(type_, "store")
        return type_, data

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        type_ = data[0]
        _refuse_pickle(type_, "load")
        if type_ not in WRITTEN_TYPES:
            raise CodecError(
                f"stored value has type tag {type_!r}, which agentq never writes; the key "
                "was written by something else or damaged"
            )
        return super().loads_typed(data)


class NoPickle(SerializerProtocol):
    """Wraps a serde you supply (e.g. LangGraph's ``EncryptedSerializer``) so that it can
    neither write nor read pickle, whatever its own settings."""

    def __init__(self, inner: SerializerProtocol) -> None:
        self.inner = inner

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        type_, data = self.inner.dumps_typed(obj)
        _refuse_pickle(type_, "store")
        return type_, data

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        _refuse_pickle(data[0], "load")
        return self.inner.loads_typed(data)


def safe_serde(serde: SerializerProtocol | None) -> SerializerProtocol:
    """The serde a saver uses: ours by default, a user's one wrapped in :class:`NoPickle`."""
    if serde is None:
        return AgentqSerializer()
    if isinstance(serde, (AgentqSerializer, NoPickle)):
        return serde
    return NoPickle(serde)
