"""What the saver adds to LangGraph's contract, or what the conformance suite does not pin
down: blob reuse, write ordering and precedence, fencing, deletion with the agentq thread,
key layout, serialisation without pickle, and the sync methods on their own."""

from __future__ import annotations

import dataclasses
import sys
import threading
import uuid
from enum import Enum
from pathlib import Path
from typing import Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.base import Checkpoint, CheckpointMetadata, empty_checkpoint
from langgraph.checkpoint.serde.types import ERROR, INTERRUPT
from langgraph.graph import START, StateGraph
from langgraph.types import Command, interrupt

from agentq.errors import (
    CheckpointTooLarge,
    CodecError,
    InvalidArgument,
    InvalidThreadId,
    LeaseHeld,
    StaleToken,
    ThreadNotFound,
    UnserializableState,
)
from agentq.langgraph import AgentqSaver, AgentqSerializer
from agentq.store.contract import Store
from agentq.store.redis.store import RedisStore
from agentq.store.sqlite.store import SQLiteStore


def config(thread_id: str, ns: str = "", checkpoint_id: str | None = None) -> Any:
    configurable = {"thread_id": thread_id, "checkpoint_ns": ns}
    if checkpoint_id is not None:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


def checkpoint(values: dict[str, Any], versions: dict[str, Any]) -> Checkpoint:
    made = empty_checkpoint()
    made["channel_values"] = values
    made["channel_versions"] = versions
    return made


def metadata(step: int, **extra: Any) -> CheckpointMetadata:
    return {"source": "loop", "step": step, "parents": {}, **extra}  # type: ignore[typeddict-item]


def put_chain(saver: AgentqSaver, thread_id: str, n: int, ns: str = "") -> list[Any]:
    """``n`` checkpoints, each the child of the one before, with a changing channel."""
    stored: list[Any] = []
    parent = config(thread_id, ns)
    for step in range(n):
        version = saver.get_next_version(None if step == 0 else str(step), None)
        cp = checkpoint({"n": step}, {"n": version})
        parent = saver.put(parent, cp, metadata(step), {"n": version})
        stored.append(parent)
    return stored


def blob_count(store: Store, thread_id: str, ns: str = "") -> int:
    """How many channel values the store holds for the namespace, read behind the saver."""
    if isinstance(store, RedisStore):
        key = f"{store.keys.thread(thread_id)}lg:blob:{ns}"
        return int(store.client.hlen(key))
    assert isinstance(store, SQLiteStore)
    import sqlite3
    from contextlib import closing

    with closing(sqlite3.connect(store.path)) as db:
        (count,) = db.execute(
            "SELECT COUNT(*) FROM lg_blobs WHERE thread_id = ? AND ns = ?", (thread_id, ns)
        ).fetchone()
    return int(count)


def test_unchanged_channels_are_not_written_again(saver: AgentqSaver, store: Store) -> None:
    big = "x" * 10_000
    first = saver.put(
        config("t1"),
        checkpoint({"doc": big, "n": 0}, {"doc": "1", "n": "1"}),
        metadata(0),
        {"doc": "1", "n": "1"},
    )
    assert blob_count(store, "t1") == 2
    second = saver.put(
        first, checkpoint({"doc": big, "n": 1}, {"doc": "1", "n": "2"}), metadata(1), {"n": "2"}
    )
    assert blob_count(store, "t1") == 3  # only n's new version was written
    for stored, n in ((first, 0), (second, 1)):
        got = saver.get_tuple(stored)
        assert got is not None and got.checkpoint["channel_values"] == {"doc": big, "n": n}


def test_a_channel_cleared_at_a_version_reads_as_absent(saver: AgentqSaver) -> None:
    stored = saver.put(config("t1"), checkpoint({}, {"gone": "1"}), metadata(0), {"gone": "1"})
    got = saver.get_tuple(stored)
    assert got is not None and got.checkpoint["channel_values"] == {}
    assert got.checkpoint["channel_versions"] == {"gone": "1"}


def test_get_tuple_by_id_and_latest_per_namespace(saver: AgentqSaver) -> None:
    root = put_chain(saver, "t1", 3)
    child = put_chain(saver, "t1", 2, ns="tools:abc|inner:1")
    latest = saver.get_tuple(config("t1"))
    assert latest is not None
    assert (
        latest.config["configurable"]["checkpoint_id"] == root[-1]["configurable"]["checkpoint_id"]
    )
    assert latest.parent_config == {
        "configurable": {
            "thread_id": "t1",
            "checkpoint_ns": "",
            "checkpoint_id": root[1]["configurable"]["checkpoint_id"],
        }
    }
    got = saver.get_tuple(config("t1", "tools:abc|inner:1"))
    assert got is not None and got.config == child[-1]
    assert got.checkpoint["channel_values"] == {"n": 1}
    first = saver.get_tuple(root[0])
    assert first is not None and first.parent_config is None
    assert first.checkpoint["channel_values"] == {"n": 0}
    assert saver.get_tuple(config("t1", "nope")) is None
    assert saver.get_tuple(config("t1", checkpoint_id=str(uuid.uuid4()))) is None


def test_an_empty_checkpoint_id_is_no_checkpoint_id(saver: AgentqSaver) -> None:
    """As LangGraph's own savers read it, on either store."""
    put_chain(saver, "t1", 3)
    latest = saver.get_tuple(config("t1"))
    empty = saver.get_tuple(config("t1", checkpoint_id=""))
    assert latest is not None and empty is not None
    assert empty.checkpoint["id"] == latest.checkpoint["id"]
    every = [t.checkpoint["id"] for t in saver.list(config("t1"))]
    before_nothing = saver.list(config("t1"), before=config("t1", checkpoint_id=""))
    assert [t.checkpoint["id"] for t in before_nothing] == every
    assert [t.checkpoint["id"] for t in saver.list(config("t1", checkpoint_id=""))] == every


def test_list_orders_newest_first_across_namespaces_and_threads(saver: AgentqSaver) -> None:
    root = put_chain(saver, "t1", 2)
    child = put_chain(saver, "t1", 2, ns="child:1")
    other = put_chain(saver, "t2", 1)
    ids = [c["configurable"]["checkpoint_id"] for c in root + child]
    everything = [
        t.config["configurable"]["checkpoint_id"]
        for t in saver.list({"configurable": {"thread_id": "t1"}})
    ]
    assert everything == sorted(ids, reverse=True)
    assert [t.config for t in saver.list(config("t1", "child:1"))] == child[::-1]
    every_thread = [t.config["configurable"]["thread_id"] for t in saver.list(None)]
    assert every_thread == ["t1"] * 4 + ["t2"]
    assert [t.config for t in saver.list(None, limit=5)][-1] == other[0]


def test_list_filters_before_and_limit(saver: AgentqSaver) -> None:
    stored = []
    parent = config("t1")
    for step in range(6):
        parent = saver.put(
            parent,
            checkpoint({}, {}),
            metadata(
                step, source="input" if step % 3 == 0 else "loop", user="ann" if step < 4 else "bob"
            ),
            {},
        )
        stored.append(parent)
    found = list(saver.list(config("t1"), filter={"source": "input"}))
    assert [t.metadata["step"] for t in found] == [3, 0]
    found = list(saver.list(config("t1"), filter={"source": "loop", "user": "ann"}))
    assert [t.metadata["step"] for t in found] == [2, 1]
    found = list(saver.list(config("t1"), before=stored[4], limit=2))
    assert [t.metadata["step"] for t in found] == [3, 2]
    assert list(saver.list(config("t1"), limit=0)) == []
    found = list(saver.list(stored[2]))
    assert [t.metadata["step"] for t in found] == [2]


def test_list_pages_through_long_threads(saver: AgentqSaver) -> None:
    stored = put_chain(saver, "t1", 230)
    listed = [t.config for t in saver.list(config("t1"))]
    assert listed == stored[::-1]
    listed = [t.config for t in saver.list(config("t1"), filter={"step": 3})]
    assert listed == [stored[3]]


def test_pending_writes_order_and_precedence(saver: AgentqSaver) -> None:
    stored = saver.put(config("t1"), checkpoint({}, {}), metadata(0), {})
    saver.put_writes(stored, [("b", 1), ("a", 2)], "task-z", task_path="~__pregel_pull, b")
    saver.put_writes(stored, [("c", 3)], "task-a", task_path="~__pregel_pull, a")
    # A regular write, once stored, is kept; a special one is replaced by the latest.
    saver.put_writes(stored, [("b", 99)], "task-z", task_path="~__pregel_pull, b")
    saver.put_writes(stored, [(ERROR, "first")], "task-e")
    saver.put_writes(stored, [(ERROR, "second"), (INTERRUPT, {"ask": "ok?"})], "task-e")
    got = saver.get_tuple(stored)
    assert got is not None
    assert got.pending_writes == [
        ("task-e", INTERRUPT, {"ask": "ok?"}),
        ("task-e", ERROR, "second"),
        ("task-a", "c", 3),
        ("task-z", "b", 1),
        ("task-z", "a", 2),
    ]


def test_oversized_pending_writes_are_refused_and_stored_ones_stay(
    saver: AgentqSaver, store: Store
) -> None:
    store.max_checkpoint_bytes = 4096
    stored = saver.put(config("t1"), checkpoint({}, {}), metadata(0), {})
    saver.put_writes(stored, [("notes", "small")], "task-a", task_path="~__pregel_pull, a")
    with pytest.raises(CheckpointTooLarge) as refused:
        saver.put_writes(
            stored,
            [("notes", "x" * 3000), ("body", "y" * 3000)],  # each under the limit, not both
            "task-b",
            task_path="~__pregel_pull, summarize",
        )
    assert refused.value.thread_id == "t1" and refused.value.limit == 4096
    assert (refused.value.size or 0) > 6000
    message = str(refused.value)
    assert "LangGraph node 'summarize'" in message and "max_checkpoint_bytes" in message
    with pytest.raises(CheckpointTooLarge, match="LangGraph task 'task-c'"):
        saver.put_writes(stored, [(ERROR, "z" * 5000)], "task-c")
    got = saver.get_tuple(stored)
    assert got is not None and got.pending_writes == [("task-a", "notes", "small")]


def test_messages_and_odd_names_round_trip(saver: AgentqSaver) -> None:
    messages = [HumanMessage("hi", id="1"), AIMessage("hello", id="2")]
    ns = "a%b:c|d:e"
    ids = "1:2%3"
    cp = checkpoint(
        {"messages": messages, "ch:with:colons": b"\x00\xff"},
        {"messages": "1", "ch:with:colons": "1"},
    )
    cp["id"] = ids
    stored = saver.put(config("t1", ns), cp, metadata(0), {"messages": "1", "ch:with:colons": "1"})
    saver.put_writes(stored, [("messages", [AIMessage("more", id="3")])], "task:1")
    got = saver.get_tuple(config("t1", ns, ids))
    assert got is not None
    assert got.checkpoint["channel_values"] == {"messages": messages, "ch:with:colons": b"\x00\xff"}
    assert got.pending_writes == [("task:1", "messages", [AIMessage("more", id="3")])]
    assert [t.config for t in saver.list(config("t1", ns))] == [stored]
    saver.delete_thread("t1")
    assert saver.get_tuple(config("t1", ns)) is None


@dataclasses.dataclass
class Invoice:
    number: str
    amount: int


def test_types_are_revived_only_when_allowed(store: Store) -> None:
    writer = AgentqSaver(store)
    stored = writer.put(
        config("t1"),
        checkpoint({"inv": Invoice("A-1", 3)}, {"inv": "1"}),
        metadata(0),
        {"inv": "1"},
    )
    got = writer.get_tuple(stored)  # it wrote an Invoice itself
    assert got is not None and got.checkpoint["channel_values"]["inv"] == Invoice("A-1", 3)
    fresh = AgentqSaver(store)  # a new process, which has written nothing
    got = fresh.get_tuple(stored)
    assert got is not None and got.checkpoint["channel_values"]["inv"] == {
        "number": "A-1",
        "amount": 3,
    }
    allowing = AgentqSaver(store, serde=AgentqSerializer(allowed_types=[Invoice]))
    got = allowing.get_tuple(stored)
    assert got is not None and got.checkpoint["channel_values"]["inv"] == Invoice("A-1", 3)


def test_a_stored_class_nobody_declared_is_neither_imported_nor_called(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran = tmp_path / "ran"
    module = f"planted_{uuid.uuid4().hex}"
    (tmp_path / f"{module}.py").write_text(
        f"import pathlib\npathlib.Path({str(ran)!r}).write_text('imported')\nPlanted = dict\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    # Bytes as a hostile writer of the store would leave them: LangGraph revives an enum
    # by calling module.name(value), here os.system("touch ..."), and a dataclass by
    # importing its module. Written through another saver, so the reader never saw them.
    command = Enum("system", {"RUN": f"touch {ran}"}, module="os")  # type: ignore[misc]
    planted = dataclasses.make_dataclass(
        "Planted", [("value", int)], namespace={"__module__": module}
    )
    stored = AgentqSaver(store).put(
        config("t1"),
        checkpoint({"cmd": command.RUN, "planted": planted(1)}, {"cmd": "1", "planted": "1"}),
        metadata(0),
        {"cmd": "1", "planted": "1"},
    )
    reader = AgentqSaver(store).for_graph(_invoice_graph())
    got = reader.get_tuple(stored)
    assert got is not None
    assert got.checkpoint["channel_values"] == {"cmd": f"touch {ran}", "planted": {"value": 1}}
    assert not ran.exists()
    assert module not in sys.modules


def _invoice_graph() -> Any:
    class State(TypedDict):
        inv: Invoice

    builder = StateGraph(State)
    builder.add_node("n", lambda state: {})
    builder.add_edge(START, "n")
    return builder


def test_a_saver_for_a_graph_revives_what_the_graph_declares(store: Store) -> None:
    stored = AgentqSaver(store).put(
        config("t1"),
        checkpoint({"inv": Invoice("A-1", 3)}, {"inv": "1"}),
        metadata(0),
        {"inv": "1"},
    )
    got = AgentqSaver(store).for_graph(_invoice_graph()).get_tuple(stored)
    assert got is not None and got.checkpoint["channel_values"]["inv"] == Invoice("A-1", 3)


class Opaque:
    """Nothing msgpack can hold; pickle could."""


def test_nothing_is_pickled(saver: AgentqSaver) -> None:
    with pytest.raises(UnserializableState, match="channel 'x'"):
        saver.put(config("t1"), checkpoint({"x": Opaque()}, {"x": "1"}), metadata(0), {"x": "1"})
    assert saver.get_tuple(config("t1")) is None
    with pytest.raises(CodecError, match="never stores pickle"):
        saver.serde.loads_typed(("pickle", b"cos\nsystem\n(S'true'\ntR."))
    with pytest.raises(CodecError, match="never writes"):
        saver.serde.loads_typed(("json", b"{}"))


def test_a_user_serde_is_kept_from_pickling(store: Store) -> None:
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    saver = AgentqSaver(store, serde=JsonPlusSerializer(pickle_fallback=True))
    with pytest.raises(CodecError, match="never stores pickle"):
        saver.put(config("t1"), checkpoint({"x": Opaque()}, {"x": "1"}), metadata(0), {"x": "1"})


# -- fencing ---------------------------------------------------------------------------------


def test_a_bound_saver_writes_with_the_current_token(saver: AgentqSaver, store: Store) -> None:
    store.open_thread("t1", task="graph")
    token = store.acquire("t1", "worker-a", 30)
    fenced = saver.bound("t1", token)
    stored = fenced.put(config("t1"), checkpoint({"n": 1}, {"n": "1"}), metadata(0), {"n": "1"})
    fenced.put_writes(stored, [("n", 2)], "task-1")
    got = saver.get_tuple(config("t1"))
    assert got is not None and got.pending_writes == [("task-1", "n", 2)]


def test_a_stale_writer_is_refused_and_writes_nothing(saver: AgentqSaver, store: Store) -> None:
    store.open_thread("t1", task="graph")
    old = store.acquire("t1", "worker-a", 0.05)
    zombie = saver.bound("t1", old)
    first = zombie.put(config("t1"), checkpoint({"n": 1}, {"n": "1"}), metadata(0), {"n": "1"})
    store.acquire("t1", "worker-a", 30)  # a new lease (the old one's owner renewing is the
    # same as another worker taking over: the token moves on)
    with pytest.raises(StaleToken):
        zombie.put(first, checkpoint({"n": 2}, {"n": "2"}), metadata(1), {"n": "2"})
    with pytest.raises(StaleToken):
        zombie.put_writes(first, [("n", 3)], "task-1")
    with pytest.raises(StaleToken):
        zombie.delete_thread("t1")
    got = saver.get_tuple(config("t1"))
    assert got is not None and got.config == first and got.pending_writes == []
    assert len(list(saver.list(config("t1")))) == 1


def test_an_unfenced_write_is_refused_while_a_task_holds_the_lease(
    saver: AgentqSaver, store: Store
) -> None:
    store.open_thread("t1", task="graph")
    token = store.acquire("t1", "worker-a", 30)
    stored = saver.bound("t1", token).put(config("t1"), checkpoint({}, {}), metadata(0), {})
    with pytest.raises(LeaseHeld):
        saver.put(stored, checkpoint({}, {}), metadata(1), {})
    with pytest.raises(LeaseHeld):
        saver.put_writes(stored, [("n", 1)], "task-1")
    with pytest.raises(LeaseHeld):
        saver.delete_thread("t1")
    assert saver.get_tuple(config("t1")) is not None  # reads are never refused
    store.release("t1", "worker-a", token)
    saver.put(stored, checkpoint({}, {}), metadata(1), {})  # e.g. update_state when waiting
    assert len(list(saver.list(config("t1")))) == 2


def test_a_bound_saver_refuses_unknown_and_other_threads(saver: AgentqSaver) -> None:
    with pytest.raises(ThreadNotFound):
        saver.bound("nobody", 1).put(config("nobody"), checkpoint({}, {}), metadata(0), {})
    with pytest.raises(InvalidArgument, match="bound to thread"):
        saver.bound("t1", 1).put(config("t2"), checkpoint({}, {}), metadata(0), {})


def test_thread_ids_are_checked(saver: AgentqSaver) -> None:
    with pytest.raises(InvalidThreadId):
        saver.put(config("a{b}"), checkpoint({}, {}), metadata(0), {})
    with pytest.raises(InvalidArgument, match="thread_id"):
        saver.get_tuple({"configurable": {}})


# -- deleting, copying, pruning ----------------------------------------------------------------


def test_deleting_the_agentq_thread_deletes_its_langgraph_data(
    saver: AgentqSaver, store: Store
) -> None:
    store.open_thread("t1", task="graph")
    stored = put_chain(saver, "t1", 3) + put_chain(saver, "t1", 2, ns="child:1")
    saver.put_writes(stored[-1], [("n", 1)], "task-1")
    put_chain(saver, "t2", 1)
    assert store.delete_thread("t1")
    assert list(saver.list(config("t1"))) == []
    assert blob_count(store, "t1") == 0
    assert len(list(saver.list(None))) == 1
    if isinstance(store, RedisStore):
        left = store.client.keys(f"{store.keys.thread('t1')}*")
        assert left == []


def test_prune_keeps_the_blobs_the_latest_checkpoint_reads(
    saver: AgentqSaver, store: Store
) -> None:
    first = saver.put(
        config("t1"),
        checkpoint({"doc": "d", "n": 0}, {"doc": "1", "n": "1"}),
        metadata(0),
        {"doc": "1", "n": "1"},
    )
    parent = first
    for step in range(1, 4):
        parent = saver.put(
            parent,
            checkpoint({"doc": "d", "n": step}, {"doc": "1", "n": str(step + 1)}),
            metadata(step),
            {"n": str(step + 1)},
        )
    assert blob_count(store, "t1") == 5
    saver.prune(["t1"])
    assert blob_count(store, "t1") == 2
    got = saver.get_tuple(config("t1"))
    assert got is not None and got.checkpoint["channel_values"] == {"doc": "d", "n": 3}
    with pytest.raises(InvalidArgument, match="strategy"):
        saver.prune(["t1"], strategy="most")


def test_delete_for_runs_and_copy_thread(saver: AgentqSaver) -> None:
    a = saver.put(
        config("t1"), checkpoint({"n": 0}, {"n": "1"}), metadata(0, run_id="r1"), {"n": "1"}
    )
    saver.put(a, checkpoint({"n": 1}, {"n": "2"}), metadata(1, run_id="r2"), {"n": "2"})
    saver.copy_thread("t1", "t9")
    copied = [t.checkpoint["channel_values"] for t in saver.list(config("t9"))]
    assert copied == [{"n": 1}, {"n": 0}]
    # A copy keeps its checkpoints' run ids: deleting a run deletes them in both threads.
    saver.delete_for_runs(["r2"])
    for thread_id in ("t1", "t9"):
        assert [t.metadata["run_id"] for t in saver.list(config(thread_id))] == ["r1"]
    saver.delete_for_runs(["r1"])
    assert list(saver.list(None)) == []


class Counter(TypedDict):
    n: int


def test_deleting_a_resuming_run_takes_its_writes_to_the_checkpoint_it_resumed(
    saver: AgentqSaver, store: Store
) -> None:
    """A run resuming an interrupted thread writes its answer and its node's output
    against the checkpoint it resumes, the earlier run's: deleting the run (a rollback)
    must delete those too, or the thread reads as if the node had finished."""

    def ask(state: Counter) -> dict[str, int]:
        return {"n": state["n"] + interrupt("how many?")}

    builder = StateGraph(Counter)
    builder.add_node("ask", ask)
    builder.add_edge(START, "ask")
    graph = builder.compile(checkpointer=saver)
    thread = {"configurable": {"thread_id": "chat-1"}}

    def run(run_id: str) -> Any:
        return {**thread, "metadata": {"run_id": run_id}}

    graph.invoke({"n": 1}, run("r1"))
    asked = graph.get_state(thread)
    graph.invoke(Command(resume=5), run("r2"))
    assert graph.get_state(thread).values == {"n": 6}
    saver.delete_for_runs(["r2"])
    state = graph.get_state(thread)
    assert (state.values, state.next, state.interrupts) == ({"n": 1}, ("ask",), asked.interrupts)
    assert state.config == asked.config
    assert graph.invoke(Command(resume=7), run("r3"))["n"] == 8
    saver.delete_for_runs(["r3", "r1"])
    assert list(saver.list(None)) == []
    if isinstance(store, RedisStore):
        assert store.client.keys(f"{store.keys.prefix}*") == []


def test_a_thread_of_thousands_of_checkpoints_is_copied_whole(saver: AgentqSaver) -> None:
    """A copy writes each key in commands a script unpacks: one command per key would pass
    Lua's limit of about 8000 values past some 4000 checkpoints."""
    put_chain(saver, "long", 4100)
    saver.copy_thread("long", "long-copy")
    assert len(list(saver.list(config("long-copy")))) == 4100
    latest = saver.get_tuple(config("long-copy"))
    assert latest is not None and latest.checkpoint["channel_values"] == {"n": 4099}


def test_a_copy_made_while_the_source_runs_has_every_value_of_its_checkpoints(
    saver: AgentqSaver,
) -> None:
    """A put landing between the copy's reads of two keys must not leave the copy a
    checkpoint without the values it reads."""
    stop = threading.Event()
    written = threading.Event()

    def write() -> None:
        at = config("busy")
        n = 0
        while not stop.is_set():
            n += 1
            version = f"{n:032}.0"
            at = saver.put(at, checkpoint({"n": n}, {"n": version}), metadata(n), {"n": version})
            written.set()

    writer = threading.Thread(target=write)
    writer.start()
    try:
        assert written.wait(timeout=10)
        for copy in range(100):
            saver.copy_thread("busy", f"copy-{copy}")
            latest = saver.get_tuple(config(f"copy-{copy}"))
            assert latest is not None and "n" in latest.checkpoint["channel_values"], copy
    finally:
        stop.set()
        writer.join(timeout=30)


def test_a_thread_deleted_elsewhere_and_written_again_is_listed(store: Store) -> None:
    """Another worker process deleted the thread, index entries with it: this saver's
    memory of having indexed it must not keep it out of list(None) and delete_for_runs."""
    with AgentqSaver(store) as first, AgentqSaver(store) as other:
        first.put(
            config("chat-1"), checkpoint({"n": 0}, {"n": "1"}), metadata(0, run_id="r1"), {"n": "1"}
        )
        other.delete_thread("chat-1")
        first.put(
            config("chat-1"), checkpoint({"n": 1}, {"n": "2"}), metadata(1, run_id="r1"), {"n": "2"}
        )
        assert [t.config["configurable"]["thread_id"] for t in other.list(None)] == ["chat-1"]
        other.delete_for_runs(["r1"])
        assert first.get_tuple(config("chat-1")) is None


def test_redis_keys_carry_the_thread_hash_tag(saver: AgentqSaver, store: Store) -> None:
    if not isinstance(store, RedisStore):
        pytest.skip("Redis key layout")
    stored = saver.put(
        config("t1", "child:x"),
        checkpoint({"n": 0}, {"n": "1"}),
        metadata(0, run_id="r1"),
        {"n": "1"},
    )
    saver.put_writes(stored, [("n", 1)], "task-1")
    keys = sorted(k.decode() for k in store.client.keys(f"{store.keys.prefix}*"))
    tagged = [k for k in keys if "{t1}" in k]
    assert set(keys) - set(tagged) == {
        f"{store.keys.prefix}lg:{{index}}:threads",
        f"{store.keys.prefix}lg:{{index}}:run:r1",
    }
    assert all(k.startswith(f"{store.keys.prefix}thread:{{t1}}:") for k in tagged)


def test_from_url_opens_and_closes_its_own_store(tmp_path: Any, request: Any) -> None:
    server = request.getfixturevalue("redis_server")
    for url in (f"sqlite:///{tmp_path / 'lg.db'}", server.url):
        with AgentqSaver.from_url(url, prefix=f"fu{uuid.uuid4().hex[:6]}:") as saver:
            stored = saver.put(
                config("t1"), checkpoint({"n": 1}, {"n": "1"}), metadata(0), {"n": "1"}
            )
            got = saver.get(stored)
            assert got is not None and got["channel_values"] == {"n": 1}
