"""Large data a node keeps out of its checkpoints, by content address."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentq.engine import aio
from agentq.engine.store_retry import RetriedCalls
from agentq.errors import ArtifactTooLarge, InvalidArgument
from agentq.store.contract import Store


class Artifacts:
    """Large data kept out of checkpoints; the state holds the small reference ``put``
    returns (``{"artifact": sha256, "size": n, "content_type": ...}``). An async node
    awaits :meth:`aput` and :meth:`aget`, which make the store's round trip off its loop."""

    def __init__(
        self,
        store: Store,
        calls: RetriedCalls,
        thread_id: str,
        max_bytes: int,
        step: int | None,
        *,
        in_node: Callable[[str], None],
    ) -> None:
        self._store = store
        self._store_calls = calls
        self._thread_id = thread_id
        self._max_bytes = max_bytes
        self._step = step
        self._in_node = in_node
        """The run's check that its node has not returned: an artifact stored since would
        be in no step."""

    def put(self, data: bytes, content_type: str = "application/octet-stream") -> dict[str, Any]:
        if self._on_loop("put"):
            return aio.blocking_on_loop(lambda: self._put(data, content_type))
        return self._put(data, content_type)

    def get(self, ref: dict[str, Any]) -> bytes:
        if self._on_loop("get"):
            return aio.blocking_on_loop(lambda: self._get(ref))
        return self._get(ref)

    async def aput(
        self, data: bytes, content_type: str = "application/octet-stream"
    ) -> dict[str, Any]:
        return await aio.blocking(self._put, data, content_type)

    async def aget(self, ref: dict[str, Any]) -> bytes:
        return await aio.blocking(self._get, ref)

    def _put(self, data: bytes, content_type: str) -> dict[str, Any]:
        self._in_node("artifacts.put")
        if isinstance(data, (bytearray, memoryview)):
            data = bytes(data)  # a memoryview's len() counts its items, not its bytes
        if not isinstance(data, bytes):
            fix = "data.encode()" if isinstance(data, str) else "bytes, e.g. json.dumps(x).encode()"
            raise self._invalid(
                f"run.artifacts.put() stores bytes, not {type(data).__name__}; pass {fix}"
            )
        if len(data) > self._max_bytes:
            raise ArtifactTooLarge(
                f"artifact of {len(data)} bytes is over max_artifact_bytes "
                f"({self._max_bytes}); store it in object storage and keep its URL, or "
                "raise the setting",
                thread_id=self._thread_id,
                step=self._step,
            )
        digest = self._store_calls(
            "storing an artifact", self._store.put_artifact, self._thread_id, data
        )
        return {"artifact": digest, "size": len(data), "content_type": content_type}

    def _get(self, ref: dict[str, Any]) -> bytes:
        digest = ref.get("artifact") if isinstance(ref, dict) else None
        if not isinstance(digest, str):
            shown = repr(ref)
            shown = shown if len(shown) <= 80 else shown[:79] + "…"
            raise self._invalid(
                f"run.artifacts.get() takes the reference run.artifacts.put() returned "
                f"(a dict with its 'artifact'), not {type(ref).__name__} {shown}; pass "
                "that dict as the state keeps it"
            )
        return self._store_calls(
            "reading an artifact", self._store.get_artifact, self._thread_id, digest
        )

    def _invalid(self, message: str) -> InvalidArgument:
        return InvalidArgument(message, thread_id=self._thread_id, step=self._step)

    def _on_loop(self, name: str) -> bool:
        """Whether the caller is an async node, warned that it blocks the loop."""
        if not aio.on_loop():
            return False
        aio.warn_blocking(
            f"thread {self._thread_id!r}: run.artifacts.{name}() in an async node blocks "
            "the event loop every async node of the process shares; call await "
            f"run.artifacts.a{name}(...)"
        )
        return True
