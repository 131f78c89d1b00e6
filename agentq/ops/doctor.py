"""Checks a Celery app's settings for what would defeat recovery or exclusion, and its
declared limits for those no call takes from."""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from typing import Any

from celery.app.utils import filter_hidden_settings
from kombu.utils.url import maybe_sanitize_url

from agentq.errors import LimitError
from agentq.limits import Limit, Limits
from agentq.records import Finding
from agentq.settings import CONF_PREFIX, Settings


def celery_findings(app: Any, settings: Settings) -> list[Finding]:
    """What in ``app``'s configuration works against agentq, each with its fix."""
    from agentq.celery.task import AgentTask

    conf = app.conf
    findings = []
    broker = str(conf.broker_url or "")
    if broker.startswith(("redis://", "rediss://", "unix://")):
        visibility = (conf.broker_transport_options or {}).get("visibility_timeout", 3600)
        if float(visibility) < settings.lease_ttl:
            findings.append(
                Finding(
                    "broker_transport_options.visibility_timeout",
                    str(visibility),
                    f"shorter than lease_ttl ({settings.lease_ttl} s): Redis redelivers every "
                    "running agent while its lease is live, and each copy wakes a worker for "
                    "nothing.",
                    "leave visibility_timeout at its default (3600 s); agentq recovers killed "
                    "workers through leases, not redelivery",
                )
            )
    if settings.sweep_interval >= settings.lease_ttl:
        findings.append(
            Finding(
                "agentq_sweep_interval",
                str(settings.sweep_interval),
                f"not shorter than lease_ttl ({settings.lease_ttl} s): recovery of a dead "
                "worker's thread waits up to a whole extra lease.",
                "use a sweep_interval of a few seconds at most, well under lease_ttl",
            )
        )
    if int(conf.worker_prefetch_multiplier or 0) != 1:
        findings.append(
            Finding(
                "worker_prefetch_multiplier",
                str(conf.worker_prefetch_multiplier),
                "a worker reserves several agent messages while one runs; a deploy then holds "
                "threads back until their grace runs out.",
                "set worker_prefetch_multiplier = 1",
            )
        )
    if os.environ.get("REMAP_SIGTERM"):
        findings.append(
            Finding(
                "REMAP_SIGTERM",
                os.environ["REMAP_SIGTERM"],
                "set in this environment (run doctor where the workers run): SIGTERM becomes a "
                "cold shutdown, and a deploy kills running nodes instead of handing their "
                "threads over after the current one.",
                "unset REMAP_SIGTERM in the workers' environment",
            )
        )
    if conf.task_always_eager:
        findings.append(
            Finding(
                "task_always_eager",
                "True",
                "agents run inside the caller, with no worker to resume them after a crash.",
                "turn it off outside unit tests",
            )
        )
    findings.extend(_unknown_settings(conf))
    for task in app.tasks.values():
        if not isinstance(task, AgentTask):
            continue
        if not task.acks_late:
            findings.append(
                Finding(
                    f"{task.name}.acks_late",
                    "False",
                    "the message is acknowledged before the agent runs; a killed worker's "
                    "thread then waits for recovery instead of being redelivered at once "
                    "(RabbitMQ).",
                    "keep acks_late = True on agent tasks (AgentTask's default)",
                )
            )
        if not task.reject_on_worker_lost:
            findings.append(
                Finding(
                    f"{task.name}.reject_on_worker_lost",
                    "False",
                    "a pool process killed mid-step marks the task FAILURE(WorkerLostError) and "
                    "drops the message.",
                    "keep reject_on_worker_lost = True on agent tasks (AgentTask's default)",
                )
            )
    return findings


def _unknown_settings(conf: Any) -> list[Finding]:
    """``agentq_*`` keys of the app's configuration that name no setting: read by nothing,
    as Celery reads none of its own misspelt keys, so a typo leaves the default in force."""
    known = [CONF_PREFIX + name for name in Settings.names()]
    # Under a namespace (Django's CELERY_), Celery reads CELERY_AGENTQ_STORE as agentq_store.
    namespace = (getattr(conf, "prefix", None) or "").upper()
    findings = []
    for key in sorted(str(key) for key in conf):
        name = key
        if namespace and key.upper().startswith(namespace):
            name = key[len(namespace) :].lower()
        if not name.lower().startswith(CONF_PREFIX) or name in known:
            continue
        near = difflib.get_close_matches(name.lower(), known, n=1)
        if not near:
            fix = f"use one of {', '.join(known)}"
        else:
            fix = f"rename it {namespace}{near[0].upper()}" if namespace else f"rename it {near[0]}"
        findings.append(
            Finding(
                key,
                _shown(key, conf[key]),
                "names no agentq setting: nothing reads it, and the default stays in force.",
                fix,
            )
        )
    return findings


def _shown(key: str, value: Any) -> str:
    """``value`` as a report may show it: masked as Celery masks its own settings, and
    a URL's password left out (a misspelt ``agentq_store`` is still a URL)."""
    shown = filter_hidden_settings({key: value})[key]
    if isinstance(shown, str):
        shown = maybe_sanitize_url(shown, mask="***")
    return repr(shown)


def unused_limits(limits: Limits, takes: Mapping[str, int]) -> list[Finding]:
    """The declared limits that no key taken from or entered as a concurrency key in the
    store (``takes``, as :meth:`~agentq.store.contract.Store.limit_takes` counts them)
    falls under."""
    used = set()
    for key in takes:
        try:
            used.add(limits.of(key).name)
        except LimitError:  # taken under a declaration the app has dropped since
            continue
    return [_unused(name, limit) for name, limit in limits.declared().items() if name not in used]


def _unused(name: str, limit: Limit) -> Finding:
    calls = (limit.requests_per_minute, limit.tokens_per_minute, limit.concurrency) != (None,) * 3
    named, fixes = [], []
    if calls:
        named.append("no call has taken from it in this store (nothing names it in limit=)")
        fixes.append(f"name it in the calls it should cap (run.tool(..., limit={name!r}))")
    if limit.threads is not None:
        named.append("no thread has run under it as a concurrency key")
        fixes.append(
            f"send the threads it should cap with a key it matches (apply_async(..., "
            f"concurrency_key={name!r}) or the task's concurrency_key)"
        )
    return Finding(
        f"limit {name!r}",
        "0 takes",
        f"declared, but {' and '.join(named)}, so it caps nothing.",
        f"{' or '.join(fixes)}, or drop the declaration",
    )
