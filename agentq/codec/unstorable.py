"""Why a value cannot be stored: the path to the first offending item, and the fix.

Only runs once msgpack has refused a value, so it can afford to walk it item by item.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentq.errors import UnserializableState

_BASES = (dict, list, tuple, set, frozenset, str, bytes, bool, int, float, dt.datetime, dt.date)
_STORABLE = frozenset({*_BASES, type(None)})
"""The types the codec stores, exactly: not their subclasses."""
_INT_MIN = -(2**63)
_INT_MAX = 2**64 - 1
_PLAIN_DATA = (
    "store plain data (dict, list, str, int, float, bool, None, bytes, tuple, set, datetime) "
    "or convert it first, e.g. model objects with .model_dump()"
)


@dataclass(frozen=True)
class _Problem:
    path: str
    type_name: str
    message: str | None
    """Why it cannot be stored and the fix, when the type alone does not say."""


@dataclass(frozen=True)
class _Where:
    """A place in a value, linked to its parent: the path string is built only if needed."""

    parent: _Where | None
    segment: str

    def path(self) -> str:
        parts: list[str] = []
        node: _Where | None = self
        while node is not None:
            parts.append(node.segment)
            node = node.parent
        return "".join(reversed(parts))


def _find_problem(value: Any, path: str) -> _Problem | None:
    # Iterative, in msgpack's order: a value nested thousands deep (or containing itself)
    # is exactly what made packing fail, and must not overflow the stack here as well.
    # Containers already searched are skipped: one shared many times must not make the
    # search exponential where packing stopped at the first too-deep path.
    stack: list[tuple[Any, _Where, bool]] = [(value, _Where(None, path), False)]
    on_path: set[int] = set()
    clean: set[int] = set()
    while stack:
        item, where, leaving = stack.pop()
        if leaving:
            on_path.discard(id(item))
            clean.add(id(item))
            continue
        if id(item) in clean:
            continue
        problem = _scalar_problem(item, where)
        if problem is not None:
            return problem
        if type(item) not in _STORABLE and not _stored_plain(item):
            return _Problem(where.path(), type(item).__name__, _subclass_fix(item, where))
        children = _children(item, where)
        if children is None:
            continue
        if id(item) in on_path:
            return _Problem(
                where.path(),
                type(item).__name__,
                f"{where.path()}: this {type(item).__name__} contains itself, and a cycle "
                "cannot be stored; store a copy without the cycle, or an id of the item",
            )
        on_path.add(id(item))
        stack.append((item, where, True))
        stack.extend((child, at, False) for child, at in reversed(children))
    return None


def _stored_plain(item: Any) -> bool:
    """Whether the codec stores this subclass as the plain value of its base type."""
    return plain_scalar(item) is not None or isinstance(item, dt.date)


def plain_scalar(obj: object) -> str | int | float | None:
    """The plain value of a text or number of a subclass (numpy's ``float64``, a ``str``
    subclass of a library), which comes back equal and behaves the same; ``None`` for
    anything else, enum members included, whose type is what they mean."""
    if isinstance(obj, enum.Enum):
        return None
    # The base type's own conversion: a subclass may override __str__ or __float__.
    if isinstance(obj, str):
        return str.__str__(obj)
    if isinstance(obj, int):
        return int.__int__(obj)
    if isinstance(obj, float):
        return float.__float__(obj)
    return None


def _subclass_fix(item: Any, where: _Where) -> str | None:
    """Why a subclass of a storable type is refused, and the fix; ``None`` for any other
    type, which the type's name and the list of storable types explain."""
    kind = type(item).__name__
    if isinstance(item, enum.Enum):
        fix = f"store its .value and rebuild it with {kind}(value) when reading it"
        return f"{where.path()}: {kind}.{item.name}, an enum member, cannot be stored; {fix}"
    base = next(
        (b for b in _BASES if isinstance(item, b)), dict if isinstance(item, Mapping) else None
    )
    if base is None:
        return None
    if base is tuple and hasattr(item, "_asdict"):
        fix = f"store x._asdict() (or tuple(x)) and rebuild it with {kind}(**d)"
    else:
        fix = f"store {base.__name__}(x)"
    return (
        f"{where.path()}: this {kind} would come back as a plain {base.__name__} after a "
        f"resume, losing what the {kind} adds; {fix}"
    )


def _children(item: Any, where: _Where) -> list[tuple[Any, _Where]] | None:
    """The items of a container with where they are (a map's keys too), else ``None``."""
    if isinstance(item, dict):
        children = []
        for key, child in item.items():
            shown = _show(key)
            children.append((key, _Where(where, f"[{shown}] (a key)")))
            segment = f".{key}" if isinstance(key, str) else f"[{shown}]"
            children.append((child, _Where(where, segment)))
        return children
    if isinstance(item, (list, tuple, set, frozenset)):
        return [(child, _Where(where, f"[{i}]")) for i, child in enumerate(item)]
    return None


def _scalar_problem(item: Any, where: _Where) -> _Problem | None:
    if isinstance(item, int) and not isinstance(item, bool) and not _INT_MIN <= item <= _INT_MAX:
        return _Problem(
            where.path(),
            type(item).__name__,
            f"{where.path()}: an int of {item.bit_length()} bits cannot be stored, ints must "
            "fit in 64 bits (-2**63 to 2**64-1); store it as a string, str(n), and convert it "
            "back with int() when reading it",
        )
    if isinstance(item, str):
        try:
            item.encode()
        except UnicodeEncodeError as exc:
            return _Problem(
                where.path(),
                type(item).__name__,
                f"{where.path()}: str holds a lone surrogate U+{ord(item[exc.start]):04X}, "
                "which is not valid UTF-8 and cannot be stored; repair the text, e.g. "
                "text.encode('utf-8', 'replace').decode()",
            )
    return None


def _show(key: Any) -> str:
    try:
        return repr(key)
    except ValueError:  # an int too long for repr (sys.set_int_max_str_digits)
        return f"<{type(key).__name__}>"


def unserializable(
    value: Any, what: str, exc: BaseException, *, thread_id: str | None, step: int | None
) -> UnserializableState:
    """The error naming where ``value`` holds what cannot be stored, and the fix."""
    problem = _find_problem(value, what)
    if problem is None and (isinstance(exc, RecursionError) or "recursion" in str(exc)):
        problem = _Problem(
            what,
            type(value).__name__,
            f"{what}: nested too deeply to store; flatten it, e.g. a list of records that "
            "refer to their parent by id",
        )
    if problem is None:
        problem = _Problem(what, type(value).__name__, None)
    message = problem.message or (
        f"{problem.path}: {problem.type_name} cannot be stored in a checkpoint ({exc}); "
        + _PLAIN_DATA
    )
    return UnserializableState(message, path=problem.path, thread_id=thread_id, step=step)
