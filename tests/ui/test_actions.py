"""The inspector's actions and pages as a client sees them over HTTP, without a browser:
what each action does to the store when the form is odd, stale or hostile."""

from __future__ import annotations

import html
import json
import math
import re
import socket
from collections.abc import Callable

import httpx
import pytest
import redis
from celery import Celery

from agentq.records import Checkpoint, EffectState, Status
from agentq.store.redis.store import RedisStore
from agentq.ui.views import SCAN_LIMIT
from tests.support.redis_server import RedisServer, free_port
from tests.ui.population import OWNER, TASK, drive

Serve = Callable[..., str]


def page_form(base: str, thread_id: str, form_id: str) -> dict[str, str]:
    """The hidden fields of a form on the thread's page, as the browser would post them."""
    page = httpx.get(base + "/thread", params={"id": thread_id}).text
    form = page.split(f'id="{form_id}"', 1)[1].split("</form>", 1)[0]
    return {
        name: html.unescape(value)
        for name, value in re.findall(r'type="hidden" name="([^"]+)" value="([^"]*)"', form)
    }


def confirm(base: str, form: dict[str, str]) -> httpx.Response:
    """Post the form as the confirmation page does."""
    return httpx.post(base + "/thread/action", data={**form, "confirmed": "yes"})


@pytest.fixture
def base(threads: dict[Status, str], serve: Serve) -> str:
    return serve()


def test_resume_with_the_value_left_empty_answers_nothing(base: str, store: RedisStore) -> None:
    form = {**page_form(base, "t-waiting", "resume-form"), "value": "  "}
    asked = httpx.post(base + "/thread/action", data=form)
    assert "a run.interrupt() asks again" in asked.text and "refund 10?" in asked.text
    assert confirm(base, form).status_code == 303
    meta = store.meta("t-waiting")
    assert meta is not None and meta.status == Status.QUEUED and not meta.resumed


def test_a_resume_confirmed_after_the_thread_moved_on_is_refused(
    base: str, store: RedisStore
) -> None:
    form = {**page_form(base, "t-waiting", "resume-form"), "value": '{"approved": true}'}
    assert httpx.post(base + "/thread/action", data=form).status_code == 200
    # Meanwhile someone else answers, and the thread asks a bigger question.
    store.reopen("t-waiting", from_statuses={Status.WAITING}, resume_value={"approved": False})
    token = store.acquire("t-waiting", OWNER, 60)
    store.commit(
        "t-waiting",
        token,
        Checkpoint(step=2, node="node3", state={"amount": 10_000}, task=TASK, token=token),
    )
    store.set_status(
        "t-waiting",
        token,
        Status.WAITING,
        interrupt={"question": "refund 10000?"},
        release_owner=OWNER,
    )
    refused = confirm(base, form)
    assert refused.status_code == 409 and "moved on since its page was read" in refused.text
    meta = store.meta("t-waiting")
    assert meta is not None and meta.status == Status.WAITING
    assert meta.interrupt == {"question": "refund 10000?"} and not meta.resumed


def test_an_effect_shows_the_key_its_tool_sent_downstream(base: str, store: RedisStore) -> None:
    """What the operator looks the call up by at the service before settling it, as
    ``agentq effects`` shows it."""
    page = httpx.get(base + "/thread", params={"id": "t-attention"}).text
    row = page.split('data-key="call-mail"', 1)[1].split("</tr>", 1)[0]
    assert f'class="path sent-as">{store.downstream_key("t-attention", "call-mail")}<' in row


def test_a_failed_thread_holding_an_answer_takes_a_new_one(base: str, store: RedisStore) -> None:
    store.reopen("t-waiting", from_statuses={Status.WAITING}, resume_value="yes")
    token = store.acquire("t-waiting", OWNER, 60)
    store.set_status("t-waiting", token, Status.FAILED, error="ValueError", release_owner=OWNER)
    form = page_form(base, "t-waiting", "resume-form")
    empty = confirm(base, form)  # no answer: only a waiting thread runs on without one
    assert empty.status_code == 409
    assert confirm(base, {**form, "value": '"no"'}).status_code == 303
    meta = store.meta("t-waiting")
    assert meta is not None and meta.status == Status.QUEUED and meta.resume_value == "no"


def test_a_failed_thread_holding_an_answer_is_not_promised_a_resume_without_one(
    base: str, store: RedisStore
) -> None:
    # Only a waiting thread runs on without an answer: the confirmation must not say it
    # will, for the store to refuse it once confirmed.
    store.reopen("t-waiting", from_statuses={Status.WAITING}, resume_value="yes")
    token = store.acquire("t-waiting", OWNER, 60)
    store.set_status("t-waiting", token, Status.FAILED, error="ValueError", release_owner=OWNER)
    asked = httpx.post(base + "/thread/action", data=page_form(base, "t-waiting", "resume-form"))
    assert asked.status_code == 409, asked.text
    assert 'id="confirm"' not in asked.text
    assert "give the answer" in html.unescape(asked.text)


def test_a_retry_whose_message_the_broker_refuses_says_the_thread_is_queued(
    threads: dict[Status, str], serve: Serve, store: RedisStore
) -> None:
    refusing = Celery("refusing", broker=f"redis://127.0.0.1:{free_port()}/0", set_as_current=False)
    try:
        base = serve(app=refusing, start_grace=9)
        done = confirm(base, page_form(base, "t-failed", "retry-form"))
    finally:
        refusing.close()
    assert done.status_code == 303, done.text
    assert store.meta("t-failed").status == Status.QUEUED  # type: ignore[union-attr]
    notice = httpx.get(base + done.headers["location"]).text.split('id="notice">', 1)[1]
    notice = html.unescape(notice.split("</p>", 1)[0])
    assert "Retrying: queued again; its message could not be sent" in notice, notice
    assert "sweeper sends it when it is due, within 9 s" in notice, notice


def test_settling_with_a_result_needs_one(base: str, store: RedisStore) -> None:
    form = page_form(base, "t-attention", "effects")
    refused = confirm(base, {**form, "outcome": "result", "result": ""})
    assert refused.status_code == 409 and "give the call&#39;s result as JSON" in refused.text
    effect = store.effect("t-attention", "call-mail")
    assert effect is not None and effect.state == EffectState.PENDING
    assert confirm(base, {**form, "outcome": "result", "result": "null"}).status_code == 303
    effect = store.effect("t-attention", "call-mail")
    assert effect is not None and effect.state == EffectState.DONE and effect.result is None


def test_cancelling_a_thread_that_failed_meanwhile_says_nothing_was_cancelled(
    serve: Serve, store: RedisStore
) -> None:
    store.open_thread("t-soon", task=TASK, start_grace=0)
    base = serve()
    form = page_form(base, "t-soon", "cancel-form")
    token = store.acquire("t-soon", OWNER, 60)
    store.set_status("t-soon", token, Status.FAILED, error="boom", release_owner=OWNER)
    done = confirm(base, form)
    assert done.status_code == 303
    page = httpx.get(base + done.headers["location"]).text
    assert "Nothing to cancel: the thread had already failed." in page
    assert store.meta("t-soon").status == Status.FAILED  # type: ignore[union-attr]


def test_a_form_over_the_limit_is_refused_before_the_rest_of_it_arrives(
    base: str, store: RedisStore
) -> None:
    """Any page the operator has open can post to a loopback inspector: an endless body
    must be cut off, not read into memory."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(
            b"POST /thread/action HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/x-www-form-urlencoded\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        chunk = b"x" * 65536
        for _ in range(40):  # 2.5 MB, and the body never ends
            conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        answer = conn.recv(4096)  # times out if the server waits for the end
    assert answer.startswith(b"HTTP/1.1 413")
    announced = httpx.post(
        base + "/thread/action",
        content=b"x" * (2 << 20),
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert announced.status_code == 413
    assert store.meta("t-queued").status == Status.QUEUED  # type: ignore[union-attr]


def test_the_live_part_of_a_thread_page_reads_the_meta_and_lease_only(
    base: str, store: RedisStore, redis_server: RedisServer
) -> None:
    def sent() -> int:
        return int(admin.info("stats")["total_net_output_bytes"])

    with redis.Redis.from_url(redis_server.url) as admin:
        before = sent()
        whole = httpx.get(base + "/thread", params={"id": "t-big"})
        between = sent()
        live = httpx.get(base + "/thread/live", params={"id": "t-big"})
        after = sent()
    assert whole.status_code == live.status_code == 200 and 'id="status"' in live.text
    # The whole page reads t-big's 100 KB state; its live part reads the meta and lease.
    assert between - before > 100_000
    assert after - between < 10_000


def test_a_state_holding_nan_has_a_json_link_that_works(serve: Serve, store: RedisStore) -> None:
    drive(store, "t-nan", [{"score": math.nan, "bound": math.inf}])
    base = serve()
    whole = httpx.get(base + "/thread/json", params={"id": "t-nan", "step": "0"})
    assert whole.status_code == 200

    def refuse(word: str) -> None:
        raise AssertionError(f"{word} is not JSON: {whole.text}")

    # Tagged as the command line's --json writes it: strict JSON, which any reader takes.
    assert json.loads(whole.text, parse_constant=refuse)["state"] == {
        "score": {"$float": "NaN"},
        "bound": {"$float": "Infinity"},
    }
    assert httpx.get(base + "/thread/json", params={"id": "t-nan"}).status_code == 200


def test_a_resume_value_holding_nan_is_refused(base: str, store: RedisStore) -> None:
    form = {**page_form(base, "t-waiting", "resume-form"), "value": '{"score": NaN}'}
    refused = confirm(base, form)
    assert refused.status_code == 409 and "NaN is not a JSON number" in refused.text
    assert store.meta("t-waiting").status == Status.WAITING  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "number",
    # Past 4300 digits int() itself refuses (CPython's limit on reading long numbers).
    ["²", "\u0661", "99999999999999999999", "9" * 5000, "-1", "1.5"],
    ids=["superscript", "arabic", "past-max", "past-int-digits", "negative", "fraction"],
)
def test_a_number_that_is_not_a_plain_whole_one_is_a_bad_request(
    base: str, number: str, store: RedisStore
) -> None:
    for path, name in [("/thread", "step"), ("/thread", "a")]:
        answer = httpx.get(base + path, params={"id": "t-done", name: number, "b": "1"})
        assert answer.status_code == 400, (path, name, answer.text)
        assert "must be a whole number" in answer.text
    form = {**page_form(base, "t-done", "fork-form"), "step": number, "to": "t-fork"}
    assert confirm(base, form).status_code == 409
    assert store.meta("t-fork") is None


def test_a_step_given_with_thousands_of_leading_zeros_is_that_step(base: str) -> None:
    answer = httpx.get(base + "/thread", params={"id": "t-done", "step": "0" * 5000 + "1"})
    assert answer.status_code == 200, answer.text


def test_error_pages_carry_the_security_headers(
    base: str, store: RedisStore, redis_server: RedisServer
) -> None:
    missing = httpx.get(base + "/thread", params={"id": "t-nobody"})
    elsewhere = httpx.get(base + "/threads", headers={"host": "attacker.example"})
    with redis.Redis.from_url(redis_server.url) as admin:
        admin.set(store.keys.meta("t-broken"), "not a hash")
        broken = httpx.get(base + "/thread", params={"id": "t-broken"})
    assert (missing.status_code, elsewhere.status_code, broken.status_code) == (404, 400, 500)
    for answer in (missing, elsewhere, broken):
        assert "default-src 'none'" in answer.headers["content-security-policy"]
        assert answer.headers["x-frame-options"] == "DENY"


def test_an_id_prefix_starting_with_a_space_finds_its_threads(
    serve: Serve, store: RedisStore
) -> None:
    store.open_thread(" spaced", task=TASK)
    base = serve()
    page = httpx.get(base + "/threads", params={"prefix": " sp"}).text
    assert 'data-thread=" spaced"' in page


def test_the_bearer_scheme_is_read_in_any_letter_case(
    threads: dict[Status, str], serve: Serve
) -> None:
    base = serve(token="s3cret", loopback=False)
    for scheme in ("Bearer", "bearer", "BEARER"):
        answer = httpx.get(base + "/threads", headers={"authorization": f"{scheme} s3cret"})
        assert answer.status_code == 200, scheme
    assert (
        httpx.get(base + "/threads", headers={"authorization": "Basic s3cret"}).status_code == 401
    )


def test_a_page_after_a_cursor_no_listing_gave_is_a_bad_request(base: str) -> None:
    answer = httpx.get(base + "/threads", params={"after": "99999999999999999999"})
    assert answer.status_code == 400 and "not a cursor of a listing" in answer.text


def test_a_link_made_elsewhere_cannot_make_the_page_report_an_action(
    base: str, store: RedisStore
) -> None:
    forged = httpx.get(
        base + "/thread",
        params={"id": "t-queued", "done": "cancel", "status": "cancelled", "sent": "evil-id"},
    )
    assert forged.status_code == 200
    assert "Cancelled." not in forged.text and "evil-id" not in forged.text
    done = confirm(base, page_form(base, "t-queued", "cancel-form"))
    shown = httpx.get(base + done.headers["location"]).text
    assert "Cancelled." in shown
    assert store.meta("t-queued").status == Status.CANCELLED  # type: ignore[union-attr]


def test_the_pages_name_the_step_a_thread_is_at_as_the_command_line_does(
    base: str, store: RedisStore
) -> None:
    # t-failed committed checkpoints 0 and 1 and failed in step 2, the step its error and
    # `agentq threads` name; a queued thread with no checkpoint is at step 0, not -1.
    listing = httpx.get(base + "/threads").text

    def listed_step(thread_id: str) -> str:
        row = listing.split(f'data-thread="{thread_id}"', 1)[1].split("</tr>", 1)[0]
        return re.findall(r'<td class="num">(-?\d+)</td>', row)[0]

    assert (listed_step("t-failed"), listed_step("t-queued"), listed_step("t-done")) == (
        "2",
        "0",
        "2",
    )
    page = httpx.get(base + "/thread", params={"id": "t-failed"}).text
    assert "<dt>step</dt><dd>2 (next node: node2; latest checkpoint 1)</dd>" in page
    queued = httpx.get(base + "/thread", params={"id": "t-queued"}).text
    assert "<dt>step</dt><dd>0 (next node: -; no checkpoint yet)</dd>" in queued


def test_a_filter_that_read_its_limit_without_a_match_does_not_say_there_is_none(
    serve: Serve, store: RedisStore
) -> None:
    store.open_thread("ticket-42", task=TASK)  # the oldest: read last, newest first
    for index in range(SCAN_LIMIT + 10):
        store.open_thread(f"other-{index}", task=TASK)
    base = serve()
    first = httpx.get(base + "/threads", params={"prefix": "ticket-"}).text
    assert "ticket-42" not in first and "No threads" not in first
    assert f"none in the {SCAN_LIMIT} newest index entries read" in first
    older = html.unescape(re.findall(r'<a href="([^"]+)" id="next-page">', first)[0])
    assert 'data-thread="ticket-42"' in httpx.get(base + older).text
