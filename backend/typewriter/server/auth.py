"""An optional API key for the socket and every HTTP route but the probes. With `api_key_page` the page and sockets
from an allowed origin need none, as a browser cannot set the header on a WebSocket; an `Origin` can be forged by
anything that is not a browser, so that keeps other sites' pages out, not scripts.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

OPEN_PATHS = ("/healthz", "/readyz")  # probes from an orchestrator carry no key
PAGE_PREFIXES = ("/static/", "/frontend/")  # the page's files; the page itself is "/"


def bearer(authorization: str | None) -> str | None:
    """The key of an `Authorization: Bearer <key>` header's value."""
    scheme, _, key = (authorization or "").partition(" ")
    return key.strip() if scheme.lower() == "bearer" and key.strip() else None


def presented_key(headers: dict[bytes, bytes]) -> str | None:
    return bearer(headers.get(b"authorization", b"").decode("latin-1"))


class ApiKeyCheck:
    def __init__(self, app: ASGIApp, key: str, page_exempt: bool, origin_ok: Callable[[Scope], bool],
                 class_key: Callable[[str], bool] = lambda key: False):
        """`class_key(key)`: whether it is a key of the classes file, which lets its holder in as the server's
        own key does."""
        self.app, self.key, self.page_exempt, self.origin_ok = app, key.encode(), page_exempt, origin_ok
        self.class_key = class_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self.key or scope["type"] not in ("http", "websocket") or self._exempt(scope):
            await self.app(scope, receive, send)
            return
        given = presented_key(dict(scope["headers"]))
        if given is not None and (hmac.compare_digest(given.encode(), self.key) or self.class_key(given)):
            await self.app(scope, receive, send)
            return
        body = {"error": {"code": "unauthorized", "message": "this server needs its API key: send "
                          "'Authorization: Bearer <key>' (TYPEWRITER_API_KEY on the server)"}}
        await JSONResponse(body, status_code=401, headers={"www-authenticate": "Bearer"})(scope, receive, send)

    def _exempt(self, scope: Scope) -> bool:
        path: str = scope["path"]
        if path in OPEN_PATHS:
            return True
        if not self.page_exempt:
            return False
        if scope["type"] == "http":
            return path == "/" or path.startswith(PAGE_PREFIXES)
        # only a browser sends an Origin; the socket checks it again
        return b"origin" in dict(scope["headers"]) and self.origin_ok(scope)
