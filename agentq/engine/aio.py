"""One event loop per worker process for ``async def`` nodes and tools."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any

_loop: asyncio.AbstractEventLoop | None = None
_loop_pid = 0


def run_coroutine(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coro`` to completion on this process's loop, created on first use.

    Async clients created inside nodes stay bound to this one loop, so they can be
    reused across steps and threads; a forked child gets a loop of its own.
    """
    global _loop, _loop_pid
    if _loop is None or _loop_pid != os.getpid() or _loop.is_closed():
        _loop = asyncio.new_event_loop()
        _loop_pid = os.getpid()
    return _loop.run_until_complete(coro)
