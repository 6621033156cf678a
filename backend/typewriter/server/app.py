"""The Starlette app: health, readiness, metrics, the chat socket and its page, and the OpenAI-style HTTP API."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket

from ..config import Settings, parse_list
from .auth import ApiKeyCheck
from .classes import Classes
from .lifecycle import EngineFactory, Phase, ServerState, load_real_engine
from .limits import client_address, forwarded_https
from .metrics import CONTENT_TYPE
from .openai.routes import OpenAI
from .origins import HostCheck, allowed_hosts, origin_allowed
from .page import Page
from .resume.registry import Resumes
from .socket import frames as p
from .socket.session import Session

# The repository root: templates/, static/ and frontend/ live beside backend/ (the package is installed editable).
WEB_ROOT = Path(__file__).resolve().parents[3]

SECURITY_HEADERS = [
    (b"content-security-policy",
     b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
     b"object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]


def create_app(settings: Settings, engine_factory: EngineFactory = load_real_engine,
               web_root: Path = WEB_ROOT, classes: Classes | None = None) -> Starlette:
    """The app; `app.state.server` is its ServerState. The engine loads on a thread once the lifespan starts.
    `classes` None: read from `settings` (the default class alone without a classes file)."""
    state = ServerState(settings, engine_factory, classes)
    allowed_origins = parse_list(settings.access.allowed_origins)
    templates = Jinja2Templates(directory=web_root / "templates")
    resumes = Resumes(settings, state.metrics.registry)
    openai = OpenAI(state, resumes)
    streams = openai.streams
    assert streams is not None  # OpenAI keeps streams where it is given the resumes

    async def healthz(request: Request) -> Response:
        healthy, body = state.health()
        return JSONResponse(body, status_code=200 if healthy else 503)

    async def readyz(request: Request) -> Response:
        ready, body = state.readiness()
        return JSONResponse(body, status_code=200 if ready else 503)

    async def metrics(request: Request) -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)

    def socket_origin_ok(scope: Scope) -> bool:
        """Against the scheme its page was served over: wss, or https at a trusted proxy."""
        headers = Headers(scope=scope)
        peer = scope["client"][0] if scope.get("client") else None
        https = scope.get("scheme") == "wss" or forwarded_https(peer, headers, state.limits.trusted)
        return origin_allowed(headers.get("origin"), headers.get("host"), allowed_origins, https)

    async def chat_socket(websocket: WebSocket) -> None:
        if not socket_origin_ok(websocket.scope):
            await websocket.close(p.CLOSE_POLICY_VIOLATION)  # before accept: the handshake is refused (403)
            return
        await websocket.accept()
        if state.phase is Phase.STOPPING:
            await websocket.close(p.CLOSE_SERVICE_RESTART, "shutdown")
            return
        if not state.ready:
            reason = ("the model is still loading; retry when /readyz is 200" if state.phase is Phase.LOADING
                      else "the server is not serving chats; see /readyz")
            await websocket.close(p.CLOSE_TRY_AGAIN_LATER, reason)
            return
        limits = state.limits
        address = client_address(websocket.client.host if websocket.client else None, websocket.headers,
                                 limits.trusted)
        client = state.identities.resolve(address, websocket.headers.get("authorization"),
                                          websocket.headers.get("cookie"))
        if client is None:
            await websocket.close(p.CLOSE_POLICY_VIOLATION, "this server serves its classes only: open the page "
                                                            "with your class's code (/?class=CODE)")
            return
        refused = limits.connect(client)
        if refused:
            await websocket.close(p.CLOSE_TRY_AGAIN_LATER, refused)
            return
        left = None
        try:
            left = await Session(websocket, state, client, resumes).run()
        finally:
            if left is not None:
                left.hold(lambda: limits.disconnect(client))
            else:
                limits.disconnect(client)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        state.start_loading()
        yield
        await state.drain()

    app = Starlette(
        routes=[
            Route("/", Page(state, templates).index),
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/metrics", metrics),
            WebSocketRoute("/ws", chat_socket),
            Route("/v1/chat/completions", openai.chat_completions, methods=["POST"]),
            Route("/v1/responses", openai.responses, methods=["POST"]),
            Route("/v1/models", openai.models, methods=["GET"]),
            Route("/v1/class", openai.classroom, methods=["GET"]),
            Route("/v1/stream/{conversation_id}", streams.replay, methods=["GET"]),
            Route("/v1/stream/{conversation_id}", streams.stop, methods=["DELETE"]),
            Route("/v1/{path:path}", openai.unknown, methods=["GET", "POST", "PUT", "PATCH", "DELETE"]),
            Mount("/static", StaticFiles(directory=web_root / "static", check_dir=False), name="static"),
            Mount("/frontend", StaticFiles(directory=web_root / "frontend", check_dir=False), name="frontend"),
        ],
        lifespan=lifespan,
    )
    # Each add wraps the app so far: the security headers go on last, so the refusals below carry them too.
    app.add_middleware(ApiKeyCheck, key=settings.access.api_key, page_exempt=settings.access.api_key_page,
                       origin_ok=socket_origin_ok, class_key=lambda key: state.classes.by_key(key) is not None)
    app.add_middleware(HostCheck, hosts=allowed_hosts(settings.access.allowed_hosts, settings.serving.host))
    app.add_middleware(SecurityHeaders)
    app.state.server = state
    return app


class SecurityHeaders:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = list(message.get("headers", [])) + SECURITY_HEADERS
            await send(message)

        await self.app(scope, receive, send_with_headers)
