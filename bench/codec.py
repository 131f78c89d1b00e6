"""Encoding and decoding a 500-message state: msgpack as agentq uses it, against ormsgpack
and msgspec, and whether either could replace it without changing a stored byte.

Run from the repository root::

    python -m bench.codec [--quick]

The state: ``messages``, 500 chat messages of ~300 bytes (user, model replies with tool
calls, tool results; every tenth carries a ``datetime``), a ``plan`` dict, a ``set`` of tool
names, a ``(page, offset)`` tuple cursor and a start ``datetime``: about 150 KB encoded.
agentq stores tuples, sets, frozensets, datetimes and dates as msgpack ext types through
msgpack's ``default=`` hook (``strict_types=True``), see :mod:`agentq.codec.envelope`.

Each variant encodes and decodes the state, rounds interleaved; the median of encode +
decode is compared with agentq's codec (the baseline). For each variant the run also checks
whether it writes byte-identical output (so stored checkpoints stay readable both ways),
reads agentq's bytes back to an equal state, and round-trips its own output faithfully
(tuples stay tuples). Variants:

- **ormsgpack**: ``default=`` hook with ``OPT_PASSTHROUGH_TUPLE | _DATETIME | _SUBCLASS``
  and ``OPT_NON_STR_KEYS``, so the hook sees exactly what msgpack's does;
- **msgspec**: its native encoding (tuples and sets become arrays, datetimes its own
  format: msgspec offers no way to route a natively supported type to a hook);
- **msgspec + pre-pass**: a Python walk first turns tuples, sets and datetimes into
  ``msgspec.msgpack.Ext``, as identical output would require.

ormsgpack and msgspec are not dependencies of agentq, only of its ``bench`` extra (which
``make bench`` installs): a variant whose library is missing says "not installed".
"""

from __future__ import annotations

import datetime as dt
import importlib
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentq import codec as agentq_codec
from bench import _chat
from bench._report import Result, exit_with, median, micros, size, skipped, standalone

ROUNDS = {False: 400, True: 40}
WARMUP = 5
Encode = Callable[[Any], bytes]
Decode = Callable[[bytes], Any]


def representative_state() -> dict[str, Any]:
    start = dt.datetime(2025, 3, 1, 9, 30, tzinfo=dt.UTC)
    messages = _chat.conversation(500)
    for i, message in enumerate(messages[::10]):
        message["at"] = start + dt.timedelta(seconds=37 * i)
    return {
        "messages": messages,
        "plan": {
            "goal": _chat.text(7, 120),
            "steps": ["search", "summarise", "answer"],
            "budget": {"tokens": 120_000, "usd": 2.5},
        },
        "tools_used": {"search", "fetch", "calculator"},
        "cursor": (3, 120),
        "started_at": start,
    }


@dataclass
class Variant:
    name: str
    encode: Encode
    decode: Decode


def _agentq() -> Variant:
    def encode(value: Any) -> bytes:
        return agentq_codec.encode_value(value, what="state", thread_id=None, step=None)

    def decode(data: bytes) -> Any:
        return agentq_codec.decode_value(data, what="state", thread_id=None, step=None)

    return Variant("msgpack (agentq)", encode, decode)


def _ext_payload(obj: object) -> tuple[int, Any] | None:
    """agentq's ext code and the value packed inside it, or ``None`` for other types."""
    if isinstance(obj, tuple):
        return 1, list(obj)
    if isinstance(obj, frozenset):
        return 3, list(obj)
    if isinstance(obj, set):
        return 2, list(obj)
    if isinstance(obj, dt.datetime):
        return 4, obj.isoformat().encode()
    if isinstance(obj, dt.date):
        return 5, obj.isoformat().encode()
    return None


def _from_ext(code: int, data: bytes, unpack: Decode) -> Any:
    if code in (1, 2, 3):
        items = unpack(data)
        return (tuple, set, frozenset)[code - 1](items)
    if code == 4:
        return dt.datetime.fromisoformat(data.decode())
    if code == 5:
        return dt.date.fromisoformat(data.decode())
    raise ValueError(f"unknown ext type {code}")


def _ormsgpack() -> Variant:
    ormsgpack: Any = importlib.import_module("ormsgpack")
    options = (
        ormsgpack.OPT_PASSTHROUGH_TUPLE
        | ormsgpack.OPT_PASSTHROUGH_DATETIME
        | ormsgpack.OPT_PASSTHROUGH_SUBCLASS
        | ormsgpack.OPT_NON_STR_KEYS
    )

    def default(obj: object) -> Any:
        found = _ext_payload(obj)
        if found is None:
            raise TypeError(f"cannot store {type(obj).__name__}")
        code, inner = found
        return ormsgpack.Ext(code, inner if isinstance(inner, bytes) else encode(inner))

    def encode(value: Any) -> bytes:
        return ormsgpack.packb(value, default=default, option=options)  # type: ignore[no-any-return]

    def ext_hook(code: int, data: bytes) -> Any:
        return _from_ext(code, data, decode)

    def decode(data: bytes) -> Any:
        return ormsgpack.unpackb(data, ext_hook=ext_hook, option=ormsgpack.OPT_NON_STR_KEYS)

    return Variant("ormsgpack", encode, decode)


def _msgspec(prepass: bool) -> Variant:
    msgspec: Any = importlib.import_module("msgspec")
    Ext = msgspec.msgpack.Ext

    def enc_hook(obj: object) -> Any:
        raise TypeError(f"cannot store {type(obj).__name__}")

    encoder = msgspec.msgpack.Encoder(enc_hook=enc_hook)

    def to_ext(value: Any) -> Any:
        kind = type(value)
        if kind is dict:
            return {key: to_ext(item) for key, item in value.items()}
        if kind is list:
            return [to_ext(item) for item in value]
        if kind in (str, int, float, bool, bytes) or value is None:
            return value
        found = _ext_payload(value)
        if found is None:
            return value
        code, inner = found
        return Ext(code, inner if isinstance(inner, bytes) else encoder.encode(to_ext(inner)))

    def ext_hook(code: int, data: memoryview) -> Any:
        return _from_ext(code, bytes(data), decode)

    decoder = msgspec.msgpack.Decoder(ext_hook=ext_hook)

    def encode(value: Any) -> bytes:
        return encoder.encode(to_ext(value) if prepass else value)  # type: ignore[no-any-return]

    def decode(data: bytes) -> Any:
        return decoder.decode(data)

    return Variant("msgspec + pre-pass" if prepass else "msgspec", encode, decode)


VARIANTS: tuple[tuple[str, str, Callable[[], Variant]], ...] = (
    ("ormsgpack", "ormsgpack", _ormsgpack),
    ("msgspec", "msgspec", lambda: _msgspec(False)),
    ("msgspec_prepass", "msgspec", lambda: _msgspec(True)),
)


def timed(variants: list[Variant], state: Any, rounds: int) -> dict[str, list[tuple[float, float]]]:
    """(encode, decode) seconds per round for each variant, rounds interleaved."""
    encoded = {v.name: v.encode(state) for v in variants}
    times: dict[str, list[tuple[float, float]]] = {v.name: [] for v in variants}
    clock = time.perf_counter
    for turn in range(WARMUP + rounds):
        for variant in variants if turn % 2 else variants[::-1]:
            start = clock()
            variant.encode(state)
            middle = clock()
            variant.decode(encoded[variant.name])
            end = clock()
            if turn >= WARMUP:
                times[variant.name].append((middle - start, end - middle))
    return times


def _total(times: list[tuple[float, float]]) -> float:
    return median([enc + dec for enc, dec in times])


def _split(times: list[tuple[float, float]]) -> str:
    enc, dec = (median([t[i] for t in times]) for i in (0, 1))
    return f"{micros(enc + dec)} ({micros(enc)} + {micros(dec)})"


def _checks(variant: Variant, state: Any, reference: bytes) -> tuple[bool, bool, bool]:
    """(byte-identical output, reads agentq's bytes, round-trips its own output)."""
    own = variant.encode(state)
    try:
        reads = variant.decode(reference) == state
    except Exception:
        reads = False
    try:
        faithful = variant.decode(own) == state
    except Exception:
        faithful = False
    return own == reference, reads, faithful


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def run(quick: bool) -> list[Result]:
    state = representative_state()
    base = _agentq()
    reference = base.encode(state)
    assert base.decode(reference) == state
    variants, missing = [base], []
    tags: dict[str, str] = {}
    for tag, module, factory in VARIANTS:
        try:
            variant = factory()
        except ImportError:
            missing.append((tag, module))
            continue
        variants.append(variant)
        tags[variant.name] = tag
    times = timed(variants, state, ROUNDS[quick])
    base_time = _total(times[base.name])
    results: list[Result] = []
    candidates: list[tuple[float, str]] = []
    for variant in variants[1:]:
        identical, reads, faithful = _checks(variant, state, reference)
        ratio = _total(times[variant.name]) / base_time
        if identical and reads and faithful:
            candidates.append((ratio, variant.name))
        results.append(
            Result(
                "ratio",
                f"codec_{tags[variant.name]}_over_msgpack",
                ratio,
                f"{variant.name} enc+dec ÷ msgpack, 500 msgs",
                _split(times[variant.name]),
                _split(times[base.name]),
                None,
                f"identical bytes {_yes(identical)}, reads agentq's {_yes(reads)}, "
                f"round-trips {_yes(faithful)}",
            )
        )
    for tag, module in missing:
        results.append(
            skipped(
                "ratio",
                f"codec_{tag}_over_msgpack",
                f"{tag} enc+dec ÷ msgpack",
                f"{module} not installed",
            )
        )
    what = "verdict: fastest byte-identical ÷ msgpack"
    if candidates:
        ratio, name = min(candidates)
        note = (
            f"{name} could replace msgpack without changing a stored byte"
            if ratio < 1
            else "no byte-identical library is faster: keep msgpack"
        )
        results.append(
            Result(
                "ratio",
                "codec_best_identical_over_msgpack",
                ratio,
                what,
                name,
                f"{size(len(reference))} state",
                None,
                note,
            )
        )
    else:
        results.append(
            Result(
                "ratio",
                "codec_best_identical_over_msgpack",
                1.0,
                what,
                "msgpack",
                f"{size(len(reference))} state",
                None,
                "no byte-identical alternative measured: keep msgpack",
            )
        )
    return results


def header() -> str:
    versions = []
    for module in ("msgpack", "ormsgpack", "msgspec"):
        try:
            found = importlib.import_module(module)
        except ImportError:
            versions.append(f"{module}=absent")
            continue
        version = getattr(found, "__version__", None) or ".".join(
            map(str, getattr(found, "version", ("?",)))
        )
        versions.append(f"{module}={version}")
    return f"codec: python={platform.python_version()} " + " ".join(versions)


def main(argv: list[str] | None = None) -> int:
    print(header())
    return standalone("python -m bench.codec", __doc__, run, argv)


if __name__ == "__main__":
    exit_with(main)
