"""The Lua scripts: each file of ``lua/`` sent with the shared preludes in front.

Before the preludes comes a table generated from :mod:`agentq.records` (the status names
and the LIVE, IDLE and FINISHED sets), so the scripts and Python agree on them by
construction. A script's Dragonfly flags line, when it has one, must open the script as
sent, so it moves in front of everything.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from importlib.resources import files
from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.typing import EncodableT

from agentq.records import FINISHED, IDLE, LIVE, Status
from agentq.store.redis.wire import run_script

RedisClient = redis.Redis | RedisCluster

STORE_SCRIPTS = (
    "index",
    "sync_index",
    "open_thread",
    "acquire",
    "renew",
    "release",
    "commit",
    "set_status",
    "latest",
    "delete_thread",
    "create_fork",
    "claim_effect",
    "complete_effect",
    "claim_due",
    "unclaim_due",
    "defer_due",
    "reopen",
    "request_cancel",
    "take_canvas",
    "put_artifact",
    "lease_sweeper",
    "release_effect",
    "resolve_effect",
    "settle_shared",
    "take_limits",
    "pause_limit",
    "limit_paused",
    "listing",
    "settle_limits",
    "renew_limits",
)
"""The store's scripts, ``lua/<name>.lua``."""

_FLAGS = "--!df "


def _lua_set(name: str, statuses: Iterable[Status]) -> str:
    members = ", ".join(f"{status.value} = true" for status in sorted(statuses))
    return f"local {name} = {{{members}}}\n"


def status_lua() -> str:
    """``STATUS.<NAME>`` and the sets ``LIVE``, ``IDLE``, ``FINISHED`` as Lua locals."""
    names = ", ".join(f"{status.name} = '{status.value}'" for status in Status)
    return (
        "-- Generated from agentq.records.\n"
        f"local STATUS = {{{names}}}\n"
        + _lua_set("LIVE", LIVE)
        + _lua_set("IDLE", IDLE)
        + _lua_set("FINISHED", FINISHED)
    )


def script_source(name: str, preludes: Sequence[str]) -> str:
    """The text sent for ``lua/<name>.lua``: flags, status table, preludes, the script."""
    lua = files("agentq.store.redis") / "lua"
    body = (lua / f"{name}.lua").read_text()
    flags = ""
    if body.startswith(_FLAGS):
        flags, _, body = body.partition("\n")
        flags += "\n"
    shared = "".join((lua / f"{prelude}.lua").read_text() for prelude in preludes)
    return flags + status_lua() + shared + body


class StoreScript:
    """A script registered with the client, called as redis-py's ``Script`` is
    (``script(keys=..., args=...)``) but sent by
    :func:`~agentq.store.redis.wire.run_script`, which packs the call with hiredis and
    skips redis-py's per-command layers: a short script's call took 186 µs of client time
    that way here, and takes 129 µs (a redis-py ``PING``: 122 µs). ``stage`` is
    run_script's."""

    def __init__(self, client: RedisClient, source: str) -> None:
        self.client = client
        self.script = source
        self.sha: str = client.register_script(source).sha

    def __call__(
        self,
        keys: Sequence[str] = (),
        args: Sequence[EncodableT] = (),
        *,
        stage: tuple[str, bytes] | None = None,
    ) -> Any:
        return run_script(self.client, self.sha, self.script, keys, args, stage=stage)


def load_scripts(
    client: RedisClient, names: Sequence[str], preludes: Sequence[str], *, prefix: str = ""
) -> dict[str, StoreScript]:
    """Register ``lua/<prefix><name>.lua`` for each name, keyed by name."""
    return {name: StoreScript(client, script_source(prefix + name, preludes)) for name in names}
