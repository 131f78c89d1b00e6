"""The store checks ``agentq doctor`` runs, where they protect checkpoints: a worker
refuses to start on a store that would lose them, and its sweeper looks again while it
runs, since a ``CONFIG SET`` can turn eviction on under a running fleet."""

from __future__ import annotations

import logging

from agentq.errors import UnsafeStore
from agentq.records import Finding
from agentq.settings import Settings
from agentq.store.contract import Store

logger = logging.getLogger("agentq.store")


def refuse_unsafe_store(store: Store, settings: Settings) -> list[Finding]:
    """Run ``store.check()``: raise :class:`~agentq.errors.UnsafeStore` if a finding is
    fatal (unless ``allow_unsafe_store``), log every finding, and return them."""
    findings = store.check()
    fatal = [f for f in findings if f.fatal]
    if fatal and not settings.allow_unsafe_store:
        raise UnsafeStore(
            "the store would lose acknowledged checkpoints: "
            + "; ".join(str(f) for f in fatal)
            + " (agentq doctor shows every finding; only for development, use it anyway "
            "with allow_unsafe_store=True, app.conf.agentq_allow_unsafe_store = True, or "
            "agentq --allow-unsafe-store / AGENTQ_ALLOW_UNSAFE_STORE=1 on the command line)",
            findings=fatal,
        )
    for finding in findings:
        allowed = " (allowed by allow_unsafe_store)" if finding.fatal else ""
        logger.warning("store %s%s", finding, allowed)
    return findings


def recheck_store(store: Store, settings: Settings) -> list[Finding]:
    """Run ``store.check()`` again in a running worker and log each fatal finding as an
    error, every time it is seen, until it is fixed; return the fatal findings.

    The worker keeps running: every worker shares the store, so stopping would turn a
    risk of losing some checkpoints into an outage of every thread, and stopping does not
    protect the keys already written. A store allowed by ``allow_unsafe_store`` was
    reported when the worker started.
    """
    fatal = [f for f in store.check() if f.fatal]
    if not settings.allow_unsafe_store:
        for finding in fatal:
            logger.error("store changed to lose checkpoints: %s", finding)
    return fatal
