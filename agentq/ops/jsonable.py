"""Stored values as JSON can hold them, for the command line's ``--json`` and the
inspector's pages."""

from __future__ import annotations

import base64
import dataclasses
import json
from typing import Any


def plain(value: Any) -> Any:
    """``value`` as JSON can hold it: msgpack bytes become ``{"$bytes": base64}``, tuples
    lists, non-string keys strings, records dicts."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {_key(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, bytes | bytearray | memoryview):
        return {"$bytes": base64.b64encode(bytes(value)).decode()}
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return repr(value)


def _key(key: Any) -> str:
    return key if isinstance(key, str) else json.dumps(plain(key))


def short(value: Any, limit: int = 80) -> str:
    """One line of at most ``limit`` characters showing ``value`` (JSON for structures)."""
    text = value if isinstance(value, str) else json.dumps(plain(value), ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
