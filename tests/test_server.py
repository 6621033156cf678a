"""The server over Starlette's TestClient with the fake engine: protocol v1 behaviour, limits, health and metrics."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
import time
from contextlib import contextmanager

import anyio
import pytest
from starlette.testclient import TestClient
from starlette.websockets import WebSocket, WebSocketDisconnect

from fakes import FakeEngine, FakeTokenizer, factory
from typewriter.config import Settings
from typewriter.request import FinishReason, Token
from typewriter.server.app import create_app
from typewriter.server.lifecycle import ServerState
from typewriter.server.session import Session


def settings(**overrides) -> Settings:
    values = dict(system_prompt="Be brief.", max_new_tokens=16, max_new_tokens_cap=64, max_messages=8,
                  max_message_bytes=4096, shutdown_grace_s=2.0)
    return Settings(**{**values, **overrides})


@contextmanager
def serving(engine: FakeEngine | None = None, tokenizer: FakeTokenizer | None = None, web_root=None, **overrides):
    engine = engine or FakeEngine()
    kwargs = {"web_root": web_root} if web_root else {}
    app = create_app(settings(**overrides), factory(engine, tokenizer), **kwargs)
    with TestClient(app) as client:
        wait_until(lambda: client.get("/readyz").status_code == 200)
        yield client, engine


def wait_until(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


def receive(ws, timeout: float = 5.0) -> dict:
    """The next frame as a dict ({"type":"websocket.close",...} for a close), failing instead of hanging."""

    async def get():
        with anyio.fail_after(timeout):
            return await ws._send_rx.receive()

    message = ws.portal.call(get)
    if message["type"] == "websocket.send":
        return json.loads(message["text"])
    return message


def chat(request_id: str = "c1", text: str = "hi there", **params) -> dict:
    frame = {"type": "chat", "id": request_id, "messages": [{"role": "user", "content": text}]}
    if params:
        frame["params"] = params
    return frame


def until_terminal(ws) -> list[dict]:
    frames = []
    while True:
        frames.append(receive(ws))
        if frames[-1]["type"] in ("end", "error"):
            return frames


def text_of(frames: list[dict]) -> str:
    return "".join(f["text"] for f in frames if f["type"] == "token")


# ---- health and readiness ----


def test_healthz_answers_while_the_model_loads_and_readyz_turns_ready_when_loaded():
    gate = threading.Event()
    app = create_app(settings(), factory(FakeEngine(), gate=gate))
    with TestClient(app) as client:
        assert client.get("/healthz").json() == {"status": "ok"}
        loading = client.get("/readyz")
        assert loading.status_code == 503
        assert loading.json()["status"] == "loading"
        with client.websocket_connect("/ws") as ws:
            assert receive(ws) == {"type": "websocket.close", "code": 1013,
                                   "reason": "the model is still loading; retry when /readyz is 200"}
        gate.set()
        wait_until(lambda: client.get("/readyz").status_code == 200)
        body = client.get("/readyz").json()
        assert body["model"] == "fake-model"
        assert body["limits"]["max_active"] == 2
        assert body["limits"]["max_new_tokens_cap"] == 64


def test_readyz_reports_a_failed_load():
    def broken(settings, progress):
        raise FileNotFoundError("no weights at /nowhere")

    with TestClient(create_app(settings(), broken)) as client:
        wait_until(lambda: client.get("/readyz").json()["status"] == "failed")
        response = client.get("/readyz")
        assert response.status_code == 503
        assert "no weights at /nowhere" in response.json()["detail"]


def test_a_dead_engine_makes_readyz_503_and_ends_the_running_chat_with_internal():
    with serving(FakeEngine(tokens=["x"] * 500, step_s=0.01)) as (client, engine):
        with client.websocket_connect("/ws") as ws:
            ws.send_json(chat(max_new_tokens=64))
            assert receive(ws)["type"] == "start"
            engine.die()
            frames = until_terminal(ws)
            assert frames[-1]["type"] == "error"
            assert frames[-1]["code"] == "internal"
            assert frames[-1]["id"] == "c1"
        response = client.get("/readyz")
        assert response.status_code == 503
        assert response.json()["status"] == "engine_stopped"


# ---- a chat ----


def test_a_chat_streams_start_tokens_and_end_with_usage_and_timings():
    tokenizer = FakeTokenizer()
    with serving(tokenizer=tokenizer) as (client, _):
        with client.websocket_connect("/ws") as ws:
            ws.send_json(chat("a1", "say hello"))
            frames = until_terminal(ws)
    assert frames[0] == {"type": "start", "id": "a1", "prompt_tokens": 3}
    assert text_of(frames) == "Hello, world!"
    assert [f["index"] for f in frames if f["type"] == "token"] == [0, 1, 2, 3]
    end = frames[-1]
    assert (end["type"], end["id"], end["reason"]) == ("end", "a1", "eos")
    assert end["usage"] == {"prompt_tokens": 3, "completion_tokens": 4}
    assert set(end["timings"]) == {"queue_ms", "ttft_ms", "total_ms", "tokens_per_s"}
    assert tokenizer.calls == [([{"role": "user", "content": "say hello"}], "Be brief.")]


def test_the_tokenizers_default_system_prompt_is_used_when_none_is_configured():
    from typewriter.tokenizer import DEFAULT_SYSTEM_PROMPT

    tokenizer = FakeTokenizer()
    with serving(tokenizer=tokenizer, system_prompt=None) as (client, _):
        with client.websocket_connect("/ws") as ws:
            ws.send_json(chat())
            until_terminal(ws)
    assert tokenizer.calls[0][1] == DEFAULT_SYSTEM_PROMPT


def test_sampling_params_reach_the_engine_and_max_new_tokens_defaults_from_settings():
    with serving() as (client, engine):
        with client.websocket_connect("/ws") as ws:
            ws.send_json(chat("p1", temperature=0, top_k=5, seed=7, stop=["\n\n"]))
            until_terminal(ws)
            ws.send_json(chat("p2", max_new_tokens=2))
            frames = until_terminal(ws)
    first, second = engine.submitted
    assert (first.params.temperature, first.params.top_k, first.params.seed) == (0, 5, 7)
    assert first.params.stop == ("\n\n",)
    assert first.params.max_new_tokens == 16
    assert second.params.max_new_tokens == 2
    assert frames[-1]["reason"] == "length"
    assert text_of(frames) == "Hello,"


def test_one_log_line_per_chat_carries_its_numbers(caplog):
    with caplog.at_level(logging.INFO, logger="typewriter.requests"):
        with serving() as (client, _):
            with client.websocket_connect("/ws") as ws:
                ws.send_json(chat("log1"))
                until_terminal(ws)
    records = [json.loads(r.getMessage()) for r in caplog.records if r.name == "typewriter.requests"]
    assert len(records) == 1
    record = records[0]
    assert record["client_id"] == "log1"
    assert (record["reason"], record["prompt_tokens"], record["completion_tokens"]) == ("eos", 3, 4)
    assert {"id", "queue_ms", "ttft_ms", "total_ms", "tokens_per_s"} <= set(record)


# ---- stop and disconnect ----


def test_stop_ends_the_chat_as_cancelled_after_at_most_one_more_token():
    with serving(FakeEngine(tokens=[f"w{i} " for i in range(50)], step_s=0.1)) as (client, engine):
        with client.websocket_connect("/ws") as ws:
            ws.send_json(chat("s1", max_new_tokens=50))
            frames = [receive(ws), receive(ws), receive(ws)]
            assert [f["type"] for f in frames] == ["start", "token", "token"]
            ws.send_json({"type": "stop", "id": "s1"})
            after = until_terminal(ws)
        wait_until(lambda: engine.stats().active == 0)
        metrics = client.get("/metrics").text
    assert len([f for f in after if f["type"] == "token"]) <= 1
    assert after[-1]["type"] == "end"
    assert after[-1]["reason"] == "cancelled"
    assert text_of(frames + after).startswith("w0 w1 ")
    assert "typewriter_active_streams 0.0" in metrics
    assert 'typewriter_requests_total{reason="cancelled"} 1.0' in metrics


class BurstOnCancel(FakeEngine):
    """An engine whose cancel lands while three tokens it already produced are still on their way."""

    def cancel(self, request_id):
        with self._lock:
            slot = next(s for s in self._active if s.request.id == request_id)
            self._active.remove(slot)
        for _ in range(3):
            index = slot.produced
            slot.produced += 1
            slot.on_event(Token(request_id, index, 1, f"late{index} "))
        self._finish(slot, FinishReason.CANCELLED)
        return True


def test_tokens_queued_behind_a_stop_are_dropped_except_one():
    with serving(BurstOnCancel(tokens=["a "] * 100, step_s=0.2)) as (client, _):
        with client.websocket_connect("/ws") as ws:
            ws.send_json(chat("s2", max_new_tokens=60))
            assert receive(ws)["type"] == "start"
            assert receive(ws)["type"] == "token"
            ws.send_json({"type": "stop", "id": "s2"})
            after = until_terminal(ws)
    assert [f["type"] for f in after] == ["token", "end"]
    assert after[-1]["reason"] == "cancelled"


def test_disconnect_mid_answer_cancels_the_chat_and_frees_its_slot():
    with serving(FakeEngine(tokens=["x"] * 500, step_s=0.02)) as (client, engine):
        with client.websocket_connect("/ws") as ws:
            ws.send_json(chat(max_new_tokens=64))
            assert receive(ws)["type"] == "start"
            assert receive(ws)["type"] == "token"
        wait_until(lambda: engine.stats().active == 0, timeout=2)
        wait_until(lambda: 'typewriter_requests_total{reason="cancelled"} 1.0' in client.get("/metrics").text)


def test_stop_for_an_id_that_is_not_running_is_not_found():
    with serving() as (client, _):
        with client.websocket_connect("/ws") as ws:
            ws.send_json({"type": "stop", "id": "ghost"})
            assert receive(ws) == {"type": "error", "id": "ghost", "code": "not_found",
                                   "message": "no chat with id 'ghost' is running on this connection"}
            ws.send_json(chat("done"))
            until_terminal(ws)
            ws.send_json({"type": "stop", "id": "done"})
            assert receive(ws)["code"] == "not_found"


# ---- limits ----


def test_a_second_chat_on_a_busy_connection_is_refused_and_the_first_finishes():
    with serving(FakeEngine(tokens=["x"] * 10, step_s=0.05)) as (client, _):
        with client.websocket_connect("/ws") as ws:
            ws.send_json(chat("first"))
            ws.send_json(chat("second"))
            frames = until_terminal(ws)
            assert frames[-1]["type"] == "error"
            assert (frames[-1]["id"], frames[-1]["code"]) == ("second", "busy")
            rest = until_terminal(ws)
    assert (rest[-1]["type"], rest[-1]["id"], rest[-1]["reason"]) == ("end", "first", "eos")
    assert text_of(frames + rest) == "x" * 10


def test_chats_beyond_the_slots_get_queue_positions_then_overloaded_beyond_the_queue():
    engine = FakeEngine(tokens=["x"] * 8, step_s=0.05, max_active=1, max_queue=2)
    with serving(engine) as (client, _):
        with client.websocket_connect("/ws") as a, client.websocket_connect("/ws") as b, \
                client.websocket_connect("/ws") as c, client.websocket_connect("/ws") as d:
            a.send_json(chat("a"))
            assert receive(a)["type"] == "start"
            b.send_json(chat("b"))
            assert receive(b) == {"type": "queued", "id": "b", "position": 1}
            c.send_json(chat("c"))
            assert receive(c) == {"type": "queued", "id": "c", "position": 2}
            d.send_json(chat("d"))
            overloaded = receive(d)
            assert (overloaded["type"], overloaded["code"], overloaded["id"]) == ("error", "overloaded", "d")
            assert until_terminal(a)[-1]["reason"] == "eos"
            b_frames, c_frames = until_terminal(b), until_terminal(c)
    assert b_frames[0]["type"] == "start"
    assert [f for f in c_frames if f["type"] == "queued"] == [{"type": "queued", "id": "c", "position": 1}]
    assert b_frames[-1]["reason"] == c_frames[-1]["reason"] == "eos"


def test_a_prompt_that_does_not_fit_with_max_new_tokens_is_prompt_too_long():
    with serving(FakeEngine(max_context=256)) as (client, engine):
        with client.websocket_connect("/ws") as ws:
            ws.send_json(chat("long", "word " * 250, max_new_tokens=10))
            error = receive(ws)
            ws.send_json(chat("fits", "word " * 200, max_new_tokens=10))
            assert until_terminal(ws)[-1]["type"] == "end"
    assert (error["type"], error["id"], error["code"]) == ("error", "long", "prompt_too_long")
    assert "256" in error["message"]
    assert len(engine.submitted) == 1  # only the chat that fits reached the engine


def test_a_chat_without_a_length_gets_what_the_context_has_room_for():
    with serving(FakeEngine(max_context=256), max_new_tokens=200, max_new_tokens_cap=200) as (client, engine):
        with client.websocket_connect("/ws") as ws:
            ws.send_json(chat("long", "word " * 150))
            assert until_terminal(ws)[-1]["type"] == "end"
            ws.send_json(chat("short", "word " * 10))
            assert until_terminal(ws)[-1]["type"] == "end"
    fitted, default = engine.submitted
    assert fitted.params.max_new_tokens == 256 - len(fitted.prompt_ids) < 200
    assert default.params.max_new_tokens == 200


# ---- errors keep the connection usable; protocol violations close it ----


@pytest.mark.parametrize(
    ("frame", "code", "echoed_id"),
    [
        ("{not json", "invalid_json", None),
        ('{"type": "chat", "id": "n", "params": {"temperature": NaN}}', "invalid_json", None),
        (json.dumps({"type": "dance"}), "invalid_request", None),
        (json.dumps({**chat("x1"), "extra": 1}), "invalid_request", "x1"),
        (json.dumps(chat("x2", temperature=9)), "invalid_request", "x2"),
        (json.dumps(chat("x3", max_new_tokens=65)), "invalid_request", "x3"),
        (json.dumps(chat("x4", beam_width=2)), "invalid_request", "x4"),
        (json.dumps({"type": "chat", "id": "x5", "messages": [{"role": "assistant", "content": "hi"}]}),
         "invalid_request", "x5"),
        (json.dumps({"type": "chat", "id": "x6", "messages": [{"role": "user", "content": "hi"}] * 9}),
         "invalid_request", "x6"),
        (json.dumps(chat("y" * 65)), "invalid_request", None),
    ],
)
def test_a_bad_frame_gets_a_named_error_and_the_connection_stays_usable(frame, code, echoed_id):
    with serving() as (client, engine):
        with client.websocket_connect("/ws") as ws:
            ws.send_text(frame)
            error = receive(ws)
            ws.send_json({"type": "ping"})
            pong = receive(ws)
        metrics = client.get("/metrics").text
    assert (error["type"], error["code"], error["id"]) == ("error", code, echoed_id)
    assert error["message"]
    assert pong == {"type": "pong"}
    assert engine.submitted == []
    assert f'typewriter_rejected_requests_total{{code="{code}"}} 1.0' in metrics


def test_a_binary_frame_closes_the_connection_with_1003():
    with serving() as (client, _):
        with client.websocket_connect("/ws") as ws:
            ws.send_bytes(b'{"type":"ping"}')
            closed = receive(ws)
    assert (closed["type"], closed["code"]) == ("websocket.close", 1003)


def test_a_frame_over_the_size_limit_closes_the_connection_with_1009():
    with serving(max_message_bytes=2048) as (client, _):
        with client.websocket_connect("/ws") as ws:
            ws.send_json(chat(text="é" * 1100))  # 1,100 characters, 2,200 bytes
            closed = receive(ws)
    assert (closed["type"], closed["code"]) == ("websocket.close", 1009)


def test_a_handshake_from_another_origin_is_refused_and_the_same_origin_is_accepted():
    with serving() as (client, _):
        with pytest.raises(WebSocketDisconnect) as refused:
            with client.websocket_connect("/ws", headers={"origin": "https://evil.example"}):
                pass
        with client.websocket_connect("/ws", headers={"origin": "http://testserver"}) as ws:
            ws.send_json({"type": "ping"})
            assert receive(ws) == {"type": "pong"}
    assert refused.value.code == 1008


# ---- shutdown ----


def test_shutdown_ends_running_chats_with_reason_shutdown_and_refuses_new_ones():
    with serving(FakeEngine(tokens=["x"] * 500, step_s=0.02)) as (client, _):
        with client.websocket_connect("/ws") as ws:
            ws.send_json(chat("run", max_new_tokens=64))
            assert receive(ws)["type"] == "start"
            client.portal.call(client.app.state.server.drain)
            frames = until_terminal(ws)
            ws.send_json(chat("late"))
            refused = receive(ws)
        assert client.get("/readyz").json() == {"status": "stopping"}
    assert (frames[-1]["type"], frames[-1]["reason"]) == ("end", "shutdown")
    assert (refused["code"], refused["id"]) == ("internal", "late")


# ---- HTTP: metrics, page, headers ----


def test_metrics_expose_the_documented_names():
    with serving() as (client, _):
        with client.websocket_connect("/ws") as ws:
            ws.send_json(chat())
            until_terminal(ws)
        text = client.get("/metrics").text
    for name in ("typewriter_requests_total", "typewriter_time_to_first_token_seconds_bucket",
                 "typewriter_inter_token_latency_seconds_bucket", "typewriter_queue_wait_seconds_bucket",
                 "typewriter_generated_tokens_total 4.0", "typewriter_prompt_tokens_total 3.0",
                 "typewriter_active_streams 0.0", "typewriter_queued_requests 0.0"):
        assert name in text


def test_the_page_gets_the_settings_as_json_and_every_response_a_strict_csp(tmp_path):
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "index.html").write_text(
        '<script id="config" type="application/json">{{ config|tojson }}</script>')
    with serving(web_root=tmp_path) as (client, _):
        page = client.get("/")
        health = client.get("/healthz")
    config = json.loads(page.text.removeprefix('<script id="config" type="application/json">')
                        .removesuffix("</script>"))
    assert config["ws_path"] == "/ws"
    assert config["max_new_tokens_cap"] == 64
    for response in (page, health):
        csp = response.headers["content-security-policy"]
        assert "script-src 'self';" in csp
        assert "unsafe-inline" not in csp
        assert response.headers["x-content-type-options"] == "nosniff"


def test_finished_events_only_end_their_own_connection():
    with serving(FakeEngine(tokens=["y"] * 6, step_s=0.02)) as (client, _):
        with client.websocket_connect("/ws") as one, client.websocket_connect("/ws") as two:
            one.send_json(chat("same"))
            two.send_json(chat("same"))
            frames_one, frames_two = until_terminal(one), until_terminal(two)
    assert text_of(frames_one) == text_of(frames_two) == "y" * 6
    assert frames_one[-1]["reason"] == frames_two[-1]["reason"] == "eos"


# ---- a client that stops reading ----


def test_a_client_that_stops_reading_has_its_chat_cancelled_after_the_backlog():
    """Drives the app over raw ASGI so the socket's send can block, as it does when a real client stops reading."""

    engine = FakeEngine(tokens=["x"] * 1000, step_s=0.001, max_context=4096)

    async def scenario():
        state = ServerState(settings(send_backlog=8, max_new_tokens_cap=1000), factory(engine))
        state.start_loading()
        while not state.ready:
            await asyncio.sleep(0.01)
        inbox: asyncio.Queue = asyncio.Queue()
        stalled = asyncio.Event()  # never set while the client "does not read"

        async def send(message):
            if message["type"] == "websocket.send":
                await stalled.wait()

        scope = {"type": "websocket", "path": "/ws", "headers": [], "query_string": b""}
        ws = WebSocket(scope, inbox.get, send)
        await inbox.put({"type": "websocket.connect"})
        await ws.accept()
        session = Session(ws, state)
        running = asyncio.create_task(session.run())
        await inbox.put({"type": "websocket.receive", "text": json.dumps(chat("slow", max_new_tokens=1000))})
        deadline = time.monotonic() + 5
        while engine.submitted == [] or engine.stats().active:
            assert time.monotonic() < deadline, "the stalled chat was never cancelled"
            await asyncio.sleep(0.01)
        waiting = session.stream.events.qsize()
        await inbox.put({"type": "websocket.disconnect", "code": 1006})
        stalled.set()
        await asyncio.wait_for(running, 5)
        return waiting, state.metrics.render().decode()

    waiting, metrics = asyncio.run(scenario())
    assert waiting <= 8 + 2  # the backlog, the token that crossed it, and the Finished
    assert 'typewriter_requests_total{reason="cancelled"} 1.0' in metrics
    generated = float(re.search(r"^typewriter_generated_tokens_total (\S+)$", metrics, re.M).group(1))
    assert generated < 100  # cancelled within a step or two of the backlog filling, not run to 1,000
