"""The server's lifecycle over Starlette's TestClient and the real engine on a scripted runner: health while the
model loads, readiness, a failed load, an engine that fails while serving, and the drain on shutdown."""

from __future__ import annotations

import threading
import time

import pytest
from helpers import chat, receive, serving, small_settings, until_terminal, wait_until
from scripted import factory, script_engine
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from typewriter.server import lifecycle
from typewriter.server.app import create_app


def test_healthz_answers_while_the_model_loads_and_readyz_turns_ready_when_loaded():
    gate = threading.Event()
    engine = script_engine()
    app = create_app(small_settings(), factory(engine, gate=gate))
    with TestClient(app) as client:
        assert client.get("/healthz").json() == {"status": "ok"}
        loading = client.get("/readyz")
        assert loading.status_code == 503
        assert loading.json() == {"status": "loading", "progress": "loading scripted weights"}
        with client.websocket_connect("/ws") as ws:
            assert receive(ws) == {"type": "websocket.close", "code": 1013,
                                   "reason": "the model is still loading; retry when /readyz is 200"}
        gate.set()
        wait_until(lambda: client.get("/readyz").status_code == 200, "ready")
        body = client.get("/readyz").json()
    assert body["status"] == "ready" and body["model"] == "SmolLM2-135M-Instruct" and body["tokenizer"] == "scripted"
    assert body["limits"] | {} == {"max_active": 2, "max_queue": 2, "max_context": 256, "max_new_tokens": 16,
                                   "max_new_tokens_cap": 64, "max_messages": 8, "max_message_bytes": 4096}


def test_once_ready_the_server_prepares_constraints_before_any_request_asks_for_one():
    engine = script_engine()
    with TestClient(create_app(small_settings(), factory(engine))) as client:
        wait_until(lambda: client.get("/readyz").status_code == 200, "ready")
        wait_until(lambda: engine.grammars._tokenizer is not None, "the constraints' tokenizer built")


def test_what_is_built_late_is_built_once_the_engine_is_idle_not_while_it_answers(monkeypatch):
    """The tokenizer's BPE and the constraints' tokenizers wait for an idle engine; the classes' prompts, which the
    first chat needs, are worked out for it, once."""
    monkeypatch.setattr(lifecycle, "WARM_WHEN_IDLE_S", 1.0)
    monkeypatch.setattr(lifecycle, "TOKENIZER_WHEN_QUIET_S", 1.0)
    with serving(script_engine(["x"] * 500, step_s=0.05)) as (client, engine):
        tokenizer = engine.tokenizer
        assert tokenizer.prefixes == 0, "the classes' prompts were encoded before any chat or an idle engine"
        with client.websocket_connect("/ws") as ws:
            ws.send_json(chat(max_new_tokens=64))  # about 3 s of steps
            assert receive(ws)["type"] == "start"
            prefixes = tokenizer.prefixes
            assert prefixes > 0, "the first chat did not work out its class's prompt"
            time.sleep(2.0)
            assert engine.grammars._tokenizer is None, "built while a chat was being answered"
            assert tokenizer.prepared == 0, "the tokenizer was prepared while a chat was being answered"
            frames = until_terminal(lambda: receive(ws))
        ended = time.monotonic()
        wait_until(lambda: engine.grammars._tokenizer is not None, "the constraints' tokenizer built once idle")
        assert tokenizer.prepared == 1
        with client.websocket_connect("/ws") as ws:
            ws.send_json(chat("again", max_new_tokens=3))
            assert until_terminal(lambda: receive(ws))[-1]["type"] == "end"
    assert frames[-1]["type"] == "end"
    assert time.monotonic() - ended >= 0.9, "built before the engine had been idle for WARM_WHEN_IDLE_S"
    assert tokenizer.prefixes == prefixes, "the classes' prompts were encoded more than once"


def test_a_part_of_the_warm_up_that_fails_leaves_the_others_built(monkeypatch):
    engine = script_engine()

    def broken() -> None:
        raise RuntimeError("no BPE today")

    monkeypatch.setattr(engine.tokenizer, "prepare", broken)
    with serving(engine) as (client, _):
        wait_until(lambda: engine.grammars._tokenizer is not None, "the constraints' tokenizer built")
        assert engine.tokenizer.prefixes > 0, "the classes' prompts were not worked out"


def test_a_chat_being_opened_keeps_the_server_from_counting_as_quiet():
    """One still being encoded is not the engine's yet: the warm-up must not start under it."""
    with serving(script_engine()) as (client, engine):
        state = client.app.state.server
        state.chat_came()
        came = time.monotonic()
        assert state._quiet_for(engine, 0.5)
        assert time.monotonic() - came >= 0.5


def test_readyz_reports_a_failed_load():
    def broken(settings, progress):
        raise FileNotFoundError("no weights at /nowhere")

    with TestClient(create_app(small_settings(), broken)) as client:
        wait_until(lambda: client.get("/readyz").json()["status"] == "failed", "failed")
        response = client.get("/readyz")
    assert response.status_code == 503
    assert "no weights at /nowhere" in response.json()["detail"]


def test_a_failed_step_ends_only_its_chat_with_internal_and_the_server_goes_on_serving():
    with serving(script_engine(["x"] * 500, step_s=0.01)) as (client, engine):
        with client.websocket_connect("/ws") as ws:
            ws.send_json(chat(max_new_tokens=64))
            assert receive(ws)["type"] == "start"
            engine.runner.fail("decode", RuntimeError("XLA said no"))  # the real failure path, no fake death
            frames = until_terminal(lambda: receive(ws))
            ws.send_json(chat("later", max_new_tokens=3))
            later = until_terminal(lambda: receive(ws))
        ready, health = client.get("/readyz"), client.get("/healthz")
        metrics = client.get("/metrics").text
    assert (frames[-1]["type"], frames[-1]["code"], frames[-1]["id"]) == ("error", "internal", "c1")
    assert "XLA" not in frames[-1]["message"], "the client learns that it failed, the log learns why"
    assert (later[-1]["type"], later[-1]["reason"]) == ("end", "length")
    assert ready.status_code == 200 and health.status_code == 200
    assert 'typewriter_requests_total{reason="error"} 1.0' in metrics


def test_an_engine_whose_steps_keep_failing_fails_for_good_and_healthz_and_readyz_turn_503():
    with serving(script_engine(["x"] * 500, step_s=0.01)) as (client, engine):
        engine.runner.fail("extend", RuntimeError("XLA said no"), times=1000)
        with client.websocket_connect("/ws") as ws:
            for n in range(3):
                ws.send_json(chat(f"try{n}", max_new_tokens=3))
                assert until_terminal(lambda: receive(ws))[-1]["code"] == "internal"
            ws.send_json(chat("later"))
            refused = receive(ws)
        ready, health = client.get("/readyz"), client.get("/healthz")
    assert (refused["code"], refused["id"]) == ("internal", "later")
    assert ready.status_code == 503 and ready.json()["status"] == "engine_stopped"
    assert health.status_code == 503 and health.json()["status"] == "engine_failed"


def test_a_drain_past_its_deadline_ends_running_chats_with_reason_shutdown_and_refuses_new_ones():
    with serving(script_engine(["x"] * 500, step_s=0.02), drain_s=0.0) as (client, _):
        with client.websocket_connect("/ws") as ws:
            ws.send_json(chat("run", max_new_tokens=64))
            assert receive(ws)["type"] == "start"
            client.portal.call(client.app.state.server.drain)
            frames = until_terminal(lambda: receive(ws))
            ws.send_json(chat("late"))
            refused = receive(ws)
            # then the socket closes at once: a client that retries at once gets 1012 (reconnect), never a
            # stream of refusals that its own retries turn into a frame flood (1008)
            closed = receive(ws)
        assert client.get("/readyz").json() == {"status": "stopping"}
    assert (frames[-1]["type"], frames[-1]["reason"]) == ("end", "shutdown")
    assert (refused["type"], refused["code"], refused["id"]) == ("error", "shutdown", "late")
    assert (closed["type"], closed["code"], closed["reason"]) == ("websocket.close", 1012, "shutdown")


def test_a_drain_lets_a_running_chat_finish_within_its_deadline_while_new_sockets_get_1012():
    with serving(script_engine(["x"] * 500, step_s=0.01), drain_s=30.0) as (client, _):
        with client.websocket_connect("/ws") as ws:
            ws.send_json(chat("run", max_new_tokens=40))
            assert receive(ws)["type"] == "start"
            client.portal.start_task_soon(client.app.state.server.drain)
            wait_until(lambda: client.get("/readyz").status_code == 503, "readyz turns 503 at once")
            with client.websocket_connect("/ws") as late:
                with pytest.raises(WebSocketDisconnect) as closed:
                    late.receive_json()
            frames = until_terminal(lambda: receive(ws))
    assert (closed.value.code, closed.value.reason) == (1012, "shutdown")
    assert (frames[-1]["type"], frames[-1]["reason"]) == ("end", "length")
    assert len([f for f in frames if f["type"] == "token"]) == 40


def test_readyz_is_503_full_while_every_slot_and_the_queue_are_taken_so_a_balancer_looks_elsewhere():
    engine = script_engine(["x"] * 400, step_s=0.01, slots=1, max_queue=0, max_context=1024)
    with serving(engine, max_new_tokens_cap=500) as (client, _):
        with client.websocket_connect("/ws") as ws:
            ws.send_json(chat("long", max_new_tokens=400))
            assert receive(ws)["type"] == "start"
            full = client.get("/readyz")
            ws.send_json({"type": "stop", "id": "long"})
            while receive(ws)["type"] != "end":
                pass
        wait_until(lambda: client.get("/readyz").status_code == 200, "ready again once the slot is free")
        ready = client.get("/readyz").json()
    assert full.status_code == 503
    body = full.json()
    assert body["status"] == "full" and body["load"] == {"active": 1, "queued": 0} and "overloaded" in body["detail"]
    assert ready["status"] == "ready" and ready["load"] == {"active": 0, "queued": 0}
