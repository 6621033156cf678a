"""The chat server under uvicorn, with readiness, dead-socket pings and a graceful shutdown (`typewriter serve`
parses its options in commands/serve.py)."""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING

import uvicorn
from websockets.exceptions import InvalidState

from ..config import Settings
from .app import create_app
from .lifecycle import EngineFactory, Phase, ServerState, load_real_engine

if TYPE_CHECKING:
    from .grpc_server import GrpcServer

GRPC_GRACE_S = 1.0


def serve(settings: Settings, engine_factory: EngineFactory = load_real_engine) -> int:
    """Run until SIGTERM or SIGINT, then drain: /readyz turns 503 at once, new sockets and chats are refused,
    running answers may finish for `drain_s`, then end with reason `shutdown`. Returns 0 after a drain (a second
    signal cuts it short), 1 if the model failed to load or the engine failed for good (so that a supervisor,
    Docker's restart policy or Kubernetes, starts a fresh process)."""
    logging.basicConfig(level=settings.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(settings, engine_factory)
    config = uvicorn_config(app, settings)
    server = Server(config, app.state.server)
    server.run()
    return 1 if server.load_failed or server.engine_failed or server.grpc_failed else 0


def uvicorn_config(app, settings: Settings, **overrides) -> uvicorn.Config:
    values = dict(
        host=settings.host,
        port=settings.port,
        ws="websockets-sansio",  # the websockets library's protocol, without its deprecated legacy layer
        ws_max_size=settings.max_message_bytes,
        ws_ping_interval=settings.ping_interval_s or None,
        ws_ping_timeout=settings.ping_timeout_s or None,
        log_level=settings.log_level,
        lifespan="on",
        timeout_graceful_shutdown=max(1, round(settings.shutdown_grace_s)),
    )
    return uvicorn.Config(app, **(values | overrides))


class Server(uvicorn.Server):
    """uvicorn's server, plus: print the URL once bound, serve gRPC beside it (`grpc_port`), exit if the model
    fails to load, and end every chat with reason `shutdown` before uvicorn closes the sockets (it would
    otherwise drop them with 1012) and the gRPC server stops."""

    def __init__(self, config: uvicorn.Config, state: ServerState):
        super().__init__(config)
        self.state = state
        self.grpc: GrpcServer | None = None
        self.load_failed = False
        self.engine_failed = False
        self.grpc_failed = False

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started:
            host, port = self.servers[0].sockets[0].getsockname()[:2]
            print(f"Typewriter on http://{_shown(host)}:{port}/ (loading the model; /readyz says when it is ready)",
                  flush=True)
            grpc_port = self.state.settings.grpc_port
            if grpc_port is not None:
                await self._start_grpc(self.config.host, grpc_port)  # beside HTTP, on its address

    async def _start_grpc(self, host: str, port: int) -> None:
        from .grpc_server import GrpcServer  # grpcio is imported only when gRPC is on

        self.grpc = GrpcServer(self.state)
        try:
            port = await self.grpc.start(host, port)
        except RuntimeError as e:
            print(f"typewriter: error: gRPC cannot listen on {_shown(host)}:{port} ({e})", file=sys.stderr,
                  flush=True)
            self.grpc_failed = self.should_exit = True  # shutdown still runs: the HTTP server is already up
            return
        print(f"gRPC on {_shown(host)}:{port}", flush=True)

    async def on_tick(self, counter: int) -> bool:
        if self.state.phase is Phase.FAILED:
            print(f"typewriter: error: the model failed to load: {self.state.error}", file=sys.stderr, flush=True)
            self.load_failed = True
            return True
        if self.state.engine_failed and not self.engine_failed:  # its thread died, or its steps kept failing
            print("typewriter: error: the engine failed for good (the log above says how); stopping so that a "
                  "fresh process can take over", file=sys.stderr, flush=True)
            self.engine_failed = True
            self.should_exit = True  # the usual shutdown: open sockets are closed, the process exits 1
        return await super().on_tick(counter)

    def handle_exit(self, sig, frame) -> None:
        """SIGTERM/SIGINT: stop taking chats now and let the main loop end (then `shutdown` drains). Unlike
        uvicorn's own handler it does not re-raise the signal afterwards: a drained server exits 0."""
        self.state.begin_drain()
        if self.should_exit:  # a second signal: no more waiting for running answers
            self.force_exit = True
        self.should_exit = True

    async def shutdown(self, sockets=None) -> None:
        await self.state.drain(hurry=lambda: self.force_exit)
        if self.grpc is not None:  # its chats have ended; what still runs (a health watch) gets a moment
            await self.grpc.stop(GRPC_GRACE_S)
        for connection in list(self.server_state.connections):
            _tolerate_closing(connection)
        await super().shutdown(sockets)


def _shown(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _tolerate_closing(connection) -> None:
    """uvicorn's websockets-sansio connection raises InvalidState when shut down just as its client's close
    frame has come in (the socket is CLOSING; uvicorn only counts its own close as sent), and that exception
    ended the whole shutdown, so a drained server exited 1. Such a socket is ending anyway: close it."""
    shutdown = connection.shutdown

    def tolerant() -> None:
        try:
            shutdown()
        except InvalidState:
            connection.transport.close()

    connection.shutdown = tolerant
