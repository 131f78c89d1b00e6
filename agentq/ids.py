"""Thread ids and effect keys: what may name a thread or an idempotency record."""

from __future__ import annotations

import os
import socket
import unicodedata
import uuid

from agentq.errors import InvalidEffectKey, InvalidThreadId

MAX_THREAD_ID_LENGTH = 200
MAX_EFFECT_KEY_LENGTH = 500
_FORBIDDEN = {
    "Cc": "the control character",
    "Zl": "the line separator",
    "Zp": "the paragraph separator",
    "Cs": "the lone surrogate",
}


def owner_id() -> str:
    """A name for a lease holder, unique per call: host and process (so an operator can
    tell where a thread runs) and a random part (two holders in one process differ)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


_DOWNSTREAM_NAMESPACE = uuid.UUID("5b1e0c2a-6f0d-4d8e-9c59-3f2a7d1b8e41")


def new_incarnation() -> str:
    """A thread's random id for its life (:attr:`~agentq.records.ThreadMeta.incarnation`)."""
    return uuid.uuid4().hex


def downstream_key(
    namespace: str, thread_id: str, key: str, *, shared: bool, incarnation: str | None
) -> str:
    """The idempotency key a tool forwards to the service it calls: a UUID derived from the
    store's ``namespace``, the thread, its ``incarnation`` and the effect ``key`` (the
    shared ones: the namespace and the key alone), so that two threads, a fork and its
    source, a thread id deleted and created again, or two deployments never send the same
    one, while a retried or replayed call sends the same one again. Thirty-six characters
    of ``[0-9a-f-]``, which every payment API accepts. A thread without an incarnation
    (created by an older agentq) keeps the keys it was sending."""
    scope = "shared" if shared else f"thread:{len(thread_id)}:{thread_id}"
    if incarnation is not None and not shared:
        scope += f":{incarnation}"
    name = f"{len(namespace)}:{namespace}|{scope}|{key}"
    return str(uuid.uuid5(_DOWNSTREAM_NAMESPACE, name))


def validate_thread_id(thread_id: object) -> str:
    """Return ``thread_id`` if it is a usable thread id, else raise :class:`InvalidThreadId`.

    Braces would break the hash tag (and could address another thread's keys), control
    characters and line separators break logs and terminals, and an unbounded id bloats
    every key.
    """
    if not isinstance(thread_id, str):
        raise InvalidThreadId(
            f"thread id must be a str, got {type(thread_id).__name__}; "
            "pass the id as a string, e.g. str(conversation.id)"
        )
    _check_name(thread_id, "thread id", MAX_THREAD_ID_LENGTH, InvalidThreadId, thread_id=thread_id)
    return thread_id


def validate_effect_key(key: object, thread_id: str | None) -> str:
    """Return ``key`` if it can name an idempotency record, else raise :class:`InvalidEffectKey`."""
    if not isinstance(key, str):
        raise InvalidEffectKey(
            f"effect key must be a str, got {type(key).__name__}", thread_id=thread_id
        )
    _check_name(key, "effect key", MAX_EFFECT_KEY_LENGTH, InvalidEffectKey, thread_id=thread_id)
    return key


def _check_name(
    value: str,
    what: str,
    limit: int,
    error: type[InvalidThreadId] | type[InvalidEffectKey],
    *,
    thread_id: str | None,
) -> None:
    shown = thread_id if what == "thread id" else None
    # An effect key's thread is a valid id, which the error names; a bad thread id is
    # shown only in the message, where it is quoted.
    owner = None if what == "thread id" else thread_id
    if not value:
        raise error(f"{what} is empty; use a stable, non-empty id", thread_id=owner)
    if len(value) > limit:
        raise error(
            f"{what} is {len(value)} characters, over the limit of {limit}; "
            "use a shorter id (e.g. a hash of the long one)",
            thread_id=shown[:40] + "…" if shown else owner,
        )
    if "{" in value or "}" in value:
        raise error(
            f"{what} {value!r} contains a brace; braces are reserved for Redis Cluster hash "
            "tags, so remove them",
            thread_id=owner,
        )
    # C1 controls (U+0080-U+009F, e.g. U+009B, a terminal escape introducer) and the Unicode
    # line and paragraph separators forge log lines and terminal output just as C0 ones do;
    # a lone surrogate cannot be encoded as a key at all.
    if value.isprintable():  # one C-speed scan for the usual id; the loop says which
        return
    for ch in value:
        kind = _FORBIDDEN.get(unicodedata.category(ch))
        if kind:
            raise error(
                f"{what} {value!r} contains {kind} U+{ord(ch):04X}; remove it", thread_id=owner
            )
