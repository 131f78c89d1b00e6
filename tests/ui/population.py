"""Threads in every status, put in place through the store API as workers would leave
them, for the inspector's tests and its benchmark."""

from __future__ import annotations

import time
from typing import Any, Final

from agentq.records import Checkpoint, Status
from agentq.store.contract import Store

TASK: Final = "support_agent"
OWNER: Final = "worker-a@host:4242"
HOSTILE: Final = "<script>window.__pwned = 1</script><img src=x onerror=window.__pwned=2>"
ARTIFACT: Final = b"%PDF-1.7 an invoice"
TRACEBACK: Final = (
    'Traceback (most recent call last):\n  File "agent.py", line 12, in model\n'
    "    customer = state['customer_id']\nKeyError: 'customer_id'"
)


def drive(store: Store, thread_id: str, states: list[dict[str, Any]], **last: Any) -> int:
    """Open the thread and commit one checkpoint per state; return the lease token."""
    store.open_thread(thread_id, task=TASK, input={"question": "refund?"})
    token = store.acquire(thread_id, OWNER, 60)
    for step, state in enumerate(states):
        final = step == len(states) - 1
        store.commit(
            thread_id,
            token,
            Checkpoint(
                step=step,
                node=f"node{step + 1}",
                state=state,
                pending=last.get("pending", []) if final else [],
                cursors={"page": step},
                task=TASK,
                token=token,
                created_at=time.time(),
            ),
            due_in=60,
        )
    return token


def populate(store: Store) -> dict[Status, str]:
    """One thread per status (returned by status), plus ``t-hostile`` (model output with
    markup in its state and error), ``t-big`` (a state over a page) and ``t-artifact``."""
    store.open_thread("t-queued", task=TASK, start_grace=3600)

    messages = [{"role": "user", "content": "refund order 1042?"}]
    token = drive(
        store,
        "t-done",
        [
            {"messages": messages, "count": 0},
            {
                "messages": [*messages, {"role": "assistant", "content": "calling refund"}],
                "count": 1,
            },
        ],
    )
    store.claim_effect("t-done", "call-refund", token)
    store.complete_effect("t-done", "call-refund", token, {"refund_id": "re_1"})
    store.commit(
        "t-done",
        token,
        Checkpoint(
            step=2,
            node=None,
            state={
                "messages": [*messages, {"role": "assistant", "content": "refunded"}],
                "count": 2,
            },
            task=TASK,
            token=token,
            created_at=time.time(),
        ),
        status=Status.DONE,
        result="Refunded 25.99 EUR.",
        release_owner=OWNER,
    )

    token = drive(store, "t-waiting", [{"amount": 10}, {"amount": 10, "asked": True}])
    store.set_status(
        "t-waiting",
        token,
        Status.WAITING,
        interrupt={"question": "refund 10?"},
        release_owner=OWNER,
    )

    token = drive(store, "t-retrying", [{"n": 1}])
    store.set_status(
        "t-retrying",
        token,
        Status.RETRYING,
        due_in=3600,
        attempts=2,
        error="RateLimitError: 429",
        release_owner=OWNER,
    )

    token = drive(store, "t-failed", [{"n": 1}, {"n": 2}])
    store.set_status("t-failed", token, Status.FAILED, error=TRACEBACK, release_owner=OWNER)

    token = drive(
        store, "t-attention", [{"n": 1}], pending=[{"id": "call-mail", "name": "send_mail"}]
    )
    store.claim_effect("t-attention", "call-mail", token)
    store.set_status(
        "t-attention",
        token,
        Status.NEEDS_ATTENTION,
        error="effect 'call-mail' of tool send_mail: outcome unknown",
        release_owner=OWNER,
    )

    store.open_thread("t-cancelled", task=TASK)
    store.request_cancel("t-cancelled")

    token = drive(store, "t-hostile", [{"reply": HOSTILE}])
    store.set_status("t-hostile", token, Status.FAILED, error=HOSTILE, release_owner=OWNER)

    drive(store, "t-big", [{"document": "x" * 100_000}])

    store.open_thread("t-artifact", task=TASK)
    digest = store.put_artifact("t-artifact", ARTIFACT)
    reference = {"artifact": digest, "size": len(ARTIFACT), "content_type": "application/pdf"}
    drive(store, "t-artifact", [{"invoice": reference}])

    drive(store, "t-running", [{"n": 1}, {"n": 2, "notes": ["a"]}])
    return {
        Status.QUEUED: "t-queued",
        Status.RUNNING: "t-running",
        Status.WAITING: "t-waiting",
        Status.RETRYING: "t-retrying",
        Status.DONE: "t-done",
        Status.FAILED: "t-failed",
        Status.NEEDS_ATTENTION: "t-attention",
        Status.CANCELLED: "t-cancelled",
    }
