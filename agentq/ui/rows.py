"""The rows of the threads table as HTML, written here rather than in a template: a page
has 50 of them, and Jinja's lookup and escape of each of their ~15 values cost more than
the store's read of the whole page. Every text read from the store goes through
:func:`html.escape` (quotes included, as the text may land in an attribute; half the
cost of markupsafe's); numbers and statuses are the store's own."""

from __future__ import annotations

from collections.abc import Iterable
from html import escape
from urllib.parse import quote

from markupsafe import Markup

from agentq.ops.jsonable import short
from agentq.records import ListedThread, Status
from agentq.ui.format import ago, error_line, when

_LOST = ' <span class="warn" title="workers lost at this step">({} lost)</span>'


def threads_rows(rows: Iterable[ListedThread]) -> Markup:
    return Markup("".join(map(_row, rows)))


def _row(row: ListedThread) -> str:
    shown = escape(row.thread_id)
    link = escape(quote(row.thread_id, safe="/"))
    status = row.status.value
    owner = f'<span class="owner">{escape(row.owner)}</span>' if row.owner else "-"
    return (
        f'<tr data-thread="{shown}">\n'
        f'  <td class="id"><a href="/thread?id={link}">{shown}</a></td>\n'
        f'  <td><span class="status status-{status}">{status}</span></td>\n'
        f'  <td class="num">{row.step}</td>\n'
        f"  <td>{escape(row.node or '-')}</td>\n"
        f"  <td>{escape(row.task or '-')}</td>\n"
        f'  <td title="{when(row.updated_at)}">{ago(row.updated_at)}</td>\n'
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
