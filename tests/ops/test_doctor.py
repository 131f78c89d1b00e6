"""``agentq doctor``'s Celery checks: each setting that defeats recovery is named with its
fix, and a configuration as the deploy guide recommends has none."""

from __future__ import annotations

import types
from collections.abc import Callable

import pytest
from celery import Celery

import agentq
from agentq import AgentTask
from agentq.celery.runtime import runtime_of
from agentq.ops.doctor import celery_findings


class _Agent(AgentTask):
    name = "doctor_agent"


def _findings(configure: Callable[[Celery], None] = lambda app: None) -> list[str]:
    # The checks read the broker's URL and never connect: a name that cannot resolve.
    app = Celery("doctor", broker="redis://broker.invalid/0", set_as_current=False)
    app.conf.update(worker_prefetch_multiplier=1, agentq_lease_ttl=30, agentq_sweep_interval=1)
    configure(app)
    agentq.init_app(app, store="sqlite:///unused.db")
    app.register_task(_Agent())
    return [f.setting for f in celery_findings(app, runtime_of(app).settings)]


def _unsafe_agent(app: Celery) -> None:
    class Unsafe(AgentTask):
        name = "unsafe_agent"
        acks_late = False
        reject_on_worker_lost = False

    app.register_task(Unsafe())


def test_a_recommended_configuration_has_nothing_to_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("REMAP_SIGTERM", raising=False)
    assert _findings() == []


@pytest.mark.parametrize(
    ("configure", "setting"),
    [
        (
            lambda app: app.conf.update(broker_transport_options={"visibility_timeout": 10}),
            "broker_transport_options.visibility_timeout",
        ),
        (lambda app: app.conf.update(agentq_sweep_interval=60), "agentq_sweep_interval"),
        (lambda app: app.conf.update(worker_prefetch_multiplier=4), "worker_prefetch_multiplier"),
        (lambda app: app.conf.update(task_always_eager=True), "task_always_eager"),
    ],
)
def test_each_dangerous_setting_is_named(
    monkeypatch: pytest.MonkeyPatch, configure: Callable[[Celery], None], setting: str
) -> None:
    monkeypatch.delenv("REMAP_SIGTERM", raising=False)
    assert _findings(configure) == [setting]


def test_agent_tasks_that_ack_early_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REMAP_SIGTERM", raising=False)
    assert _findings(_unsafe_agent) == [
        "unsafe_agent.acks_late",
        "unsafe_agent.reject_on_worker_lost",
    ]


def test_a_remapped_sigterm_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REMAP_SIGTERM", "SIGQUIT")
    assert _findings() == ["REMAP_SIGTERM"]


def test_a_misspelt_agentq_setting_is_named_with_the_one_meant(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("REMAP_SIGTERM", raising=False)
    app = Celery("doctor", broker="redis://broker.invalid/0", set_as_current=False)
    app.conf.update(
        worker_prefetch_multiplier=1, agentq_lease_tll=30, agentq_colour="blue", agentq_prefix="p:"
    )
    agentq.init_app(app, store="sqlite:///unused.db")
    findings = {f.setting: f for f in celery_findings(app, runtime_of(app).settings)}
    assert sorted(findings) == ["agentq_colour", "agentq_lease_tll"]
    assert findings["agentq_lease_tll"].fix == "rename it agentq_lease_ttl"
    assert findings["agentq_lease_tll"].value == "30"
    assert "agentq_store" in findings["agentq_colour"].fix


def test_a_misspelt_setting_is_shown_without_its_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REMAP_SIGTERM", raising=False)
    app = Celery("doctor", broker="redis://broker.invalid/0", set_as_current=False)
    app.conf.update(
        worker_prefetch_multiplier=1,
        agentq_stor="redis://:s3cret@store.invalid:6379/0",
        agentq_api_token="t0ken",
    )
    agentq.init_app(app, store="sqlite:///unused.db")
    findings = {f.setting: f.value for f in celery_findings(app, runtime_of(app).settings)}
    assert findings == {
        "agentq_api_token": "'********'",
        "agentq_stor": "'redis://:***@store.invalid:6379/0'",
    }


def test_under_a_namespace_the_settings_read_are_not_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Django's ``config_from_object(..., namespace="CELERY")``: CELERY_AGENTQ_LEASE_TTL is
    agentq_lease_ttl to Celery; an AGENTQ_ key without the namespace is read by nothing."""
    monkeypatch.delenv("REMAP_SIGTERM", raising=False)
    config = types.SimpleNamespace(
        CELERY_WORKER_PREFETCH_MULTIPLIER=1,
        CELERY_AGENTQ_LEASE_TTL=30,
        CELERY_AGENTQ_SWEEP_INTERVALL=1,
        AGENTQ_PREFIX="p:",
    )
    app = Celery("doctor", broker="redis://broker.invalid/0", set_as_current=False)
    app.config_from_object(config, namespace="CELERY")
    agentq.init_app(app, store="sqlite:///unused.db")
    findings = {f.setting: f.fix for f in celery_findings(app, runtime_of(app).settings)}
    assert findings == {
        "AGENTQ_PREFIX": "rename it CELERY_AGENTQ_PREFIX",
        "CELERY_AGENTQ_SWEEP_INTERVALL": "rename it CELERY_AGENTQ_SWEEP_INTERVAL",
    }
