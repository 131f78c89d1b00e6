"""Import paths from before the package was layered, kept for one release with a warning.

``import agentq.task`` still works and warns once; the module it gives hands on the names
of the modules that now hold them. Nothing inside agentq imports an old path.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from collections.abc import Sequence
from typing import Any, Final

MOVED: Final[dict[str, tuple[str, ...]]] = {
    "agentq.aio": ("agentq.engine.aio",),
    "agentq.app": ("agentq.celery.runtime",),
    "agentq.backoff": ("agentq.engine.backoff",),
    "agentq.cli.cleanup": ("agentq.ops.gc",),
    "agentq.cli.latency": ("agentq.ops.latency",),
    "agentq.doctor": ("agentq.ops.doctor",),
    "agentq.driver": ("agentq.engine.driver",),
    "agentq.effects": ("agentq.engine.tool_policy",),
    "agentq.function_agent": ("agentq.celery.function_agent",),
    "agentq.heartbeat": ("agentq.engine.lease",),
    "agentq.keys": ("agentq.ids", "agentq.store.redis.keys"),
    "agentq.langgraph.backend": ("agentq.store.graph",),
    "agentq.langgraph.keys": ("agentq.store.redis.graph_keys",),
    "agentq.langgraph.records": ("agentq.store.graph_records",),
    "agentq.langgraph.redis_backend": ("agentq.store.redis.graph",),
    "agentq.langgraph.sqlite_backend": ("agentq.store.sqlite.graph",),
    "agentq.logs": ("agentq.engine.append_only",),
    "agentq.run": ("agentq.engine.run",),
    "agentq.store.base": ("agentq.store.contract",),
    "agentq.sweeper": ("agentq.celery.recovery",),
    "agentq.task": ("agentq.celery.task",),
    "agentq.unstorable": ("agentq.codec.unstorable",),
    "agentq.worker": ("agentq.celery.bootstep", "agentq.celery.drain"),
}
"""Old module path -> the modules that now hold its names, searched in order."""


class MovedModule(types.ModuleType):
    """An old module path: each attribute is looked up in the modules that hold it now."""

    def __init__(self, name: str, targets: Sequence[str]) -> None:
        super().__init__(name, f"Moved to {', '.join(targets)}.")
        self.__targets = tuple(targets)

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        for target in self.__targets:
            module = importlib.import_module(target)
            if hasattr(module, attr):
                return getattr(module, attr)
        raise AttributeError(f"module {self.__name__!r} has no attribute {attr!r}")


class _MovedLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return MovedModule(spec.name, MOVED[spec.name])

    def exec_module(self, module: types.ModuleType) -> None:
        targets = MOVED[module.__name__]
        warnings.warn(
            f"{module.__name__} is deprecated and goes away in agentq 0.3; import from "
            f"{' or '.join(targets)} (or from agentq itself)",
            DeprecationWarning,
            stacklevel=2,
        )


class MovedFinder(importlib.abc.MetaPathFinder):
    """Finds the old paths in :data:`MOVED`; every other name is left to the usual finders."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, _MovedLoader())


def install() -> None:
    if not any(isinstance(finder, MovedFinder) for finder in sys.meta_path):
        sys.meta_path.append(MovedFinder())
