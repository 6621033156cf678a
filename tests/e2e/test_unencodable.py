"""Text that is not text: JSON can escape a lone UTF-16 surrogate ("\\udfff"), which no UTF-8 frame can carry back.

Over a real server: every string field holding one is refused with `invalid_request` naming the field, before any
chat starts, and the socket goes on. And whatever a send raises, the chat it belongs to is cancelled and the
socket closes (1011), so nothing runs on that no client hears. Found by a probe: 40 chats with such an id, each
of which the socket could not send a frame of, ran on unattached after their socket closed.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging

import httpx
import pytest
from helpers import until_terminal_async, wait_until
from scripted import script_engine
from served import running
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from typewriter.server.socket import frames as protocol

LONE = "\\udfff"  # as it travels: the JSON escape of a lone low surrogate


def chat_text(chat_id: str = "c1", content: str = "hi there", extra: str = "") -> str:
    """A chat frame written by hand, so that escapes reach the server as escapes."""
    return ('{"type":"chat","id":"%s","messages":[{"role":"user","content":"%s"}]%s}' % (chat_id, content, extra))


BAD_FRAMES = [
    (chat_text(chat_id=LONE), None, "id"),
    (chat_text(chat_id="x" + LONE + "y"), None, "id"),
    ('{"type":"stop","id":"%s"}' % LONE, None, "id"),
    (chat_text(content="my id is 7138" + LONE), "c1", "messages[0].content"),
    (chat_text(content="\\ud800\\ud800"), "c1", "messages[0].content"),  # two highs are no pair
    (chat_text(extra=',"params":{"stop":["ok","%s"]}' % LONE), "c1", "params.stop[1]"),
    (chat_text(extra=',"params":{"%s":1}' % LONE), "c1", "a field name in params"),
    ('{"type":"ping","%s":1}' % LONE, None, "a field name in the frame"),
    ('{"type":"chat","id":"c1","messages":[{"role":"%s","content":"hi"}]}' % LONE, "c1", "messages[0].role"),
]


@pytest.mark.parametrize(("frame", "echoed", "where"), BAD_FRAMES, ids=[w for _, _, w in BAD_FRAMES])
def test_a_lone_surrogate_in_any_string_field_is_invalid_request_naming_it_and_the_socket_goes_on(
        frame, echoed, where):
    engine = script_engine()

    async def talk(address):
        async with connect(f"ws://{address}/ws") as ws:
            await ws.send(frame)
            refused = json.loads(await asyncio.wait_for(ws.recv(), 5))
            await ws.send(json.dumps({"type": "chat", "id": "after", "params": {"max_new_tokens": 4},
                                      "messages": [{"role": "user", "content": "hi"}]}))
            return refused, await until_terminal_async(ws, 5)

    with running(engine) as (_, address):
        refused, after = asyncio.run(talk(address))
    assert (refused["type"], refused["code"], refused["id"]) == ("error", "invalid_request", echoed)
    assert refused["message"].startswith(f"{where}: holds a lone surrogate")
    assert [r.id for r in engine.submitted] == ["r1"]  # only the chat after it reached the engine
    assert (after[-1]["type"], after[-1]["id"]) == ("end", "after")


def test_forty_chats_with_a_surrogate_id_start_nothing_and_leave_no_unretrieved_task(caplog):
    engine = script_engine(["ab"] * 300, step_s=0.01)

    async def flood(address):
        async with connect(f"ws://{address}/ws") as ws:
            answers = []
            for _ in range(40):
                await ws.send(chat_text(chat_id=LONE))
                answers.append(json.loads(await asyncio.wait_for(ws.recv(), 5)))
            return answers

    with caplog.at_level(logging.ERROR):
        with running(engine, frames_per_second=100) as (_, address):
            answers = asyncio.run(flood(address))
        gc.collect()  # an unretrieved task's exception is logged when the task is collected
    assert {(a["code"], a["id"]) for a in answers} == {("invalid_request", None)}
    assert engine.submitted == [] and engine.stats().active == 0
    assert "never retrieved" not in caplog.text


@pytest.mark.parametrize(("path", "body", "where"), [
    ("/v1/chat/completions", '{"messages":[{"role":"user","content":"%s"}]}' % LONE, "messages[0].content"),
    ("/v1/responses", '{"input":"my id is 7138%s"}' % LONE, "input"),
    ("/v1/responses", '{"input":"hi","model":"tutor%s"}' % LONE, "model"),
], ids=["chat completions", "responses input", "responses model"])
def test_a_lone_surrogate_in_an_openai_body_is_a_400_naming_the_field(path, body, where):
    engine = script_engine()
    with running(engine) as (_, address):
        response = httpx.post(f"http://{address}{path}", content=body.encode(),
                              headers={"content-type": "application/json"})
    assert response.status_code == 400 and engine.submitted == []
    error = response.json()["error"]
    assert error["code"] == "invalid_request" and error["message"].startswith(f"{where}: holds a lone")


def test_a_frame_that_cannot_be_sent_cancels_its_chat_and_closes_the_socket_with_1011(monkeypatch, caplog):
    """Whatever a send raises (here: encoding a token frame of chat "boom" fails), the engine stops the chat and
    the socket closes with a code, instead of the chat running on with nobody attached."""
    engine = script_engine(["ab"] * 300, step_s=0.01)
    encode = protocol.encode

    def failing(frame):
        if frame["type"] == "token" and frame["id"] == "boom":
            raise UnicodeEncodeError("utf-8", "\udfff", 0, 1, "surrogates not allowed")
        return encode(frame)

    monkeypatch.setattr(protocol, "encode", failing)

    async def talk(address):
        async with connect(f"ws://{address}/ws") as ws:
            await ws.send(json.dumps({"type": "chat", "id": "boom", "params": {"max_new_tokens": 64},
                                      "messages": [{"role": "user", "content": "hi"}]}))
            frames = []
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    frames.append(json.loads(await asyncio.wait_for(ws.recv(), 5)))
            return frames, closed.value.rcvd.code

    with caplog.at_level(logging.ERROR):
        with running(engine) as (_, address):
            frames, code = asyncio.run(talk(address))
            wait_until(lambda: engine.stats().active == 0, "the chat has left its slot")
            metrics = httpx.get(f"http://{address}/metrics").text
        gc.collect()
    assert [f["type"] for f in frames] == ["start"] and code == protocol.CLOSE_INTERNAL_ERROR
    assert 'typewriter_requests_total{reason="cancelled"} 1.0' in metrics
    assert "a token frame could not be sent" in caplog.text and "never retrieved" not in caplog.text


def test_an_sse_event_that_cannot_be_sent_cancels_its_chat(monkeypatch):
    from typewriter.server.openai import completions_answer

    engine = script_engine(["ab"] * 300, step_s=0.01)
    sse = completions_answer.sse

    def failing(data):
        if data.get("choices") and data["choices"][0]["delta"].get("content"):
            raise UnicodeEncodeError("utf-8", "\udfff", 0, 1, "surrogates not allowed")
        return sse(data)

    monkeypatch.setattr(completions_answer, "sse", failing)
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 64, "stream": True}
    with running(engine) as (_, address):
        with pytest.raises(httpx.HTTPError):  # the response ends mid-stream
            with httpx.stream("POST", f"http://{address}/v1/chat/completions", json=body, timeout=5) as response:
                for _ in response.iter_lines():
                    pass
        wait_until(lambda: engine.stats().active == 0, "the chat has left its slot")
        metrics = httpx.get(f"http://{address}/metrics").text
    assert 'typewriter_requests_total{reason="cancelled"} 1.0' in metrics
