"""Connections on the gRPC port, kept as server/connections.py keeps the HTTP port's. A connection with no call
running waits, as an HTTP connection waits for its request header: those waiting are capped per address and in
total, one more closing the oldest waiting, so that a new connection (a health probe's) always gets its turn, and
each may wait only so long: `first_call_s` for its first call, `idle_s` between calls. gRPC itself sees only the
proxy's loopback connections (proxy.py), so the guard also says which client each of them stands for.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from ..connections import Every
from .service import peer_address

log = logging.getLogger("typewriter.server")

LOOPBACK = "127.0.0.1"  # gRPC listens here only, and the proxy's connections to it come from here


@dataclass(eq=False)
class Connection:
    """A client's connection to the gRPC port; `close` ends it and its loopback twin."""

    client: str
    close: Callable[[], None]
    port: int | None = None  # the loopback twin's own port: what gRPC's peer string names
    calls: int = 0
    served: bool = False  # a call has run on it: it waits for the next one
    deadline: asyncio.TimerHandle | None = field(default=None, repr=False)


class Guard:
    """Event loop only; `on_drop(reason)` hears of each connection closed (the HTTP port's reasons)."""

    def __init__(self, total: int, per_client: int, first_call_s: float, idle_s: float,
                 on_drop: Callable[[str], None]):
        self.total, self.per_client = total, per_client
        self.first_call_s, self.idle_s = first_call_s, idle_s
        self.on_drop = on_drop
        self.open: set[Connection] = set()
        self._waiting: dict[Connection, None] = {}  # insertion order: the oldest first
        self._waiting_from: dict[str, dict[Connection, None]] = {}
        self._by_port: dict[int, Connection] = {}
        self._dropped = {reason: Every() for reason in ("header_timeout", "pending_per_client", "pending_total")}

    def opened(self, client: str, close: Callable[[], None]) -> Connection:
        connection = Connection(client, close)
        self.open.add(connection)
        self._wait(connection)
        return connection

    def bound(self, connection: Connection, port: int) -> None:
        if connection in self.open:
            connection.port = port
            self._by_port[port] = connection

    def closed(self, connection: Connection) -> None:
        """Idempotent."""
        self._stop_waiting(connection)
        self.open.discard(connection)
        if connection.port is not None and self._by_port.get(connection.port) is connection:
            del self._by_port[connection.port]

    def client(self, peer: str) -> str | None:
        """The client address behind gRPC's peer string: the proxied client's, else the peer's own."""
        connection = self._connection(peer)
        return connection.client if connection is not None else peer_address(peer)

    def call_started(self, peer: str) -> Connection | None:
        connection = self._connection(peer)
        if connection is not None:
            connection.calls += 1
            connection.served = True
            self._stop_waiting(connection)
        return connection

    def call_ended(self, connection: Connection | None) -> None:
        if connection is None:
            return
        connection.calls -= 1
        if connection.calls == 0 and connection in self.open:
            self._wait(connection)

    def _connection(self, peer: str) -> Connection | None:
        _, _, port = peer.rpartition(":")
        if peer_address(peer) != LOOPBACK or not port.isdigit():
            return None
        return self._by_port.get(int(port))

    def _wait(self, connection: Connection) -> None:
        wait_s = self.idle_s if connection.served else self.first_call_s
        connection.deadline = asyncio.get_running_loop().call_later(wait_s, self._drop, connection, "header_timeout")
        self._waiting[connection] = None
        peers = self._waiting_from.setdefault(connection.client, {})
        peers[connection] = None
        if len(peers) > self.per_client:
            self._drop(next(iter(peers)), "pending_per_client")
        if len(self._waiting) > self.total:
            self._drop(next(iter(self._waiting)), "pending_total")

    def _stop_waiting(self, connection: Connection) -> None:
        if connection.deadline is not None:
            connection.deadline.cancel()
            connection.deadline = None
        if connection in self._waiting:
            del self._waiting[connection]
            peers = self._waiting_from[connection.client]
            del peers[connection]
            if not peers:
                del self._waiting_from[connection.client]

    def _drop(self, connection: Connection, reason: str) -> None:
        self.closed(connection)
        connection.close()
        self.on_drop(reason)
        if (count := self._dropped[reason].tick()) is not None:
            why = {"header_timeout": f"started no call within {self.first_call_s:g} s of opening, or within "
                                     f"{self.idle_s:g} s of their last call's end",
                   "pending_per_client": f"were pushed out by newer ones from their address (at most "
                                         f"{self.per_client} may wait for a call: TYPEWRITER_MAX_PENDING_PER_CLIENT)",
                   "pending_total": f"were pushed out by newer ones (at most {self.total} may wait for a call: "
                                    "TYPEWRITER_MAX_PENDING_CONNECTIONS)"}[reason]
            log.warning("%d gRPC connection(s) closed since this was last said (at most once a minute): they %s; "
                        "the latest from %s", count, why, connection.client)
