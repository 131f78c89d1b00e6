"""``/metrics`` of the inspector: threads by status, needs_attention and the due lag, read
from the store's indexes when scraped."""

from __future__ import annotations

from collections import Counter

from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from agentq.records import Status
from agentq.store.redis import RedisStore
from agentq.ui.app import create_app
from tests.support.redis_server import wait_until
from tests.ui.population import TASK

EXTRA = ("t-hostile", "t-big", "t-artifact")


def scrape(client: TestClient, **headers: str) -> dict[tuple[str, str], float]:
    page = client.get("/metrics", headers=headers)
    assert page.status_code == 200, page.text
    return {
        (sample.name, sample.labels.get("status", "")): sample.value
        for family in text_string_to_metric_families(page.text)
        for sample in family.samples
    }


def test_threads_by_status_and_needs_attention(
    store: RedisStore, threads: dict[Status, str]
) -> None:
    expected = Counter(store.meta(t).status for t in [*threads.values(), *EXTRA])  # type: ignore[union-attr]
    shown = scrape(TestClient(create_app(store), base_url="http://127.0.0.1"))
    for status in Status:
        assert shown[("agentq_threads", status.value)] == expected[status], status
    assert shown[("agentq_needs_attention", "")] == 1


def test_due_lag_is_the_oldest_overdue_thread(store: RedisStore) -> None:
    client = TestClient(create_app(store), base_url="http://127.0.0.1")
    assert scrape(client)[("agentq_due_lag_seconds", "")] == 0
    store.open_thread("t-late", task=TASK, start_grace=0.01)  # no worker sweeps it
    first = wait_until(
        lambda: scrape(client)[("agentq_due_lag_seconds", "")], timeout=10, what="a lag"
    )
    wait_until(
        lambda: scrape(client)[("agentq_due_lag_seconds", "")] > first, timeout=10, what="growth"
    )


def test_metrics_need_the_access_token(store: RedisStore) -> None:
    client = TestClient(create_app(store, token="s3cret"), base_url="http://127.0.0.1")
    assert client.get("/metrics").status_code in (401, 403)
    shown = scrape(client, authorization="Bearer s3cret")
    assert ("agentq_needs_attention", "") in shown
