"""Protocol v1 end to end: `typewriter serve` with the real model, over a real socket, with the websockets client.

One server for the whole module (starting it costs most of the time), with two slots and a wait queue of two so
queueing and `overloaded` are reachable with five clients, and short default answers. The tests run one after
another and each ends every chat it starts, so each begins with the server idle.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time

import helpers
import pytest
from helpers import chat_json as chat
from helpers import recv_json, until_terminal_async
from helpers import stop_json as stop
from helpers import text_of as text
from helpers import token_frames as tokens
from real_server import ROOT, http_get, real_server
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MAX_NEW_TOKENS = 64
SETTINGS = {
    "TYPEWRITER_MAX_ACTIVE": "2",
    "TYPEWRITER_MAX_QUEUE": "2",
    "TYPEWRITER_MAX_CONTEXT": "1024",  # smaller than the default: fewer programs to compile at start-up
    "TYPEWRITER_MAX_NEW_TOKENS": str(MAX_NEW_TOKENS),
    "TYPEWRITER_MAX_NEW_TOKENS_CAP": "256",
}
MAX_MESSAGE_BYTES = 262_144  # the default
FRAME_TIMEOUT_S = 60.0  # a frame on a busy two-core machine; generation runs at tens of tokens a second
SETTLE_TIMEOUT_S = 10.0

SHORT = "What is a prime number?"
MULTILINGUAL = "How do you say 'thank you' in Japanese, Greek and Russian?"  # multi-byte characters
ESSAY = "Write a long, detailed essay about the history of mathematics, from Babylon to today."
NEIGHBOUR = "Summarize this: " + "The quick brown fox jumps over the lazy dog. " * 30  # ~380 prompt tokens


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> str:
    with real_server(SETTINGS, tmp_path_factory.mktemp("e2e") / "server.log") as base:
        yield base


def ws_url(base: str) -> str:
    return base.replace("http://", "ws://", 1) + "/ws"


# ---- frames ----


async def recv(ws) -> dict:
    return await recv_json(ws, FRAME_TIMEOUT_S)


async def until_terminal(ws) -> list[dict]:
    """Frames up to and including the next `end` or chat `error`."""
    return await until_terminal_async(ws, FRAME_TIMEOUT_S)


async def answer(base: str, chat_id: str, content: str, **params) -> tuple[list[dict], float, float]:
    """Every frame of one chat on its own connection, with when its start and its end arrived."""
    async with connect(ws_url(base)) as ws:
        await ws.send(chat(chat_id, content, **params))
        frames = [await recv(ws)]
        started = time.monotonic()
        if frames[0]["type"] not in ("end", "error"):
            frames += await until_terminal(ws)
        return frames, started, time.monotonic()


async def answers_on_one_socket(base: str, chats: list[tuple[str, str]],
                                **params) -> list[tuple[list[dict], float, float]]:
    """As `answer`, for chats asked one after another on one connection: one student's turns."""
    out = []
    async with connect(ws_url(base)) as ws:
        for chat_id, content in chats:
            await ws.send(chat(chat_id, content, **params))
            frames = [await recv(ws)]
            started = time.monotonic()
            if frames[0]["type"] not in ("end", "error"):
                frames += await until_terminal(ws)
            out.append((frames, started, time.monotonic()))
    return out


async def assert_nothing_after_end(ws) -> None:
    """A ping is answered in order, so a pong as the next frame means no frame of the chat came after its end."""
    await ws.send(json.dumps({"type": "ping"}))
    assert await recv(ws) == {"type": "pong"}


# ---- metrics ----


def metric(base: str, name: str, labels: str = "") -> float:
    """A sample's value; a labelled counter that has never counted is not listed yet, so it reads 0."""
    _, body = http_get(f"{base}/metrics")
    match = re.search(rf"^{re.escape(name + labels)} (\S+)$", body, re.M)
    assert match or labels, f"{name} is missing from /metrics"
    return float(match.group(1)) if match else 0.0


def cancelled_total(base: str) -> float:
    return metric(base, "typewriter_requests_total", '{reason="cancelled"}')


def wait_until(condition, what: str) -> None:
    helpers.wait_until(condition, what, timeout=SETTLE_TIMEOUT_S, interval=0.05)


# ---- 1. a full answer ----


def test_a_full_answer_is_start_then_whole_characters_then_one_end(server):
    async def talk():
        async with connect(ws_url(server)) as ws:
            await ws.send(chat("full", MULTILINGUAL, temperature=0))
            frames = await until_terminal(ws)
            await assert_nothing_after_end(ws)
            return frames

    frames = asyncio.run(talk())
    start, *streamed, end = frames
    assert {f["id"] for f in frames} == {"full"}
    assert start["type"] == "start" and start["prompt_tokens"] > 0
    assert [f["type"] for f in streamed] == ["token"] * len(streamed)
    assert end["type"] == "end" and end["reason"] in ("eos", "length")

    answer_text = text(frames)
    assert answer_text.strip()
    assert any(ord(c) > 127 for c in answer_text), "the prompt should draw multi-byte characters out of the model"
    assert "\ufffd" not in answer_text
    # Text that is held back (an incomplete character) is not sent as an empty token: indexes may skip.
    assert all(f["text"] for f in streamed)
    indexes = [f["index"] for f in streamed]
    assert indexes == sorted(set(indexes)) and indexes[0] >= 0

    usage = end["usage"]
    assert usage["prompt_tokens"] == start["prompt_tokens"]
    assert len(streamed) <= usage["completion_tokens"] <= MAX_NEW_TOKENS  # the server's default length applies
    assert indexes[-1] < usage["completion_tokens"]
    if end["reason"] == "length":
        assert usage["completion_tokens"] == MAX_NEW_TOKENS
    timings = end["timings"]
    assert 0 <= timings["queue_ms"] <= timings["ttft_ms"] <= timings["total_ms"]
    assert timings["tokens_per_s"] > 0


# ---- 2. stop ----


def test_stop_mid_answer_ends_cancelled_with_the_partial_text_kept_and_frees_the_slot(server):
    async def talk():
        async with connect(ws_url(server)) as ws:
            await ws.send(chat("essay", ESSAY, max_new_tokens=256))
            before = [await recv(ws)]
            while len(tokens(before)) < 5:
                before.append(await recv(ws))
            await ws.send(stop("essay"))
            after = await until_terminal(ws)
            await assert_nothing_after_end(ws)
            return before, after

    before, after = asyncio.run(talk())
    assert before[0]["type"] == "start"
    # The frames already on their way when the stop was sent come after it too (the model writes a token every few
    # milliseconds, and drafts several a step), so only "few" is asserted here; at most one token after the server
    # reads the stop is server/socket/test_session.py's, with a scripted engine
    assert len(tokens(after)) < 32
    end = after[-1]
    assert (end["type"], end["id"], end["reason"]) == ("end", "essay", "cancelled")
    assert text(before).strip()
    assert len(tokens(before + after)) <= end["usage"]["completion_tokens"] < 256
    # `end` is sent after the engine let go of the slot.
    assert metric(server, "typewriter_active_streams") == 0


# ---- 3. disconnect ----


def test_a_disconnect_mid_answer_cancels_the_chat_and_frees_its_slot(server):
    cancelled_before = cancelled_total(server)

    async def leave_mid_answer():
        async with connect(ws_url(server)) as ws:
            await ws.send(chat("gone", ESSAY, max_new_tokens=256))
            while (await recv(ws))["type"] != "token":
                pass
            assert metric(server, "typewriter_active_streams") == 1
            assert metric(server, "typewriter_open_connections") == 1

    asyncio.run(leave_mid_answer())
    wait_until(lambda: metric(server, "typewriter_active_streams") == 0, "the slot was not freed")
    wait_until(lambda: cancelled_total(server) == cancelled_before + 1,
               'typewriter_requests_total{reason="cancelled"} did not rise by one')
    wait_until(lambda: metric(server, "typewriter_open_connections") == 0, "the connection was not counted closed")


# ---- 4. more clients than slots ----


def test_clients_beyond_the_slots_queue_in_order_all_finish_and_a_full_queue_refuses_more(server):
    async def crowd():
        clients = [await connect(ws_url(server)) for _ in range(5)]
        try:
            first = {}
            for n, ws in enumerate(clients[:4]):  # one at a time, so their order at the server is known
                # 256 tokens, never cut by the loop guard: c0 and c1 still answer when c4 arrives, however fast
                await ws.send(chat(f"c{n}", ESSAY, max_new_tokens=256, loop_guard=False))
                first[n] = await recv(ws)
            gauges = (metric(server, "typewriter_active_streams"), metric(server, "typewriter_queued_requests"))
            await clients[4].send(chat("c4", SHORT))
            refused = await recv(clients[4])
            rest = await asyncio.gather(*(until_terminal(ws) for ws in clients[:4]))
            # Once the crowd has gone, the refused client is served on the same connection.
            await clients[4].send(chat("c4-again", SHORT, max_new_tokens=8))
            retried = await until_terminal(clients[4])
            return first, gauges, refused, [[first[n], *frames] for n, frames in enumerate(rest)], retried
        finally:
            for ws in clients:
                await ws.close()

    first, gauges, refused, chats, retried = asyncio.run(crowd())
    assert [first[n]["type"] for n in range(4)] == ["start", "start", "queued", "queued"]
    assert (first[2]["position"], first[3]["position"]) == (1, 2)
    assert gauges == (2, 2)
    assert (refused["type"], refused["id"], refused["code"]) == ("error", "c4", "overloaded")

    for n, frames in enumerate(chats):
        assert {f["id"] for f in frames} == {f"c{n}"}
        assert frames[-1]["type"] == "end" and frames[-1]["reason"] in ("eos", "length"), frames[-1]
        assert text(frames).strip()
        positions = [f["position"] for f in frames if f["type"] == "queued"]
        assert positions == sorted(positions, reverse=True) and len(set(positions)) == len(positions)
        if n >= 2:  # every position came before the one start
            types = [f["type"] for f in frames]
            assert types.count("start") == 1 and types.index("start") == len(positions)
    assert next(f["position"] for f in chats[3] if f["type"] == "queued") == 2
    assert retried[-1]["type"] == "end"


def test_a_chat_stopped_while_queued_ends_cancelled_without_starting(server):
    async def run():
        clients = [await connect(ws_url(server)) for _ in range(3)]
        try:
            for n, ws in enumerate(clients):
                await ws.send(chat(f"q{n}", ESSAY, max_new_tokens=256))
                assert (await recv(ws))["type"] == ("queued" if n == 2 else "start")
            await clients[2].send(stop("q2"))
            waiter = await until_terminal(clients[2])
            queued_after = metric(server, "typewriter_queued_requests")
            for n in (0, 1):
                await clients[n].send(stop(f"q{n}"))
            runners = await asyncio.gather(*(until_terminal(ws) for ws in clients[:2]))
            return waiter, queued_after, runners
        finally:
            for ws in clients:
                await ws.close()

    waiter, queued_after, runners = asyncio.run(run())
    assert [f["type"] for f in waiter] == ["end"]
    assert (waiter[0]["reason"], waiter[0]["usage"]["completion_tokens"]) == ("cancelled", 0)
    assert queued_after == 0
    assert [frames[-1]["reason"] for frames in runners] == ["cancelled", "cancelled"]


# ---- 5. errors and close codes ----


def test_each_bad_frame_gets_its_error_code_and_the_connection_stays_usable(server):
    too_long = " ".join(["word"] * 800)  # fits the 1024-token context alone, not with 256 new tokens
    bad_frames = [
        ("not json at all", "invalid_json", None),
        ('{"type": "chat", "id": "nan", "params": {"temperature": NaN}}', "invalid_json", None),
        ('{"type": "dance"}', "invalid_request", None),
        (json.dumps({"type": "chat", "id": "empty", "messages": []}), "invalid_request", "empty"),
        (chat("hot", SHORT, temperature=9), "invalid_request", "hot"),
        (chat("cap", SHORT, max_new_tokens=257), "invalid_request", "cap"),
        (chat("odd", SHORT, beam_width=4), "invalid_request", "odd"),
        (json.dumps({"type": "chat", "id": "last", "messages": [{"role": "user", "content": "hi"},
                                                                 {"role": "assistant", "content": "hello"}]}),
         "invalid_request", "last"),
        (chat("long", too_long, max_new_tokens=256), "prompt_too_long", "long"),
        (stop("nobody"), "not_found", "nobody"),
    ]
    codes = {code for _, code, _ in bad_frames} | {"busy"}
    rejected_before = {code: metric(server, "typewriter_rejected_requests_total", f'{{code="{code}"}}')
                       for code in codes}

    async def offend():
        answers = []
        async with connect(ws_url(server)) as ws:
            for frame, _, _ in bad_frames:
                await ws.send(frame)
                answers.append(await recv(ws))
            await ws.send(chat("running", ESSAY, max_new_tokens=256))
            assert (await recv(ws))["type"] == "start"
            await ws.send(chat("second", SHORT))
            busy = await recv(ws)
            while busy["type"] == "token":
                busy = await recv(ws)
            await ws.send(stop("running"))
            ended = await until_terminal(ws)
            await ws.send(stop("running"))  # it has ended
            stale = await recv(ws)
            await assert_nothing_after_end(ws)
        return answers, busy, ended, stale

    answers, busy, ended, stale = asyncio.run(offend())
    for (frame, code, chat_id), got in zip(bad_frames, answers, strict=True):
        assert (got["type"], got["code"], got["id"]) == ("error", code, chat_id), frame[:80]
        assert got["message"]
    assert (busy["type"], busy["code"], busy["id"]) == ("error", "busy", "second")
    assert (ended[-1]["type"], ended[-1]["reason"]) == ("end", "cancelled")
    assert (stale["type"], stale["code"], stale["id"]) == ("error", "not_found", "running")

    sent = {code: sum(c == code for _, c, _ in bad_frames) for code in codes}
    sent["busy"], sent["not_found"] = 1, sent["not_found"] + 1
    for code in codes:
        now = metric(server, "typewriter_rejected_requests_total", f'{{code="{code}"}}')
        assert now == rejected_before[code] + sent[code], code


@pytest.mark.parametrize(("payload", "code"), [(b"\x00binary", 1003), ("x" * (MAX_MESSAGE_BYTES + 1), 1009)],
                         ids=["binary", "too_big"])
def test_a_protocol_violation_closes_the_socket_with_its_code(server, payload, code):
    async def offend():
        async with connect(ws_url(server), max_size=None) as ws:
            await ws.send(payload)
            with pytest.raises(ConnectionClosed) as closed:
                await recv(ws)
            return closed.value.rcvd.code

    assert asyncio.run(offend()) == code


def test_a_page_from_another_origin_is_refused_at_the_handshake(server):
    async def hijack():
        with pytest.raises(InvalidStatus) as refused:
            async with connect(ws_url(server), origin="http://evil.example"):
                pass
        return refused.value.response.status_code

    assert asyncio.run(hijack()) == 403


# ---- 6. greedy answers ----


def test_a_greedy_answer_is_the_same_alone_again_and_batched_with_other_chats(server):
    async def run():
        alone, again = await answers_on_one_socket(server, [("alone", SHORT), ("again", SHORT)], temperature=0)
        twins = await asyncio.gather(answer(server, "twin-a", SHORT, temperature=0),
                                     answer(server, "twin-b", SHORT, temperature=0))
        # A long neighbour makes the decode step attend over a longer cache bucket than the chat alone needs.
        mixed = await asyncio.gather(answer(server, "mixed", SHORT, temperature=0),
                                        answer(server, "neighbour", NEIGHBOUR, temperature=0))
        return alone, again, twins, mixed

    (alone, _, _), (again, _, _), twins, mixed = asyncio.run(run())
    assert (alone[0]["type"], alone[-1]["type"]) == ("start", "end") and text(alone).strip()
    # asked again by the same student: all but the last token reused (by another, only the system prompt)
    assert again[0]["cached_tokens"] == again[0]["prompt_tokens"] - 1
    assert text(again) == text(alone)
    assert [text(frames) for frames, _, _ in twins] == [text(alone)] * 2
    assert text(mixed[0][0]) == text(alone)
    for (_, a_started, a_ended), (_, b_started, b_ended) in (twins, mixed):
        assert a_started < b_ended and b_started < a_ended, "the pair did not share decode steps"


def test_the_next_turn_of_a_real_conversation_reuses_its_history_and_the_shared_system_prompt(server):
    async def run():
        async with connect(ws_url(server)) as ws:
            first_messages = [{"role": "user", "content": "What is a fraction?"}]
            await ws.send(json.dumps({"type": "chat", "id": "turn-1", "messages": first_messages,
                                      "params": {"temperature": 0}}))
            first = await until_terminal(ws)
            history = first_messages + [{"role": "assistant", "content": text(first)},
                                        {"role": "user", "content": "Can you give an example?"}]
            await ws.send(json.dumps({"type": "chat", "id": "turn-2", "messages": history,
                                      "params": {"temperature": 0}}))
            return first, await until_terminal(ws)

    first, second = asyncio.run(run())
    assert first[0]["cached_tokens"] > 0  # at least the tutor's system prompt, from an earlier chat
    # The answer's text re-encodes to the tokens that were generated, so the whole first turn is reused.
    assert second[0]["cached_tokens"] >= first[0]["prompt_tokens"] + first[-1]["usage"]["completion_tokens"] - 2
    assert second[-1]["type"] == "end" and text(second).strip()


# ---- start-up ----


def test_serve_with_a_bad_setting_exits_at_once_with_one_line_naming_it(tmp_path):
    log_path = tmp_path / "server.log"
    with pytest.raises(pytest.fail.Exception, match="exited with 2 before it was ready"):
        with real_server({"TYPEWRITER_MAX_QUEUE": "-1"}, log_path):
            pass
    assert log_path.read_text().strip() == "typewriter: error: TYPEWRITER_MAX_QUEUE: must be at least 0, got -1"


# ---- 7. the load test ----


def test_the_load_test_drives_the_real_endpoint_without_errors(server):
    result = subprocess.run(
        [sys.executable, "-m", "typewriter", "loadtest", "--url", ws_url(server), "--concurrency", "2",
         "--requests", "4", "--max-new-tokens", "32", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert (report["ok"], report["errors"]) == (4, {})
    assert sum(report["reasons"].values()) == 4
    assert report["completion_tokens"] > 0 and report["tokens_per_s"] > 0
    assert 0 < report["ttft_ms"]["p50"] <= report["ttft_ms"]["p95"]
