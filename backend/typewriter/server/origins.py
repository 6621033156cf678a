"""Which names the server answers to (`Host`) and which pages may open its socket (`Origin`). A WebSocket is not
bound by the same-origin policy, and comparing `Origin` with `Host` alone is passed by DNS rebinding: hence two
lists. A client without an `Origin` is not a browser and is let in.
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
PASSED = "typewriter.host_passed"  # absent from the scope after the check: it refused


def allowed_hosts(spec: str, listen_host: str) -> list[str]:
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
