"""The saver's serializer writes and reads LangGraph's own msgpack bytes, and remembering
the classes it revived never lets one through that its allowlist would refuse."""

from __future__ import annotations

import dataclasses
import datetime
import uuid
from enum import Enum
from typing import Any

import ormsgpack
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.serde.jsonplus import EXT_PYDANTIC_V2, JsonPlusSerializer
from langgraph.types import Send
from pydantic import BaseModel

from agentq.langgraph import AgentqSerializer
from agentq.langgraph.msgpack_ext import pack


class Refund(BaseModel):
    order: str
    cents: int


class Inner(BaseModel):
    refund: Refund
    note: str | None = None


@dataclasses.dataclass
class Case:
    refund: Refund
    tags: set[str]


class Level(Enum):
    LOW = 1


def _state() -> dict[str, Any]:
    return {
        "messages": [
            HumanMessage(content="refund 4411", id="m1"),
            AIMessage(content="", id="m2", tool_calls=[{"name": "r", "args": {}, "id": "c1"}]),
            ToolMessage(content="ok", tool_call_id="c1", id="m3"),
        ],
        "nested": Inner(refund=Refund(order="4411", cents=1999)),
        "case": Case(Refund(order="1", cents=2), {"a"}),
        "send": Send("node", {"refund": Refund(order="2", cents=3)}),
        "level": Level.LOW,
        "when": datetime.datetime(2026, 1, 2, tzinfo=datetime.UTC),
        "id": uuid.UUID(int=7),
        "plain": {1: (1.5, None, b"x")},
    }


def test_the_bytes_are_langgraphs() -> None:
    state = _state()
    assert pack(state) == JsonPlusSerializer().dumps_typed(state)[1]
    assert AgentqSerializer().dumps_typed(state) == JsonPlusSerializer().dumps_typed(state)


def test_a_serializer_revives_every_class_it_has_written_however_deep() -> None:
    writer = AgentqSerializer()
    typed = writer.dumps_typed(_state())
    theirs = JsonPlusSerializer(allowed_msgpack_modules=[Refund, Inner, Case, Level])
    assert writer.loads_typed(typed) == theirs.loads_typed(typed)
    assert AgentqSerializer().loads_typed(typed) != theirs.loads_typed(typed)


def test_reading_gives_what_langgraph_gives_under_the_same_allowlist() -> None:
    allowed = [Refund, Inner, Case, Level]
    typed = AgentqSerializer().dumps_typed(_state())
    ours = AgentqSerializer(allowed_types=allowed)
    theirs = JsonPlusSerializer(allowed_msgpack_modules=allowed)
    for _ in range(2):  # the second read takes the remembered classes
        assert ours.loads_typed(typed) == theirs.loads_typed(typed)


def test_a_copy_allowing_more_does_not_widen_the_original() -> None:
    typed = AgentqSerializer().dumps_typed({"refund": Refund(order="1", cents=2)})
    strict = AgentqSerializer()
    wider = strict.with_msgpack_allowlist([Refund])
    assert wider.loads_typed(typed) == {"refund": Refund(order="1", cents=2)}
    assert strict.loads_typed(typed) == {"refund": {"order": "1", "cents": 2}}
    assert wider.loads_typed(typed) == {"refund": Refund(order="1", cents=2)}


def test_a_model_that_no_longer_validates_comes_back_as_langgraph_builds_it() -> None:
    typed = AgentqSerializer().dumps_typed([Refund(order="1", cents=2)])
    reader = AgentqSerializer(allowed_types=[Refund])
    assert reader.loads_typed(typed) == [Refund(order="1", cents=2)]
    # As a model written before the class changed would be stored.
    fields = (Refund.__module__, "Refund", {"order": "2", "cents": "many"}, "model_validate_json")
    typed = ("msgpack", ormsgpack.packb([ormsgpack.Ext(EXT_PYDANTIC_V2, ormsgpack.packb(fields))]))
    expected = JsonPlusSerializer(allowed_msgpack_modules=[Refund]).loads_typed(typed)
    got = reader.loads_typed(typed)
    assert type(got[0]) is type(expected[0]) and got[0].__dict__ == expected[0].__dict__
