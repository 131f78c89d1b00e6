"""Append-only state fields: write each item once, however long the list grows."""

from __future__ import annotations

import copy
from collections.abc import Collection, Iterable
from typing import Any

from agentq.errors import AppendOnlyViolation, InvalidArgument

_ATOMS = frozenset({str, int, float, bool, bytes, type(None)})


def _private(value: Any) -> Any:
    """A copy of ``value`` that no later edit of it can reach: ``copy.deepcopy``, with the
    lists, dicts and immutable scalars that make up most state (model messages) copied
    here without its memo and dispatch, in a fraction of its time."""
    kind = type(value)
    if kind in _ATOMS:
        return value
    if kind is dict:
        return {key: _private(item) for key, item in value.items()}
    if kind is list:
        return [_private(item) for item in value]
    return copy.deepcopy(value)


class AppendOnlyFields:
    """Remembers the committed items of each append-only field of one thread.

    A commit then carries only the items appended since (see ``Store.commit(logs=...)``),
    after checking that the committed ones are unchanged: an item edited in place after
    it was stored would otherwise be silently lost, since its log entry is never
    rewritten. The copies are private, so an in-place edit cannot hide from the check.

    ``logged`` names the fields whose items ``state`` holds from a log. Any other field
    (the thread began before the field was declared append-only) counts as having
    nothing in its log yet: the next commit writes it whole, and from then on only what
    is appended.
    """

    def __init__(
        self,
        thread_id: str,
        fields: Iterable[str],
        state: dict[str, Any],
        logged: Collection[str],
    ) -> None:
        self.thread_id = thread_id
        # ("messages") is the string, whose letters would each be taken for a field.
        names = None if isinstance(fields, str) else tuple(fields)
        if names is None or not all(isinstance(field, str) for field in names):
            raise InvalidArgument(
                f"append_only is {fields!r}; it names state fields in a tuple, e.g. "
                "append_only = ('messages',) (mind the comma)",
                thread_id=thread_id,
            )
        self._committed = {
            field: _private(state.get(field, [])) if field in logged else [] for field in names
        }

    def lengths(self, step: int, state: dict[str, Any]) -> dict[str, int]:
        """The committed length of each field, for ``commit(logs=...)``; raises
        :class:`AppendOnlyViolation` if a committed item was changed or removed."""
        for field, committed in self._committed.items():
            items = state.get(field)
            if not isinstance(items, list):
                continue  # the encoder refuses it, naming the field
            if items[: len(committed)] != committed:
                index = next(
                    (i for i, (a, b) in enumerate(zip(items, committed, strict=False)) if a != b),
                    len(items),
                )
                raise AppendOnlyViolation(
                    f"state.{field}[{index}] was changed or removed after it was committed, "
                    f"but {field!r} is append-only; append a new item instead (e.g. a "
                    f"correction), or remove {field!r} from append_only",
                    thread_id=self.thread_id,
                    step=step,
                    field=field,
                    index=index,
                )
        return {field: len(committed) for field, committed in self._committed.items()}

    def committed(self, state: dict[str, Any]) -> None:
        """Record that ``state``'s fields are now stored."""
        for field, committed in self._committed.items():
            committed.extend(_private(state[field][len(committed) :]))
