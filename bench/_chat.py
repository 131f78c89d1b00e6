"""Deterministic chat messages of realistic shape for the benchmarks (no model is called).

A round of an agent is a model reply that asks for a tool and the tool's result, each about
300 bytes encoded: the unit a step appends to the conversation.
"""

from __future__ import annotations

import random
from typing import Any

from agentq.codec.envelope import encode_value

_WORDS = (
    "the",
    "model",
    "calls",
    "a",
    "tool",
    "with",
    "arguments",
    "and",
    "reads",
    "result",
    "before",
    "it",
    "answers",
    "user",
    "question",
    "about",
    "invoice",
    "order",
    "shipment",
    "refund",
    "weather",
    "account",
    "balance",
    "search",
    "query",
    "document",
    "summary",
    "paragraph",
    "citation",
    "source",
    "retry",
    "timeout",
    "context",
    "window",
    "budget",
)


def text(seed: int, length: int) -> str:
    """``length`` characters of word salad, the same for the same ``seed``."""
    rng = random.Random(seed)
    words: list[str] = []
    total = 0
    while total < length:
        word = rng.choice(_WORDS)
        words.append(word)
        total += len(word) + 1
    return " ".join(words)[:length]


def user(i: int) -> dict[str, Any]:
    return {"role": "user", "content": text(i, 160)}


def reply(i: int) -> dict[str, Any]:
    """The model asking for tool call ``i`` (about 300 bytes encoded)."""
    return {
        "role": "assistant",
        "content": text(i, 178),
        "tool_calls": [
            {"id": f"call-{i}", "name": "search", "args": {"query": text(i + 1, 40), "limit": 5}}
        ],
    }


def tool_result(i: int) -> dict[str, Any]:
    """The result of tool call ``i`` (about 300 bytes encoded)."""
    return {"role": "tool", "tool_call_id": f"call-{i}", "content": text(-i - 1, 259)}


def answer(i: int) -> dict[str, Any]:
    return {"role": "assistant", "content": text(i, 280)}


def conversation(n: int) -> list[dict[str, Any]]:
    """A user question, then rounds of reply + tool result, ``n`` messages in all."""
    messages = [user(0)]
    i = 0
    while len(messages) < n:
        messages.append(reply(i) if len(messages) % 2 else tool_result(i))
        i += len(messages) % 2
    return messages


def encoded_size(value: Any) -> int:
    """The bytes agentq's codec writes for ``value``."""
    return len(encode_value(value, what="bench", thread_id=None, step=None))
