"""The inspector as an ASGI app: :func:`create_app` over a store, and what it needs to run."""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from agentq.errors import InvalidArgument
from agentq.store.contract import Store
from agentq.ui.inspector import Inspector, templates
from agentq.ui.routes import EXCEPTION_HANDLERS, ROUTES
from agentq.ui.security import LoopbackHosts, SecureHeaders, TokenGate, new_secret


def create_app(
    store: Store,
    *,
    app: Any = None,
    start_grace: float = 30.0,
    read_only: bool = False,
    token: str | None = None,
    loopback: bool = True,
) -> Starlette:
    """The inspector over ``store``. ``token`` (required unless ``loopback``) must come
    with every request; ``read_only`` leaves out every action. On loopback only requests
    addressed to a loopback name are served: a site whose name an attacker points at
    127.0.0.1 (DNS rebinding) gets a refusal, not the threads."""
    if not loopback and token is None:
        raise InvalidArgument(
            "an inspector reachable from other machines needs an access token; pass "
            "token=... (agentq ui prints one, or reads AGENTQ_UI_TOKEN)"
        )
    inspector = Inspector(store, app, start_grace, read_only, new_secret(), templates())
    middleware = [Middleware(SecureHeaders), Middleware(TokenGate, token=token)]
    if loopback:
        middleware.insert(1, Middleware(LoopbackHosts))
    web = Starlette(
        routes=[
            *ROUTES,
            Mount("/static", StaticFiles(packages=[("agentq.ui", "static")]), name="static"),
        ],
        middleware=middleware,
        exception_handlers=EXCEPTION_HANDLERS,
    )
    web.state.inspector = inspector
    return web
