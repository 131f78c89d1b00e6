"""The console agentq prints to, on a terminal or piped."""

from __future__ import annotations

import sys
from typing import Final

from rich.console import Console

# Piped output is not squeezed to 80 columns: tables are read by grep and awk there.
_PIPE_WIDTH: Final = 200


def console(*, stderr: bool = False) -> Console:
    """A console on the current stdout (or stderr): colour only on a terminal (rich also
    honours NO_COLOR and FORCE_COLOR)."""
    stream = sys.stderr if stderr else sys.stdout
    terminal = stream.isatty()
    # No emoji codes: ":x:" in a thread id or an error must print as written.
    return Console(
        file=stream, highlight=False, emoji=False, width=None if terminal else _PIPE_WIDTH
    )
