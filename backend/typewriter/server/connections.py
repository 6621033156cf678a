"""Connections before they are requests, and descriptors running out (SECURITY.md). Those still waiting for a
whole header are capped and timed out, the oldest closed first, so that a silent crowd cannot take every
descriptor and a health probe always gets its turn.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections.abc import Callable
from typing import Any

import h11
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

log = logging.getLogger("typewriter.server")

LOG_INTERVAL_S = 60.0
RESERVED_DESCRIPTORS = 128  # beyond the connections: the model's files, the engine's threads, gRPC, the log


class Every:
    """Something said at most once an interval, with how many times it happened in between."""

    def __init__(self, interval_s: float = LOG_INTERVAL_S, clock: Callable[[], float] = time.monotonic):
        self.interval_s, self.clock = interval_s, clock
        self.count = 0
        self._last: float | None = None

    def tick(self) -> int | None:
        """Count one; the count since the last time it was said if it is time to say it again, else None."""
        self.count += 1
        now = self.clock()
        if self._last is not None and now - self._last < self.interval_s:
            return None
        count, self.count, self._last = self.count, 0, now
        return count


class Waiting:
    """Connections waiting for a request header. Event loop only; `on_drop(reason)` hears of each one closed."""

    def __init__(self, total: int, per_client: int, timeout_s: float, on_drop: Callable[[str], None]):
        self.total, self.per_client, self.timeout_s = total, per_client, timeout_s
        self.on_drop = on_drop
        self._all: dict[GuardedH11Protocol, str] = {}  # insertion order: the oldest first
        self._by_client: dict[str, dict[GuardedH11Protocol, None]] = {}
        self._dropped = {reason: Every() for reason in ("header_timeout", "pending_per_client", "pending_total")}

    def __len__(self) -> int:
        return len(self._all)

    def wait(self, connection: GuardedH11Protocol, client: str) -> None:
        self._all[connection] = client
        peers = self._by_client.setdefault(client, {})
        peers[connection] = None
        if len(peers) > self.per_client:
            self.drop(next(iter(peers)), "pending_per_client")
        if len(self._all) > self.total:
            self.drop(next(iter(self._all)), "pending_total")

    def done(self, connection: GuardedH11Protocol) -> None:
        """Idempotent."""
        client = self._all.pop(connection, None)
        if client is None:
            return
        peers = self._by_client[client]
        del peers[connection]
        if not peers:
            del self._by_client[client]

    def drop(self, connection: GuardedH11Protocol, reason: str) -> None:
        client = self._all.get(connection, "unknown")
        self.done(connection)
        connection.close()
        self.on_drop(reason)
        if (count := self._dropped[reason].tick()) is not None:
            why = {"header_timeout": f"sent no whole request header within {self.timeout_s:g} s",
                   "pending_per_client": f"were pushed out by newer ones from their address (at most "
                                         f"{self.per_client} may wait for a header: TYPEWRITER_MAX_PENDING_PER_CLIENT)",
                   "pending_total": f"were pushed out by newer ones (at most {self.total} may wait for a header: "
                                    "TYPEWRITER_MAX_PENDING_CONNECTIONS)"}[reason]
            log.warning("%d connection(s) closed since this was last said (at most once a minute): they %s; the "
                        "latest from %s", count, why, client)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, with a deadline for each request header, a kept-alive connection's next too."""

    def __init__(self, config: Config, server_state: ServerState, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None, *, waiting: Waiting):
        super().__init__(config, server_state, app_state, _loop)
        self.waiting = waiting
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(  # type: ignore[override]  # as uvicorn's: a Transport, not asyncio's BaseTransport
            self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)
        self._await_header()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._deadline is not None and self.conn.their_state is not h11.IDLE:  # a whole header came
            self._stop_waiting()

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        self._stop_waiting()  # the socket's own protocol takes the connection over from here
        super().handle_websocket_upgrade(event)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE and self._deadline is None:
            self._await_header()  # kept alive: the next request's header has the same time

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_waiting()
        super().connection_lost(exc)

    def close(self) -> None:
        self._stop_waiting()
        if not self.transport.is_closing():
            self.transport.close()

    def _await_header(self) -> None:
        self._deadline = self.loop.call_later(self.waiting.timeout_s, self._timed_out)
        self.waiting.wait(self, self.client[0] if self.client else "unknown")

    def _stop_waiting(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self.waiting.done(self)

    def _timed_out(self) -> None:
        self._deadline = None
        self.waiting.drop(self, "header_timeout")


def guarded_http(waiting: Waiting) -> Callable[..., GuardedH11Protocol]:
    def protocol(config: Config, server_state: ServerState, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> GuardedH11Protocol:
        return GuardedH11Protocol(config, server_state, app_state, _loop, waiting=waiting)

    return protocol


def log_accept_failures_once_an_interval(loop: asyncio.AbstractEventLoop, interval_s: float = LOG_INTERVAL_S) -> None:
    """asyncio reports each failed accept to the loop's exception handler, many a second: say it once an interval."""
    failures = Every(interval_s)
    default = loop.get_exception_handler()

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") != "socket.accept() out of system resource":
            if default is not None:
                default(loop, context)
            else:
                loop.default_exception_handler(context)
            return
        if (count := failures.tick()) is not None:
            log.error("%d connection(s) could not be accepted since this was last said (at most once a minute): %s; "
                      "the process is out of file descriptors (ulimit -n %d): lower TYPEWRITER_MAX_CONNECTIONS or "
                      "TYPEWRITER_MAX_PENDING_CONNECTIONS, or raise the limit", count, context.get("exception"),
                      descriptor_limit())

    loop.set_exception_handler(handler)


def descriptor_limit() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def ensure_descriptors(connections: int, pending: int, each: int = 1) -> int:
    """Raise the soft descriptor limit to what the caps need, `each` descriptors a connection (more with gRPC on),
    where the hard limit allows, else warn; returns it."""
    need = (connections + pending) * each + RESERVED_DESCRIPTORS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need and (hard == resource.RLIM_INFINITY or hard > soft):
        soft = need if hard == resource.RLIM_INFINITY else min(need, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    if soft < need:
        log.warning("this process may open %d file descriptors (ulimit -n), and TYPEWRITER_MAX_CONNECTIONS (%d) and "
                    "TYPEWRITER_MAX_PENDING_CONNECTIONS (%d) need about %d: past it, new connections wait until a "
                    "waiting one times out; raise the limit or lower the settings", soft, connections, pending, need)
    return soft
