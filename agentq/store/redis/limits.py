"""Fleet-wide rate limits in Redis: one script per take, on the server's clock."""

from __future__ import annotations

from typing import Any

from agentq.store.contract.limits import Grant, LimitState, Slot, Take
from agentq.store.redis.base import RedisBase


class RedisLimits(RedisBase):
    """The limit operations of :class:`~agentq.store.redis.store.RedisStore`."""

    def take_limits(
        self, takes: list[Take], holder: str, ttl: float, reserve_within: float = 0
    ) -> Grant:
        keys: list[str] = []
        args: list[Any] = [holder, max(1, int(ttl * 1000)), repr(float(reserve_within))]
        for take in takes:
            limit = take.limit
            keys += [self.keys.limit(take.key), self.keys.limit_holders(take.key)]
            rpm, tpm = limit.requests_per_minute, limit.tokens_per_minute
            req_interval = 60 / rpm if rpm else 0
            burst = limit.request_burst
            args += [
                repr(req_interval),
                repr(burst * req_interval),
                repr(60 / tpm if tpm else 0),
                repr(float(take.cost)),
                limit.concurrency or 0,
            ]
        taken, ms = self._scripts["take_limits"](keys=keys, args=args)
        return Grant(bool(taken), int(ms) / 1000)

    def release_limits(self, keys: list[str], holder: str) -> None:
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.zrem(self.keys.limit_holders(key), holder)
        pipe.execute()

    def pause_limit(self, key: str, seconds: float) -> None:
        self._scripts["pause_limit"](keys=[self.keys.limit(key)], args=[int(seconds * 1000)])

    def limit_paused(self, keys: list[str]) -> float:
        ms = self._scripts["limit_paused"](keys=[self.keys.limit(key) for key in keys], args=[])
        return int(ms) / 1000

    def limit_states(self) -> dict[str, LimitState]:
        start = self.keys.limit("")
        # A concurrency-only key has holders and no hash.
        keys = sorted(
            {
                key.decode()[len(start) :].removesuffix(":holders")
                for key in self.client.scan_iter(match=f"{start}*", count=1000)
            }
        )
        now = self._now()
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.hmget(self.keys.limit(key), ["req_tat", "tok_tat", "paused"])
            pipe.zcount(self.keys.limit_holders(key), now, "+inf")
        replies = pipe.execute()
        states = {}
        for i, key in enumerate(keys):
            req, tok, paused = (float(v or 0) for v in replies[2 * i])
            states[key] = LimitState(now, req, tok, paused, int(replies[2 * i + 1]))
        return states

    def settle_limits(self, settles: list[Take]) -> None:
        settles = [s for s in settles if s.limit.tokens_per_minute and s.cost]
        if not settles:
            return
        args: list[Any] = []
        for settle in settles:
            assert settle.limit.tokens_per_minute is not None
            args += [repr(60 / settle.limit.tokens_per_minute), repr(float(settle.cost))]
        self._scripts["settle_limits"](
            keys=[self.keys.limit(settle.key) for settle in settles], args=args
        )

    def renew_limits(self, slots: list[Slot]) -> None:
        if not slots:
            return
        args: list[Any] = []
        for slot in slots:
            args += [slot.holder, max(1, int(slot.ttl * 1000))]
        self._scripts["renew_limits"](
            keys=[self.keys.limit_holders(slot.key) for slot in slots], args=args
        )

    def limit_takes(self) -> dict[str, int]:
        start = self.keys.limit("")
        keys = [
            name.decode()[len(start) :]
            for name in self.client.scan_iter(match=f"{start}*", count=1000)
            if not name.endswith(b":holders")
        ]
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.hget(self.keys.limit(key), "takes")
        return {key: int(n) for key, n in zip(keys, pipe.execute(), strict=True) if n}
