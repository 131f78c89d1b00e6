"""msgpack encoding of checkpoints and stored values, with a versioned envelope.

Beyond msgpack's own types, tuples, sets, frozensets, datetimes and dates round-trip as
ext types. Nothing else is accepted, nor subclasses of these types, which would come back
as the base type, save texts, numbers, dates and times, stored as their plain value.
Decoding never runs code: there is no pickle.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgpack

from agentq.codec.unstorable import plain_scalar, unserializable
from agentq.errors import (
    CheckpointTooLarge,
    CorruptCheckpoint,
    UnserializableState,
    UnsupportedVersion,
)
from agentq.records import Checkpoint
from agentq.settings import DEFAULT_MAX_CHECKPOINT_BYTES

FORMAT_VERSION = 2
"""The newest envelope version this agentq reads. Version 2 adds append-only logs; a
checkpoint without them is still written as version 1, readable by older agentq."""
LOG_FORMAT_VERSION = 2

_EXT_TUPLE = 1
_EXT_SET = 2
_EXT_FROZENSET = 3
_EXT_DATETIME = 4
_EXT_DATE = 5


_COLLECTION_EXT: dict[type, int] = {tuple: _EXT_TUPLE, set: _EXT_SET, frozenset: _EXT_FROZENSET}
_TIME_EXT: dict[type, int] = {dt.datetime: _EXT_DATETIME, dt.date: _EXT_DATE}


def _default(obj: Any) -> Any:
    # By exact type: strict_types sends every subclass here too (a named tuple, a
    # defaultdict, an enum member), and stored as its base type it would come back as
    # another type after a resume, or as another value (str() of a (str, Enum) member).
    # Only texts, numbers, dates and times are stored as their plain value.
    kind = type(obj)
    code = _COLLECTION_EXT.get(kind)
    if code is not None:
        return msgpack.ExtType(code, _pack(list(obj)))
    code = _TIME_EXT.get(kind)
    if code is not None:
        return msgpack.ExtType(code, obj.isoformat().encode())
    plain = plain_scalar(obj)
    if plain is not None:
        return plain
    # A subclass of these (pendulum's, arrow's) as the plain one its ISO text makes.
    if isinstance(obj, dt.datetime):
        return msgpack.ExtType(_EXT_DATETIME, obj.isoformat().encode())
    if isinstance(obj, dt.date):
        return msgpack.ExtType(_EXT_DATE, obj.isoformat().encode())
    raise TypeError(f"cannot store {kind.__name__}")


def _ext_hook(code: int, data: bytes) -> Any:
    if code == _EXT_TUPLE:
        return tuple(_unpack(data))
    if code == _EXT_SET:
        return set(_unpack(data))
    if code == _EXT_FROZENSET:
        return frozenset(_unpack(data))
    if code == _EXT_DATETIME:
        return dt.datetime.fromisoformat(data.decode())
    if code == _EXT_DATE:
        return dt.date.fromisoformat(data.decode())
    raise ValueError(f"unknown msgpack ext type {code}")


def _pack(value: Any) -> bytes:
    return msgpack.packb(value, default=_default, strict_types=True, use_bin_type=True)  # type: ignore[no-any-return]


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False)


# RecursionError: tuples and sets are packed by nested calls, so deep nesting of them
# exhausts Python's stack before msgpack's own depth limit (a ValueError) is reached.
_PACK_ERRORS = (TypeError, ValueError, OverflowError, RecursionError)
_UNPACK_ERRORS = (*_PACK_ERRORS, msgpack.UnpackException)
"""What bytes that do not decode raise. Not every exception: one a signal handler raises
meanwhile (Celery's soft time limit) is not damage, and must reach the task as itself."""


def encode_value(value: Any, *, what: str, thread_id: str | None, step: int | None) -> bytes:
    """Encode one stored value (an input, a result, an effect's result) or raise
    :class:`UnserializableState` naming the path ``what`` to the offending item."""
    try:
        return _pack(value)
    except _PACK_ERRORS as exc:
        raise unserializable(value, what, exc, thread_id=thread_id, step=step) from exc


def decode_value(data: bytes, *, what: str, thread_id: str | None, step: int | None) -> Any:
    """Decode a value written by :func:`encode_value`."""
    try:
        return _unpack(data)
    except _UNPACK_ERRORS as exc:
        raise CorruptCheckpoint(
            f"{what} does not decode ({type(exc).__name__}: {exc}); the stored bytes were "
            "not written by agentq or were damaged",
            thread_id=thread_id,
            step=step,
        ) from exc


@dataclass(frozen=True)
class EncodedCheckpoint:
    """A checkpoint ready to store: the snapshot, and for each append-only field the items
    appended since the previous step (the snapshot records only the field's length)."""

    snapshot: bytes
    appended: dict[str, list[bytes]]


# The user's fields first: a bad value is far likelier there than in the bookkeeping.
_ENVELOPE_PATHS = (
    ("state", "state"),
    ("pending", "pending"),
    ("cursors", "cursors"),
    ("step", "checkpoint.step"),
    ("node", "checkpoint.node"),
    ("task", "checkpoint.task"),
    ("token", "checkpoint.token"),
    ("at", "checkpoint.created_at"),
)


# Each field, the types it may hold (a tuple of pending calls round-trips, and was always
# taken), the one it is said to be, and how to keep it so.
_SHAPES: tuple[tuple[str, tuple[type, ...], str, str], ...] = (
    ("state", (dict,), "dict", "set its keys (run.state['name'] = value), or .clear() it"),
    ("pending", (list, tuple), "list", "assign the calls left, run.pending = [] when none is"),
    ("cursors", (dict,), "dict", "set its keys (run.cursors['name'] = position)"),
)


def check_shape(thread_id: str, checkpoint: Checkpoint) -> None:
    """Raise :class:`UnserializableState` unless the checkpoint's state and cursors are
    dicts and its pending calls a list. Stored otherwise, the checkpoint would decode,
    but every node after it (and the inspector, ``agentq show``) would fail on it, and a
    retry would start from it again: only a fork from an older step would get past it."""
    for field, kinds, kind, fix in _SHAPES:
        value = getattr(checkpoint, field)
        if not isinstance(value, kinds):
            raise UnserializableState(
                f"run.{field} was set to {type(value).__name__}, but it must stay a {kind}: {fix}",
                path=field,
                thread_id=thread_id,
                step=checkpoint.step,
            )


def encode_checkpoint(
    thread_id: str,
    checkpoint: Checkpoint,
    *,
    limit: int = DEFAULT_MAX_CHECKPOINT_BYTES,
    logs: Mapping[str, int] | None = None,
) -> EncodedCheckpoint:
    """Encode ``checkpoint`` in the versioned envelope.

    ``logs`` maps each append-only state field to how many of its items are already
    stored; only the rest are encoded. Raises :class:`UnserializableState` for a value
    that cannot be stored and :class:`CheckpointTooLarge` when the encoded size exceeds
    ``limit`` bytes; both before any write, so nothing stored is touched.
    """
    check_shape(thread_id, checkpoint)
    logs = logs or {}
    state = checkpoint.state
    for field in logs:
        if not isinstance(state.get(field), list):
            raise UnserializableState(
                f"append-only field state.{field} is {type(state.get(field)).__name__}, not "
                "a list; keep it a list, or stop declaring it append-only",
                path=f"state.{field}",
                thread_id=thread_id,
                step=checkpoint.step,
            )
    envelope = {
        "v": LOG_FORMAT_VERSION if logs else 1,
        "step": checkpoint.step,
        "node": checkpoint.node,
        "state": {k: v for k, v in state.items() if k not in logs} if logs else state,
        "pending": checkpoint.pending,
        "cursors": checkpoint.cursors,
        "task": checkpoint.task,
        "token": checkpoint.token,
        "at": checkpoint.created_at,
    }
    if logs:
        envelope["logs"] = {field: len(state[field]) for field in logs}
    try:
        data = _pack(envelope)
    except _PACK_ERRORS as exc:
        for field, what in _ENVELOPE_PATHS:
            encode_value(envelope[field], what=what, thread_id=thread_id, step=checkpoint.step)
        raise unserializable(
            envelope, "checkpoint", exc, thread_id=thread_id, step=checkpoint.step
        ) from exc
    appended = {
        field: [
            encode_value(
                item, what=f"state.{field}[{index}]", thread_id=thread_id, step=checkpoint.step
            )
            for index, item in enumerate(state[field][start:], start)
        ]
        for field, start in logs.items()
    }
    size = len(data) + sum(len(item) for items in appended.values() for item in items)
    if size > limit:
        raise CheckpointTooLarge(
            f"checkpoint is {size} bytes, over the limit of {limit}; keep large data "
            "(documents, files, images) out of the state: store it with "
            "run.artifacts.put(data) and keep the returned reference, or raise "
            "max_checkpoint_bytes",
            size=size,
            limit=limit,
            thread_id=thread_id,
            step=checkpoint.step,
        )
    return EncodedCheckpoint(data, appended)


def decode_envelope(
    thread_id: str, data: bytes, *, step: int | None = None
) -> tuple[dict[str, Any], dict[str, int]]:
    """Decode and check an envelope; return it with the lengths of its append-only fields
    (whose items the caller reads from their logs and passes to :func:`build_checkpoint`).

    Raises :class:`CorruptCheckpoint` for bytes that are not an envelope and
    :class:`UnsupportedVersion` for one written by a newer format version.
    """
    try:
        envelope = decode_value(data, what="checkpoint", thread_id=thread_id, step=step)
    except CorruptCheckpoint as exc:
        # A newer agentq may store a value type this one has no ext code for: its
        # checkpoint is newer, not damaged, and restoring a backup would lose progress.
        newer = _newer_version(data)
        if newer is None:
            raise
        raise _unsupported(newer, thread_id, step) from exc
    if not isinstance(envelope, dict) or not isinstance(envelope.get("v"), int):
        raise CorruptCheckpoint(
            "stored bytes are not an agentq checkpoint envelope; restore the key from a "
            "backup or fork the thread from an earlier step",
            thread_id=thread_id,
            step=step,
        )
    if envelope["v"] > FORMAT_VERSION:
        raise _unsupported(envelope["v"], thread_id, step)
    logs = envelope.get("logs") or {}
    if not isinstance(logs, dict):
        raise CorruptCheckpoint(
            "checkpoint envelope has malformed logs; restore the key",
            thread_id=thread_id,
            step=step,
        )
    return envelope, logs


def _newer_version(data: bytes) -> int | None:
    """The format version of an envelope that did not decode, if it is newer than this
    agentq's: read again with ext types left undecoded (only on that error path)."""
    try:
        envelope = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception:
        return None
    version = envelope.get("v") if isinstance(envelope, dict) else None
    if isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION:
        return version
    return None


def _unsupported(version: int, thread_id: str, step: int | None) -> UnsupportedVersion:
    return UnsupportedVersion(
        f"checkpoint format version {version} is newer than this agentq understands "
        f"({FORMAT_VERSION}); upgrade agentq on this worker",
        thread_id=thread_id,
        step=step,
    )


def build_checkpoint(
    thread_id: str,
    envelope: dict[str, Any],
    log_items: Mapping[str, list[bytes]],
    *,
    step: int | None = None,
) -> Checkpoint:
    """The checkpoint an envelope describes, with each append-only field rebuilt from the
    first ``length`` items of its log."""
    try:
        state = envelope["state"]
        for field, length in (envelope.get("logs") or {}).items():
            items = log_items.get(field, [])
            if len(items) < length:
                raise CorruptCheckpoint(
                    f"the log of state.{field} holds {len(items)} items, but the checkpoint "
                    f"needs {length}; restore the store from a backup",
                    thread_id=thread_id,
                    step=step,
                )
            state[field] = [
                decode_value(item, what=f"state.{field}[{i}]", thread_id=thread_id, step=step)
                for i, item in enumerate(items[:length])
            ]
        return Checkpoint(
            step=int(envelope["step"]),
            node=envelope["node"],
            state=state,
            pending=envelope["pending"],
            cursors=envelope["cursors"],
            task=envelope["task"],
            token=int(envelope["token"]),
            created_at=float(envelope["at"]),
            logs=dict(envelope.get("logs") or {}),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CorruptCheckpoint(
            f"checkpoint envelope is missing or mistypes a field ({exc}); restore the key "
            "from a backup or fork the thread from an earlier step",
            thread_id=thread_id,
            step=step,
        ) from exc


def decode_checkpoint(thread_id: str, data: bytes, *, step: int | None = None) -> Checkpoint:
    """Decode a checkpoint that has no append-only fields (or whose logs are not needed:
    those fields are then absent from its state)."""
    envelope, _ = decode_envelope(thread_id, data, step=step)
    envelope.pop("logs", None)
    return build_checkpoint(thread_id, envelope, {}, step=step)
