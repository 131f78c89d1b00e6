"""Private ``redis-server`` processes for tests: a free port, a temp dir, AOF always.

Tests that kill or restart the store use these, never a shared Redis.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import redis

STARTUP_DEADLINE = 20.0


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A free port whose +10000 twin (the cluster bus) is free too."""
    while True:
        port = random.randint(20000, 30000)
        if _bindable(port) and _bindable(port + 10000):
            return port


def wait_until(predicate, *, timeout: float, interval: float = 0.02, what: str = "condition"):  # type: ignore[no-untyped-def]
    """Poll ``predicate`` until it returns a truthy value or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout} s")
        time.sleep(interval)


class RedisServer:
    """One ``redis-server`` process that can be killed and restarted on the same data."""

    def __init__(self, directory: Path, *extra: str, port: int | None = None) -> None:
        self.directory = directory
        self.port = port or free_port()
        self.extra = extra
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.directory.mkdir(parents=True, exist_ok=True)
        args = [
            "redis-server",
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
            str(self.directory / "redis.log"),
            *self.extra,
        ]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        try:
            wait_until(
                lambda: self._answers(client),
                timeout=STARTUP_DEADLINE,
                what=f"redis-server on port {self.port} answering",
            )
        finally:
            client.close()
        return self

    def _answers(self, client: redis.Redis) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            log = (self.directory / "redis.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"redis-server exited with {self.process.returncode}: {log}")
        try:
            # A server still loading its AOF answers PING with an error.
            return bool(client.ping()) and client.info("persistence")["loading"] == 0
        except redis.RedisError:
            return False

    def kill(self, sig: int = signal.SIGKILL) -> None:
        assert self.process is not None
        os.kill(self.process.pid, sig)
        self.process.wait(timeout=10)

    def restart(self, sig: int = signal.SIGKILL, *, down: float = 0.0) -> float:
        """Kill the server with ``sig``, leave it down for ``down`` seconds (a slow host
        restart), and start it again on the same directory and port, so it reloads its
        AOF; return the seconds it was unavailable."""
        started = time.monotonic()
        self.kill(sig)
        if down > 0:
            time.sleep(down)  # the outage itself, not a wait for a condition
        self.start()
        return time.monotonic() - started

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.kill(signal.SIGKILL)

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port)


@contextlib.contextmanager
def running_redis(directory: Path, *extra: str) -> Iterator[RedisServer]:
    server = RedisServer(directory, *extra).start()
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def running_cluster(directory: Path, nodes: int = 3) -> Iterator[list[RedisServer]]:
    """A Redis Cluster of ``nodes`` primaries on loopback, no replicas."""
    servers = [
        RedisServer(
            directory / f"node{i}",
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "5000",
        )
        for i in range(nodes)
    ]
    try:
        for server in servers:
            server.start()
        subprocess.run(
            [
                "redis-cli",
                "--cluster",
                "create",
                *(f"127.0.0.1:{s.port}" for s in servers),
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=60,
        )

        def ready() -> bool:
            for server in servers:
                with contextlib.closing(server.client()) as client:
                    if client.execute_command("CLUSTER INFO")["cluster_state"] != "ok":
                        return False
            return True

        wait_until(ready, timeout=30, what="cluster_state:ok on every node")
        yield servers
    finally:
        for server in servers:
            server.stop()
