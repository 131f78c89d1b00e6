"""A structural diff of two checkpoints: which paths of the state, the pending calls and
the cursors were added, removed or changed.

A line diff of pretty-printed JSON would show brackets moving; paths such as
``state.messages[3].content`` say what an agent's step actually did.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Final

from agentq.records import Checkpoint

_IDENTIFIER: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MISSING: Final = object()


@dataclass(frozen=True)
class Change:
    """``kind`` is ``added``, ``removed`` or ``changed``; ``before``/``after`` are the values
    (``None`` on the side where the path does not exist)."""

    path: str
    kind: str
    before: Any = None
    after: Any = None


def checkpoint_changes(old: Checkpoint, new: Checkpoint) -> list[Change]:
    """What differs between two checkpoints: the next node, then state, pending, cursors."""
    changes: list[Change] = []
    if old.node != new.node:
        changes.append(Change("node", "changed", old.node, new.node))
    for part in ("state", "pending", "cursors"):
        changes.extend(value_changes(part, getattr(old, part), getattr(new, part)))
    return changes


def value_changes(path: str, old: Any, new: Any) -> list[Change]:
    """The paths below ``path`` at which ``old`` and ``new`` differ, in document order."""
    if isinstance(old, dict) and isinstance(new, dict):
        changes = []
        for key in [*old, *(k for k in new if k not in old)]:
            changes.extend(_pair(_child(path, key), old.get(key, _MISSING), new.get(key, _MISSING)))
        return changes
    if isinstance(old, list) and isinstance(new, list):
        changes = []
        for index in range(max(len(old), len(new))):
            changes.extend(
                _pair(
                    f"{path}[{index}]",
                    old[index] if index < len(old) else _MISSING,
                    new[index] if index < len(new) else _MISSING,
                )
            )
        return changes
    if not same(old, new):
        return [Change(path, "changed", old, new)]
    return []


def same(old: Any, new: Any) -> bool:
    """Whether a value is unchanged as stored: of one type all the way down (``1``,
    ``1.0`` and ``True`` differ, as a tuple and a list do), and NaN equal to NaN (a state
    that held NaN and still does did not change; ``==`` says it did)."""
    if type(old) is not type(new):
        return False
    if isinstance(old, dict):
        return old.keys() == new.keys() and all(same(value, new[key]) for key, value in old.items())
    if isinstance(old, list | tuple):
        return len(old) == len(new) and all(map(same, old, new))
    if isinstance(old, float) and math.isnan(old):
        return math.isnan(new)
    return bool(old == new)


def _pair(path: str, old: Any, new: Any) -> list[Change]:
    if old is _MISSING:
        return [Change(path, "added", None, new)]
    if new is _MISSING:
        return [Change(path, "removed", old, None)]
    return value_changes(path, old, new)


def _child(path: str, key: Any) -> str:
    if isinstance(key, str) and _IDENTIFIER.match(key):
        return f"{path}.{key}"
    return f"{path}[{key!r}]"


def changed_parts(old: Checkpoint, new: Checkpoint) -> list[str]:
    """The top-level names a step changed (``node``, ``state.messages``, ``pending``...),
    for one-line summaries: those under which :func:`checkpoint_changes` finds a change."""
    names = ["node"] if old.node != new.node else []
    for key in [*old.state, *(k for k in new.state if k not in old.state)]:
        if not same(old.state.get(key, _MISSING), new.state.get(key, _MISSING)):
            names.append(_child("state", key))
    names.extend(
        part for part in ("pending", "cursors") if not same(getattr(old, part), getattr(new, part))
    )
    return names
