"""``agentq limits``: the app's declared budgets and what the store says is used of them."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from agentq import limit
from agentq.cli.entry import cli
from agentq.limits import Limits
from agentq.store.contract.limits import Take
from agentq.store.sqlite.store import SQLiteStore

APP = """
from celery import Celery
import agentq

app = Celery("limits-cli", broker="memory://", set_as_current=False)
agentq.init_app(app, store="sqlite:///{db}", limits=[
    agentq.limit("openai", requests_per_minute=60, tokens_per_minute=1000, concurrency=2),
    agentq.limit("tenant:{{tenant}}", requests_per_minute=6),
])
"""


def test_limits_shows_budgets_use_slots_and_pauses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "agentq.db"
    module = f"limits_app_{uuid.uuid4().hex[:6]}"
    (tmp_path / f"{module}.py").write_text(APP.format(db=db))
    monkeypatch.syspath_prepend(str(tmp_path))
    store = SQLiteStore(db)

    declared = Limits(
        [
            limit("openai", requests_per_minute=60, tokens_per_minute=1000, concurrency=2),
            limit("tenant:{tenant}", requests_per_minute=6),
        ]
    )
    takes = [
        Take("openai", declared.of("openai"), 400),
        Take("tenant:7", declared.of("tenant:7"), 0),
    ]
    taken_at = time.monotonic()
    assert store.take_limits(takes, "call-1", 60).taken
    store.pause_limit("tenant:7", 30)
    store.close()

    result = CliRunner().invoke(cli, ["-A", f"{module}:app", "limits", "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["key"]: row for row in json.loads(result.stdout)}
    assert set(rows) == {"openai", "tenant:7"}
    assert rows["openai"]["in_flight"] == 1
    # What is left refills with the time since the take, however long the command took.
    refilled_for = time.monotonic() - taken_at
    assert 600 - 1e-6 <= rows["openai"]["tokens_left"] <= 600 + 1000 / 60 * refilled_for + 1e-6
    assert 59 - 1e-6 <= rows["openai"]["requests_left"] <= min(60, 59 + refilled_for) + 1e-6
    assert rows["tenant:7"]["declared"] == "tenant:{tenant}"
    assert rows["tenant:7"]["paused_for"] > 25

    table = CliRunner().invoke(cli, ["-A", f"{module}:app", "limits"])
    assert table.exit_code == 0, table.output
    assert "tenant:7 (tenant:{tenant})" in table.output


KEYED_APP = """
from celery import Celery
import agentq

app = Celery("limits-cli", broker="memory://", set_as_current=False)
agentq.init_app(app, store="sqlite:///{db}", limits=[agentq.limit("team:{{team}}", threads=1)])
"""


def test_limits_shows_each_concurrency_keys_running_and_waiting_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "agentq.db"
    module = f"keyed_app_{uuid.uuid4().hex[:6]}"
    (tmp_path / f"{module}.py").write_text(KEYED_APP.format(db=db))
    monkeypatch.syspath_prepend(str(tmp_path))
    store = SQLiteStore(db)
    for thread_id in ("a", "b", "c"):
        store.open_thread(thread_id, task="t")
        token = store.acquire(thread_id, "me", 60)
        store.enter_key(thread_id, "me", token, "team:1", 1)
    store.close()

    result = CliRunner().invoke(cli, ["-A", f"{module}:app", "limits", "--json"])
    assert result.exit_code == 0, result.output
    [row] = json.loads(result.stdout)
    assert (row["key"], row["declared"], row["threads"]) == ("team:1", "team:{team}", 1)
    assert row["running_threads"] == ["a"]
    assert [(w["thread_id"], w["position"]) for w in row["waiting"]] == [("b", 1), ("c", 2)]
    assert all(w["since"] > 0 and w["waited"] >= 0 for w in row["waiting"])

    table = CliRunner().invoke(cli, ["-A", f"{module}:app", "limits"])
    assert table.exit_code == 0, table.output
    assert "1 running, 2 waiting" in table.output
    assert "team:1 (team:{team})" in table.output


def test_limits_without_the_app_asks_for_it_rather_than_saying_none_are_declared(
    tmp_path: Path,
) -> None:
    # The budgets are declared in the app's settings; the store alone cannot say them.
    db = tmp_path / "agentq.db"
    declared = limit("openai", requests_per_minute=60)
    store = SQLiteStore(db)
    assert store.take_limits([Take("openai", declared, 0)], "call-1", 60).taken
    store.close()

    for args in (["limits"], ["limits", "--json"]):
        result = CliRunner().invoke(cli, ["--store", f"sqlite:///{db}", *args])
        assert result.exit_code == 1, result.output
        assert result.stdout == ""
        assert "-A module:app" in result.stderr
        assert "no limits declared" not in result.output


def test_limits_prints_keys_and_thread_ids_with_brackets_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A concurrency key's family part and a thread id come from the application's data
    # (a tenant's name, an order id): rich must not read their brackets as markup, as the
    # other commands' tables do not (they print them as Text).
    db = tmp_path / "agentq.db"
    module = f"keyed_app_{uuid.uuid4().hex[:6]}"
    (tmp_path / f"{module}.py").write_text(KEYED_APP.format(db=db))
    monkeypatch.syspath_prepend(str(tmp_path))
    store = SQLiteStore(db)
    for thread_id in ("order[bold]1", "order[/]2"):
        store.open_thread(thread_id, task="t")
        token = store.acquire(thread_id, "me", 60)
        store.enter_key(thread_id, "me", token, "team:[red]", 1)
    store.close()

    table = CliRunner().invoke(cli, ["-A", f"{module}:app", "limits"])
    assert table.exit_code == 0, table.output
    assert "team:[red] (team:{team})" in table.output
    assert "order[/]2" in table.output
