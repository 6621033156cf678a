"""Connections that never speak, over a real server in a process of its own with a low descriptor limit.

A TCP connection that sent nothing, or half a request header, was never closed and counted against no limit:
100 of them under a low `ulimit -n` made `/healthz` and `/ws` time out, and asyncio logged "socket.accept() out of
system resource" 643,065 times in 47 s. Now each must send a whole header within `header_timeout_s`, those
waiting are capped per address and in total (the oldest closed first), and a failed accept is logged once an
interval (server/connections.py).
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

from helpers import WAIT_S, wait_until
from real_server import http_get
from repo import TESTS

HERE = TESTS
BOUND = re.compile(r"Typewriter on (http://\S+?)/? ")
HEADER_TIMEOUT_S = 2.0


@contextlib.contextmanager
def server(log_path: Path, descriptors: int, **settings):
    """tests/scripted_server.py with `settings`, its descriptor limit `descriptors` (soft and hard); yields
    (host, port) once it is ready."""
    def limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (descriptors, descriptors))

    settings = {"header_timeout_s": HEADER_TIMEOUT_S, "log_level": "info", **settings}
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, str(HERE / "scripted_server.py"), json.dumps(settings)],
                                stdout=log, stderr=subprocess.STDOUT, preexec_fn=limit,
                                env=os.environ | {"PYTHONUNBUFFERED": "1"})
    try:
        wait_until(lambda: BOUND.search(log_path.read_text()) or proc.poll() is not None, "the server is bound")
        assert proc.poll() is None, log_path.read_text()
        base = BOUND.search(log_path.read_text()).group(1)
        wait_until(lambda: _status(f"{base}/readyz") == 200, "the server is ready")
        host, port = base.removeprefix("http://").rsplit(":", 1)
        yield host, int(port)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _status(url: str) -> int | None:
    try:
        return http_get(url, timeout=2)[0]
    except OSError:
        return None


def silent(address: tuple[str, int], half_header: bool = False) -> socket.socket:
    sock = socket.create_connection(address, timeout=5)
    if half_header:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
    return sock


def closed_by_the_server(sock: socket.socket, within_s: float) -> bool:
    """Whether the server closes the connection within `within_s`, whatever it sends first."""
    deadline = time.monotonic() + within_s
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            if sock.recv(4096) == b"":
                return True
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False
    return False


def test_silent_and_half_sent_connections_are_closed_and_healthz_answers_throughout(tmp_path):
    log = tmp_path / "server.log"
    with server(log, descriptors=64, max_pending_per_client=8, max_pending_connections=16) as address:
        base = "http://%s:%d" % address
        held, answers = [], []
        try:
            for n in range(120):  # far more than the descriptors left: each cap pushes out the oldest
                held.append(silent(address, half_header=n % 3 == 0))
                if n % 20 == 19:
                    answers.append(_status(f"{base}/healthz"))
            answers.append(_status(f"{base}/healthz"))
            started = time.monotonic()
            closed = [closed_by_the_server(sock, HEADER_TIMEOUT_S + WAIT_S - (time.monotonic() - started))
                      for sock in held]
            metrics = http_get(f"{base}/metrics")[1]
        finally:
            for sock in held:
                sock.close()
    assert answers == [200] * 7
    assert all(closed), f"{closed.count(False)} of {len(closed)} connections were left open"
    dropped = dict(re.findall(r'typewriter_dropped_connections_total\{reason="(\w+)"\} (\S+)', metrics))
    assert float(dropped["pending_per_client"]) > 0 and float(dropped["header_timeout"]) > 0
    text = log.read_text()
    assert "out of system resource" not in text and "could not be accepted" not in text


def test_with_descriptors_run_out_a_failed_accept_is_logged_once_an_interval_and_healthz_comes_back(tmp_path):
    """Caps the descriptor limit cannot hold: accepts fail until the header timeout frees descriptors."""
    log = tmp_path / "server.log"
    with server(log, descriptors=48, max_pending_per_client=1000, max_pending_connections=1000) as address:
        base = "http://%s:%d" % address
        held = []
        try:
            for _ in range(80):
                held.append(silent(address))
            time.sleep(1.5)  # accepts fail meanwhile, retried each second
            wait_until(lambda: _status(f"{base}/healthz") == 200, "/healthz answers again")
        finally:
            for sock in held:
                sock.close()
    text = log.read_text()
    assert "socket.accept() out of system resource" not in text  # asyncio's own line, once per retry
    assert len(re.findall("could not be accepted", text)) == 1, text[-3000:]
    assert "may open 48 file descriptors" in text  # said at start-up


def test_a_kept_alive_connection_has_the_same_time_for_its_next_header_and_a_post_for_its_body():
    from scripted import script_engine
    from served import running

    with running(script_engine(), header_timeout_s=1.0) as (_, address):
        host, port = address.split(":")
        with socket.create_connection((host, int(port)), timeout=5) as kept:
            kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            first = whole_response(kept)
            kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # the next header, never finished
            assert closed_by_the_server(kept, WAIT_S)
        with socket.create_connection((host, int(port)), timeout=5) as trickle:
            trickle.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                            b"\r\nContent-Length: 100\r\n\r\n{\"messages\":")  # and no more of the body
            trickle.settimeout(WAIT_S)
            refused = whole_response(trickle)
    assert first.startswith(b"HTTP/1.1 200 ")
    assert refused.startswith(b"HTTP/1.1 408 ") and b'"code":"request_timeout"' in refused


def whole_response(sock: socket.socket) -> bytes:
    """One HTTP response, its header and as many bytes of body as its Content-Length says."""
    data = b""
    while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < int(
            re.search(rb"content-length: (\d+)", data, re.I).group(1)):
        data += sock.recv(4096)
    return data


def test_a_repeated_warning_is_said_once_an_interval_with_how_often_it_happened():
    from typewriter.server.connections import Every

    now = [0.0]
    every = Every(60.0, clock=lambda: now[0])
    said = []
    for t in (0, 1, 2, 59, 61, 62, 200):
        now[0] = t
        said.append(every.tick())
    assert said == [1, None, None, None, 4, None, 2]


def test_a_grpc_connection_that_never_sends_its_preface_is_closed_after_the_header_timeout():
    import asyncio

    from helpers import small_settings
    from scripted import factory, script_engine

    from typewriter.server.grpc.server import GrpcServer
    from typewriter.server.lifecycle import ServerState

    async def scenario():
        state = ServerState(small_settings(header_timeout_s=1.0), factory(script_engine()))
        server = GrpcServer(state)
        port = await server.start("127.0.0.1", 0)
        try:
            quiet = silent(("127.0.0.1", port))
            half = silent(("127.0.0.1", port))
            half.sendall(b"PRI * HTTP/2.0\r\n")  # half the preface (the server sends its settings first)
            with quiet, half:
                return [await asyncio.to_thread(closed_by_the_server, sock, WAIT_S) for sock in (quiet, half)]
        finally:
            await server.stop(0)

    assert asyncio.run(scenario()) == [True, True]


