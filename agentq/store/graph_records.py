"""The bytes the LangGraph saver stores, shared by the Redis and SQLite graph stores.

A checkpoint is stored as three parts, so that a write touches only what changed:

- the *record*: a versioned msgpack envelope ``[format, checkpoint type, checkpoint bytes,
  metadata type, metadata bytes, parent id]``; the checkpoint is stored without its
  ``channel_values``;
- the *refs*: the blob fields the checkpoint reads, one per channel it has a version of;
- the *blobs*: one per ``(channel, version)``, written only when a ``put`` brings a new
  version (``new_versions``), so an unchanged channel is never written again.

Fields are msgpack pairs (unambiguous whatever the names hold). Refs and fields are packed
as msgpack *str* (not bin) because Redis' Lua ``cmsgpack`` reads only those.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

import msgpack

from agentq.errors import CorruptCheckpoint, UnsupportedVersion

FORMAT_VERSION: Final = 1


@dataclass(frozen=True)
class StoredCheckpoint:
    """What ``put`` hands a graph store for one checkpoint."""

    checkpoint_id: str
    record: bytes
    refs: bytes
    run_id: str | None
    blobs: dict[bytes, bytes] = field(default_factory=dict)
    """New blobs only: field -> value."""
    clears_failures: bool = False
    """Whether the thread's failed attempts and lost workers are cleared with it, as a
    commit clears them: the graph got past the super-step that failed."""


@dataclass(frozen=True)
class Row:
    """What a graph store reads back for one checkpoint."""

    ns: str
    checkpoint_id: str
    record: bytes
    fields: list[bytes]
    blobs: list[bytes | None]
    """In the order of ``fields``; ``None`` for a blob that is not stored."""
    writes: list[tuple[bytes, bytes]]
    """``(write field, write value)`` pairs, in no particular order."""


@dataclass(frozen=True)
class Record:
    """A decoded record envelope."""

    checkpoint: tuple[str, bytes]
    metadata: tuple[str, bytes]
    parent_id: str | None


def _pack(value: Any, *, raw: bool = False) -> bytes:
    return msgpack.packb(value, use_bin_type=not raw)  # type: ignore[no-any-return]


def encode_record(
    checkpoint: tuple[str, bytes], metadata: tuple[str, bytes], parent_id: str | None
) -> bytes:
    return _pack([FORMAT_VERSION, *checkpoint, *metadata, parent_id])


def decode_record(data: bytes, *, thread_id: str, checkpoint_id: str) -> Record:
    try:
        value = msgpack.unpackb(data, raw=False)
        version = value[0]
    except Exception as exc:
        raise _corrupt(thread_id, checkpoint_id, exc) from exc
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise UnsupportedVersion(
            f"LangGraph checkpoint {checkpoint_id} has format version {version!r}, newer "
            f"than this agentq understands ({FORMAT_VERSION}); upgrade agentq on this worker",
            thread_id=thread_id,
        )
    try:
        _, cp_type, cp_data, md_type, md_data, parent = value
        return Record((cp_type, cp_data), (md_type, md_data), parent)
    except (TypeError, ValueError) as exc:
        raise _corrupt(thread_id, checkpoint_id, exc) from exc


def _corrupt(thread_id: str, checkpoint_id: str, exc: Exception) -> CorruptCheckpoint:
    return CorruptCheckpoint(
        f"LangGraph checkpoint {checkpoint_id} does not decode ({type(exc).__name__}: "
        f"{exc}); it was not written by agentq or was damaged",
        thread_id=thread_id,
    )


def blob_field(channel: str, version: str | int | float) -> bytes:
    # str(): LangGraph compares versions by value, and 1 and "1" must find one blob.
    return _pack([channel, str(version)], raw=True)


def field_channel(field_: bytes) -> str:
    channel = msgpack.unpackb(field_, raw=False)[0]
    assert isinstance(channel, str)
    return channel


def encode_refs(fields: list[bytes]) -> bytes:
    return _pack(fields, raw=True)


def decode_refs(data: bytes) -> list[bytes]:
    return list(msgpack.unpackb(data, raw=True))


def encode_blob(typed: tuple[str, bytes]) -> bytes:
    return _pack(list(typed))


def decode_blob(data: bytes) -> tuple[str, bytes]:
    type_, value = msgpack.unpackb(data, raw=False)
    return type_, value


def write_field(task_id: str, idx: int) -> bytes:
    return _pack([task_id, idx], raw=True)


def decode_write_field(data: bytes) -> tuple[str, int]:
    task_id, idx = msgpack.unpackb(data, raw=False)
    return task_id, idx


def encode_write(channel: str, typed: tuple[str, bytes], task_path: str) -> bytes:
    return _pack([channel, typed[0], typed[1], task_path])


def decode_write(data: bytes) -> tuple[str, tuple[str, bytes], str]:
    channel, type_, value, task_path = msgpack.unpackb(data, raw=False)
    return channel, (type_, value), task_path
