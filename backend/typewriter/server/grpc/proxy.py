"""The gRPC port as clients reach it: our own listener, which hands each connection to the guard (guard.py) and
pipes its bytes to gRPC, listening on a loopback port of its own. gRPC core can cap its connections only in total;
the caps per address, and the time a connection may wait for a call, need the accept in our hands.
"""

from __future__ import annotations

import asyncio
import logging

from ..listen import listen
from .guard import LOOPBACK, Connection, Guard

log = logging.getLogger("typewriter.server")


class Proxy:
    def __init__(self, guard: Guard, grpc_port: int, linger_s: float):
        self.guard, self.grpc_port = guard, grpc_port
        self.linger_s = linger_s  # how long a closed pipe may take to hand over what it still holds
        self._servers: list[asyncio.Server] = []
        self.pipes: set[Pipe] = set()

    async def start(self, host: str, port: int) -> int:
        """Returns the bound port; raises OSError when it cannot be had, with nothing left open."""
        loop = asyncio.get_running_loop()
        sockets = listen(host, port)
        try:
            for sock in sockets:
                self._servers.append(await loop.create_server(lambda: Pipe(self).client, sock=sock))
        except OSError:
            self.close()
            for sock in sockets:
                sock.close()
            raise
        bound: int = sockets[0].getsockname()[1]
        return bound

    def close(self) -> None:
        """Stop accepting; the connections open go on until gRPC closes them (its GOAWAY reaches each)."""
        for server in self._servers:
            server.close()
        self._servers.clear()

    def end(self) -> None:
        for pipe in list(self.pipes):
            pipe.close()


class Pipe:
    """One client connection and its loopback twin to gRPC: what one end reads, the other writes."""

    def __init__(self, proxy: Proxy):
        self.proxy = proxy
        self.client = _ClientEnd(self)
        self.grpc = _End(self)
        self.client.other, self.grpc.other = self.grpc, self.client
        self.connection: Connection | None = None
        self._connecting: asyncio.Task[None] | None = None
        self._closed = False

    def opened(self, peer: str) -> None:
        self.proxy.pipes.add(self)
        self.connection = self.proxy.guard.opened(peer, self.close)
        self._connecting = asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            transport, _ = await loop.create_connection(lambda: self.grpc, LOOPBACK, self.proxy.grpc_port)
        except OSError as e:
            log.warning("a gRPC connection from %s was closed: the proxy could not reach gRPC on %s:%d (%s)",
                        self.connection.client if self.connection else "?", LOOPBACK, self.proxy.grpc_port, e)
            self.close()
            return
        if self._closed:
            transport.close()
            return
        assert self.connection is not None
        self.proxy.guard.bound(self.connection, transport.get_extra_info("sockname")[1])
        self.client.resume()

    def close(self) -> None:
        """Idempotent: both ends close once what they hold is written, or after `linger_s` regardless."""
        if self._closed:
            return
        self._closed = True
        self.proxy.pipes.discard(self)
        if self.connection is not None:
            self.proxy.guard.closed(self.connection)
        if self._connecting is not None and not self._connecting.done():
            self._connecting.cancel()
        for end in (self.client, self.grpc):
            end.close(self.proxy.linger_s)


class _End(asyncio.Protocol):
    def __init__(self, pipe: Pipe):
        self.pipe = pipe
        self.other: _End
        self.transport: asyncio.Transport | None = None
        self._reading = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if self.pipe._closed:
            transport.close()

    def data_received(self, data: bytes) -> None:
        if self.other.transport is not None:
            self.other.transport.write(data)

    def eof_received(self) -> bool:
        self.pipe.close()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.pipe.close()

    def pause_writing(self) -> None:  # the other end reads no more until this one's buffer drains
        self.other.pause()

    def resume_writing(self) -> None:
        self.other.resume()

    def pause(self) -> None:
        if self.transport is not None and self._reading and not self.transport.is_closing():
            self.transport.pause_reading()
            self._reading = False

    def resume(self) -> None:
        if self.transport is not None and not self._reading and not self.transport.is_closing():
            self.transport.resume_reading()
            self._reading = True

    def close(self, linger_s: float) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        transport.close()
        if transport.get_write_buffer_size():  # a peer that reads nothing would hold it open for ever
            asyncio.get_running_loop().call_later(linger_s, transport.abort)


class _ClientEnd(_End):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.pause()  # until its twin to gRPC is connected
        peer = transport.get_extra_info("peername")
        self.pipe.opened(str(peer[0]) if peer else "unknown")
