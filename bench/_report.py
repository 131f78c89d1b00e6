"""What every benchmark in the suite reports, and how it is printed.

A benchmark returns :class:`Result` rows: each is one number measured against a baseline
taken in the same run (a ``ratio``), or one absolute number (a ``figure``), with its target
if it has one. Targets are printed with a verdict, never asserted. The table is for
people; the ``ratio <name> <value>`` / ``figure <name> <value>`` lines after it are for
machines (a row that could not run prints ``skipped`` or ``error`` as its value).
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Literal

Kind = Literal["ratio", "figure"]


@dataclass(frozen=True)
class Target:
    """``value <= limit`` (``at_most``) or ``value >= limit``."""

    limit: float
    at_most: bool = True

    def met(self, value: float) -> bool:
        return value <= self.limit if self.at_most else value >= self.limit

    def __str__(self) -> str:
        return f"{'≤' if self.at_most else '≥'}{self.limit:g}"


@dataclass(frozen=True)
class Result:
    """One row of the table and one machine-readable line."""

    kind: Kind
    name: str
    value: float | None
    """``None`` when the row could not run; ``note`` says why."""
    what: str
    """What is compared, for people: ``commit ÷ SET, 10 KB``."""
    measured: str = ""
    baseline: str = ""
    target: Target | None = None
    note: str = ""

    @property
    def verdict(self) -> str:
        if self.value is None:
            return self.note or "skipped"
        if self.target is None:
            return self.note
        verdict = "meets" if self.target.met(self.value) else "MISSES"
        return f"{verdict} ({self.note})" if self.note else verdict

    @property
    def missed(self) -> bool:
        return (
            self.value is not None and self.target is not None and not self.target.met(self.value)
        )

    def line(self) -> str:
        if self.value is None:
            value = "error" if self.note.startswith("error") else "skipped"
        else:
            value = f"{self.value:.{_digits(self.value)}f}"
        return f"{self.kind} {self.name} {value}"


def skipped(kind: Kind, name: str, what: str, reason: str) -> Result:
    return Result(kind, name, None, what, note=f"skipped: {reason}")


def _digits(value: float) -> int:
    return 2 if abs(value) >= 1 or value == 0 else 3


def print_table(rows: Sequence[Result | str]) -> None:
    """A fixed-width table of results; a string in ``rows`` starts a section."""
    cells = [
        (
            r.what,
            r.measured,
            r.baseline,
            "—" if r.value is None else f"{r.value:.{_digits(r.value)}f}",
            str(r.target) if r.target else "",
            r.verdict,
        )
        for r in rows
        if isinstance(r, Result)
    ]
    head = ("benchmark", "measured", "baseline", "value", "target", "verdict")
    widths = [max([len(head[i]), *(len(row[i]) for row in cells)]) for i in range(5)]

    def line(row: tuple[str, ...]) -> str:
        return (
            "  ".join(
                (cell.rjust(w) if i in (3, 4) else cell.ljust(w))
                for i, (cell, w) in enumerate(zip(row[:5], widths, strict=True))
            )
            + "  "
            + row[5]
        )

    text = [line(head)]
    remaining = iter(cells)
    for row in rows:
        text.append(f"[{row}]" if isinstance(row, str) else line(next(remaining)))
    print(text[0])
    print("-" * max(len(t) for t in text))
    print("\n".join(text[1:]))


def print_lines(results: Iterable[Result]) -> None:
    for result in results:
        print(result.line())


def report(rows: Sequence[Result | str]) -> None:
    """The table, a blank line, then one machine line per result (strings: sections)."""
    print()
    print_table(rows)
    print()
    print_lines(r for r in rows if isinstance(r, Result))


# -- numbers ----------------------------------------------------------------------------------


def quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def micros(seconds: float) -> str:
    return f"{seconds * 1e6:.0f} µs"


def millis(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def size(nbytes: float) -> str:
    for unit, scale in (("MB", 1e6), ("KB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes:.0f} B"


# -- the machine ------------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _redis_version() -> str:
    try:
        out = subprocess.run(
            ["redis-server", "--version"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "absent"
    for part in out.split():
        if part.startswith("v="):
            return part[2:]
    return "?"


def machine_line() -> str:
    """One line saying where the numbers come from (without needing a running server)."""
    import celery
    import msgpack
    import redis

    cores = os.cpu_count() or 0
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cores
    load = " ".join(f"{value:.2f}" for value in os.getloadavg())
    return (
        f"machine: cpu={cpu_model()!r} cores={cores} (usable {usable}) "
        f"python={platform.python_version()} redis-server={_redis_version()} "
        f"redis-py={redis.__version__} celery={celery.__version__} "
        f"msgpack={'.'.join(map(str, msgpack.version))} loadavg={load}"
    )


# -- stopping cleanly -------------------------------------------------------------------------


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Let SIGTERM unwind like Ctrl-C, so every ``finally`` stops what it started."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# -- running one module on its own ------------------------------------------------------------


def standalone(
    prog: str, doc: str | None, run: Callable[[bool], list[Result]], argv: list[str] | None
) -> int:
    """``python -m bench.<name> [--quick]``: the machine line, the run, the report."""
    parser = argparse.ArgumentParser(
        prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, for CI")
    args = parser.parse_args(argv)
    print(machine_line(), flush=True)
    started = time.monotonic()
    with terminate_as_interrupt():
        results = run(args.quick)
    print(f"elapsed {time.monotonic() - started:.1f} s")
    report(results)
    return 0


def exit_with(main: Callable[[], int]) -> None:
    """Run ``main`` as a program: its status, or 130 after Ctrl-C/SIGTERM."""
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted; everything this run started was stopped", file=sys.stderr)
        sys.exit(130)
