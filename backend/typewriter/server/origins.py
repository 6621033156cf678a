"""Which names the server answers to (the `Host` header) and which pages may open its socket (`Origin`).

A page on another site cannot read the server's HTTP answers, but a WebSocket is not bound by that, so the
socket checks `Origin`. Comparing it with `Host` alone is passed by DNS rebinding (the attacker's name resolves
to this server, so `Host` and `Origin` agree) and broken by a proxy that rewrites `Host`. Hence two lists:
`allowed_hosts` (default: the loopback names and the address the server listens on; "*" for any, "*.example.org"
for every name under one) is checked on every request by Starlette's `TrustedHostMiddleware`, and
`allowed_origins` (default: the page's own origin, on a host that passed that check) on the socket's handshake.
Clients without an `Origin` (command-line tools) are not browsers and are let in.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..config import parse_list

LOOPBACK = ("localhost", "127.0.0.1", "[::1]")
ANY_ADDRESS = ("0.0.0.0", "::", "")
PASSED = "typewriter.host_passed"  # set in the scope by the app behind the host check, so a refusal is known


def allowed_hosts(spec: str, listen_host: str) -> list[str]:
    """The host names `Host` may carry, as TrustedHostMiddleware reads them (["*"]: any); `spec` is the setting, a
    comma-separated list. An IPv6 address is written in brackets, as it appears in a Host header."""
    names = parse_list(spec)
    if "*" in names:
        return ["*"]
    if names:
        return sorted({_as_in_host_header(name) for name in names})
    own = () if listen_host in ANY_ADDRESS else (_as_in_host_header(listen_host.lower()),)
    return sorted(set(LOOPBACK + own))


def _as_in_host_header(name: str) -> str:
    bare = name.strip("[]")
    try:
        return f"[{bare}]" if ipaddress.ip_address(bare).version == 6 else bare
    except ValueError:
        return name


def origin_allowed(origin: str | None, host_header: str | None, allowed: Iterable[str], https: bool = False) -> bool:
    """An `Origin` may open the socket if it is listed, or, with nothing listed, if it is the page's own: the host
    and port of `Host`, and the scheme the page was served over (https when `https`)."""
    if origin is None:
        return True
    listed = tuple(allowed)
    if listed:
        return origin.rstrip("/").lower() in {o.rstrip("/") for o in listed}
    parts = urlsplit(origin)
    return (parts.scheme.lower() == ("https" if https else "http")
            and parts.netloc.lower() == (host_header or "").lower())


class HostCheck:
    """Starlette's TrustedHostMiddleware decides; its refusal (HTTP 400 "Invalid host header") is replaced by one
    that names the host and the setting to change. No `www.` redirect: a name is listed or it is not."""

    def __init__(self, app: ASGIApp, hosts: list[str]):
        self.app = app
        self.check = TrustedHostMiddleware(self._passed, allowed_hosts=hosts, www_redirect=False)

    async def _passed(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope[PASSED] = True
        await self.app(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return

        async def send_unless_refused(message: Message) -> None:
            if scope.get(PASSED):  # the app's own messages; the middleware's refusal is dropped
                await send(message)

        await self.check(scope, receive, send_unless_refused)
        if not scope.get(PASSED):
            header = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            message = (f"this server does not answer to the host {header!r}; add it to TYPEWRITER_ALLOWED_HOSTS "
                       "(a comma-separated list; * allows any, *.example.org every name under it)")
            await PlainTextResponse(message, status_code=400)(scope, receive, send)
