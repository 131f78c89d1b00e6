"""The rows of the threads table as HTML, written here rather than in a template: a page
has 50 of them, and Jinja's lookup and escape of each of their ~15 values cost more than
the store's read of the whole page. Every text read from the store is escaped (quotes
included, as the text may land in an attribute); numbers and statuses are the store's own.

Most thread ids are plain (letters, digits, ``_.~/-``), which neither escaping nor URL
quoting changes, so those skip both; node and task names repeat from row to row, so their
escaped forms are kept."""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from functools import lru_cache
from html import escape
from typing import Final
from urllib.parse import quote

from markupsafe import Markup

from agentq.ops.jsonable import short
from agentq.records import ListedThread, Status, step_at
from agentq.ui.format import ago, error_line, when

_LOST: Final = ' <span class="warn" title="workers lost at this step">({} lost)</span>'
_PLAIN: Final = re.compile(r"[A-Za-z0-9_.~/-]*")


@lru_cache(maxsize=1024)
def _name(text: str | None) -> str:
    """A node, task or owner name as shown: escaped, ``-`` when absent."""
    return escape(text) if text else "-"


def threads_rows(rows: Iterable[ListedThread]) -> Markup:
    now = time.time()
    return Markup("".join([_row(row, now) for row in rows]))


def _row(row: ListedThread, now: float) -> str:
    thread_id = row.thread_id
    if _PLAIN.fullmatch(thread_id):
        shown = link = thread_id
    else:
        shown, link = escape(thread_id), escape(quote(thread_id, safe="/"))
    status = row.status
    owner = f'<span class="owner">{_name(row.owner)}</span>' if row.owner else "-"
    updated = row.updated_at
    return (
        f'<tr data-thread="{shown}">\n'
        f'  <td class="id"><a href="/thread?id={link}">{shown}</a></td>\n'
        f'  <td><span class="status status-{status}">{status}</span></td>\n'
        # The step it is at, as `agentq threads` and the thread's error name it.
        f'  <td class="num">{step_at(status, row.step)}</td>\n'
        f"  <td>{_name(row.node)}</td>\n"
        f"  <td>{_name(row.task)}</td>\n"
        f'  <td title="{when(updated)}">{ago(updated, now)}</td>\n'
        f'  <td class="num">{row.attempts}{_LOST.format(row.crashes) if row.crashes else ""}</td>\n'
        f"  <td>{owner}</td>\n"
        f'  <td class="note">{_note(row)}</td>\n'
        "</tr>\n"
    )


def _note(row: ListedThread) -> str:
    if row.error:
        return f'<span class="error">{escape(error_line(row.error, 70))}</span>'
    if row.cancel_requested and not row.status.finished:
        return "cancel requested"
    if row.status is Status.WAITING and row.interrupt is not None:
        return f"asks: {escape(short(row.interrupt, 60))}"
    if row.status is Status.DONE:
        return f"→ {escape(short(row.result, 60))}"
    return ""
