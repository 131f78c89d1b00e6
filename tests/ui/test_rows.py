"""The threads table's rows, written in Python: every text from the store is escaped."""

from __future__ import annotations

import time

from agentq.records import ListedThread, Status
from agentq.ui.rows import threads_rows

MARKUP = '<script>alert(1)</script>"&'
ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;&quot;&amp;"


def row(status: Status, **fields: object) -> ListedThread:
    base = ListedThread(
        'id<b>"&', status, 3, MARKUP, MARKUP, 1, 0, time.time(), None, False, owner=MARKUP
    )
    return base._replace(**fields)


def test_every_text_of_a_row_is_escaped() -> None:
    rows = [
        row(Status.RUNNING),
        row(Status.FAILED, error=f"Traceback (most recent call last):\nValueError: {MARKUP}"),
        row(Status.WAITING, interrupt=MARKUP),
        row(Status.DONE, result=MARKUP),
    ]
    html = str(threads_rows(rows))
    assert "<script" not in html and "<b>" not in html
    assert html.count(ESCAPED) == 3 + 4 * 3  # the note of three rows; node, task, owner of each
    assert 'data-thread="id&lt;b&gt;&quot;&amp;"' in html
    assert 'href="/thread?id=id%3Cb%3E%22%26"' in html


def test_a_row_notes_what_its_status_asks_for() -> None:
    notes = [
        row(Status.WAITING, interrupt={"ask": "ok?"}, owner=None),
        row(Status.DONE, result=42, owner=None),
        row(Status.RUNNING, cancel_requested=True),
        row(Status.QUEUED, crashes=2, owner=None),
    ]
    html = str(threads_rows(notes))
    assert (
        "asks: {&quot;ask&quot;: &quot;ok?&quot;}" in html
        and "→ 42" in html
        and "cancel requested" in html
    )
    assert "(2 lost)" in html
