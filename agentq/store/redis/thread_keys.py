"""Concurrency keys in Redis: one script per enter, leave and wake, on the server's clock.

The scripts read and write the keys of several threads (the holders' locks, the waiters'
metas) beside the key's own, which Redis Cluster cannot do in one script: on Cluster the
operations refuse with :class:`~agentq.errors.StoreConfigError` (and the sweep and the
listing find no key there).
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from agentq.errors import StoreConfigError
from agentq.store.contract.thread_keys import KeyState, KeyWaiter
from agentq.store.redis.base import RedisBase
from agentq.store.redis.decode import raise_refusal, text
from agentq.store.redis.scripts import StoreScript, load_scripts

_SCRIPTS = ("enter_key", "leave_key", "wake_keys", "key_states")


class RedisThreadKeys(RedisBase):
    """The concurrency-key operations of :class:`~agentq.store.redis.store.RedisStore`."""

    @cached_property
    def _key_scripts(self) -> dict[str, StoreScript]:
        if self.cluster:
            raise StoreConfigError(
                "concurrency keys need a single Redis server (their scripts span several "
                "threads' keys); drop concurrency_key or use one server for the store"
            )
        return load_scripts(self.client, _SCRIPTS, ("_prelude", "_thread_keys_prelude"))

    def _key_run(self, name: str, keys: list[str], args: list[Any]) -> Any:
        index_keys, index_args = self._index_keys()
        thread_prefix = f"{self.keys.prefix}thread:"
        return self._key_scripts[name](
            keys=keys + index_keys, args=[*index_args, thread_prefix, *args]
        )

    def _parts(self, key: str) -> list[str]:
        parts = ("holders", "queue", "state")
        return [
            *(self.keys.thread_key(key, part) for part in parts),
            self.keys.thread_keys_active(),
        ]

    def _do_enter_key(self, thread_id: str, owner: str, token: int, key: str, cap: int) -> int:
        keys = [*self._parts(key), self.keys.meta(thread_id), self.keys.lock(thread_id)]
        queue = self.keys.thread_key(key, "queue")
        code, value, _ = self._key_run(
            "enter_key",
            keys,
            [thread_id, token, owner, cap, key, self.keys.limit(key), "parked", queue],
        )
        raise_refusal(code, value, thread_id=thread_id, token=token)
        return int(value)

    def _do_leave_key(
        self, thread_id: str, token: int, key: str, start_grace: float, cap: int | None
    ) -> list[str]:
        woken = self._key_run(
            "leave_key",
            self._parts(key),
            [thread_id, token, repr(float(start_grace)), key, "" if cap is None else cap],
        )
        return [text(each) for each in woken]

    def wake_keys(self) -> list[str]:
        if self.cluster:  # no key can be entered there
            return []
        woken = self._key_run(
            "wake_keys", [self.keys.thread_keys_active()], [self.keys.thread_key_prefix()]
        )
        return [text(each) for each in woken]

    def key_states(self) -> list[KeyState]:
        if self.cluster:
            return []
        thread_prefix = f"{self.keys.prefix}thread:"
        rows = self._key_scripts["key_states"](
            keys=[self.keys.thread_keys_active()],
            args=["", thread_prefix, self.keys.thread_key_prefix()],
        )
        states = []
        for key, cap, running, queue in rows:
            waiting = [
                KeyWaiter(text(queue[i]), i // 2 + 1, float(queue[i + 1]))
                for i in range(0, len(queue), 2)
            ]
            states.append(
                KeyState(text(key), int(cap), sorted(text(each) for each in running), waiting)
            )
        return sorted(states, key=lambda state: state.key)
