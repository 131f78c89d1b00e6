"""What every page works on, kept on the app: the store, the Celery app, the server's
rules and its templates."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jinja2
from starlette.templating import Jinja2Templates

from agentq.records import Status, step_at
from agentq.store.contract import Store
from agentq.ui.format import FILTERS
from agentq.ui.rows import threads_rows


@dataclass(frozen=True)
class Inspector:
    """The store, the Celery app that sends requeued threads (``None``: the workers'
    sweeper sends them, as the command line does without ``-A``), the start grace such a
    message gets, whether actions are offered, and this process's CSRF secret."""

    store: Store
    app: Any
    start_grace: float
    read_only: bool
    csrf: str
    templates: Jinja2Templates


def templates() -> Jinja2Templates:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("agentq.ui", "templates"),
        autoescape=True,  # every value from a thread may be model output: hostile
        undefined=jinja2.StrictUndefined,
        auto_reload=False,  # the templates ship in the package: no stat of each per page
    )
    env.filters.update(FILTERS, threads_rows=threads_rows)
    env.globals.update(statuses=list(Status), step_at=step_at)
    return Jinja2Templates(env=env)
