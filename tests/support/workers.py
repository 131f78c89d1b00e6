"""``celery worker`` subprocesses that tests can SIGKILL, SIGTERM, SIGSTOP and replace."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from celery import Celery

from tests.support.redis_server import wait_until

ROOT = Path(__file__).resolve().parents[2]


class WorkerProcess:
    """One worker (prefork ``-c 1`` unless told) in its own session, so the whole group
    can be signalled like a container's processes."""

    def __init__(
        self,
        app: Celery,
        env: dict[str, str],
        log_dir: Path,
        *,
        concurrency: int = 1,
        pool: str = "prefork",
        app_module: str = "tests.support.worker_app",
    ) -> None:
        self.app = app
        self.env = env
        self.app_module = app_module
        self.name = f"w{uuid.uuid4().hex[:6]}@agentq-test"
        self.log = log_dir / f"{self.name.split('@')[0]}.log"
        self.concurrency = concurrency
        self.pool = pool
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, *, ready_timeout: float = 60) -> WorkerProcess:
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    self.app_module,
                    "worker",
                    "-P",
                    self.pool,
                    "-c",
                    str(self.concurrency),
                    "-n",
                    self.name,
                    "-Q",
                    self.env["AGENTQ_TEST_QUEUE"],
                    "--without-mingle",
                    "--without-gossip",
                    "--loglevel",
                    "INFO",
                ],
                cwd=ROOT,
                env={**os.environ, **self.env},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_until(
            self._answers_ping,
            timeout=ready_timeout,
            interval=0.2,
            what=f"worker {self.name} answering ping",
        )
        return self

    def _answers_ping(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(
                f"worker exited with {self.process.returncode}:\n"
                + self.log.read_text(errors="replace")[-3000:]
            )
        return bool(self.app.control.ping(destination=[self.name], timeout=0.5))

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def signal_group(self, sig: int) -> None:
        os.killpg(self.pid, sig)

    def owns(self, pid: int) -> bool:
        """Whether ``pid`` is this worker or one of its pool processes (same group)."""
        try:
            return os.getpgid(pid) == self.pid
        except ProcessLookupError:
            return False

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL the worker and its pool children, as an OOM kill of the container."""
        self.signal_group(signal.SIGKILL)
        assert self.process is not None
        self.process.wait(timeout=10)

    def terminate(self) -> None:
        """SIGTERM the main process only, as ``docker stop``/a deploy does: warm shutdown."""
        os.kill(self.pid, signal.SIGTERM)

    def wait_exit(self, timeout: float) -> int:
        assert self.process is not None
        return self.process.wait(timeout=timeout)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.signal_group(signal.SIGCONT)
            self.kill()
