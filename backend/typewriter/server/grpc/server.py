"""The gRPC server beside uvicorn, on the same event loop: `typewriter.v1.Chat`, the standard health service and
server reflection. A health Check reads the state as it is answered, so that it never lags /readyz. Health and
reflection need no API key, as /healthz needs none (and the schema is public).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import grpc  # type: ignore[import-untyped, unused-ignore]  # untyped unless grpc-stubs (the test extra) is in
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ..lifecycle import ServerState
from .calls import Calls, client_of
from .guard import LOOPBACK, Guard
from .proxy import Proxy
from .service import SERVICE_NAME, ChatService, add_to_server

HEALTH_POLL_S = 0.2
IDLE_S = 60.0  # a connection without calls is closed after this: a student reading an answer and typing the next
# question keeps it, while the connections a crowd leaves open are given back within a minute (the caps bound them)
OVERALL = ""  # the health service's name for the whole server
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


# grpc-stubs has no grpc_health.v1.health.aio, and without the stubs grpc_health is untyped: its class is Any.
class _LiveHealth(health.aio.HealthServicer):  # type: ignore[misc, name-defined, unused-ignore]
    def __init__(self, follow: Callable[[], Awaitable[None]]):
        super().__init__()
        self._follow = follow

    async def Check(self, request: health_pb2.HealthCheckRequest,
                    context: grpc.aio.ServicerContext[health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse],
                    ) -> health_pb2.HealthCheckResponse:
        await self._follow()
        response: health_pb2.HealthCheckResponse = await super().Check(request, context)
        return response


class GrpcServer:
    def __init__(self, state: ServerState):
        self.state = state
        self.health = _LiveHealth(self._follow_state)
        self._status: int | None = None
        self._server: grpc.aio.Server | None = None
        self._proxy: Proxy | None = None
        self._watch: asyncio.Task[None] | None = None

    async def start(self, host: str, port: int) -> int:
        """Returns the bound port; raises RuntimeError when it is in use (SO_REUSEPORT is off, so none is shared)."""
        settings = self.state.settings
        limits = settings.limits
        metrics = self.state.metrics
        guard = Guard(limits.max_pending_connections, limits.max_pending_per_client, limits.header_timeout_s,
                      IDLE_S + limits.header_timeout_s,  # after gRPC's own goodbye, for a call it still counts
                      lambda reason: metrics.dropped_connections.labels(reason=reason).inc())
        options = [("grpc.so_reuseport", 0),
                   ("grpc.max_receive_message_length", settings.socket.max_message_bytes),  # as a socket's frame
                   # a connection that never sends HTTP/2's preface is closed, as an HTTP one without its header
                   ("grpc.server_handshake_timeout_ms", round(limits.header_timeout_s * 1000)),
                   # a connection without calls gets a GOAWAY, so that its client reconnects without failing a call
                   ("grpc.max_connection_idle_ms", round(IDLE_S * 1000))]
        if settings.socket.ping_interval_s and settings.socket.ping_timeout_s:  # a dead peer loses its chat, as on the socket
            options += [("grpc.keepalive_time_ms", round(settings.socket.ping_interval_s * 1000)),
                        ("grpc.keepalive_timeout_ms", round(settings.socket.ping_timeout_s * 1000)),
                        ("grpc.http2.max_pings_without_data", 0)]  # also while a chat waits in the queue
        server = grpc.aio.server(options=options, interceptors=(Calls(guard, self.state.limits, self.state.identities),))
        add_to_server(ChatService(self.state, lambda context: client_of(context, guard, self.state.limits.trusted)),
                      server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
            server)
        await self._follow_state()  # NOT_SERVING from the first check on, unless already ready
        grpc_port: int = server.add_insecure_port(f"{LOOPBACK}:0")
        await server.start()
        proxy = Proxy(guard, grpc_port, linger_s=limits.header_timeout_s)
        try:
            bound = await proxy.start(host, port)
        except OSError as e:
            await server.stop(None)
            raise RuntimeError(str(e)) from e
        self._server, self._proxy = server, proxy
        self._watch = asyncio.create_task(self._watch_state(), name="grpc-health")
        return bound

    async def stop(self, grace_s: float) -> None:
        """Call it once the drain has ended the chats, so that their streams have sent their end."""
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        if self._proxy is not None:
            self._proxy.close()  # no new connections; those open hear gRPC's GOAWAY through it
        await self.health.enter_graceful_shutdown()  # health watchers hear NOT_SERVING before they are cut off
        if self._server is not None:
            await self._server.stop(grace_s)
        if self._proxy is not None:
            self._proxy.end()

    async def _watch_state(self) -> None:
        while True:
            await asyncio.sleep(HEALTH_POLL_S)
            await self._follow_state()

    async def _follow_state(self) -> None:
        status = SERVING if self.state.ready else NOT_SERVING
        if status != self._status:
            self._status = status
            for service in (OVERALL, SERVICE_NAME):
                await self.health.set(service, status)
