"""The benchmark suite: every benchmark, one table.

Run from the repository root::

    python -m bench            # full size, a few minutes (limits alone about 13)
    python -m bench --quick    # everything small, to prove it works (CI)
    python -m bench --only steps,codec

Each row is a number measured against a baseline taken in the same run (or an absolute
figure), with our target where there is one: printed with a verdict, never asserted.
After the table, one ``ratio <name> <value>`` / ``figure <name> <value>`` line per row.

The benchmarks (each also runs alone as ``python -m bench.<name> [--quick]``):

- ``store``: commit ÷ raw SET, resume ÷ raw GET at 1/10/100 KB (:mod:`bench.store`);
- ``wire``: the commit encoded by hiredis against redis-py's ``pack_commands``, and
  committed through a redis-py pipeline against the pooled path (:mod:`bench.wire`);
- ``steps``: per-step latency and bytes written against conversation length;
- ``agent``: agent steps/s ÷ a raw SET loop ÷ bare Celery, and per-step overhead;
- ``storage``: store size of a finished 200-step thread ÷ its final state, and LangGraph's;
- ``rss``: worker RSS after 10 000 runs ÷ after 100;
- ``codec``: msgpack against ormsgpack and msgspec;
- ``concurrency``: 1000 threads of 0.5 s waits on ``-P threads``/``gevent`` (sync and
  ``async def`` nodes) and 100 on SQLite, wall time ÷ plain Celery tasks doing the same
  waits, with failed threads, lease takeovers, pool errors, peak connections and RSS;
- ``ui``: the inspector's threads page over 100 000 threads, server time and ÷ one
  ``ZREVRANGE`` page of the status index (:mod:`bench.ui`);
- ``limits``: a fake provider's 429s, calls a minute, busy pool slots and two tenants'
  shares under an agentq limit, against Celery's per-worker ``rate_limit`` for the same
  budget (4 workers x 50 threads x 10 calls at 600/min: about 13 minutes at full size);
- ``thread_keys``: a concurrency key's enter and leave on a run's lease cycle, and parking
  behind 1000 waiters, against the bare cycle (:mod:`bench.thread_keys`);
- ``send``: ``agent.delay()`` per second from 1 and 16 threads, no worker running, against
  a plain task's ``delay()`` (:mod:`bench.send`);
- ``recovery``, ``langgraph``: run when their modules are present (:data:`EXTERNAL`).

Needs ``redis-server`` on PATH (private servers are started and stopped) and, for
``agent`` and ``rss``, the machine's Redis on 127.0.0.1:6379 as broker
(``AGENTQ_BENCH_BROKER`` to change it). Exits 1 if a benchmark failed to run.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import inspect
import io
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from bench._report import (
    Kind,
    Result,
    Target,
    exit_with,
    machine_line,
    report,
    skipped,
    terminate_as_interrupt,
)

Runner = Callable[[bool], list[Result]]


def store_results(quick: bool) -> list[Result]:
    """The rows of :mod:`bench.store`, through its own functions (it stays the reference)."""
    from agentq.store.redis.store import RedisStore
    from bench import store as bench_store
    from bench._redis import PrivateRedis

    samples = 300 if quick else bench_store.DEFAULT_SAMPLES
    warmup = max(20, samples // 10)
    rows: list[Any] = []
    parts: list[Result] = []
    with PrivateRedis() as server:
        client = server.client()
        try:
            store = RedisStore(client)
            for label, nbytes in bench_store.SIZES:
                found, _, spent = bench_store.bench_size(
                    store, client, label, nbytes, samples, warmup, bench_store.BLOCK
                )
                rows += found
                parts += [
                    Result(
                        "figure",
                        f"commit_{label}_{part}_us",
                        micros,
                        f"  commit {label}B beyond a SET: {what}, µs",
                    )
                    for part, what in (("encode", "encoding"), ("script", "server script"))
                    for micros in (spent[part],)
                ]
        finally:
            client.close()
    rows.sort(key=lambda row: row.ratio_name.startswith("resume"))
    return [
        Result(
            "ratio",
            row.ratio_name,
            row.ratio,
            f"{row.subject.name} ÷ {row.base.name}, {row.label}B ({samples} samples)",
            f"{row.subject.median:.0f} µs (p99 {row.subject.p99:.0f})",
            f"{row.base.median:.0f} µs (p99 {row.base.p99:.0f})",
            None if row.target is None else Target(row.target),
        )
        for row in rows
    ] + parts


def _module_runner(name: str) -> Runner:
    def run(quick: bool) -> list[Result]:
        module = importlib.import_module(f"bench.{name}")
        results: list[Result] = module.run(quick)
        return results

    return run


# -- benchmarks other people own -------------------------------------------------------------

EXTERNAL: dict[str, list[str] | None] = {"recovery": None, "langgraph": ["--samples", "100"]}
"""Modules written alongside this suite, with the arguments that make them small for
``--quick`` (``None``: ``--quick`` if their source mentions it, else their defaults). Each
runs when ``bench/<name>.py`` exists: through ``run(quick) -> list[Result]`` if it has one,
else through ``main(argv)``, whose ``ratio``/``figure`` lines are read from its output."""


def _parse_lines(text: str, module: str) -> list[Result]:
    results = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] in ("ratio", "figure"):
            try:
                value: float | None = float(parts[2])
            except ValueError:
                value = None
            kind: Kind = "ratio" if parts[0] == "ratio" else "figure"
            results.append(Result(kind, parts[1], value, parts[1], note=f"from {module}"))
    return results


def external_runner(name: str) -> Runner | None:
    """A runner for ``bench.<name>``, or ``None`` while that module does not exist."""
    module_name = f"bench.{name}"
    if importlib.util.find_spec(module_name) is None:
        return None

    def run(quick: bool) -> list[Result]:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:  # e.g. langgraph, an optional extra
            if exc.name and exc.name.split(".")[0] in ("bench", "agentq"):
                raise
            return [skipped("figure", f"{name}_present", module_name, f"{exc.name} not installed")]
        entry = getattr(module, "run", None)
        if callable(entry):
            results: list[Result] = entry(quick)
            return results
        argv: list[str] = []
        if quick:
            argv = EXTERNAL.get(name) or (
                ["--quick"] if "--quick" in inspect.getsource(module) else []
            )
        captured = io.StringIO()
        with contextlib.redirect_stdout(captured):
            try:
                status = module.main(argv)
            except SystemExit as exc:
                status = exc.code
        output = captured.getvalue()
        results = _parse_lines(output, module_name)
        if status not in (0, None) or not results:
            raise RuntimeError(
                f"{module_name} exited with {status}; its output ended:\n" + output[-2000:]
            )
        return results

    return run


BENCHMARKS: dict[str, Runner] = {
    "codec": _module_runner("codec"),
    "store": store_results,
    "wire": _module_runner("wire"),
    "steps": _module_runner("steps"),
    "storage": _module_runner("storage"),
    "agent": _module_runner("agent"),
    "rss": _module_runner("rss"),
    "concurrency": _module_runner("concurrency"),
    "ui": _module_runner("ui"),
    "limits": _module_runner("limits"),
    "thread_keys": _module_runner("thread_keys"),
    "send": _module_runner("send"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, for CI")
    parser.add_argument("--only", default="", help="comma-separated benchmark names")
    args = parser.parse_args(argv)
    benchmarks: dict[str, Runner | None] = {**BENCHMARKS}
    for name in EXTERNAL:
        benchmarks[name] = external_runner(name)
    if args.only:
        wanted = args.only.split(",")
        unknown = set(wanted) - set(benchmarks)
        if unknown:
            parser.error(
                f"unknown benchmark(s) {', '.join(sorted(unknown))}; known: {', '.join(benchmarks)}"
            )
        benchmarks = {name: benchmarks[name] for name in wanted}

    print(machine_line(), flush=True)
    started = time.monotonic()
    rows: list[Result | str] = []
    failed = False
    with terminate_as_interrupt():
        for name, runner in benchmarks.items():
            rows.append(name)
            if runner is None:
                rows.append(
                    skipped(
                        "figure", f"{name}_present", f"bench/{name}.py", "module not present yet"
                    )
                )
                continue
            began = time.monotonic()
            print(f"bench: {name} ...", file=sys.stderr, flush=True)
            try:
                # Progress a benchmark prints goes to stderr: stdout is the report alone.
                with contextlib.redirect_stdout(sys.stderr):
                    rows += runner(args.quick)
            except Exception as exc:
                failed = True
                traceback.print_exc()
                rows.append(
                    Result(
                        "figure",
                        f"{name}_error",
                        None,
                        f"bench.{name}",
                        note=f"error: {type(exc).__name__}: {exc}"[:120],
                    )
                )
            print(
                f"bench: {name} took {time.monotonic() - began:.1f} s", file=sys.stderr, flush=True
            )
    mode = "quick" if args.quick else "full"
    print(f"elapsed {time.monotonic() - started:.1f} s ({mode} size)")
    report(rows)
    missed = [r.name for r in rows if isinstance(r, Result) and r.missed]
    if missed:
        print(f"# missed targets: {', '.join(missed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    exit_with(main)
