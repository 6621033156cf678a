"""Whose calls are whose on the gRPC port (server/grpc/calls.py), over a real server: gRPC sees only the proxy's
loopback connections, so each call must still be counted against the address of the client behind it, a stream
of any service as a socket, and `x-forwarded-for` metadata only from a trusted proxy."""

from __future__ import annotations

import contextlib
import re
import socket
import threading
from collections.abc import Iterator

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers import WAIT_S, wait_until
from scripted import script_engine
from served import running

from typewriter.server.grpc.gen import chat_pb2 as pb
from typewriter.server.grpc.gen import chat_pb2_grpc
from typewriter.server.grpc.service import ERROR_CODE_KEY

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


@contextlib.contextmanager
def from_address(source: str, target: tuple[str, int]) -> Iterator[str]:
    """A loopback address whose connections reach `target` from `source` (a gRPC client cannot pick its own)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    stopped = threading.Event()

    def pipe(reader: socket.socket, writer: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := reader.recv(65536):
                writer.sendall(data)
        for sock in (reader, writer):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        reader.close()  # each end is the reader of one thread

    def accept() -> None:
        while not stopped.is_set():
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            client.settimeout(None)
            upstream = socket.create_connection(target, source_address=(source, 0))
            for ends in ((client, upstream), (upstream, client)):
                threading.Thread(target=pipe, args=ends, daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield "127.0.0.1:%d" % listener.getsockname()[1]
    finally:
        stopped.set()
        thread.join()
        listener.close()


def chat(channel: grpc.Channel, forwarded_for: str | None = None) -> tuple[str | None, str]:
    """(our error code or None, the answer's text) of one chat."""
    request = pb.ClientMessage(chat=pb.ChatRequest(id="c", messages=[pb.Message(role="user", content="hi")]))
    metadata = (("x-forwarded-for", forwarded_for),) if forwarded_for else None
    try:
        events = list(chat_pb2_grpc.ChatStub(channel).Stream(iter([request]), metadata=metadata, timeout=WAIT_S))
    except grpc.RpcError as e:
        return dict(e.trailing_metadata() or ()).get(ERROR_CODE_KEY), e.details()
    return None, "".join(e.token.text for e in events if e.WhichOneof("kind") == "token")


def test_every_stream_counts_against_its_own_clients_address_and_only_a_trusted_proxy_may_say_another(capsys):
    with running(script_engine(), grpc_port=0, max_connections_per_client=1, chats_per_minute=1,
                 trusted_proxies="127.0.0.1") as (server, _):
        limits = server.state.limits
        port = int(re.search(r"^gRPC on \S+:(\d+)$", capsys.readouterr().out, re.M).group(1))
        with from_address("127.0.0.2", ("127.0.0.1", port)) as relayed, grpc.insecure_channel(relayed) as student, \
                grpc.insecure_channel(f"127.0.0.1:{port}") as proxy:
            watch = health_pb2_grpc.HealthStub(student).Watch(health_pb2.HealthCheckRequest(), timeout=WAIT_S)
            watched = next(watch).status in (SERVING, NOT_SERVING)  # whichever it says, the stream runs
            counted = dict(limits.open)
            while_watching = chat(student, forwarded_for="10.0.0.9")  # from an untrusted peer: not believed
            watch.cancel()
            wait_until(lambda: limits.total == 0, "the watch is no longer counted")
            own = [chat(student, forwarded_for="10.0.0.9") for _ in range(2)]
            forwarded = [chat(proxy, "10.0.0.5"), chat(proxy, "10.0.0.5"), chat(proxy, "10.0.0.6")]
    assert watched and counted == {"127.0.0.2": 1}
    assert while_watching[0] == "overloaded" and "too many connections from your address" in while_watching[1]
    assert [code for code, _ in own] == [None, "rate_limited"]  # the chats a minute of 127.0.0.2, not 10.0.0.9
    assert [code for code, _ in forwarded] == [None, "rate_limited", None]
    assert forwarded[0][1] == "Hello, world!"
