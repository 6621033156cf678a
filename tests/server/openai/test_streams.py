"""The OpenAI door's kept streams and keep-alives over a real socket (uvicorn on loopback, the real engine on a
scripted runner): a stream sent with X-Conversation-Id survives its connection and its owner, who holds the
X-Resume-Token its response carried, reads it again from a byte offset with GET /v1/stream/<id>?from=N, stops it
with DELETE or replaces it; nobody else can do any of that, and guessing is limited; bad ids and offsets get named
errors, and a stream that waits for a slot carries `: keep-alive` comments."""

from __future__ import annotations

import json
import uuid

import httpx
from helpers import wait_until
from scripted import script_engine
from served import running

PIECES = [f"w{i} " for i in range(40)]
BODY = {"model": "scripted-model", "messages": [{"role": "user", "content": "go on"}], "stream": True,
        "max_tokens": 60}


def content_of(sse: bytes) -> tuple[str, list]:
    """(the answer's text, the events) of an SSE body; comments skipped."""
    events = []
    for block in sse.decode().split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events
                   if isinstance(e, dict) and e.get("choices"))
    return text, events


def read_some(base: str, headers: dict, enough: int) -> tuple[bytes, dict]:
    """POST a streamed completion and read at least `enough` bytes of it, then drop the connection: (the bytes,
    the headers its owner presents to read it again: its X-Resume-Token, where it was kept)."""
    got = b""
    with httpx.stream("POST", f"{base}/v1/chat/completions", json=BODY, headers=headers, timeout=10) as response:
        assert response.status_code == 200, response.read()
        token = response.headers.get("x-resume-token")
        for part in response.iter_raw():
            got += part
            if len(got) >= enough:
                break
    return got, ({"X-Resume-Token": token} if token else {})


def test_a_kept_stream_dropped_mid_answer_is_read_again_from_the_byte_the_client_stopped_at():
    conversation = str(uuid.uuid4())
    engine = script_engine(PIECES, step_s=0.03)
    with running(engine) as (_, address):
        base = f"http://{address}"
        before, owner = read_some(base, {"X-Conversation-Id": conversation}, 600)
        with httpx.stream("GET", f"{base}/v1/stream/{conversation}", params={"from": len(before)}, headers=owner,
                          timeout=10) as response:
            assert response.status_code == 200
            after = response.read()
        whole = httpx.get(f"{base}/v1/stream/{conversation}", params={"from": 0}, headers=owner, timeout=10).content
    assert before + after == whole
    text, events = content_of(whole)
    assert text == "".join(PIECES) and events[-1] == "[DONE]"
    assert len(engine.submitted) == 1  # one answer, read three times


def test_without_the_header_a_dropped_stream_is_cancelled_as_before():
    engine = script_engine(["z "] * 1000, step_s=0.02, max_context=2048)
    with running(engine, max_context=2048, max_new_tokens_cap=1000) as (_, address):
        _, owner = read_some(f"http://{address}", {}, 300)
        wait_until(lambda: engine.stats().active == 0, "the dropped stream's chat is cancelled")
        metrics = httpx.get(f"http://{address}/metrics").text
    assert 'typewriter_requests_total{reason="cancelled"} 1.0' in metrics and owner == {}


def test_delete_stops_a_kept_stream_and_answers_204_also_once_it_has_ended():
    conversation = str(uuid.uuid4())
    engine = script_engine(["z "] * 1000, step_s=0.02, max_context=2048)
    with running(engine, max_context=2048, max_new_tokens_cap=1000) as (_, address):
        base = f"http://{address}"
        _, owner = read_some(base, {"X-Conversation-Id": conversation}, 300)
        stopped = httpx.delete(f"{base}/v1/stream/{conversation}", headers=owner)
        wait_until(lambda: engine.stats().active == 0, "the stopped answer's slot is free")
        _, events = content_of(httpx.get(f"{base}/v1/stream/{conversation}", headers=owner, timeout=10).content)
        again = httpx.delete(f"{base}/v1/stream/{conversation}", headers=owner)
    assert stopped.status_code == 204 and again.status_code == 204
    assert events[-2]["error"]["code"] == "cancelled" and events[-1] == "[DONE]"


def test_bad_ids_unknown_streams_and_offsets_past_the_end_get_named_errors():
    conversation = str(uuid.uuid4())
    with running(script_engine(PIECES[:3], step_s=0)) as (_, address):
        base = f"http://{address}"
        short = httpx.post(f"{base}/v1/chat/completions", json=BODY, headers={"X-Conversation-Id": "abc"})
        _, owner = read_some(base, {"X-Conversation-Id": conversation}, 10**9)
        unknown = httpx.get(f"{base}/v1/stream/{uuid.uuid4()}", headers=owner)
        past = httpx.get(f"{base}/v1/stream/{conversation}", params={"from": 10**9}, headers=owner)
        garbage = httpx.get(f"{base}/v1/stream/{conversation}", params={"from": "-5"}, headers=owner)
        bad_path = httpx.get(f"{base}/v1/stream/short", headers=owner)
    assert (short.status_code, short.json()["error"]["code"]) == (400, "invalid_request")
    assert "X-Conversation-Id: must be 16 to 128" in short.json()["error"]["message"]
    assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "not_found")
    assert past.status_code == 400 and "so from may be at most" in past.json()["error"]["message"]
    assert garbage.status_code == 400 and "from: must be a byte offset" in garbage.json()["error"]["message"]
    assert bad_path.status_code == 400


def test_a_new_request_with_the_same_conversation_id_and_its_token_replaces_the_running_one():
    conversation = str(uuid.uuid4())
    engine = script_engine(["z "] * 1000, step_s=0.02, max_context=2048)
    with running(engine, max_context=2048, max_new_tokens_cap=1000) as (_, address):
        base = f"http://{address}"
        _, first = read_some(base, {"X-Conversation-Id": conversation}, 300)
        second, owner = read_some(base, {"X-Conversation-Id": conversation, **first}, 300)
        wait_until(lambda: engine.stats().active == 1, "the first answer was stopped")
        gone = httpx.get(f"{base}/v1/stream/{conversation}", headers=first)
        replay = b""
        with httpx.stream("GET", f"{base}/v1/stream/{conversation}", headers=owner, timeout=10) as response:
            for part in response.iter_raw():
                replay += part
                if len(replay) >= len(second):
                    break
    assert replay[:len(second)] == second and gone.status_code == 404  # the second answer; the first forgotten


def test_an_abandoned_kept_stream_is_cancelled_after_the_grace_period():
    conversation = str(uuid.uuid4())
    engine = script_engine(["z "] * 1000, step_s=0.02, max_context=2048)
    with running(engine, max_context=2048, max_new_tokens_cap=1000, resume_grace_s=0.5) as (_, address):
        _, owner = read_some(f"http://{address}", {"X-Conversation-Id": conversation}, 300)
        wait_until(lambda: engine.stats().active == 0, "the abandoned answer's slot is free")
        gone = httpx.get(f"http://{address}/v1/stream/{conversation}", headers=owner)
    assert gone.status_code == 404


def test_a_stream_waiting_for_a_slot_carries_keep_alive_comments_until_its_answer_starts():
    engine = script_engine(PIECES, step_s=0.05, slots=1)
    with running(engine, sse_keepalive_s=0.2) as (_, address):
        base = f"http://{address}"
        with httpx.stream("POST", f"{base}/v1/chat/completions", json=BODY, timeout=10) as first:
            assert first.status_code == 200
            with httpx.stream("POST", f"{base}/v1/chat/completions", json=BODY, timeout=10) as second:
                body = second.read()
            first.read()
    lines = body.decode().split("\n\n")
    answer_starts = next(i for i, block in enumerate(lines) if block.startswith("data: "))
    assert ": queued 1" in lines[:answer_starts]
    assert ": keep-alive" in lines[:answer_starts]  # the slot took two seconds to free
    assert content_of(body)[0] == "".join(PIECES)


def test_only_the_owner_reads_stops_or_replaces_a_kept_stream_and_guessing_is_limited(caplog):
    """The id is the client's (a 16-letter `aaaaaaaaaaaaaaaa` is accepted) and routes the request; the token is the
    server's and owns the stream. Another client with the id, a wrong token or none gets 404 and can neither stop
    nor replace it; past a minute's misses its look-ups get 429 whatever they send; the token is in no log line."""
    conversation = "a" * 16
    engine = script_engine(["z "] * 1000, step_s=0.02, max_context=2048)
    with running(engine, max_context=2048, max_new_tokens_cap=1000) as (_, address):
        base = f"http://{address}"
        _, owner = read_some(base, {"X-Conversation-Id": conversation}, 300)
        token = owner["X-Resume-Token"]
        others = [{}, {"X-Resume-Token": "x" * 43}, {"X-Resume-Token": token[:-1] + ("A" if token[-1] != "A" else "B")}]
        reads = [httpx.get(f"{base}/v1/stream/{conversation}", headers=h) for h in others]
        stops = [httpx.delete(f"{base}/v1/stream/{conversation}", headers=h) for h in others]
        _, own = read_some(base, {"X-Conversation-Id": conversation}, 10)  # without the token: a stream of its own
        wait_until(lambda: engine.stats().active == 2, "both answers run")
        guesses = [httpx.get(f"{base}/v1/stream/{conversation}", headers={"X-Resume-Token": f"guess{i:040d}"})
                   for i in range(20)]
        blocked = httpx.get(f"{base}/v1/stream/{conversation}", headers=owner)  # the window is past its misses
    assert [r.status_code for r in reads + stops] == [404] * 6
    assert {r.json()["error"]["code"] for r in reads} == {"not_found"}
    assert own["X-Resume-Token"] != token
    assert [g.status_code for g in guesses][-1] == 429 and 404 in [g.status_code for g in guesses]
    assert guesses[-1].headers.get("retry-after") and blocked.status_code == 429
    assert token not in caplog.text and own["X-Resume-Token"] not in caplog.text


def test_the_owner_still_reads_the_whole_kept_stream_while_a_stranger_is_refused():
    conversation = str(uuid.uuid4())
    engine = script_engine(PIECES, step_s=0.01)
    with running(engine) as (_, address):
        base = f"http://{address}"
        before, owner = read_some(base, {"X-Conversation-Id": conversation}, 200)
        stranger = httpx.get(f"{base}/v1/stream/{conversation}", params={"from": 0})
        whole = httpx.get(f"{base}/v1/stream/{conversation}", params={"from": 0}, headers=owner, timeout=10)
    assert stranger.status_code == 404 and whole.status_code == 200
    assert whole.content.startswith(before) and content_of(whole.content)[0] == "".join(PIECES)
