"""LangGraph's msgpack format, encoded and decoded with fewer steps per object.

The bytes are exactly those LangGraph's ``JsonPlusSerializer`` writes and reads (a test
compares them). A state of messages is mostly pydantic models, and LangGraph's hooks do per
object what depends only on its class: find which kind of value it is when writing, import
its module and check the allowlist when reading. Here that is decided once per class.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import ormsgpack
from langgraph.checkpoint.serde.jsonplus import EXT_PYDANTIC_V2, _msgpack_default, _option
from langgraph.checkpoint.serde.types import _DeltaSnapshot

_LIMIT: Final = 4096
_pydantic: dict[type, bool] = {}
"""Whether LangGraph's encoder writes the class as a pydantic v2 model (its test order)."""


def _default(obj: Any) -> Any:
    cls = type(obj)
    model = _pydantic.get(cls)
    if model is None:
        if len(_pydantic) > _LIMIT:  # classes made at run time must not pile up
            _pydantic.clear()
        model = _pydantic[cls] = not isinstance(obj, _DeltaSnapshot) and callable(
            getattr(obj, "model_dump", None)
        )
    if not model:
        return _msgpack_default(obj)
    fields = (cls.__module__, cls.__name__, obj.model_dump(), "model_validate_json")
    return ormsgpack.Ext(EXT_PYDANTIC_V2, ormsgpack.packb(fields, default=_default, option=_option))


def pack(obj: Any) -> bytes:
    """``obj`` as LangGraph's serializer packs it (``"msgpack"`` type)."""
    return ormsgpack.packb(obj, default=_default, option=_option)


class RevivedClasses:
    """LangGraph's ext hook, remembering the pydantic classes it has revived.

    LangGraph's hook imports the module and looks the class up for every object; a state
    of messages is mostly that. A class the hook once revived under this allowlist is
    allowed for good, so later objects of it are built here the way the hook builds them
    (``cls(**fields)``); anything else, or a failure, goes to the hook itself."""

    def __init__(self, inner: Callable[[int, bytes], Any]) -> None:
        self.inner = inner
        self.classes: dict[tuple[str, str], type] = {}

    def __call__(self, code: int, data: bytes) -> Any:
        if code != EXT_PYDANTIC_V2:
            return self.inner(code, data)
        try:
            module, name, fields, _ = ormsgpack.unpackb(
                data, ext_hook=self, option=ormsgpack.OPT_NON_STR_KEYS
            )
            cls = self.classes.get((module, name))
            if cls is not None:
                return cls(**fields)
        except Exception:
            return self.inner(code, data)
        value = self.inner(code, data)
        made = type(value)
        if made.__module__ == module and made.__name__ == name:
            self.classes[(module, name)] = made
        return value
