"""The effects' side of the store contract: the idempotency records of a thread's side
effects (and the global ones, shared across threads), claimed and completed under the
thread's fencing token."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from agentq.ids import validate_effect_key, validate_thread_id
from agentq.records import Claim, Effect


class EffectsContract(ABC):
    """The effect operations of :class:`~agentq.store.contract.Store`."""

    def claim_effect(
        self,
        thread_id: str,
        key: str,
        token: int,
        *,
        shared: bool = False,
        takeover: bool = False,
        claim_id: str = "",
    ) -> Claim:
        """Claim the idempotency record ``key`` of the thread (``shared=True``: the global
        record, across threads).

        A new record is created ``pending`` under ``token`` and the outcome is ``claimed``.
        A ``done`` record answers ``done`` with its result. A ``pending`` one answers
        ``unknown``, or with ``takeover=True`` passes to ``token`` and answers ``claimed``.
        ``claim_id`` names this one call: the same claim sent again (a client retrying
        after its reply was lost) answers ``claimed`` again rather than ``unknown``, since
        no effect can have run in between.

        Raises :class:`~agentq.errors.StaleToken` when ``token`` is not the thread's
        current one. Atomic (for ``shared`` records on Redis Cluster the token check and the
        claim are two steps, because they live in different slots).
        """
        validate_thread_id(thread_id)
        validate_effect_key(key, thread_id)
        return self._do_claim_effect(
            thread_id, key, token, shared=shared, takeover=takeover, claim_id=claim_id
        )

    @abstractmethod
    def _do_claim_effect(
        self, thread_id: str, key: str, token: int, *, shared: bool, takeover: bool, claim_id: str
    ) -> Claim: ...

    def complete_effect(
        self, thread_id: str, key: str, token: int, result: Any, *, shared: bool = False
    ) -> None:
        """Record the effect's result and mark it ``done``. Refused with
        :class:`~agentq.errors.StaleToken` unless ``token`` is current and holds the claim.
        Atomic."""
        validate_thread_id(thread_id)
        validate_effect_key(key, thread_id)
        self._do_complete_effect(thread_id, key, token, result, shared=shared)

    @abstractmethod
    def _do_complete_effect(
        self, thread_id: str, key: str, token: int, result: Any, *, shared: bool
    ) -> None: ...

    def release_effect(
        self, thread_id: str, key: str, token: int, *, claim_id: str, shared: bool = False
    ) -> None:
        """Drop the claim ``claim_id`` (made under ``token``) on ``key``: its call was
        refused before it could take effect (a rate limit), so the next claim runs it
        again instead of finding its outcome unknown. Refused with
        :class:`~agentq.errors.StaleToken` unless ``token`` is current and that claim is
        the pending one (tokens count per thread, a shared key is claimed by several); a
        record already gone is left so. Atomic."""
        validate_thread_id(thread_id)
        validate_effect_key(key, thread_id)
        self._do_release_effect(thread_id, key, token, claim_id=claim_id, shared=shared)

    @abstractmethod
    def _do_release_effect(
        self, thread_id: str, key: str, token: int, *, claim_id: str, shared: bool
    ) -> None: ...

    def effect(self, thread_id: str, key: str, *, shared: bool = False) -> Effect | None:
        """Return the idempotency record, or ``None``."""
        validate_thread_id(thread_id)
        validate_effect_key(key, thread_id)
        return self._do_effect(thread_id, key, shared=shared)

    @abstractmethod
    def _do_effect(self, thread_id: str, key: str, *, shared: bool) -> Effect | None: ...
