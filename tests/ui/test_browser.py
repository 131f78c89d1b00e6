"""The inspector in a real headless Chromium, against a real Redis store holding threads
in every status: what an operator sees, and that what they do changes the store."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import Select, WebDriverWait

from agentq.ops.diffing import checkpoint_changes
from agentq.records import EffectState, Status
from agentq.store.redis.store import RedisStore
from tests.ui.conftest import SCREENSHOTS
from tests.ui.population import ARTIFACT, HOSTILE, TASK, drive

WAIT = 15.0


def ids_listed(browser: webdriver.Chrome) -> list[str]:
    # Read in one script: the page swaps its rows when it refreshes, which would leave
    # elements found one call earlier stale.
    ids: list[str] = browser.execute_script(
        "return Array.from(document.querySelectorAll('#threads tbody tr'),"
        " row => row.dataset.thread || '')"
    )
    return ids


def wait_for(browser: webdriver.Chrome, css: str) -> WebElement:
    return WebDriverWait(browser, WAIT).until(lambda b: b.find_element(By.CSS_SELECTOR, css))


def test_threads_page_counts_every_status_and_filters(
    inspector: str, browser: webdriver.Chrome, store: RedisStore
) -> None:
    browser.get(inspector + "/threads")
    counts = {
        link.get_attribute("data-status"): int(link.find_element(By.CLASS_NAME, "n").text)
        for link in browser.find_elements(By.CSS_SELECTOR, "#counts a.count")
    }
    assert counts == {status.value: n for status, n in store.status_counts().items()}
    assert all(counts[status.value] >= 1 for status in Status)
    listed = ids_listed(browser)
    assert listed == [meta.thread_id for meta in store.threads(limit=50)]  # newest first
    running = browser.find_element(By.CSS_SELECTOR, 'tr[data-thread="t-running"]').text
    assert "worker-a@host:4242" in running  # the lease owner
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SCREENSHOTS / "threads.png"))

    Select(browser.find_element(By.ID, "filter-status")).select_by_value("failed")
    browser.find_element(By.ID, "filter-apply").click()
    WebDriverWait(browser, WAIT).until(lambda b: "status=failed" in b.current_url)
    assert set(ids_listed(browser)) == {"t-failed", "t-hostile"}

    Select(browser.find_element(By.ID, "filter-status")).select_by_value("")
    browser.find_element(By.ID, "filter-prefix").send_keys("t-a")
    browser.find_element(By.ID, "filter-apply").click()
    WebDriverWait(browser, WAIT).until(lambda b: "prefix=t-a" in b.current_url)
    assert set(ids_listed(browser)) == {"t-attention", "t-artifact"}

    browser.get(inspector + f"/threads?task={TASK}x")
    assert ids_listed(browser) == []
    assert "No threads" in browser.find_element(By.ID, "no-threads").text


def test_threads_page_pages_through_the_index(
    inspector: str, browser: webdriver.Chrome, store: RedisStore
) -> None:
    for index in range(60):
        store.open_thread(f"bulk-{index:02d}", task=TASK)
    browser.get(inspector + "/threads")
    first = ids_listed(browser)
    assert len(first) == 50
    browser.find_element(By.ID, "next-page").click()
    WebDriverWait(browser, WAIT).until(lambda b: "after=" in b.current_url)
    second = ids_listed(browser)
    everything = [meta.thread_id for meta in store.threads(limit=200)]
    assert first + second == everything


def test_threads_page_refreshes_without_reloading(
    inspector: str, browser: webdriver.Chrome, store: RedisStore
) -> None:
    browser.get(inspector + "/threads")
    browser.execute_script("window.__same_page = true;")
    assert "t-late" not in ids_listed(browser)
    store.open_thread("t-late", task=TASK)
    WebDriverWait(browser, WAIT).until(lambda b: "t-late" in ids_listed(b))
    assert browser.execute_script("return window.__same_page") is True
    counts = browser.find_element(By.CSS_SELECTOR, '#counts a[data-status="queued"] .n').text
    assert int(counts) == store.status_counts()[Status.QUEUED]


def test_thread_page_shows_timeline_effects_and_the_diff(
    inspector: str, browser: webdriver.Chrome, store: RedisStore
) -> None:
    browser.get(inspector + "/thread?id=t-done")
    steps = [
        row.get_attribute("data-step")
        for row in browser.find_elements(By.CSS_SELECTOR, "#timeline tbody tr")
    ]
    assert steps == ["2", "1", "0"]
    assert "Refunded 25.99 EUR." in browser.find_element(By.ID, "result").text
    effect = browser.find_element(By.CSS_SELECTOR, '#effects tr[data-key="call-refund"]').text
    assert "done" in effect and "re_1" in effect
    Select(browser.find_element(By.ID, "diff-a")).select_by_visible_text("0")
    Select(browser.find_element(By.ID, "diff-b")).select_by_visible_text("2")
    browser.find_element(By.ID, "diff-show").click()
    wait_for(browser, "#changes")
    shown = [cell.text for cell in browser.find_elements(By.CSS_SELECTOR, "#changes td.path")]
    expected = checkpoint_changes(store.checkpoint("t-done", 0), store.checkpoint("t-done", 2))
    assert shown == [change.path for change in expected]  # agentq diff's paths, in order
    assert "state.count" in shown
    browser.find_element(By.CSS_SELECTOR, '#timeline tr[data-step="1"] a.show-step').click()
    WebDriverWait(browser, WAIT).until(lambda b: "step=1" in b.current_url)
    assert json.loads(browser.find_element(By.ID, "state").text)["count"] == 1
    browser.get(inspector + "/thread?id=t-done&a=1&b=2")
    browser.save_screenshot(str(SCREENSHOTS / "thread.png"))


def test_thread_page_shows_error_lease_and_artifacts(
    inspector: str, browser: webdriver.Chrome
) -> None:
    browser.get(inspector + "/thread?id=t-failed")
    assert "KeyError: 'customer_id'" in browser.find_element(By.ID, "thread-error").text
    assert "Traceback" in browser.find_element(By.ID, "thread-error").text
    browser.get(inspector + "/thread?id=t-running")
    assert "worker-a@host:4242" in browser.find_element(By.ID, "lease").text
    assert "not due" not in browser.find_element(By.ID, "due").text
    browser.get(inspector + "/thread?id=t-artifact")
    link = browser.find_element(By.CSS_SELECTOR, "#artifacts a")
    download = httpx.get(link.get_attribute("href") or "")
    assert download.content == ARTIFACT
    assert download.headers["content-disposition"].startswith("attachment")


def test_state_with_markup_renders_as_text(inspector: str, browser: webdriver.Chrome) -> None:
    for page in ("/thread?id=t-hostile", "/threads?status=failed"):
        browser.get(inspector + page)
        assert browser.execute_script("return window.__pwned") is None
    browser.get(inspector + "/thread?id=t-hostile")
    assert json.loads(browser.find_element(By.ID, "state").text)["reply"] == HOSTILE
    assert HOSTILE in browser.find_element(By.ID, "thread-error").text
    assert browser.find_elements(By.CSS_SELECTOR, "main script, main img") == []


def test_oversize_state_is_cut_with_a_link_to_the_whole(
    inspector: str, browser: webdriver.Chrome
) -> None:
    browser.get(inspector + "/thread?id=t-big")
    assert len(browser.find_element(By.ID, "state").text) < 70_000
    link = browser.find_element(By.CSS_SELECTOR, ".cut a.full-json").get_attribute("href")
    whole = httpx.get(link or "").json()
    assert whole["state"]["document"] == "x" * 100_000


def act(browser: webdriver.Chrome, button: str) -> None:
    """Press an action's button, then confirm on the page that asks."""
    browser.find_element(By.ID, button).click()
    wait_for(browser, "#confirm").click()
    wait_for(browser, "#notice")


def test_resume_asks_first_then_queues_the_thread_with_the_value(
    inspector: str, browser: webdriver.Chrome, store: RedisStore
) -> None:
    browser.get(inspector + "/thread?id=t-waiting")
    browser.find_element(By.ID, "resume-value").send_keys('{"approved": true}')
    browser.find_element(By.ID, "resume").click()
    wait_for(browser, "#confirm")
    assert store.meta("t-waiting").status == Status.WAITING  # type: ignore[union-attr]
    browser.find_element(By.ID, "confirm").click()
    assert "Resumed" in wait_for(browser, "#notice").text
    meta = store.meta("t-waiting")
    assert meta is not None and meta.status == Status.QUEUED
    assert meta.resume_value == {"approved": True}


def test_a_value_that_is_not_json_is_refused_before_anything_changes(
    inspector: str, browser: webdriver.Chrome, store: RedisStore
) -> None:
    browser.get(inspector + "/thread?id=t-waiting")
    browser.find_element(By.ID, "resume-value").send_keys("{approved: yes")
    browser.find_element(By.ID, "resume").click()
    assert "is not JSON" in wait_for(browser, "#error").text
    assert browser.find_elements(By.ID, "confirm") == []
    assert store.meta("t-waiting").status == Status.WAITING  # type: ignore[union-attr]


def test_retry_cancel_and_fork_change_the_store(
    inspector: str, browser: webdriver.Chrome, store: RedisStore
) -> None:
    browser.get(inspector + "/thread?id=t-failed")
    act(browser, "retry")
    meta = store.meta("t-failed")
    assert meta is not None and meta.status == Status.QUEUED and meta.error is None

    browser.get(inspector + "/thread?id=t-queued")
    act(browser, "cancel")
    assert store.meta("t-queued").status == Status.CANCELLED  # type: ignore[union-attr]

    browser.get(inspector + "/thread?id=t-done")
    Select(browser.find_element(By.ID, "fork-step")).select_by_value("1")
    browser.find_element(By.ID, "fork-to").send_keys("t-done-again")
    act(browser, "fork")
    assert browser.find_element(By.ID, "thread-id").text == "t-done-again"
    fork = store.meta("t-done-again")
    assert fork is not None and fork.status == Status.WAITING and fork.step == 1


@pytest.mark.parametrize("outcome", ["result", "did_not_run"])
def test_settling_an_effect_records_it_and_queues_the_thread(
    inspector: str, browser: webdriver.Chrome, store: RedisStore, outcome: str
) -> None:
    browser.get(inspector + "/thread?id=t-attention")
    form = browser.find_element(By.CSS_SELECTOR, '#effects tr[data-key="call-mail"] form')
    assert (
        "needs_attention"
        in browser.find_element(By.CSS_SELECTOR, '#effects tr[data-key="call-mail"]').text
    )
    if outcome == "result":
        form.find_element(By.CLASS_NAME, "resolve-result").send_keys('{"message_id": "m-1"}')
    else:
        form.find_element(By.CLASS_NAME, "did-not-run").click()
    form.find_element(By.CLASS_NAME, "resolve").click()
    wait_for(browser, "#confirm").click()
    assert "Settled" in wait_for(browser, "#notice").text
    assert store.meta("t-attention").status == Status.QUEUED  # type: ignore[union-attr]
    effect = store.effect("t-attention", "call-mail")
    if outcome == "result":
        assert effect is not None and effect.state == EffectState.DONE
        assert effect.result == {"message_id": "m-1"}
    else:
        assert effect is None


def test_an_action_posted_without_the_pages_csrf_token_is_refused(
    inspector: str, store: RedisStore
) -> None:
    form = {"action": "cancel", "id": "t-queued", "confirmed": "yes", "csrf": "guessed"}
    refused = httpx.post(inspector + "/thread/action", data=form)
    assert refused.status_code == 403
    assert store.meta("t-queued").status == Status.QUEUED  # type: ignore[union-attr]


def test_read_only_offers_no_action_and_refuses_posts(
    threads: dict[Status, str],
    serve: Callable[..., str],
    browser: webdriver.Chrome,
    store: RedisStore,
) -> None:
    base = serve(read_only=True)
    for thread_id in threads.values():
        browser.get(f"{base}/thread?id={thread_id}")
        assert browser.find_element(By.ID, "read-only").text == "read-only"
        assert browser.find_elements(By.CSS_SELECTOR, "main form[method=post]") == []
        assert browser.find_elements(By.ID, "actions") == []
    refused = httpx.post(base + "/thread/action", data={"action": "cancel", "id": "t-queued"})
    assert refused.status_code == 403
    assert store.meta("t-queued").status == Status.QUEUED  # type: ignore[union-attr]


def test_off_loopback_every_request_needs_the_token(
    threads: dict[Status, str], serve: Callable[..., str], browser: webdriver.Chrome
) -> None:
    base = serve(token="s3cret-token", loopback=False)
    browser.delete_all_cookies()
    for page in ("/threads", "/thread?id=t-done", "/threads?token=wrong"):
        browser.get(base + page)
        assert "needs its access token" in browser.find_element(By.TAG_NAME, "body").text
        assert browser.find_elements(By.ID, "threads") == []
    assert httpx.get(base + "/thread/json?id=t-done").status_code == 401
    bearer = {"authorization": "Bearer s3cret-token"}
    assert httpx.get(base + "/thread/json?id=t-done", headers=bearer).status_code == 200
    browser.get(base + "/threads?token=s3cret-token")
    wait_for(browser, "#threads")
    assert "token" not in browser.current_url  # out of the address bar and the history
    browser.get(base + "/thread?id=t-done")  # the cookie carries it on
    assert browser.find_element(By.ID, "thread-id").text == "t-done"
    browser.delete_all_cookies()


def test_on_loopback_a_request_for_another_host_name_is_refused(inspector: str) -> None:
    assert httpx.get(inspector + "/threads").status_code == 200
    rebound = httpx.get(inspector + "/threads", headers={"host": "attacker.example:8765"})
    assert rebound.status_code == 400


def test_a_thread_made_running_later_shows_up_on_its_page(
    inspector: str, browser: webdriver.Chrome, store: RedisStore
) -> None:
    store.open_thread("t-fresh", task=TASK)
    browser.get(inspector + "/thread?id=t-fresh")
    assert browser.find_element(By.ID, "status").text == "queued"
    drive(store, "t-fresh", [{"n": 1}])
    WebDriverWait(browser, WAIT).until(lambda b: b.find_element(By.ID, "status").text == "running")
