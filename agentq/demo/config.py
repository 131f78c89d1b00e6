"""Where one demo run keeps everything, passed to its workers as environment variables."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any, Final

ENV_PREFIX: Final = "AGENTQ_DEMO_"


class DemoConfigMissing(RuntimeError):
    """Raised when agentq.demo.app is loaded without the environment the demo sets."""


@dataclass(frozen=True)
class DemoConfig:
    """``namespace`` is unique per run: the store's key prefix, the queue, the ledger's
    keys. ``ledger`` is the payment service's database: a SQLite path, or a Redis URL.
    ``lifeline_fd``, when set, is a pipe the demo holds open; workers exit when it closes
    (the demo died without cleaning up)."""

    workdir: str
    store: str
    broker: str
    ledger: str
    namespace: str
    lease_ttl: float = 2.0
    sweep_interval: float = 0.2
    start_grace: float = 3.0
    lifeline_fd: int = -1

    @property
    def queue(self) -> str:
        return self.namespace

    @property
    def prefix(self) -> str:
        return f"{self.namespace}:"

    @property
    def embedded(self) -> bool:
        return self.broker.startswith("filesystem:")

    def broker_folder(self, name: str) -> str:
        return os.path.join(self.workdir, "broker", name)

    def to_env(self) -> dict[str, str]:
        return {ENV_PREFIX + f.name.upper(): str(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> DemoConfig:
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = environ.get(ENV_PREFIX + f.name.upper())
            if raw is None:
                if f.default is MISSING:
                    raise DemoConfigMissing(
                        f"{ENV_PREFIX}{f.name.upper()} is not set: agentq.demo.app is the "
                        "app of the demo's workers, configured by 'agentq demo'; run that"
                    )
                continue
            values[f.name] = _CONVERTERS[str(f.type)](raw)
        return cls(**values)


_CONVERTERS: Final = {"str": str, "float": float, "int": int}
