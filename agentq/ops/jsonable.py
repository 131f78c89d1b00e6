"""Stored values as JSON can hold them, for the command line's ``--json`` and the
inspector's pages."""

from __future__ import annotations

import base64
import dataclasses
import json
import math
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


def dumps(value: Any, *, indent: int | None = None) -> str:
    """``value`` as strict JSON, for scripts: :func:`plain`, with each float JSON has no
    number for written ``{"$float": "NaN"}`` (or ``"Infinity"``, ``"-Infinity"``), as bytes
    are written ``{"$bytes": ...}``. A state may hold NaN; Python would write a bare
    ``NaN``, which most JSON readers (``JSON.parse``, Go, jq 1.6) refuse."""
    return json.dumps(_tag_floats(plain(value)), indent=indent, ensure_ascii=False, allow_nan=False)


def _tag_floats(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return {"$float": json.dumps(value)}
    if isinstance(value, dict):
        return {k: _tag_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_tag_floats(v) for v in value]
    return value


def loads(text: str) -> Any:
    """JSON a person typed (a resume value, a tool's result), read as strict JSON reads
    it: NaN, Infinity and a number too large for a float (which Python reads as Infinity)
    raise ``ValueError``, as :func:`json.loads` raises for anything else not JSON."""
    return json.loads(text, parse_constant=_no_number, parse_float=_finite)


def _no_number(word: str) -> Any:
    raise ValueError(f"{word} is not a JSON number; give a number, a string or null")


def _finite(digits: str) -> float:
    number = float(digits)
    if not math.isfinite(number):
        raise ValueError(f"{digits} is too large for a number; give it as a string")
    return number


def _key(key: Any) -> str:
    return key if isinstance(key, str) else json.dumps(plain(key))


def short(value: Any, limit: int = 80) -> str:
    """One line of at most ``limit`` characters showing ``value`` (JSON for structures)."""
    text = value if isinstance(value, str) else json.dumps(plain(value), ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
