"""LangGraph's serde, made safe to read back: never pickle, revive only allowed types.

LangGraph's :class:`JsonPlusSerializer` pickles what msgpack cannot hold when
``pickle_fallback`` is on, and by default revives *any* class named in stored bytes
(importing its module and calling it). A checkpoint store is shared by every worker, so
bytes read from it must not be able to run code: :class:`AgentqSerializer` never pickles
and, like LangGraph's strict mode, only revives the types in LangGraph's safe list, the
ones the graph declares (:meth:`AgentqSaver.for_graph`), the ones you allow, and the ones
it has itself written. A type that is not allowed comes back as its plain data (a dict),
as in LangGraph's strict mode, without its module being imported.
"""

from __future__ import annotations

import dataclasses
import re
import threading
from collections import deque
from collections.abc import Iterable
from enum import Enum
from typing import Any, Final

import ormsgpack
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer, _create_msgpack_ext_hook
from langgraph.checkpoint.serde.types import SendProtocol

from agentq.errors import CodecError
from agentq.langgraph.msgpack_ext import RevivedClasses, pack

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


_EXT_MARKERS: Final = re.compile(rb"[\xc7-\xc9\xd4-\xd8]")
"""The bytes msgpack starts an extension value with: written data without any holds no
class, and needs no walk to learn one."""


class AgentqSerializer(JsonPlusSerializer):
    """LangGraph's msgpack serializer with pickle off and strict reviving.

    ``allowed_types`` are extra ``(module, name)`` pairs or classes to revive (your
    pydantic models or dataclasses in the graph state); LangGraph's own safe list
    (messages, ``Send``, ``Interrupt``, datetimes, ...) is always allowed. So is every
    pydantic model, dataclass, enum and named tuple this serializer has written: the
    process made those objects itself, so reading them back as objects runs nothing a
    stored name chose. A fresh process has written nothing yet: there the graph's own
    declaration (:meth:`AgentqSaver.for_graph`) says what to revive.
    """

    def __init__(self, *, allowed_types: Iterable[tuple[str, ...] | type] = ()) -> None:
        allowed = tuple(allowed_types)
        # None is LangGraph's strict mode: only its safe list is revived.
        super().__init__(pickle_fallback=False, allowed_msgpack_modules=allowed or None)
        self._learning = threading.Lock()
        self._revived: RevivedClasses | None = None

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        if obj is None or isinstance(obj, (bytes, bytearray)):
            type_, data = super().dumps_typed(obj)
        else:  # the bytes LangGraph's serializer writes, made faster (msgpack_ext)
            type_, data = "msgpack", pack(obj)
        _refuse_pickle(type_, "store")
        if _EXT_MARKERS.search(data):
            self._allow_written(obj)
        return type_, data

    def _allow_written(self, obj: Any) -> None:
        found: set[tuple[str, ...]] = set()
        _classes_in(obj, found)
        with self._learning:
            allowed = self._allowed_msgpack_modules
            known = allowed if isinstance(allowed, set) else set()
            if found <= known:
                return
            # A new set and hook, not an update in place: a reader holds the old pair.
            merged = known | found
            self._allowed_msgpack_modules = merged
            self._unpack_ext_hook = _create_msgpack_ext_hook(merged)

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        type_ = data[0]
        _refuse_pickle(type_, "load")
        if type_ not in WRITTEN_TYPES:
            raise CodecError(
                f"stored value has type tag {type_!r}, which agentq never writes; the key "
                "was written by something else or damaged"
            )
        if type_ == "msgpack":
            return ormsgpack.unpackb(
                data[1], ext_hook=self._ext_hook(), option=ormsgpack.OPT_NON_STR_KEYS
            )
        return super().loads_typed(data)

    def _ext_hook(self) -> RevivedClasses:
        # Rebuilt whenever the allowlist's hook is (learning a class, a copy with more).
        inner = self._unpack_ext_hook
        revived = self._revived
        if revived is None or revived.inner is not inner:
            revived = self._revived = RevivedClasses(inner)
        return revived


_NAMED: Final = 1
_MAPPING: Final = 2
_ITEMS: Final = 4
_SEND: Final = 8
_FIELDS: Final = 16
_SHAPES_LIMIT: Final = 4096
_shapes: dict[type, int] = {}
"""What :func:`_classes_in` does with an object, per class: the checks cost more than the
walk (a runtime ``Protocol`` check inspects the class on every call), and every value of a
state of messages is one of a few classes."""


def _shape(obj: Any) -> int:
    if isinstance(obj, type):
        return 0
    if isinstance(obj, dict):
        return _MAPPING
    shape = 0
    named = dataclasses.is_dataclass(obj) or isinstance(obj, Enum) or hasattr(obj, "_asdict")
    # Pydantic models: their dump holds nested models as dicts, which they validate back.
    if named or hasattr(obj, "model_dump") or hasattr(obj, "__fields__"):
        shape |= _NAMED
    if isinstance(obj, (list, tuple, set, frozenset, deque)):
        shape |= _ITEMS
    elif isinstance(obj, SendProtocol):
        shape |= _SEND
    elif dataclasses.is_dataclass(obj):
        shape |= _FIELDS
    return shape


def _learn_shape(obj: Any) -> int:
    shape = _shape(obj)
    if len(_shapes) > _SHAPES_LIMIT:  # classes made at run time must not pile up
        _shapes.clear()
    _shapes[type(obj)] = shape
    return shape


def _classes_in(obj: Any, found: set[tuple[str, ...]]) -> None:
    """Add to ``found`` the classes LangGraph's msgpack encoding names for ``obj``."""
    cls = type(obj)
    shape = _shapes.get(cls)
    if shape is None:
        shape = _learn_shape(obj)
    if shape & _NAMED:
        found.add((cls.__module__, cls.__name__))
    if shape & _MAPPING:
        for key, value in obj.items():
            _classes_in(key, found)
            _classes_in(value, found)
    elif shape & _ITEMS:
        shapes = _shapes
        for item in obj:
            # Inline for the common items, plain values and messages: no call per item.
            kind = shapes.get(type(item))
            if kind == _NAMED:
                found.add((type(item).__module__, type(item).__name__))
            elif kind != 0:
                _classes_in(item, found)
    elif shape & _SEND:
        _classes_in(getattr(obj, "arg", None), found)
    elif shape & _FIELDS:
        for field in dataclasses.fields(obj):
            _classes_in(getattr(obj, field.name), found)


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
