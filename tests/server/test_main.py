"""The server under real uvicorn on a loopback socket, with the real engine on a scripted runner: what only a real socket shows
(close codes from the WebSocket layer, the graceful shutdown). The load test has its own file, commands/test_loadtest.py."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import socket
import threading
import time
from contextlib import contextmanager

import httpx
import live_server
import pytest
from helpers import chat_json, until_terminal_async
from scripted import factory, script_engine
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from typewriter.config import Settings
from typewriter.server.app import create_app
from typewriter.server.main import Server, uvicorn_config


@contextmanager
def running(engine, **overrides):
    with live_server.running(factory(engine), **overrides) as served:
        yield served


def chat(request_id: str, **params) -> str:
    return chat_json(request_id, "hi", **params)


async def until_terminal(ws) -> list[dict]:
    return await until_terminal_async(ws, timeout=5)


def test_a_chat_and_a_stop_over_a_real_socket():
    async def talk(address):
        async with connect(f"ws://{address}/ws") as ws:
            await ws.send(chat("full"))
            full = await until_terminal(ws)
            await ws.send(chat("cut", max_new_tokens=64))
            assert json.loads(await ws.recv())["type"] == "start"
            assert json.loads(await ws.recv())["type"] == "token"
            await ws.send(json.dumps({"type": "stop", "id": "cut"}))
            return full, await until_terminal(ws)

    with running(script_engine(["ab"] * 60, step_s=0.05)) as (_, address):
        full, cut = asyncio.run(talk(address))
        metrics = httpx.get(f"http://{address}/metrics").text
    assert (full[-1]["reason"], "".join(f.get("text", "") for f in full)) == ("length", "ab" * 16)
    assert cut[-1]["reason"] == "cancelled"
    assert len([f for f in cut if f["type"] == "token"]) <= 1
    assert "typewriter_active_streams 0.0" in metrics


def _silent_client(address: str, max_new_tokens: int = 200) -> socket.socket:
    """A peer that opens the socket, starts a chat, then neither reads nor answers pings: a dead laptop."""
    host, port = address.split(":")
    sock = socket.create_connection((host, int(port)), timeout=5)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((f"GET /ws HTTP/1.1\r\nHost: {address}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
    assert b" 101 " in sock.recv(4096).split(b"\r\n", 1)[0]
    payload, mask = chat("silent", max_new_tokens=max_new_tokens).encode(), os.urandom(4)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    header = bytes([0x81, 0x80 | 126]) + len(payload).to_bytes(2, "big")  # one masked text frame
    sock.sendall(header + mask + masked)
    return sock


def _metrics_once_the_slot_is_free(engine, address: str, sock: socket.socket) -> str:
    """Wait (bounded) until the silent peer's chat has reached the engine and left its slot, then for /metrics to
    count its end: the engine frees the slot before it hands the chat's end to the event loop, so a thread that
    holds the GIL between the two (llguidance's tokenizers being built) lets /metrics answer in between."""
    try:
        deadline = time.monotonic() + 20
        while not engine.submitted or engine.stats().active:
            assert time.monotonic() < deadline, "the silent peer's chat still holds its slot"
            time.sleep(0.05)
        while 'typewriter_requests_total{reason="' not in (metrics := httpx.get(f"http://{address}/metrics").text):
            assert time.monotonic() < deadline, "the silent peer's chat left its slot but its end was never counted"
            time.sleep(0.05)
        return metrics
    finally:
        sock.close()


def test_a_dead_peer_that_never_answers_pings_loses_its_chat_and_slot():
    engine = script_engine(["ab"] * 1000, step_s=0.05)
    with running(engine, ping_interval_s=0.5, ping_timeout_s=0.5, max_new_tokens_cap=200) as (_, address):
        metrics = _metrics_once_the_slot_is_free(engine, address, _silent_client(address))
    assert 'typewriter_requests_total{reason="cancelled"} 1.0' in metrics
    assert "typewriter_active_streams 0.0" in metrics


def test_a_peer_that_stops_reading_a_flood_loses_its_chat_once_the_backlog_is_full():
    """Big tokens fill the kernel and transport buffers; sends then wait, events pile up, the chat is cancelled."""
    engine = script_engine(["x" * 4000] * 3000, step_s=0.0005, max_context=4096)
    with running(engine, send_backlog=32, max_context=4096, max_new_tokens_cap=3000) as (_, address):
        sock = _silent_client(address, max_new_tokens=3000)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        metrics = _metrics_once_the_slot_is_free(engine, address, sock)
    assert 'typewriter_requests_total{reason="cancelled"} 1.0' in metrics


@pytest.mark.parametrize(("payload", "code"), [(b"\x00binary", 1003), ("x" * 5000, 1009)])
def test_protocol_violations_close_the_real_socket_with_their_code(payload, code):
    async def offend(address):
        async with connect(f"ws://{address}/ws") as ws:
            await ws.send(payload)
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 5)
            return closed.value.rcvd.code

    with running(script_engine()) as (_, address):
        assert asyncio.run(offend(address)) == code


def test_stopping_the_server_ends_a_running_chat_with_reason_shutdown():
    async def chat_through_shutdown(server, address):
        async with connect(f"ws://{address}/ws") as ws:
            await ws.send(chat("late", max_new_tokens=64))
            assert json.loads(await ws.recv())["type"] == "start"
            server.should_exit = True
            return await until_terminal(ws)

    with running(script_engine(["x"] * 500, step_s=0.05), drain_s=0.0) as (server, address):
        frames = asyncio.run(chat_through_shutdown(server, address))
    assert (frames[-1]["type"], frames[-1]["reason"]) == ("end", "shutdown")


def test_a_second_signal_cuts_the_drain_short():
    async def chat_through_two_signals(server, address):
        async with connect(f"ws://{address}/ws") as ws:
            await ws.send(chat("long", max_new_tokens=64))
            assert json.loads(await ws.recv())["type"] == "start"
            server.handle_exit(signal.SIGTERM, None)  # uvicorn's signal handler, as a signal would call it
            await asyncio.sleep(0.3)
            server.handle_exit(signal.SIGINT, None)
            started = time.monotonic()
            return await until_terminal(ws), time.monotonic() - started

    with running(script_engine(["x"] * 500, step_s=0.05), drain_s=60.0) as (server, address):
        frames, waited = asyncio.run(chat_through_two_signals(server, address))
    assert (frames[-1]["type"], frames[-1]["reason"]) == ("end", "shutdown")
    assert waited < 30, "the second signal ended the 60-second drain"


def test_an_engine_that_fails_for_good_stops_the_server_with_exit_code_1_after_ending_its_chats(capsys):
    from typewriter.engine.engine import MAX_FAULTY_STEPS

    engine = script_engine(["x"] * 500, step_s=0.01)
    settings = Settings.of(port=0, system_prompt="Be brief.", max_new_tokens=16, max_new_tokens_cap=64,
                        shutdown_grace_s=2.0)
    app = create_app(settings, factory(engine))
    server = Server(uvicorn_config(app, settings, host="127.0.0.1", log_level="warning"), app.state.server)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not (server.started and app.state.server.ready):
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]

    async def chat_until_the_engine_fails():
        engine.runner.fail("extend", RuntimeError("the model state is broken"), times=100)
        ends = []
        async with connect(f"ws://127.0.0.1:{port}/ws") as ws:
            for n in range(MAX_FAULTY_STEPS):  # each chat's prefill fails: that many failed steps in a row
                await ws.send(chat(f"doomed{n}", max_new_tokens=16))
                ends.append((await until_terminal(ws))[-1])
            with pytest.raises(ConnectionClosed):  # and then the server closes the socket on its way out
                await asyncio.wait_for(ws.recv(), 10)
        return ends

    ends = asyncio.run(chat_until_the_engine_fails())
    thread.join(10)
    assert not thread.is_alive(), "the server went on with a failed engine"
    assert [(e["type"], e["code"]) for e in ends] == [("error", "internal")] * MAX_FAULTY_STEPS
    assert server.engine_failed and "the engine failed for good" in capsys.readouterr().err  # serve() returns 1


def test_a_socket_whose_client_is_closing_as_the_server_stops_does_not_end_the_shutdown():
    from websockets.exceptions import InvalidState

    from typewriter.server.main import _tolerate_closing

    class Closing:  # what uvicorn's websockets-sansio connection does when its client's close just came in
        def __init__(self):
            self.transport = self
            self.closed = False

        def shutdown(self):
            raise InvalidState("connection is closing")

        def close(self):
            self.closed = True

    connection = Closing()
    _tolerate_closing(connection)
    connection.shutdown()
    assert connection.closed


@pytest.mark.parametrize("load", ["ready", "failed"])
def test_a_server_holding_the_collector_for_its_start_turns_it_back_on_once_loaded(load):
    """`typewriter serve` turns Python's cyclic collector off for its imports and load (commands/serve.py); the
    server turns it back on once the model is loaded, or failed to load, and never before, the start's objects
    frozen."""
    import gc

    gate = threading.Event()
    engine = script_engine()
    loaded = factory(engine, gate=gate)

    def load_or_fail(settings, progress):
        handed = loaded(settings, progress)
        if load == "failed":
            raise RuntimeError("no weights")
        return handed

    settings = Settings.of(port=0, shutdown_grace_s=2.0)
    app = create_app(settings, load_or_fail)
    server = Server(uvicorn_config(app, settings, host="127.0.0.1", log_level="warning"), app.state.server,
                    collector_held=True)
    gc.disable()
    thread = threading.Thread(target=server.run, daemon=True)
    try:
        thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        time.sleep(0.5)  # several of uvicorn's ticks while the model loads
        assert not gc.isenabled(), "the collector was turned on while the model loaded"
        gate.set()
        while not gc.isenabled():
            assert time.monotonic() < deadline + 10, "the collector stayed off once the model had loaded"
            time.sleep(0.02)
        assert app.state.server.phase.value == "ready" or load == "failed"
        assert gc.get_freeze_count() > 0, "the start's objects were left for the collector to go over"
    finally:
        server.should_exit = True
        thread.join(10)
        gc.unfreeze()
        gc.enable()
    assert server.load_failed == (load == "failed")
