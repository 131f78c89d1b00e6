"""The effects' side of the store contract: the idempotency records of a thread's side
effects (and the global ones, shared across threads), claimed and completed under the
thread's fencing token, and settled by an operator when a worker died in between."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Final

from agentq.errors import EffectError, InvalidArgument, LeaseHeld, ThreadStateError
from agentq.ids import validate_effect_key, validate_thread_id
from agentq.records import Claim, Effect, EffectState, Status, ThreadMeta
from agentq.store.contract.common import UNSET

RESOLVABLE: Final = frozenset({Status.NEEDS_ATTENTION, Status.FAILED})
"""The statuses in which an operator may settle an effect: the thread stopped for a person
and nothing drives it."""


class EffectsContract(ABC):
    """The effect operations of :class:`~agentq.store.contract.Store`."""

    @property
    @abstractmethod
    def key_namespace(self) -> str:
        """What tells this store's idempotency keys from another deployment's downstream:
        the key prefix of a Redis store, the file name of a SQLite one."""

    def claim_effect(
        self,
        thread_id: str,
        key: str,
        token: int,
        *,
        shared: bool = False,
        takeover: bool = False,
        claim_id: str = "",
        tool: str = "",
    ) -> Claim:
        """Claim the idempotency record ``key`` of the thread (``shared=True``: the global
        record, across threads).

        A new record is created ``pending`` under ``token`` and the outcome is ``claimed``.
        A ``done`` record answers ``done`` with its result. A ``pending`` one answers
        ``unknown``, or with ``takeover=True`` passes to ``token`` and answers ``claimed``.
        ``claim_id`` names this one call: the same claim sent again (a client retrying
        after its reply was lost) answers ``claimed`` again rather than ``unknown``, since
        no effect can have run in between. ``tool`` names the function, for the operator
        who reads the record; a shared record also keeps the thread that claimed it
        (:attr:`~agentq.records.Effect.claimed_by`), as tokens count per thread.

        Raises :class:`~agentq.errors.StaleToken` when ``token`` is not the thread's
        current one. Atomic (for ``shared`` records on Redis Cluster the token check and the
        claim are two steps, because they live in different slots).
        """
        validate_thread_id(thread_id)
        validate_effect_key(key, thread_id)
        return self._do_claim_effect(
            thread_id, key, token, shared=shared, takeover=takeover, claim_id=claim_id, tool=tool
        )

    @abstractmethod
    def _do_claim_effect(
        self,
        thread_id: str,
        key: str,
        token: int,
        *,
        shared: bool,
        takeover: bool,
        claim_id: str,
        tool: str,
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

    def effects(self, thread_id: str) -> list[Effect]:
        """The thread's own idempotency records (not the shared ones: read one with
        ``effect(..., shared=True)``), sorted by key; empty for an unknown thread. Each
        record is read as it is at that moment."""
        validate_thread_id(thread_id)
        return sorted(self._do_effects(thread_id), key=lambda effect: effect.key)

    @abstractmethod
    def _do_effects(self, thread_id: str) -> list[Effect]: ...

    def resolve_effect(
        self,
        thread_id: str,
        key: str,
        *,
        result: Any = UNSET,
        did_not_run: bool = False,
        start_grace: float = 30.0,
        shared: bool = False,
    ) -> ThreadMeta:
        """Settle the pending record ``key`` whose outcome no worker recorded, as a person
        who checked the outside world: with ``result`` the record becomes ``done`` with it
        (the node gets it back without calling the tool); with ``did_not_run=True`` it is
        removed (the next call runs the tool, once). Then the thread is queued again, due in
        ``start_grace`` seconds, as :meth:`reopen` does.

        Only for a thread in ``needs_attention`` or ``failed`` whose lease nobody holds
        (else :class:`~agentq.errors.ThreadStateError`, :class:`~agentq.errors.LeaseHeld`);
        the fencing token is raised, so a worker frozen with the old one is refused from
        then on. :class:`~agentq.errors.EffectError` if the record is absent or ``done``.

        ``shared=True`` settles the global record ``key`` (of a tool declared
        ``shared=True``) that stopped the thread. It may have been claimed by another
        thread (:attr:`~agentq.records.Effect.claimed_by`): while that one holds its lease
        it may still be running the call and record it itself, so that is refused with
        :class:`~agentq.errors.LeaseHeld` too. A record settled with ``result`` is then
        held under this thread's new token.

        Atomic; for a shared record on Redis Cluster, which lives in another slot than the
        thread, in steps: the thread and the claimant are checked, the record is settled if
        the same claim still holds it, then the thread is checked again and queued.
        """
        validate_thread_id(thread_id)
        validate_effect_key(key, thread_id)
        if did_not_run == (result is not UNSET):
            raise InvalidArgument(
                f"settle effect {key!r} either with result=... (what it did) or with "
                "did_not_run=True, not both nor neither",
                thread_id=thread_id,
            )
        return self._do_resolve_effect(
            thread_id,
            key,
            result=result,
            did_not_run=did_not_run,
            start_grace=start_grace,
            shared=shared,
        )

    @abstractmethod
    def _do_resolve_effect(
        self,
        thread_id: str,
        key: str,
        *,
        result: Any,
        did_not_run: bool,
        start_grace: float,
        shared: bool,
    ) -> ThreadMeta: ...


def not_resolvable(
    thread_id: str, key: str, state: EffectState | None, *, shared: bool
) -> EffectError:
    """The refusal to settle a record that is absent or already ``done``."""
    if shared:
        if state is None:
            found = "has no record: nothing to settle, the thread runs the call (once)"
        else:
            found = (
                f"is already {state.value}: nothing to settle, the thread gets the recorded result"
            )
        return EffectError(
            f"shared effect {key!r} {found} when it runs again: agentq retry {thread_id}",
            thread_id=thread_id,
        )
    found = "has no record" if state is None else f"is already {state.value}"
    return EffectError(
        f"effect {key!r} {found}: only a pending one can be settled; list the thread's "
        "records with 'agentq effects THREAD' (the record of a tool declared shared=True is "
        "not the thread's own: settle it with shared=True, agentq resolve --shared)",
        thread_id=thread_id,
    )


def status_not_resolvable(thread_id: str, status: str) -> ThreadStateError:
    """The refusal to settle an effect of a thread that something may still drive."""
    return ThreadStateError(
        f"cannot settle an effect of a thread in status {status!r} (only "
        f"{sorted(s.value for s in RESOLVABLE)}); a thread still running records its own "
        "effects: wait until it stops",
        thread_id=thread_id,
        status=status,
    )


def held_while_resolving(thread_id: str, ttl_ms: int) -> LeaseHeld:
    """The refusal to settle an effect of a thread a worker holds."""
    return LeaseHeld(
        f"a worker holds this thread's lease for {ttl_ms} ms more and records its own "
        "effects; settle one only once the thread stopped (needs_attention or failed)",
        thread_id=thread_id,
        ttl_ms=ttl_ms,
    )


def claimant_holds(thread_id: str, key: str, claimant: str, ttl_ms: int) -> LeaseHeld:
    """The refusal to settle a shared record whose claimant may still record it."""
    return LeaseHeld(
        f"shared effect {key!r} was claimed by thread {claimant!r}, whose worker holds its "
        f"lease for {ttl_ms} ms more: it may be running the call still, and records its "
        f"outcome itself; wait until {claimant!r} stops, then run this thread on (agentq "
        f"retry {thread_id}) or, if the outcome is still unknown, settle it",
        thread_id=thread_id,
        ttl_ms=ttl_ms,
    )
