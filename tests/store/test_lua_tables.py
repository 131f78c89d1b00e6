"""The Lua scripts and Python name refusals and statuses the same way."""

from __future__ import annotations

import re
from importlib.resources import files
from pathlib import Path

from agentq.records import FINISHED, IDLE, LIVE, Status
from agentq.store.redis.refusal import Refusal
from agentq.store.redis.scripts import STORE_SCRIPTS, script_source, status_lua

LUA = files("agentq.store.redis") / "lua"


def _lua_table(text: str, name: str) -> str:
    found = re.search(rf"^local {name} = \{{(.*?)\}}", text, re.MULTILINE | re.DOTALL)
    assert found, f"no table {name} in the Lua text"
    return found.group(1)


def test_prelude_refusals_are_the_python_enum() -> None:
    table = _lua_table((LUA / "_prelude.lua").read_text(), "REFUSAL")
    entries = dict(re.findall(r"(\w+)\s*=\s*(-?\d+)", table))
    assert {name: int(code) for name, code in entries.items()} == {
        refusal.name: refusal.value for refusal in Refusal
    }


def test_no_script_spells_a_refusal_code() -> None:
    for script in LUA.iterdir():
        if script.name.endswith(".lua") and script.name != "_prelude.lua":
            assert not re.search(r"return \{-\d", script.read_text()), script.name


def test_generated_statuses_are_the_records_sets() -> None:
    text = status_lua()
    names = dict(re.findall(r"(\w+) = '(\w+)'", _lua_table(text, "STATUS")))
    assert names == {status.name: status.value for status in Status}
    for name, members in (("LIVE", LIVE), ("IDLE", IDLE), ("FINISHED", FINISHED)):
        assert set(re.findall(r"(\w+) = true", _lua_table(text, name))) == {
            status.value for status in members
        }


def test_dragonfly_flags_open_the_sent_script() -> None:
    for name in STORE_SCRIPTS:
        source = script_source(name, ("_prelude",))
        lines = source.splitlines()
        assert not any(line.startswith("--!df") for line in lines[1:]), name
        flagged = (LUA / f"{name}.lua").read_text().startswith("--!df ")
        assert source.startswith("--!df flags=allow-undeclared-keys\n") == flagged, name


def test_architecture_lists_every_script_and_whether_it_declares_its_keys() -> None:
    architecture = (Path(__file__).resolve().parents[2] / "ARCHITECTURE.md").read_text()
    table = architecture.split("| script | what it does, atomically | KEYS only |", 1)[1]
    listed: set[str] = set()
    keys_only: set[str] = set()
    for line in table.strip().splitlines()[1:]:
        if not line.startswith("|"):
            break
        script_cell, _, marked = (cell.strip() for cell in line.strip("|").split("|"))
        names = re.findall(r"`(\w+)`", script_cell)
        listed.update(names)
        if marked in ("yes", "both", "all three"):
            keys_only.update(names)
        else:
            keys_only.update(re.findall(r"`(\w+)`", marked))
    scripts = {
        script.name.removesuffix(".lua"): "allow-undeclared-keys" not in script.read_text()
        for script in LUA.iterdir()
        if script.name.endswith(".lua") and not script.name.startswith("_")
    }
    graph = {name for name in scripts if name.startswith("graph_")}
    assert set(scripts) - graph == listed
    assert {name for name, declared in scripts.items() if declared} == keys_only
