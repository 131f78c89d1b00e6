"""A private, throw-away ``redis-server`` for benchmarks: a free port, a temp dir, AOF always.

Self-contained on purpose (no dependency on ``tests/``). The process is started in its own
session, so a Ctrl-C in the terminal reaches only the benchmark, whose ``finally`` stops the
server by its PID and removes the directory.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import redis

STARTUP_DEADLINE = 20.0
STOP_DEADLINE = 10.0


def free_port() -> int:
    """A loopback port nobody listens on right now (the kernel picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivateRedis:
    """``with PrivateRedis() as server:`` runs one ``redis-server`` for the block's duration."""

    def __init__(self, *extra: str, binary: str = "redis-server") -> None:
        self.binary = binary
        self.extra = extra
        self.port = 0
        self.directory: Path | None = None
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> PrivateRedis:
        if shutil.which(self.binary) is None:
            raise RuntimeError(f"{self.binary} is not on PATH; install redis-server")
        self.directory = Path(tempfile.mkdtemp(prefix="agentq-bench-redis-"))
        for attempt in range(5):
            self.port = free_port()
            try:
                self._launch()
                return self
            except OSError:  # lost the port to someone else between probe and bind
                self._kill()
                if attempt == 4:
                    self.stop()
                    raise
        raise AssertionError("unreachable")

    def _launch(self) -> None:
        assert self.directory is not None
        log = self.directory / "redis.log"
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.directory),
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--daemonize",
            "no",
            "--logfile",
            str(log),
            *self.extra,
        ]
        self.process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + STARTUP_DEADLINE
        try:
            while True:
                if self.process.poll() is not None:
                    text = log.read_text(errors="replace") if log.exists() else ""
                    if "Address already in use" in text:
                        raise OSError(f"port {self.port} taken")
                    raise RuntimeError(
                        f"redis-server exited with {self.process.returncode}: {text[-2000:]}"
                    )
                try:
                    if client.ping() and client.info("persistence")["loading"] == 0:
                        return
                except redis.RedisError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(f"redis-server on port {self.port} did not answer")
                time.sleep(0.02)
        finally:
            client.close()

    def _kill(self) -> None:
        """Stop our process by its PID: SIGTERM, then SIGKILL if it lingers."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=STOP_DEADLINE)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=STOP_DEADLINE)

    def stop(self) -> None:
        try:
            self._kill()
        finally:
            if self.directory is not None:
                shutil.rmtree(self.directory, ignore_errors=True)
                self.directory = None

    def client(self, **options: object) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, **options)  # type: ignore[arg-type]

    def __enter__(self) -> PrivateRedis:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
