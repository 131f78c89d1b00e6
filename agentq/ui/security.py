"""Who may talk to the inspector: anyone on this machine when it listens on loopback, only
holders of its access token otherwise; and only its own pages may post actions.

The access token arrives once as ``?token=`` (the link printed at start), or as
``Authorization: Bearer``; it is kept in an HttpOnly, same-site cookie so the page's own
requests carry it. Every form carries the CSRF token, a secret of this process that no
other site can read (the browser's same-origin rule keeps our pages from it), so a page
elsewhere cannot make an operator's browser retry or cancel a thread.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from typing import Final

from starlette.datastructures import URL
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

TOKEN_ENV: Final = "AGENTQ_UI_TOKEN"
COOKIE: Final = "agentq_ui_token"
LOOPBACK_NAMES: Final = ("localhost", "127.0.0.1", "::1", "[::1]")

# No inline script or style anywhere: a thread's state that escaped its escaping could
# still not run.
SECURE_HEADERS: Final = [
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        b"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
]


class SecureHeaders:
    """Adds :data:`SECURE_HEADERS` to every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURE_HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_headers)


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the inspector on this machine."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def new_secret() -> str:
    return secrets.token_urlsafe(24)


def same(given: str | None, expected: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


def host_name(header: str) -> str:
    """The name in a ``Host`` header, without its port (``[::1]:8765`` -> ``::1``)."""
    if header.startswith("["):
        return header[1:].partition("]")[0]
    return header.rpartition(":")[0] if header.count(":") == 1 else header


class LoopbackHosts:
    """Refuses requests addressed to any name but a loopback one."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not is_loopback(
            host_name(Request(scope).headers.get("host", ""))
        ):
            response = PlainTextResponse(
                "agentq ui: this inspector listens on loopback and answers only requests "
                "addressed to localhost or 127.0.0.1",
                status_code=400,
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


class TokenGate:
    """Refuses every request without the access token (``None``: no token needed)."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.token is None:
            await self.app(scope, receive, send)
            return
        response = self._check(Request(scope))
        if response is None:
            await self.app(scope, receive, send)
        else:
            await response(scope, receive, send)

    def _check(self, request: Request) -> Response | None:
        assert self.token is not None
        given = request.query_params.get("token")
        if given is not None:
            if not same(given, self.token):
                return _refused()
            # Out of the address bar and the history: the cookie carries it from now on.
            target = URL(str(request.url)).remove_query_params("token")
            response = RedirectResponse(str(target), status_code=303)
            response.set_cookie(COOKIE, self.token, httponly=True, samesite="strict", path="/")
            return response
        scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and same(credentials.strip(), self.token):
            return None
        if same(request.cookies.get(COOKIE), self.token):
            return None
        return _refused()


def _refused() -> Response:
    return PlainTextResponse(
        "agentq ui: this inspector needs its access token. Open the link it printed at "
        f"start (…/?token=...), or set {TOKEN_ENV} before starting it and pass that.",
        status_code=401,
        headers={"WWW-Authenticate": "Bearer"},
    )
