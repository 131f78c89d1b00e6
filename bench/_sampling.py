"""What a benchmark samples from a running worker: its process tree, the RSS of that tree,
the descriptors it holds open on a file; and a thread keeping the peaks of such samples."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import redis

from bench.rss import rss_bytes

SAMPLE_EVERY = 0.1


def process_tree(root: int) -> list[int]:
    """``root`` and its descendants, from ``/proc``."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                # The command name is in parentheses and may hold spaces: split after it.
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                parents[int(entry.name)] = int(fields[1])
    tree, frontier = [root], [root]
    while frontier:
        children = [pid for pid, parent in parents.items() if parent in frontier]
        tree += children
        frontier = children
    return tree


def tree_rss(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):  # a pool child replaced between two samples
            total += rss_bytes(pid)
    return total


def open_files(pids: list[int], path: Path) -> int:
    """How many descriptors of ``pids`` are open on ``path``."""
    count = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    count += os.readlink(fd) == str(path)
    return count


@dataclass
class Peaks:
    connections: int = 0
    rss: int = 0
    in_flight: int = 0

    @property
    def rss_per_in_flight(self) -> float:
        return self.rss / max(1, self.in_flight)


class Sampler:
    """Samples connections, worker RSS and in-flight work every 100 ms on a thread of its own,
    keeping each one's peak."""

    def __init__(
        self, pids: list[int], connections: Callable[[], int], in_flight: Callable[[], int]
    ) -> None:
        self.pids = pids
        self.probes = (connections, in_flight)
        self.peaks = Peaks()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="bench-sampler", daemon=True)

    def _sample(self) -> None:
        connections, in_flight = self.probes
        while True:
            peaks = self.peaks
            peaks.rss = max(peaks.rss, tree_rss(self.pids))
            # A probe failing under load loses one sample, not the row.
            with contextlib.suppress(redis.RedisError, sqlite3.Error, OSError):
                peaks.connections = max(peaks.connections, connections())
                peaks.in_flight = max(peaks.in_flight, in_flight())
            if self._stop.wait(SAMPLE_EVERY):
                return

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()
