"""The Celery app the demo's workers load: ``celery -A agentq.demo.app worker``.

Configured by the environment ``agentq demo`` sets (see
:class:`~agentq.demo.config.DemoConfig`).
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

from celery.signals import worker_init, worker_ready

from agentq.demo.config import DemoConfig
from agentq.demo.ledger import open_ledger
from agentq.demo.wiring import build_app

config = DemoConfig.from_env(os.environ)
app = build_app(config)


@worker_ready.connect  # type: ignore[untyped-decorator]
def _report_ready(**_: Any) -> None:
    with open_ledger(config.ledger, config.namespace) as ledger:
        ledger.record("worker_ready", pid=os.getpid())


def _exit_when_the_demo_is_gone(fd: int) -> None:
    # read() returns b"" only once every write end is closed: the demo exited (even by
    # SIGKILL) without stopping this worker. Take the pool processes down with us.
    while os.read(fd, 1):
        pass
    os.killpg(os.getpgrp(), signal.SIGKILL)


@worker_init.connect  # type: ignore[untyped-decorator]
def _watch_lifeline(**_: Any) -> None:
    if config.lifeline_fd >= 0:
        threading.Thread(
            target=_exit_when_the_demo_is_gone,
            args=(config.lifeline_fd,),
            name="agentq-demo-lifeline",
            daemon=True,
        ).start()
