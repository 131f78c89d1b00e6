"""``agentq ui``: a web inspector for threads (``pip install 'agentq[ui]'``).

Starlette with Jinja templates; the CSS and the script that refreshes the pages ship in
the package, no build step and nothing fetched from elsewhere.
"""

from agentq.errors import missing_extra

_EXTRA = frozenset({"starlette", "jinja2", "markupsafe"})
"""What the ``ui`` extra installs and these modules import (uvicorn only serves them)."""

try:
    from agentq.ui.app import create_app
except ModuleNotFoundError as exc:
    if (exc.name or "").partition(".")[0] not in _EXTRA:
        raise
    raise missing_extra("agentq.ui", "ui", exc) from exc

__all__ = ["create_app"]
