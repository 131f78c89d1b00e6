"""``agentq ui``: a web inspector for threads (``pip install 'agentq[ui]'``).

Starlette with Jinja templates; the CSS and the script that refreshes the pages ship in
the package, no build step and nothing fetched from elsewhere.
"""

_EXTRA = frozenset({"starlette", "jinja2", "markupsafe"})
"""What the ``ui`` extra installs and these modules import (uvicorn only serves them)."""

try:
    from agentq.ui.app import create_app
except ModuleNotFoundError as exc:
    _missing = (exc.name or "").partition(".")[0]
    if _missing not in _EXTRA:
        raise
    raise ModuleNotFoundError(
        f"agentq.ui needs its extra: pip install 'agentq[ui]' ({_missing} is not installed)",
        name=exc.name,
    ) from exc

__all__ = ["create_app"]
