"""Idempotency records on Redis: claim, complete, release and read an effect's record.

A thread's own records live in its slot and are fenced in the same script; a shared
record (``shared=True``) is global, and on Redis Cluster in another slot than the meta.
"""

from __future__ import annotations

from typing import Any

from agentq.codec.envelope import decode_value, encode_value
from agentq.errors import EffectError, ThreadStateError
from agentq.records import Claim, ClaimOutcome, Effect, EffectState, Status, ThreadMeta
from agentq.store.contract.effects import (
    RESOLVABLE,
    claimant_holds,
    held_while_resolving,
    not_resolvable,
    status_not_resolvable,
)
from agentq.store.redis.base import RedisBase, request_id
from agentq.store.redis.decode import (
    blob,
    fields,
    hash_to_fields,
    raise_refusal,
    refusal_error,
    text,
)
from agentq.store.redis.refusal import Refusal, refusal_of

_CLAIMED, _DONE = 1, 2
"""claim_effect.lua's success codes (3: an unknown outcome)."""


class RedisEffects(RedisBase):
    """Effect records, fenced by the thread's token."""

    def _effect_keys(self, thread_id: str, key: str, *, shared: bool) -> list[str]:
        if not shared:
            return [
                self.keys.effect(thread_id, key),
                self.keys.meta(thread_id),
                self.keys.owned(thread_id),
            ]
        if self.cluster:
            return [self.keys.global_effect(key)]
        return [self.keys.global_effect(key), self.keys.meta(thread_id)]

    def _check_fence_apart(self, thread_id: str, token: int, shared: bool) -> None:
        """On Redis Cluster a shared record lives in another slot than the thread's meta,
        so its claim cannot check the token in the same script: check it just before."""
        if shared and self.cluster:
            fence = self.client.hget(self.keys.meta(thread_id), "fence")
            if fence is None:
                raise refusal_error(Refusal.THREAD_NOT_FOUND, 0, thread_id=thread_id)
            if int(fence) != token:
                raise refusal_error(Refusal.STALE_TOKEN, fence, thread_id=thread_id, token=token)

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
    ) -> Claim:
        keys = self._effect_keys(thread_id, key, shared=shared)
        self._check_fence_apart(thread_id, token, shared)
        code, holder, result = self._scripts["claim_effect"](
            keys=keys,
            args=[token, "1" if takeover else "0", claim_id, tool, thread_id if shared else ""],
        )
        raise_refusal(code, holder, thread_id=thread_id, token=token, key=key)
        if code == _DONE:
            value = decode_value(
                result, what=f"effect {key!r} result", thread_id=thread_id, step=None
            )
            return Claim(ClaimOutcome.DONE, Effect(key, EffectState.DONE, int(holder), value))
        outcome = ClaimOutcome.CLAIMED if code == _CLAIMED else ClaimOutcome.UNKNOWN
        return Claim(outcome, Effect(key, EffectState.PENDING, int(holder)))

    def _do_complete_effect(
        self, thread_id: str, key: str, token: int, result: Any, *, shared: bool
    ) -> None:
        keys = self._effect_keys(thread_id, key, shared=shared)[:2]
        data = encode_value(result, what=f"effect {key!r} result", thread_id=thread_id, step=None)
        self._check_fence_apart(thread_id, token, shared)
        code, holder, _ = self._scripts["complete_effect"](
            keys=keys, args=[token, data, thread_id if shared else ""]
        )
        raise_refusal(code, holder, thread_id=thread_id, token=token, key=key)

    def _do_release_effect(
        self, thread_id: str, key: str, token: int, *, claim_id: str, shared: bool
    ) -> None:
        keys = self._effect_keys(thread_id, key, shared=shared)
        self._check_fence_apart(thread_id, token, shared)
        code, holder, _ = self._scripts["release_effect"](keys=keys, args=[token, claim_id])
        raise_refusal(code, holder, thread_id=thread_id, token=token, key=key)

    def _do_effect(self, thread_id: str, key: str, *, shared: bool) -> Effect | None:
        record = fields(self.client.hgetall(self._effect_keys(thread_id, key, shared=shared)[0]))
        return _effect(thread_id, key, record, shared=shared)

    def _do_effects(self, thread_id: str) -> list[Effect]:
        prefix = self.keys.effect(thread_id, "")
        owned = (text(name) for name in self.client.smembers(self.keys.owned(thread_id)))
        names = [name for name in owned if name.startswith(prefix)]
        pipe = self.client.pipeline(transaction=False)
        for name in names:
            pipe.hgetall(name)
        found = [
            _effect(thread_id, name[len(prefix) :], fields(record), shared=False)
            for name, record in zip(names, pipe.execute() if names else [], strict=True)
        ]
        return [effect for effect in found if effect is not None]

    def _do_resolve_effect(
        self,
        thread_id: str,
        key: str,
        *,
        result: Any,
        did_not_run: bool,
        start_grace: float,
        shared: bool,
    ) -> ThreadMeta:
        data = (
            b""
            if did_not_run
            else encode_value(result, what=f"effect {key!r} result", thread_id=thread_id, step=None)
        )
        request = request_id()
        keys = [self.keys.meta(thread_id), self.keys.lock(thread_id)]
        if not shared:
            record = "own"
            keys += [self.keys.effect(thread_id, key), self.keys.owned(thread_id)]
        elif self.cluster:
            record = "apart"
            self._settle_apart(thread_id, key, data, did_not_run, request)
        else:
            record = "shared"
            keys.append(self.keys.global_effect(key))
        code, value, _ = self._run(
            "resolve_effect",
            keys,
            [
                thread_id,
                start_grace,
                "1" if did_not_run else "0",
                data,
                request,
                record,
                f"{self.keys.prefix}thread:",
                *sorted(status.value for status in RESOLVABLE),
            ],
            indexed=True,
        )
        refusal = refusal_of(code)
        if record == "apart" and refusal in (Refusal.LEASE_HELD, Refusal.STATUS_REFUSED):
            raise self._moved_on(thread_id, key)
        if refusal is Refusal.LEASE_HELD:
            if isinstance(value, list):
                held, claimant = value
                raise claimant_holds(thread_id, key, text(claimant), int(held))
            raise held_while_resolving(thread_id, int(value))
        if refusal is Refusal.STATUS_REFUSED:
            raise status_not_resolvable(thread_id, text(value))
        if refusal is Refusal.NOT_CLAIMED or refusal is Refusal.NOT_HOLDER:
            state = None if refusal is Refusal.NOT_CLAIMED else EffectState.DONE
            raise not_resolvable(thread_id, key, state, shared=shared)
        raise_refusal(code, value, thread_id=thread_id, key=key)
        return self._meta(thread_id, hash_to_fields(value))

    def _settle_apart(
        self, thread_id: str, key: str, data: bytes, did_not_run: bool, request: str
    ) -> None:
        """On Redis Cluster a shared record lives in another slot than the thread it
        stopped, and its claimant's lease in a third: no one script can check them all and
        settle it. The thread and the claimant are checked here, the record is settled
        only if the claim read here still holds it (one taken since may be running the
        call), then resolve_effect.lua checks the thread again and queues it."""
        status, fence = self.client.hmget(self.keys.meta(thread_id), ["status", "fence"])
        if status is None:
            raise refusal_error(Refusal.THREAD_NOT_FOUND, 0, thread_id=thread_id)
        if (ttl := int(self.client.pttl(self.keys.lock(thread_id)))) > 0:
            raise held_while_resolving(thread_id, ttl)
        if Status(text(status)) not in RESOLVABLE:
            raise status_not_resolvable(thread_id, text(status))
        name = self.keys.global_effect(key)
        stored = fields(self.client.hgetall(name))
        found = _effect(thread_id, key, stored, shared=True)
        if found is None or found.state != EffectState.PENDING:
            state = None if found is None else found.state
            raise not_resolvable(thread_id, key, state, shared=True)
        claimant = found.claimed_by
        if claimant is not None and (held := int(self.client.pttl(self.keys.lock(claimant)))) > 0:
            raise claimant_holds(thread_id, key, claimant, held)
        code, holder, _ = self._scripts["settle_shared"](
            keys=[name],
            args=[
                found.token,
                stored.get("claim", b""),
                "1" if did_not_run else "0",
                data,
                int(blob(fence)) + 1,
                thread_id,
                request,
            ],
        )
        refusal = refusal_of(code)
        if refusal is Refusal.NOT_CLAIMED:
            raise not_resolvable(thread_id, key, None, shared=True)
        if refusal is Refusal.NOT_HOLDER:
            raise EffectError(
                f"shared effect {key!r} was claimed again (token {int(holder)}) or recorded "
                "while it was being settled: nothing was changed; look at it again with "
                f"'agentq effects {thread_id} --shared {key}'",
                thread_id=thread_id,
            )
        raise_refusal(code, holder, thread_id=thread_id, key=key)

    def _moved_on(self, thread_id: str, key: str) -> ThreadStateError:
        """The thread was taken up between the settling of its shared record and its queuing
        (Redis Cluster only, see :meth:`_settle_apart`)."""
        status = text(self.client.hget(self.keys.meta(thread_id), "status"))
        return ThreadStateError(
            f"shared effect {key!r} is settled, but meanwhile the thread was taken up "
            f"(status {status}), so it was not queued again: whenever it runs, it gets the "
            f"settled outcome; 'agentq show {thread_id}' shows where it is",
            thread_id=thread_id,
            status=status,
        )


def _effect(thread_id: str, key: str, record: dict[str, bytes], *, shared: bool) -> Effect | None:
    """The record from its stored fields, ``None`` when there are none."""
    if not record:
        return None
    result, tool, claimed_at = record.get("result"), record.get("tool"), record.get("at")
    claimant: str | None = thread_id
    if shared:
        # None when an agentq that did not keep it made the claim.
        claimant = text(record["thread"]) if "thread" in record else None
    return Effect(
        key,
        EffectState(record["state"].decode()),
        int(record["token"]),
        None
        if result is None
        else decode_value(result, what=f"effect {key!r} result", thread_id=thread_id, step=None),
        tool=tool.decode() if tool else None,
        claimed_at=float(claimed_at) if claimed_at else None,
        claimed_by=claimant,
    )
