"""The demo's ``celery worker`` subprocesses: started, SIGKILLed, always cleaned up."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from agentq.demo.config import DemoConfig


class DemoWorker:
    """One prefork worker with one pool process, in a session of its own, so SIGKILL to
    its process group takes down the worker and its pool at once, like an OOM kill of
    its container."""

    def __init__(self, label: str, config: DemoConfig) -> None:
        self.label = label
        self.config = config
        self.log = Path(config.workdir) / f"worker-{label.lower()}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> int:
        config = self.config
        command = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "agentq.demo.app",
            "worker",
            "-P",
            "prefork",
            "-c",
            "1",
            "-n",
            f"{self.label.lower()}@{config.namespace}",
            "-Q",
            config.queue,
            "--without-mingle",
            "--without-gossip",
            "--without-heartbeat",
            "--loglevel",
            "INFO",
        ]
        fds = (config.lifeline_fd,) if config.lifeline_fd >= 0 else ()
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                command,
                cwd=config.workdir,
                env={**os.environ, **config.to_env()},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=fds,
            )
        return self.process.pid

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def exited(self) -> int | None:
        """The exit status if the worker is gone, else ``None``."""
        return None if self.process is None else self.process.poll()

    def kill(self) -> None:
        """SIGKILL the worker's whole process group and reap it."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])
