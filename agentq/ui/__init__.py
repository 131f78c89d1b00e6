"""``agentq ui``: a web inspector for threads (``pip install 'agentq[ui]'``).

Starlette with Jinja templates; the CSS and the script that refreshes the pages ship in
the package, no build step and nothing fetched from elsewhere.
"""

from agentq.ui.app import create_app

__all__ = ["create_app"]
