"""Values agentq cannot keep are refused with the exact place and the fix, before any write."""

from __future__ import annotations

import collections
import datetime as dt
import enum
import signal
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentq.codec.envelope import decode_checkpoint, decode_value, encode_checkpoint, encode_value
from agentq.errors import InvalidEffectKey, InvalidThreadId, UnserializableState
from agentq.records import Checkpoint
from agentq.store.sqlite.store import SQLiteStore
from tests.store.raw import snapshot

TTL = 30.0


def cp(step: int, token: int, **state: Any) -> Checkpoint:
    return Checkpoint(step=step, node=f"node{step}", state=dict(state), token=token, task="agent")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    with SQLiteStore(tmp_path / "agentq.db", keep_last=5) as backend:
        yield backend


@pytest.fixture
def token(store: SQLiteStore) -> int:
    store.open_thread("t1", task="agent", input={"q": "hi"})
    return store.acquire("t1", "w1", TTL)


# -- thread ids and effect keys that could forge a log line (tests/test_ids.py) ------------


def test_the_store_refuses_such_ids_before_creating_anything(
    store: SQLiteStore, token: int
) -> None:
    before = snapshot(store)
    with pytest.raises(InvalidThreadId, match="U\\+2028"):
        store.open_thread("t\u20282", task="agent")
    with pytest.raises(InvalidEffectKey, match="U\\+0085"):
        store.claim_effect("t1", "charge\x85card", token)
    assert snapshot(store) == before


# -- ints beyond 64 bits -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "path"),
    [
        ({"big": 2**64}, "state.big"),
        ({"ok": 1, "small": -(2**63) - 1}, "state.small"),
        ({"rows": [{"id": 1}, {"id": 10**30}]}, "state.rows[1].id"),
        ({"pair": (1, 2**100)}, "state.pair[1]"),
        ({"by_id": {2**64: "x"}}, "state.by_id[18446744073709551616] (a key)"),
    ],
)
def test_an_oversized_int_names_its_path_and_the_fix(state: dict[str, Any], path: str) -> None:
    with pytest.raises(UnserializableState) as info:
        encode_checkpoint("t1", cp(1, 1, **state))
    assert info.value.path == path
    message = str(info.value)
    assert f"{path}: " in message and "64 bits" in message and "string" in message


def test_ints_at_the_64_bit_limits_are_kept() -> None:
    state = {"max": 2**64 - 1, "min": -(2**63)}
    encoded = encode_checkpoint("t1", cp(0, 1, **state))
    assert decode_checkpoint("t1", encoded.snapshot).state == state


def test_an_oversized_int_in_a_stored_value_names_its_path() -> None:
    with pytest.raises(UnserializableState) as info:
        encode_value({"n": 2**64}, what="input", thread_id="t1", step=None)
    assert info.value.path == "input.n" and "64 bits" in str(info.value)


# -- nothing unstorable escapes as a bare TypeError or OverflowError -------------------------


@pytest.mark.parametrize(
    ("fields", "path"),
    [
        ({"step": 2**64}, "checkpoint.step"),
        ({"token": -(2**64)}, "checkpoint.token"),
        ({"node": object()}, "checkpoint.node"),
        ({"task": object()}, "checkpoint.task"),
    ],
)
def test_bad_checkpoint_fields_raise_unserializable_state(
    fields: dict[str, Any], path: str
) -> None:
    checkpoint = Checkpoint(**{"step": 0, "node": "n", "token": 1, "task": "agent", **fields})
    with pytest.raises(UnserializableState) as info:
        encode_checkpoint("t1", checkpoint)
    assert info.value.path == path


def test_a_lone_surrogate_names_its_path() -> None:
    with pytest.raises(UnserializableState) as info:
        encode_checkpoint("t1", cp(1, 1, notes=["fine", "bad \udc80 text"]))
    assert info.value.path == "state.notes[1]" and "U+DC80" in str(info.value)


def test_a_value_that_contains_itself_names_where_the_cycle_closes() -> None:
    loop: list[Any] = []
    loop.append({"back": loop})
    with pytest.raises(UnserializableState) as info:
        encode_checkpoint("t1", cp(1, 1, loop=loop))
    assert info.value.path == "state.loop[0].back" and "contains itself" in str(info.value)


@pytest.mark.parametrize("container", [list, tuple])
def test_nesting_too_deep_to_store_is_refused_not_crashed(container: type) -> None:
    value: Any = 1
    for _ in range(5000):
        value = container([value])
    with pytest.raises(UnserializableState) as info:
        encode_checkpoint("t1", cp(1, 1, deep=value))
    assert info.value.path == "state" and "nested too deeply" in str(info.value)


# -- a refused commit leaves the store as it was ---------------------------------------------


def test_a_refused_commit_leaves_the_stored_thread_unchanged(
    store: SQLiteStore, token: int
) -> None:
    first = cp(0, token, total=10, rows=[1, 2])
    store.commit("t1", token, first)
    before = snapshot(store)
    with pytest.raises(UnserializableState) as info:
        store.commit("t1", token, cp(1, token, total=2**64, rows=[1, 2, 3]))
    assert info.value.path == "state.total"
    assert (info.value.thread_id, info.value.step) == ("t1", 1)
    assert store.latest("t1") == first
    assert store.meta("t1").step == 0  # type: ignore[union-attr]
    assert snapshot(store) == before
    # the thread is not wedged: the corrected step commits
    store.commit("t1", token, cp(1, token, total="18446744073709551616", rows=[1, 2, 3]))
    assert store.latest("t1").state["total"] == "18446744073709551616"  # type: ignore[union-attr]


def test_a_refused_result_or_log_item_leaves_the_store_unchanged(
    store: SQLiteStore, token: int
) -> None:
    first = cp(0, token, messages=["hi"])
    store.commit("t1", token, first, logs={"messages": 0})
    before = snapshot(store)
    with pytest.raises(UnserializableState) as info:
        store.commit("t1", token, cp(1, token, messages=["hi", {"n": 2**70}]), logs={"messages": 1})
    assert info.value.path == "state.messages[1].n"
    with pytest.raises(UnserializableState) as info:
        store.commit("t1", token, cp(1, token, messages=["hi"]), result={"id": 2**64})
    assert info.value.path == "result.id"
    assert snapshot(store) == before
    assert store.latest("t1") == first


@pytest.mark.parametrize(
    ("fields", "path", "fix"),
    [
        ({"state": None}, "state", "or .clear() it"),
        ({"state": ["a"]}, "state", "or .clear() it"),
        ({"pending": None}, "pending", "run.pending = [] when none"),
        ({"pending": {"id": "c1"}}, "pending", "run.pending = [] when none"),
        ({"cursors": [3]}, "cursors", "run.cursors['name']"),
    ],
)
def test_a_state_pending_or_cursors_of_another_type_is_refused_before_any_write(
    store: SQLiteStore, token: int, fields: dict[str, Any], path: str, fix: str
) -> None:
    """Stored, it would decode, but every node after it, ``agentq show`` and the inspector
    would fail on it, and a retry would start from it again."""
    first = cp(0, token, total=1)
    store.commit("t1", token, first)
    before = snapshot(store)
    bad = Checkpoint(**{"step": 1, "node": "n", "token": token, "task": "agent", **fields})
    with pytest.raises(UnserializableState) as info:
        store.commit("t1", token, bad)
    assert info.value.path == path and (info.value.thread_id, info.value.step) == ("t1", 1)
    assert f"run.{path} was set to" in str(info.value) and fix in str(info.value)
    assert snapshot(store) == before
    assert store.latest("t1") == first


def test_pending_calls_kept_as_a_tuple_are_stored_as_before(store: SQLiteStore, token: int) -> None:
    store.commit("t1", token, Checkpoint(step=0, node="n", pending=({"id": "c1"},), token=token))
    assert store.latest("t1").pending == ({"id": "c1"},)  # type: ignore[union-attr]


# -- values that would come back as another type or value are refused -----------------------


class Color(str, enum.Enum):  # noqa: UP042  # str() of a member is "Color.RED"
    RED = "red"


class Stage(enum.StrEnum):
    REVIEW = "review"


class Priority(enum.IntEnum):
    HIGH = 1


Point = collections.namedtuple("Point", "x y")


@pytest.mark.parametrize(
    ("value", "fix"),
    [
        (Color.RED, "Color(value)"),
        (Stage.REVIEW, "Stage(value)"),
        (Priority.HIGH, "Priority(value)"),
        (Point(1, 2), "._asdict()"),
        (collections.defaultdict(list, a=[1]), "dict("),
        (collections.OrderedDict(a=1), "dict("),
        (collections.Counter("aab"), "dict("),
        (types.MappingProxyType({"a": 1}), "dict("),
    ],
    ids=[
        "str-enum",
        "StrEnum",
        "IntEnum",
        "namedtuple",
        "defaultdict",
        "OrderedDict",
        "Counter",
        "mappingproxy",
    ],
)
def test_a_subclass_is_refused_rather_than_stored_as_its_base_type(value: Any, fix: str) -> None:
    """A worker that goes on from a step keeps the value it holds; one that resumes the
    thread after a crash reads the stored one: a named tuple would lose its fields there,
    a defaultdict its default, an enum member its type (a (str, Enum) one its value)."""
    with pytest.raises(UnserializableState) as info:
        encode_checkpoint("t1", cp(1, 1, rows=[{"v": value}]))
    assert info.value.path == "state.rows[0].v"
    assert type(value).__name__ in str(info.value) and fix in str(info.value)
    if _hashable(value):
        with pytest.raises(UnserializableState) as info:
            encode_checkpoint("t1", cp(1, 1, by={value: 1}))
        assert info.value.path == f"state.by[{value!r}] (a key)"


def _hashable(value: object) -> bool:
    """Whether ``value`` can be a dict key. Not ``isinstance(value, Hashable)``: from
    Python 3.12 a mappingproxy has a ``__hash__``, which fails on the dict it wraps."""
    try:
        hash(value)
    except TypeError:
        return False
    return True


class Score(float):
    """Like numpy's float64: a number whose type adds nothing the state needs."""

    def __str__(self) -> str:
        return "score"


class Label(str):
    def __str__(self) -> str:
        return "label"


def test_a_text_or_number_of_a_subclass_is_stored_as_its_plain_value() -> None:
    """The same value comes back, as the plain type: not what the subclass's __str__
    says, and not refused like an enum member, whose type is its meaning."""
    encoded = encode_checkpoint("t1", cp(1, 1, score=Score(0.25), label=Label("x")))
    stored = decode_checkpoint("t1", encoded.snapshot)
    assert stored.state == {"score": 0.25, "label": "x"}
    assert type(stored.state["score"]) is float and type(stored.state["label"]) is str


def test_a_refused_subclass_leaves_the_stored_thread_unchanged(
    store: SQLiteStore, token: int
) -> None:
    first = cp(0, token, color="red")
    store.commit("t1", token, first)
    before = snapshot(store)
    with pytest.raises(UnserializableState) as info:
        store.commit("t1", token, cp(1, token, color=Color.RED))
    assert (info.value.thread_id, info.value.step, info.value.path) == ("t1", 1, "state.color")
    assert snapshot(store) == before and store.latest("t1") == first


# -- an exception from a signal handler while decoding ---------------------------------------


class Alarm(Exception):
    """What a signal handler raises, as Celery's soft time limit does."""


def test_an_exception_raised_by_a_signal_while_decoding_is_not_taken_for_damage() -> None:
    """Celery's soft time limit raises from its signal handler wherever the worker is:
    landing in the decoding of a checkpoint, it is still the time limit, not damaged
    bytes that an operator would restore from a backup."""
    # Mostly tuples: the decoder calls back into Python for each, where handlers run.
    data = encode_value([(n,) for n in range(50_000)], what="state", thread_id="t1", step=1)

    def alarm(signum: int, frame: object) -> None:
        raise Alarm

    previous = signal.signal(signal.SIGALRM, alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        with pytest.raises(Alarm):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                decode_value(data, what="state", thread_id="t1", step=1)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class Moment(dt.datetime):
    """Like pendulum's DateTime: a datetime with more methods."""


def test_a_datetime_of_a_subclass_is_stored_as_a_plain_one() -> None:
    at = Moment(2026, 12, 7, 9, 30, tzinfo=dt.UTC)
    encoded = encode_checkpoint("t1", cp(1, 1, at=at, day=at.date()))
    stored = decode_checkpoint("t1", encoded.snapshot)
    assert stored.state == {"at": at, "day": dt.date(2026, 12, 7)}
    assert type(stored.state["at"]) is dt.datetime
