"""Which names the server answers to (the `Host` header) and which pages may open its socket (`Origin`).

A page on another site cannot read the server's HTTP answers, but a WebSocket is not bound by that, so the
socket checks `Origin`. Comparing it with `Host` alone is passed by DNS rebinding (the attacker's name resolves
to this server, so `Host` and `Origin` agree) and broken by a proxy that rewrites `Host`. Hence two lists:
`allowed_hosts` (default: the loopback names and the address the server listens on; "*" for any) is checked on
every request, and `allowed_origins` (default: the page's own origin, on a host that passed that check) on the
socket's handshake. Clients without an `Origin` (command-line tools) are not browsers and are let in.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

LOOPBACK = ("localhost", "127.0.0.1", "::1")
ANY_ADDRESS = ("0.0.0.0", "::", "")


def parse_list(spec: str) -> tuple[str, ...]:
    return tuple(item.strip().lower() for item in spec.split(",") if item.strip())


def allowed_hosts(spec: str, listen_host: str) -> frozenset[str] | None:
    """The host names `Host` may carry (None: any); `spec` is the setting, a comma-separated list."""
    names = parse_list(spec)
    if "*" in names:
        return None
    if names:
        return frozenset(names)
    own = () if listen_host in ANY_ADDRESS else (listen_host.strip("[]").lower(),)
    return frozenset(LOOPBACK + own)


def host_name(host_header: str | None) -> str | None:
    """The name in a Host header, without its port; None for a missing or malformed one."""
    if not host_header:
        return None
    parsed = urlsplit("//" + host_header)
    try:
        parsed.port  # raises on a port that is not a number
    except ValueError:
        return None
    return (parsed.hostname or "").lower() or None


def origin_allowed(origin: str | None, host_header: str | None, allowed: Iterable[str]) -> bool:
    """An `Origin` may open the socket if it is listed, or, with nothing listed, if it is the page's own."""
    if origin is None:
        return True
    listed = tuple(allowed)
    if listed:
        return origin.rstrip("/").lower() in {o.rstrip("/") for o in listed}
    return urlsplit(origin).netloc.lower() == (host_header or "").lower()


class HostCheck:
    """Refuses (HTTP 400, naming the setting) a request whose `Host` is not one of `hosts`."""

    def __init__(self, app: ASGIApp, hosts: frozenset[str] | None):
        self.app, self.hosts = app, hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.hosts is None or scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        header = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
        if host_name(header) in self.hosts:
            await self.app(scope, receive, send)
            return
        message = (f"this server does not answer to the host {header!r}; add it to TYPEWRITER_ALLOWED_HOSTS "
                   "(a comma-separated list; * allows any)")
        await PlainTextResponse(message, status_code=400)(scope, receive, send)
