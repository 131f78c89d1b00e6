"""Checkpoints on Redis: the fenced commit, status changes, and the reads.

The two hot paths keep large values out of Lua, where every kilobyte costs time both
ways: ``commit`` sends a snapshot of up to :data:`INLINE_SNAPSHOT_BYTES` to the commit
script as an argument (one command), a larger one as ``MULTI``, a plain ``SET`` of the
snapshot to the thread's staged key, the commit script (which checks the fence and the
step, then renames the staged key into place) and ``EXEC``, in one write; ``latest``
reads the pointer and the snapshot it names with one ``MGET`` when it knows the step to
expect (from this store's last commit, ``meta()`` or ``latest()`` of the thread), and
falls back to a script otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from redis.typing import EncodableT

from agentq.codec.envelope import (
    build_checkpoint,
    decode_envelope,
    encode_checkpoint,
    encode_value,
)
from agentq.errors import CheckpointNotFound
from agentq.records import Checkpoint, Status
from agentq.store.contract import UNSET, _Unset, checkpoint_not_stored
from agentq.store.redis.base import RedisBase
from agentq.store.redis.decode import blob, log_fields, pairs, raise_refusal, text

INLINE_SNAPSHOT_BYTES = 16 * 1024
"""Up to this size a snapshot goes to the commit script as an argument; a larger one is
staged, since copying it into Lua and out again would cost more than the extra commands."""


def due_arg(due_in: float | _Unset | None) -> EncodableT:
    """commit.lua's due argument: seconds, '' to clear, 'keep' to leave it."""
    if isinstance(due_in, _Unset):
        return "keep"
    # As a float here: a number type Lua cannot read would fail the script midway.
    return "" if due_in is None else float(due_in)


class RedisCheckpoints(RedisBase):
    """Commits, status changes and checkpoint reads."""

    def _do_commit(
        self,
        thread_id: str,
        token: int,
        checkpoint: Checkpoint,
        *,
        status: Status,
        due_in: float | _Unset | None,
        result: Any,
        interrupt: Any,
        release_owner: str | None,
        logs: Mapping[str, int] | None,
    ) -> bool:
        step = checkpoint.step
        encoded = encode_checkpoint(
            thread_id, checkpoint, limit=self.max_checkpoint_bytes, logs=logs
        )
        blobs = [
            b""
            if value is UNSET
            else encode_value(value, what=name, thread_id=thread_id, step=step)
            for name, value in (("result", result), ("interrupt", interrupt))
        ]
        log_args: list[EncodableT] = [len(encoded.appended)]
        for field, items in encoded.appended.items():
            log_args += [field, (logs or {})[field], len(items), *items]
        base = self.keys.thread(thread_id)
        staged = self.keys.staged(thread_id)
        inline = len(encoded.snapshot) <= INLINE_SNAPSHOT_BYTES
        index_keys, index_args = self._index_keys()
        reply = self._scripts["commit"](
            [
                f"{base}meta",
                f"{base}latest",
                f"{base}checkpoint:{step}",
                f"{base}lock",
                staged,
                *index_keys,
            ],
            [
                *index_args,
                token,
                step,
                status.value,
                due_arg(due_in),
                f"{token}:{release_owner}" if release_owner else "",
                self.keep_last,
                checkpoint.node or "",
                *blobs,
                log_fields(logs or {}),
                encoded.snapshot if inline else b"",
                *log_args,
            ],
            stage=None if inline else (staged, encoded.snapshot),
        )
        self._apply_index_ops(reply)
        code, value, _ = reply
        raise_refusal(code, value, thread_id=thread_id, token=token, step=step)
        self._remember(thread_id, step, tuple(logs or ()))
        return bool(value)

    def _do_set_status(
        self,
        thread_id: str,
        token: int,
        status: Status,
        *,
        due_in: float | None,
        error: str | _Unset | None,
        attempts: int | _Unset,
        crashes: int | _Unset,
        result: Any,
        interrupt: Any,
        release_owner: str | None,
        raise_fence: bool,
    ) -> None:
        fields: dict[str, Any] = {"fence": token + 1} if raise_fence else {}
        if not isinstance(error, _Unset):
            fields["error"] = error or ""
        if not isinstance(attempts, _Unset):
            fields["attempts"] = attempts
        if not isinstance(crashes, _Unset):
            fields["crashes"] = crashes
        for name, value in (("result", result), ("interrupt", interrupt)):
            if value is not UNSET:
                fields[name] = (
                    b""
                    if value is None
                    else encode_value(value, what=name, thread_id=thread_id, step=None)
                )
        code, value, _ = self._run(
            "set_status",
            [self.keys.meta(thread_id), self.keys.lock(thread_id)],
            [
                thread_id,
                token,
                status.value,
                "" if due_in is None else due_in,
                f"{token}:{release_owner}" if release_owner else "",
                *pairs(fields),
            ],
            indexed=True,
        )
        raise_refusal(code, value, thread_id=thread_id, token=token)

    def _do_latest(self, thread_id: str) -> Checkpoint | None:
        head = self._heads.get(thread_id)
        if head is not None:
            guessed, found = self._latest_at(thread_id, *head)
            if guessed:
                return found
        return self._latest_script(thread_id)

    def _latest_at(
        self, thread_id: str, step: int, fields: tuple[str, ...]
    ) -> tuple[bool, Checkpoint | None]:
        """``(True, latest checkpoint or None)`` if the latest step is ``step`` (or there is
        none) and its logs are among ``fields``, read with one ``MGET`` (and an ``LRANGE``
        per log, in a ``MULTI``): its bytes never pass through Lua. ``(False, None)`` when
        the guess was wrong."""
        base = self.keys.thread(thread_id)
        read = ("MGET", f"{base}latest", f"{base}checkpoint:{step}")
        if fields:
            replies = self._send(
                [read, *(("LRANGE", f"{base}log:{field}", 0, -1) for field in fields)],
                transaction=True,
            )
        else:
            replies = self._send([read], transaction=False)
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        (latest, data), *items = replies
        if latest is None:
            return True, None
        if int(latest) != step or data is None:
            return False, None
        envelope, lengths = decode_envelope(thread_id, blob(data), step=step)
        if not lengths.keys() <= set(fields):
            return False, None
        log_items = dict(zip(fields, items, strict=True))
        return True, build_checkpoint(thread_id, envelope, log_items, step=step)

    def _latest_script(self, thread_id: str) -> Checkpoint | None:
        """The latest checkpoint through latest.lua: one round trip, whatever the step."""
        reply = self._scripts["latest"](
            keys=[self.keys.latest(thread_id)],
            args=[self.keys.checkpoint_prefix(thread_id), self.keys.thread(thread_id)],
        )
        if reply is None:
            self._remember(thread_id, -1, ())
            return None
        step, data = int(reply[0]), reply[1]
        if data is None:
            raise CheckpointNotFound(
                "the latest pointer names a checkpoint that is missing; fork the thread "
                f"from an earlier step: 'agentq fork {thread_id} --from N' (store.fork in code)",
                thread_id=thread_id,
                step=step,
            )
        envelope, _ = decode_envelope(thread_id, data, step=step)
        log_items = {text(reply[i]): reply[i + 1] for i in range(2, len(reply), 2)}
        self._remember(thread_id, step, tuple(log_items))
        return build_checkpoint(thread_id, envelope, log_items, step=step)

    def _with_logs(self, thread_id: str, blobs: list[tuple[int, bytes]]) -> list[Checkpoint]:
        """Checkpoints from their snapshots, reading their logs in one more round trip."""
        decoded = [(step, *decode_envelope(thread_id, data, step=step)) for step, data in blobs]
        pipe = self.client.pipeline(transaction=False)
        for _, _, lengths in decoded:
            for field, length in lengths.items():
                pipe.lrange(self.keys.log(thread_id, field), 0, length - 1)
        fetched = iter(pipe.execute() if any(lengths for *_, lengths in decoded) else [])
        return [
            build_checkpoint(thread_id, envelope, {f: next(fetched) for f in lengths}, step=step)
            for step, envelope, lengths in decoded
        ]

    def _do_checkpoint(self, thread_id: str, step: int) -> Checkpoint:
        data = self.client.get(self.keys.checkpoint(thread_id, step))
        if data is None:
            raise self._not_stored(thread_id, step)
        return self._with_logs(thread_id, [(step, blob(data))])[0]

    def _not_stored(
        self, thread_id: str, step: int, *, forking: bool = False
    ) -> CheckpointNotFound:
        """:func:`~agentq.store.contract.checkpoint_not_stored`, with the steps held read
        after the miss (a commit in between may have moved them on: still what is held)."""
        first, latest = self.client.hmget(self.keys.meta(thread_id), ["first", "step"])
        return checkpoint_not_stored(
            thread_id,
            step,
            None if first is None else int(first),
            None if latest is None else int(latest),
            forking=forking,
        )

    def _do_history(self, thread_id: str, *, before: int | None, limit: int) -> list[Checkpoint]:
        pipe = self.client.pipeline(transaction=False)
        pipe.get(self.keys.latest(thread_id))
        pipe.hget(self.keys.meta(thread_id), "first")
        latest, first = pipe.execute()
        if latest is None:
            return []
        top = int(latest) if before is None else min(int(latest), before - 1)
        steps = list(range(top, max(int(first or 0), top - limit + 1) - 1, -1))
        if not steps:
            return []
        blobs = self.client.mget([self.keys.checkpoint(thread_id, s) for s in steps])
        return self._with_logs(
            thread_id,
            [(s, blob(data)) for s, data in zip(steps, blobs, strict=True) if data is not None],
        )
