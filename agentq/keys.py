"""The Redis key layout, in one place, and thread id validation.

Braces are literal: ``{<thread_id>}`` is a Redis Cluster hash tag, so every key of one
thread lives in one slot and one Lua script can touch them all. The global indexes share
the ``{index}`` tag for the same reason.

=========================================  ======  ===========================================
key                                        type    contents
=========================================  ======  ===========================================
``P thread:{T}:checkpoint:<n>``            string  snapshot n, a msgpack envelope; the last
                                                   ``keep_last`` are kept
``P thread:{T}:latest``                    string  n of the latest snapshot
``P thread:{T}:meta``                      hash    status, step, node, task, attempts,
                                                   crashes, fence, first, error, timestamps,
                                                   input/result/interrupt/resume (msgpack),
                                                   cancel ("1" once requested), log_fields
                                                   (msgpack list of the latest checkpoint's
                                                   append-only fields; absent if none)
``P thread:{T}:staged``                    string  the snapshot of a commit in flight: SET
                                                   in the commit's MULTI, then renamed to its
                                                   checkpoint key, or deleted if the commit
                                                   is refused
``P thread:{T}:lock``                      string  ``<token>:<owner>``, expires with the lease
``P thread:{T}:effect:<key>``              hash    state (pending/done), token, result, and
                                                   while pending the id of the claim
``P thread:{T}:artifact:<sha256>``         string  an artifact's bytes, content-addressed
``P thread:{T}:log:<field>``               list    the items of an append-only state field,
                                                   each msgpack; snapshots record a length
``P thread:{T}:logs``                      set     the fields that have a log, added when
                                                   each log is created
``P thread:{T}:owned``                     set     every effect and artifact key of the
                                                   thread, so that deleting it finds them
``P effect:{<key>}``                       hash    a global (cross-thread) effect record
``P index:{index}:due``                    zset    thread id -> Unix time it is due to run
``P index:{index}:status:<status>``        zset    thread id -> Unix time of its last update
``P index:{index}:sweeper``                string  the owner of the sweeper lease (PX TTL)
=========================================  ======  ===========================================

``P`` is the configured prefix (``agentq:`` by default). Leases expire through ``PX`` on
the lock keys; no other key has a Redis TTL: finished threads are removed by ``gc()``, which
also keeps the indexes consistent. A staged snapshot exists only within one MULTI, unless
its script never ran (a server that lost its scripts and then the connection): the thread's
next commit overwrites it, deleting the thread deletes it.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

from agentq.errors import InvalidThreadId

MAX_THREAD_ID_LENGTH = 200
MAX_EFFECT_KEY_LENGTH = 500
_FORBIDDEN = {"Cc": "the control character", "Zl": "the line separator",
              "Zp": "the paragraph separator",
              "Cs": "the lone surrogate"}  # fmt: skip


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
    _check_name(thread_id, "thread id", MAX_THREAD_ID_LENGTH, thread_id=thread_id)
    return thread_id


def validate_effect_key(key: object, thread_id: str | None) -> str:
    """Return ``key`` if it can name an idempotency record, else raise :class:`InvalidThreadId`."""
    if not isinstance(key, str):
        raise InvalidThreadId(
            f"effect key must be a str, got {type(key).__name__}", thread_id=thread_id
        )
    _check_name(key, "effect key", MAX_EFFECT_KEY_LENGTH, thread_id=thread_id)
    return key


def _check_name(value: str, what: str, limit: int, *, thread_id: str | None) -> None:
    shown = thread_id if what == "thread id" else None
    if not value:
        raise InvalidThreadId(f"{what} is empty; use a stable, non-empty id")
    if len(value) > limit:
        raise InvalidThreadId(
            f"{what} is {len(value)} characters, over the limit of {limit}; "
            "use a shorter id (e.g. a hash of the long one)",
            thread_id=shown[:40] + "…" if shown else None,
        )
    if "{" in value or "}" in value:
        raise InvalidThreadId(
            f"{what} {value!r} contains a brace; braces are reserved for Redis Cluster hash "
            "tags, so remove them",
            thread_id=None,
        )
    # C1 controls (U+0080-U+009F, e.g. U+009B, a terminal escape introducer) and the Unicode
    # line and paragraph separators forge log lines and terminal output just as C0 ones do;
    # a lone surrogate cannot be encoded as a key at all.
    if value.isprintable():  # one C-speed scan for the usual id; the loop says which
        return
    for ch in value:
        kind = _FORBIDDEN.get(unicodedata.category(ch))
        if kind:
            raise InvalidThreadId(
                f"{what} {value!r} contains {kind} U+{ord(ch):04X}; remove it", thread_id=None
            )


@dataclass(frozen=True)
class Keys:
    """Builds every key name for one prefix."""

    prefix: str = "agentq:"

    def thread(self, thread_id: str) -> str:
        return f"{self.prefix}thread:{{{thread_id}}}:"

    def checkpoint(self, thread_id: str, step: int) -> str:
        return f"{self.thread(thread_id)}checkpoint:{step}"

    def checkpoint_prefix(self, thread_id: str) -> str:
        return f"{self.thread(thread_id)}checkpoint:"

    def latest(self, thread_id: str) -> str:
        return f"{self.thread(thread_id)}latest"

    def meta(self, thread_id: str) -> str:
        return f"{self.thread(thread_id)}meta"

    def staged(self, thread_id: str) -> str:
        return f"{self.thread(thread_id)}staged"

    def lock(self, thread_id: str) -> str:
        return f"{self.thread(thread_id)}lock"

    def effect(self, thread_id: str, key: str) -> str:
        return f"{self.thread(thread_id)}effect:{key}"

    def artifact(self, thread_id: str, digest: str) -> str:
        return f"{self.thread(thread_id)}artifact:{digest}"

    def log(self, thread_id: str, field: str) -> str:
        return f"{self.thread(thread_id)}log:{field}"

    def owned(self, thread_id: str) -> str:
        return f"{self.thread(thread_id)}owned"

    def global_effect(self, key: str) -> str:
        return f"{self.prefix}effect:{{{key}}}"

    def due(self) -> str:
        return f"{self.prefix}index:{{index}}:due"

    def status_index_prefix(self) -> str:
        return f"{self.prefix}index:{{index}}:status:"

    def status_index(self, status: str) -> str:
        return f"{self.status_index_prefix()}{status}"

    def sweeper(self) -> str:
        return f"{self.prefix}index:{{index}}:sweeper"
