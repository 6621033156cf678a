"""Every way the Python client can fail to open its socket is a named ClientError (ConnectFailed) with the URL and a
reason a person can act on, in the async and the sync client alike, over real sockets: a port nothing listens on,
a host name that does not resolve, a peer that never answers the handshake, TLS against a plain server, and a peer
that is not a WebSocket server."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from live_server import running
from scripted import factory, script_engine

from typewriter.client import AsyncClient, Client, ClientError, ConnectFailed


def free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def listener(answer: bytes | None) -> Iterator[int]:
    """A TCP peer on a free port: it says `answer` to whoever connects and closes, or (None) never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    held: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                peer, _ = server.accept()
            except OSError:
                return
            held.append(peer)
            if answer is not None:
                peer.recv(4096)
                peer.sendall(answer)
                peer.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        server.close()
        for peer in held:
            peer.close()


def connect_sync(url: str, **options) -> ConnectFailed:
    with pytest.raises(ConnectFailed) as failed:
        Client(url, **options).complete("hi")
    return failed.value


def connect_async(url: str, **options) -> ConnectFailed:
    async def attempt() -> None:
        async with AsyncClient(url, **options) as client:
            await client.complete("hi")

    with pytest.raises(ConnectFailed) as failed:
        asyncio.run(attempt())
    return failed.value


@pytest.fixture(params=["sync", "async"])
def connect(request):
    return connect_sync if request.param == "sync" else connect_async


def test_a_port_nothing_listens_on(connect):
    port = free_port()
    error = connect(f"http://127.0.0.1:{port}")
    assert isinstance(error, ClientError) and error.code == "connect_failed"
    assert error.url == f"ws://127.0.0.1:{port}/ws"
    assert str(error) == (f"cannot connect to ws://127.0.0.1:{port}/ws: connection refused: nothing listens on port "
                          f"{port} of 127.0.0.1; is the server running on this port?")


def test_a_host_name_that_does_not_resolve(connect):
    error = connect("http://nosuchhost.invalid:8000")
    assert str(error).startswith("cannot connect to ws://nosuchhost.invalid:8000/ws: the host name "
                                 "'nosuchhost.invalid' does not resolve")


def test_a_peer_that_never_answers_the_handshake(connect):
    with listener(None) as port:
        error = connect(f"http://127.0.0.1:{port}", open_timeout=0.3)
    assert str(error) == f"cannot connect to ws://127.0.0.1:{port}/ws: no handshake within 0.3 s (open_timeout)"


def test_tls_against_a_plain_server(connect):
    with running(factory(script_engine())) as (_, address):
        error = connect(f"https://{address}")
    assert error.url == f"wss://{address}/ws"
    assert "TLS failed" in error.reason and "is it an https:// or wss:// server?" in error.reason


def test_a_peer_that_is_not_a_websocket_server(connect):
    with listener(b"SSH-2.0-OpenSSH_9.2\r\n") as port:
        error = connect(f"http://127.0.0.1:{port}")
    assert "what answered is not a WebSocket server" in error.reason
    assert "is this a Typewriter server's address?" in error.reason
