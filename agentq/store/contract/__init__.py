"""The store contract: what every agentq backend provides, and how atomic each call is.

A store holds threads. A thread has meta (status, step, node, ...), an append-only chain of
checkpoints addressed by step, a lease with a fencing token, idempotency records for its
side effects, and an entry in the due-time index while something should run it.

Fencing: ``acquire`` hands out a token that only ever increases for a thread. Every write a
driver makes (``commit``, ``set_status``, ``claim_effect``, ``complete_effect``) carries it,
and the store refuses the write with :class:`~agentq.errors.StaleToken` once a newer token
exists. A worker that was paused past its lease ("zombie") therefore cannot damage the
thread, whatever it believes.

Times: durations are seconds (floats); the due index and timestamps are Unix times taken
from the store's clock where it has one (Redis ``TIME``), so workers' clocks may drift.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Self

from agentq.errors import ThreadNotFound
from agentq.ids import downstream_key, validate_effect_key, validate_thread_id
from agentq.records import Finding
from agentq.settings import DEFAULT_KEEP_LAST, DEFAULT_MAX_CHECKPOINT_BYTES
from agentq.store.contract.checkpoints import CheckpointsContract
from agentq.store.contract.common import (
    UNSET,
    Renewal,
    Taken,
    _Unset,
    check_ttl,
    checkpoint_not_stored,
    final_checkpoint,
    refuse_graph_fork,
    retry_not_due,
)
from agentq.store.contract.effects import EffectsContract
from agentq.store.contract.leases import LeaseContract
from agentq.store.contract.limits import LimitsContract
from agentq.store.contract.thread_keys import ThreadKeysContract
from agentq.store.contract.threads import ThreadsContract
from agentq.store.graph import GraphStore

__all__ = [
    "UNSET",
    "Renewal",
    "Store",
    "Taken",
    "_Unset",
    "check_ttl",
    "checkpoint_not_stored",
    "final_checkpoint",
    "refuse_graph_fork",
    "retry_not_due",
]


class Store(
    ThreadsContract,
    LeaseContract,
    CheckpointsContract,
    EffectsContract,
    LimitsContract,
    ThreadKeysContract,
):
    """A durable home for threads. Subclasses: ``RedisStore``, ``SQLiteStore``.

    Each public method checks its arguments (thread ids, effect keys, lease TTLs) here,
    once, then calls the backend's ``_do_<name>`` with the same arguments: a backend never
    sees an id it could not store, and every backend refuses bad input in the same words.
    The methods come in sections, one module each: threads
    (:mod:`~agentq.store.contract.threads`), the lease and recovery
    (:mod:`~agentq.store.contract.leases`), checkpoints
    (:mod:`~agentq.store.contract.checkpoints`), effects
    (:mod:`~agentq.store.contract.effects`), rate limits
    (:mod:`~agentq.store.contract.limits`) and concurrency keys
    (:mod:`~agentq.store.contract.thread_keys`); the store's settings and operations are here.
    """

    keep_last: int
    """How many checkpoints of a thread are kept; older ones are deleted by ``commit``."""
    max_checkpoint_bytes: int
    """The encoded size over which ``commit`` refuses a checkpoint."""
    transient_errors: tuple[type[BaseException], ...] = ()
    """Errors that mean the store could not be reached (a restart, a timeout): nothing was
    decided, so a driver that meets one tries again while its lease lasts instead of
    failing the thread."""

    def is_transient(self, exc: BaseException) -> bool:
        """Whether ``exc`` says the store could not answer now but may soon (see
        :attr:`transient_errors`; a backend adds refusals it knows to be passing)."""
        return isinstance(exc, self.transient_errors)

    def __init__(
        self,
        *,
        keep_last: int = DEFAULT_KEEP_LAST,
        max_checkpoint_bytes: int = DEFAULT_MAX_CHECKPOINT_BYTES,
    ) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last must be at least 1, got {keep_last}")
        if max_checkpoint_bytes < 1:
            raise ValueError(f"max_checkpoint_bytes must be positive, got {max_checkpoint_bytes}")
        self.keep_last = keep_last
        self.max_checkpoint_bytes = max_checkpoint_bytes

    def downstream_key(self, thread_id: str, key: str, *, shared: bool = False) -> str:
        """The idempotency key a tool receives (``idempotency_key``) for the effect ``key``
        of the thread, to forward to the service it calls; see :func:`agentq.ids.downstream_key`.
        An operator looks a pending effect up at the service by it. Reads the thread's
        incarnation (one round trip) unless ``shared``; raises
        :class:`~agentq.errors.ThreadNotFound` for an unknown thread."""
        validate_thread_id(thread_id)
        validate_effect_key(key, thread_id)
        incarnation = None
        if not shared:
            meta = self.meta(thread_id)
            if meta is None:
                raise ThreadNotFound(
                    "no such thread: its tools' keys derive from its incarnation, which "
                    "went with it",
                    thread_id=thread_id,
                )
            incarnation = meta.incarnation
        return downstream_key(
            self.key_namespace, thread_id, key, shared=shared, incarnation=incarnation
        )

    # -- operations ----------------------------------------------------------------------

    @abstractmethod
    def check(self) -> list[Finding]:
        """Read the backend's configuration; return what threatens durability, with fixes."""

    @abstractmethod
    def close(self) -> None:
        """Release connections."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @abstractmethod
    def graph(self) -> GraphStore:
        """LangGraph's checkpoints beside this store's threads, on its connections. Each
        call builds a new one (scripts registered, tables created): keep it."""
