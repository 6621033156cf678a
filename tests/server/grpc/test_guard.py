"""Connections to the gRPC port that never make a call, over a real server and raw sockets (server/grpc/guard.py).

150 HTTP/2 connections that sent the preface and SETTINGS and then nothing were never pinged or closed: under
`ulimit -n 128` `/healthz` stopped answering and a socket chat timed out until they closed. Now a connection with
no call running waits, as an HTTP one before its header: the first call must come within `header_timeout_s`,
those waiting are capped per address and in total (the oldest closed first), and gRPC closes one idle for
`IDLE_S` with a GOAWAY.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers import WAIT_S, wait_until
from real_server import http_get
from repo import TESTS
from scripted import script_engine
from served import running

from typewriter.server.grpc.gen import chat_pb2 as pb
from typewriter.server.grpc.gen import chat_pb2_grpc

HEADER_TIMEOUT_S = 3.0  # long enough that the newest of a flood are still waiting when it ends
BOUND = re.compile(r"Typewriter on http://(\S+?)/? ")
GRPC_BOUND = re.compile(r"^gRPC on (\S+)$", re.M)
SETTINGS = bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # a frame header: length 0, type SETTINGS, no flags, stream 0
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + SETTINGS


def http2(address: tuple[str, int], source: str, half_call: bool = False) -> socket.socket:
    """A connection from `source` that sends HTTP/2's preface and an empty SETTINGS, and with `half_call` a call's
    HEADERS without its message, then nothing."""
    sock = socket.create_connection(address, timeout=5, source_address=(source, 0))
    sock.sendall(PREFACE + (call_headers("/grpc.health.v1.Health/Check") if half_call else b""))
    return sock


def call_headers(path: str) -> bytes:
    """A HEADERS frame on stream 1 (END_HEADERS), each field a literal HPACK never indexes."""
    fields = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "localhost"),
              ("content-type", "application/grpc"), ("te", "trailers")]
    block = b"".join(bytes([0, len(name)]) + name.encode() + bytes([len(value)]) + value.encode()
                     for name, value in fields)
    return len(block).to_bytes(3, "big") + bytes([1, 4]) + (1).to_bytes(4, "big") + block


def is_open(sock: socket.socket) -> bool:
    """Whether the server still holds the connection, reading whatever it sent without waiting."""
    sock.setblocking(False)
    try:
        while True:
            if sock.recv(65536) == b"":
                return False
    except BlockingIOError:
        return True
    except ConnectionResetError:
        return False
    finally:
        sock.setblocking(True)


def closed_within(socks: list[socket.socket], within_s: float) -> list[bool]:
    deadline = time.monotonic() + within_s
    while any(map(is_open, socks)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [not is_open(sock) for sock in socks]


def settled(socks: list[socket.socket], expected: list[bool]) -> list[bool]:
    """Which are open, once they are as `expected` or WAIT_S has passed (the server accepts at its own pace)."""
    deadline = time.monotonic() + WAIT_S
    while (now := [is_open(sock) for sock in socks]) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return now


def a_chat(address: str) -> str:
    with grpc.insecure_channel(address) as channel:
        request = pb.ClientMessage(chat=pb.ChatRequest(id="c", messages=[pb.Message(role="user", content="hi")]))
        events = list(chat_pb2_grpc.ChatStub(channel).Stream(iter([request]), timeout=WAIT_S))
    return "".join(e.token.text for e in events if e.WhichOneof("kind") == "token")


# ---- a real server in a process of its own, with a low descriptor limit ----


@contextlib.contextmanager
def scripted_server(log_path: Path, descriptors: tuple[int, int], **settings):
    """tests/scripted_server.py with gRPC on and `settings`, its descriptor limit (soft, hard) `descriptors`; yields
    (process, the HTTP base URL, the gRPC address) once it is ready."""
    def limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, descriptors)

    settings = {"grpc_port": 0, "header_timeout_s": HEADER_TIMEOUT_S, **settings}
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, str(TESTS / "scripted_server.py"), json.dumps(settings)],
                                stdout=log, stderr=subprocess.STDOUT, preexec_fn=limit,
                                env=os.environ | {"PYTHONUNBUFFERED": "1"})
    try:
        wait_until(lambda: BOUND.search(log_path.read_text()) or proc.poll() is not None, "the server is bound")
        assert proc.poll() is None, log_path.read_text()
        base = "http://" + BOUND.search(log_path.read_text()).group(1)
        wait_until(lambda: status(f"{base}/readyz") == 200, "the server is ready")
        yield proc, base, GRPC_BOUND.search(log_path.read_text()).group(1)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def status(url: str) -> int | None:
    try:
        return http_get(url, timeout=2)[0]
    except OSError:
        return None


def address_of(grpc_address: str) -> tuple[str, int]:
    host, port = grpc_address.rsplit(":", 1)
    return host, int(port)


def test_150_silent_http2_connections_are_capped_and_closed_while_healthz_and_a_grpc_chat_answer(tmp_path):
    log = tmp_path / "server.log"
    with scripted_server(log, (128, 128), max_pending_per_client=8, max_pending_connections=16) as (_, base, address):
        flood, answers = [], []
        try:
            for n in range(150):  # a third send a call's header and never its message
                flood.append(http2(address_of(address), "127.0.0.2", half_call=n % 3 == 0))
                if n % 25 == 24:
                    answers.append(status(f"{base}/healthz"))
            still_open = settled(flood, [False] * 142 + [True] * 8)  # past the cap, the oldest closed at once
            text = a_chat(address)  # from 127.0.0.1
            answers.append(status(f"{base}/healthz"))
            closed = closed_within(flood, HEADER_TIMEOUT_S + WAIT_S)
            metrics = http_get(f"{base}/metrics")[1]
        finally:
            for sock in flood:
                sock.close()
    assert answers == [200] * 7 and text
    assert still_open == [False] * 142 + [True] * 8
    assert all(closed), f"{closed.count(False)} of {len(closed)} connections were left open"
    dropped = dict(re.findall(r'typewriter_dropped_connections_total\{reason="(\w+)"\} (\S+)', metrics))
    assert float(dropped["pending_per_client"]) == 142 and float(dropped["header_timeout"]) == 8
    assert "out of system resource" not in log.read_text()


def test_the_descriptor_limit_is_raised_for_the_grpc_ports_caps_too(tmp_path):
    """Each connection to the gRPC port takes three descriptors: the client's, the proxy's to gRPC, gRPC's own."""
    with scripted_server(tmp_path / "server.log", (128, 4096), max_connections=10, max_pending_connections=20) as (
            proc, _, _):
        limits = Path(f"/proc/{proc.pid}/limits").read_text()
    soft = int(re.search(r"^Max open files\s+(\d+)", limits, re.M).group(1))
    assert soft == (10 + 20) * 4 + 128


# ---- a server on a thread of the test process ----


def printed_grpc_address(capsys) -> str:
    found = GRPC_BOUND.search(capsys.readouterr().out)
    assert found, "no 'gRPC on' line"
    return found.group(1)


def test_waiting_connections_are_capped_per_address_and_in_total_the_oldest_closed_first(capsys):
    with running(script_engine(), grpc_port=0, header_timeout_s=WAIT_S, max_pending_per_client=4,
                 max_pending_connections=8):
        address, held = address_of(printed_grpc_address(capsys)), []
        try:
            held += (b := [http2(address, "127.0.0.3") for _ in range(3)])
            held += (a := [http2(address, "127.0.0.2") for _ in range(10)])
            per_client = settled(a + b, [False] * 6 + [True] * 7)  # another address keeps its own
            held += (c := [http2(address, "127.0.0.4") for _ in range(3)])
            total = settled(b + a[6:] + c, [False] * 2 + [True] * 8)  # 10 waiting past 8: the 2 oldest of all
            text = a_chat("%s:%d" % address)
        finally:
            for sock in held:
                sock.close()
    assert per_client == [False] * 6 + [True] * 7
    assert total == [False] * 2 + [True] * 8
    assert text == "Hello, world!"


def test_a_connection_idle_for_the_idle_time_gets_a_goaway_and_its_next_call_just_works(monkeypatch, capsys):
    monkeypatch.setattr("typewriter.server.grpc.server.IDLE_S", 1.0, raising=False)
    with running(script_engine(), grpc_port=0), grpc.insecure_channel(printed_grpc_address(capsys)) as channel:
        states: list[grpc.ChannelConnectivity] = []
        channel.subscribe(states.append)
        health = health_pb2_grpc.HealthStub(channel)
        first = health.Check(health_pb2.HealthCheckRequest(), timeout=WAIT_S).status
        wait_until(lambda: states[-1:] == [grpc.ChannelConnectivity.IDLE], "the server closed the idle connection")
        again = health.Check(health_pb2.HealthCheckRequest(), timeout=WAIT_S).status
        channel.unsubscribe(states.append)
    assert first == again == health_pb2.HealthCheckResponse.SERVING
