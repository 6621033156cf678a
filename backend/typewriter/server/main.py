"""The chat server under uvicorn, with a graceful shutdown (`typewriter serve` parses its options in commands/)."""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
import sys
from types import FrameType
from typing import TYPE_CHECKING, Any

import uvicorn
from starlette.applications import Starlette
from websockets.exceptions import InvalidState

from ..config import Settings
from .access_log import quiet_probes
from .app import create_app
from .classes import Classes
from .connections import Waiting, ensure_descriptors, guarded_http, log_accept_failures_once_an_interval
from .lifecycle import EngineFactory, Phase, ServerState, load_real_engine
from .listen import EXIT_CANNOT_LISTEN, cannot_listen, listen, taken

if TYPE_CHECKING:
    from uvicorn.server import Protocols

    from .grpc.server import GrpcServer

GRPC_GRACE_S = 1.0
GRPC_DESCRIPTORS = 3  # a connection to the gRPC port: the client's, the proxy's to gRPC, and gRPC's own end of it


def serve(settings: Settings, engine_factory: EngineFactory = load_real_engine, classes: Classes | None = None,
          collector_held: bool = False) -> int:
    """Run until SIGTERM or SIGINT, then drain. Returns 0 after a drain, 1 if the model or the engine failed (so
    that a supervisor starts a fresh process), EXIT_CANNOT_LISTEN if a port cannot be bound. `classes` None: read
    from `settings`; `collector_held`: as Server's."""
    try:
        sockets = listen(settings.serving.host, settings.serving.port)
    except OSError as e:
        print(f"typewriter: error: {cannot_listen('port', settings.serving.host, settings.serving.port, e, '--port')}",
              file=sys.stderr, flush=True)
        return EXIT_CANNOT_LISTEN
    if settings.serving.grpc_port is not None and (why := taken("gRPC port", settings.serving.host, settings.serving.grpc_port,
                                                        "--grpc-port")):
        for sock in sockets:
            sock.close()
        print(f"typewriter: error: {why}", file=sys.stderr, flush=True)
        return EXIT_CANNOT_LISTEN
    logging.basicConfig(level=settings.serving.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(settings, engine_factory, classes=classes)
    server = Server(uvicorn_config(app, settings), app.state.server, collector_held)
    try:
        server.run(sockets=sockets)
    finally:
        for sock in sockets:
            sock.close()
    if server.grpc_failed:
        return EXIT_CANNOT_LISTEN
    return 1 if server.load_failed or server.engine_failed else 0


def uvicorn_config(app: Starlette, settings: Settings, **overrides: Any) -> uvicorn.Config:
    metrics = app.state.server.metrics
    waiting = Waiting(settings.limits.max_pending_connections, settings.limits.max_pending_per_client, settings.limits.header_timeout_s,
                      lambda reason: metrics.dropped_connections.labels(reason=reason).inc())
    values: dict[str, Any] = dict(
        host=settings.serving.host,
        port=settings.serving.port,
        ws="websockets-sansio",  # without the websockets library's deprecated legacy layer
        ws_max_size=settings.socket.max_message_bytes,
        ws_ping_interval=settings.socket.ping_interval_s or None,
        ws_ping_timeout=settings.socket.ping_timeout_s or None,
        # uvicorn would trust X-Forwarded-For from loopback; trusted_proxies alone decides whose header counts.
        proxy_headers=False,
        http=guarded_http(waiting),
        log_level=settings.serving.log_level,
        lifespan="on",
        timeout_graceful_shutdown=max(1, round(settings.serving.shutdown_grace_s)),
    )
    config = uvicorn.Config(app, **(values | overrides))  # configures uvicorn's loggers, so it comes first
    quiet_probes()
    return config


class Server(uvicorn.Server):
    """uvicorn's server, plus gRPC beside it, an exit when the model fails to load, and every chat ended with
    reason `shutdown` before uvicorn would drop the sockets with 1012."""

    def __init__(self, config: uvicorn.Config, state: ServerState, collector_held: bool = False):
        """`collector_held`: Python's cyclic collector is off for the start (commands/serve.py); it is turned back on
        at the first tick after the server is ready or the load failed, with the start's objects frozen first: they
        live as long as the process, and a first full pass over them landed on the first chat
        (docs/measurements/2026-12-06-late-tokenizer.md)."""
        super().__init__(config)
        self.state = state
        self.collector_held = collector_held
        self.grpc: GrpcServer | None = None
        self.load_failed = False
        self.engine_failed = False
        self.grpc_failed = False

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        log_accept_failures_once_an_interval(asyncio.get_running_loop())
        grpc_port = self.state.settings.serving.grpc_port
        ensure_descriptors(self.state.settings.limits.max_connections, self.state.settings.limits.max_pending_connections,
                           1 if grpc_port is None else 1 + GRPC_DESCRIPTORS)
        if grpc_port is not None and not await self._start_grpc(self.config.host, grpc_port):
            self.grpc_failed = self.should_exit = True  # before the lifespan: nothing loads, nothing to drain
            return
        await super().startup(sockets)
        if self.started:
            host, port = self.servers[0].sockets[0].getsockname()[:2]
            print(f"Typewriter on http://{_shown(host)}:{port}/ (loading the model; /readyz says when it is ready)",
                  flush=True)

    async def _start_grpc(self, host: str, port: int) -> bool:
        """False, and one line saying why, when the port cannot be had."""
        from .grpc.server import GrpcServer  # grpcio is imported only when gRPC is on

        why = taken("gRPC port", host, port, "--grpc-port")
        if why is None:
            grpc = GrpcServer(self.state)
            try:
                bound = await grpc.start(host, port)
            except RuntimeError as e:  # taken in between, or refused for a reason of gRPC's own
                why = f"gRPC cannot listen on {_shown(host)}:{port} ({e})"
            else:
                self.grpc = grpc
                print(f"gRPC on {_shown(host)}:{bound}", flush=True)
                return True
        print(f"typewriter: error: {why}", file=sys.stderr, flush=True)
        return False

    async def on_tick(self, counter: int) -> bool:
        if self.collector_held and self.state.phase is not Phase.LOADING:
            gc.freeze()
            gc.enable()
            self.collector_held = False
        if self.state.phase is Phase.FAILED:
            print(f"typewriter: error: the model failed to load: {self.state.error}", file=sys.stderr, flush=True)
            self.load_failed = True
            return True
        if self.state.engine_failed and not self.engine_failed:
            print("typewriter: error: the engine failed for good (the log above says how); stopping so that a "
                  "fresh process can take over", file=sys.stderr, flush=True)
            self.engine_failed = True
            self.should_exit = True
        return await super().on_tick(counter)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Unlike uvicorn's handler this does not re-raise the signal afterwards: a drained server exits 0."""
        self.state.begin_drain()
        if self.should_exit:  # a second signal: no more waiting for running answers
            self.force_exit = True
        self.should_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self.state.drain(hurry=lambda: self.force_exit)
        if self.grpc is not None:
            await self.grpc.stop(GRPC_GRACE_S)
        for connection in list(self.server_state.connections):
            _tolerate_closing(connection)
        await super().shutdown(sockets)


def _shown(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _tolerate_closing(connection: Protocols) -> None:
    """uvicorn's websockets-sansio connection raises InvalidState when shut down just as its client's close frame
    has come in, which would end the whole shutdown; such a socket is ending anyway."""
    shutdown = connection.shutdown

    def tolerant() -> None:
        try:
            shutdown()
        except InvalidState:
            connection.transport.close()

    connection.shutdown = tolerant  # type: ignore[method-assign]  # uvicorn has no hook: its method is wrapped
