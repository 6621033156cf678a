"""Resuming an answer over real sockets (uvicorn on loopback, the real engine on a scripted runner): a resumable
chat outlives its socket for the grace period and another socket picks it up with its secret token, from the
first token its client lacks; only that token opens it; its frames are bounded per chat and in total; a chat
nobody comes back for is cancelled and its slot freed; another server continues it from the text and ids the
client kept (continue anywhere)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import re
import socket

import httpx
from helpers import until_terminal_async, wait_until
from scripted import script_engine
from served import running
from websockets.asyncio.client import connect

PIECES = [f"w{i} " for i in range(60)]  # each piece its own token, so a cut's position is plain in the text
WHOLE = "".join(PIECES)
SLOW = 0.02  # seconds a decode step takes: a client reads a few tokens before the answer is over


def resumable(request_id: str = "r1", **extra) -> str:
    return json.dumps({"type": "chat", "id": request_id, "messages": [{"role": "user", "content": "go on"}],
                       "params": {"max_new_tokens": 64}, "resumable": True, **extra})


def resume(request_id: str, token: str, first: int) -> str:
    return json.dumps({"type": "resume", "id": request_id, "token": token, "from": first})


async def recv(ws) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), 10))


async def start_and_read(ws, tokens: int, frame: str | None = None) -> tuple[dict, list[dict]]:
    """Send a resumable chat; (its start frame, its first `tokens` token frames)."""
    await ws.send(frame or resumable())
    start = await recv(ws)
    assert start["type"] == "start", start
    got = [await recv(ws) for _ in range(tokens)]
    assert all(f["type"] == "token" for f in got), got
    return start, got


def text(frames: list[dict]) -> str:
    return "".join(f["text"] for f in frames if f["type"] == "token")


def metric(address: str, name: str) -> float:
    body = httpx.get(f"http://{address}/metrics").text
    found = re.search(rf"^{re.escape(name)} (\S+)$", body, re.M)
    return float(found.group(1)) if found else 0.0


def test_an_old_client_sees_no_change_and_a_resumable_one_gets_a_token_and_the_ids():
    async def talk(address):
        async with connect(f"ws://{address}/ws") as ws:
            await ws.send(json.dumps({"type": "chat", "id": "old", "messages": [{"role": "user", "content": "hi"}]}))
            old = await until_terminal_async(ws)
            await ws.send(resumable("new"))
            new = await until_terminal_async(ws)
        return old, new

    with running(script_engine(PIECES[:4], step_s=0)) as (_, address):
        old, new = asyncio.run(talk(address))
    assert set(old[0]) == {"type", "id", "prompt_tokens", "cached_tokens", "dropped_messages"}
    assert all(set(f) == {"type", "id", "index", "text"} for f in old if f["type"] == "token")
    assert re.fullmatch(r"[A-Za-z0-9_-]{43}", new[0]["resume_token"])  # 32 random bytes
    tokens = [f for f in new if f["type"] == "token"]
    assert [f["ids"] for f in tokens] == [[0], [1], [2], [3]] and text(new) == text(old) == "".join(PIECES[:4])


def test_a_dropped_socket_s_answer_is_resumed_on_a_new_one_with_nothing_repeated_or_missing():
    async def talk(address):
        async with connect(f"ws://{address}/ws") as first:
            start, before = await start_and_read(first, 5)
        # the socket is closed mid-answer; the chat runs on
        async with connect(f"ws://{address}/ws") as second:
            await second.send(resume("r1", start["resume_token"], 5))
            assert await recv(second) == {"type": "resumed", "id": "r1"}
            after = await until_terminal_async(second)
            await second.send(resumable("r2"))  # the socket is free for the next question
            nxt = await until_terminal_async(second)
        return before, after, nxt

    with running(script_engine(PIECES, step_s=SLOW)) as (_, address):
        before, after, nxt = asyncio.run(talk(address))
    assert [f["index"] for f in after if f["type"] == "token"] == list(range(5, 60))
    assert text(before) + text(after) == WHOLE
    assert after[-1]["type"] == "end" and after[-1]["reason"] == "eos"
    assert nxt[-1]["reason"] == "eos" and text(nxt) == WHOLE


def test_resuming_takes_the_chat_from_a_socket_the_server_still_thinks_is_open():
    """A phone that changed networks: its old socket is dead, but the server has not noticed yet."""
    async def talk(address):
        async with connect(f"ws://{address}/ws") as old, connect(f"ws://{address}/ws") as new:
            start, before = await start_and_read(old, 3)
            await new.send(resume("r1", start["resume_token"], 3))
            assert (await recv(new))["type"] == "resumed"
            after = await until_terminal_async(new)
            # the old socket got at most what was on its way, and is free for a new chat
            late = []
            await old.send(json.dumps({"type": "ping"}))
            while (frame := await recv(old))["type"] != "pong":
                late.append(frame)
            await old.send(resumable("r2"))
            assert (await until_terminal_async(old))[-1]["reason"] == "eos"
        return before, late, after

    with running(script_engine(PIECES, step_s=SLOW)) as (_, address):
        before, late, after = asyncio.run(talk(address))
    assert text(before) + text(after) == WHOLE
    assert all(f["type"] == "token" for f in late) and not any(f["type"] == "end" for f in late)


def test_only_the_secret_token_of_the_start_frame_resumes_a_chat(caplog):
    async def talk(address):
        async with connect(f"ws://{address}/ws") as owner, connect(f"ws://{address}/ws") as other:
            start, before = await start_and_read(owner, 2)
            token = start["resume_token"]
            refusals = []
            for attempt in (resume("r1", "x" * 43, 0),  # a forged token for the right chat id
                            resume("r1", token[:-1] + ("A" if token[-1] != "A" else "B"), 0),  # one character off
                            resume("other", token, 0)):  # the right token for another chat id
                await other.send(attempt)
                refusals.append(await recv(other))
            await other.send(json.dumps({"type": "resume", "id": "r1", "from": 0}))  # no token at all
            refusals.append(await recv(other))
            rest = await until_terminal_async(owner)  # the owner's answer went on, untouched
        return before, refusals, rest, token

    with caplog.at_level(logging.DEBUG), running(script_engine(PIECES, step_s=SLOW)) as (_, address):
        before, refusals, rest, token = asyncio.run(talk(address))
        resumes = httpx.get(f"http://{address}/metrics").text
    assert [(r["type"], r["code"]) for r in refusals] == [("error", "not_found")] * 3 + [("error", "invalid_request")]
    assert "token: must be the resume_token" in refusals[-1]["message"]
    assert text(before) + text(rest) == WHOLE
    server_log = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith(("typewriter", "uvicorn")))
    assert server_log and token not in server_log and token not in resumes
    assert 'typewriter_resumes_total{outcome="not_found"} 3.0' in resumes


def test_a_from_past_what_the_chat_has_sent_or_out_of_range_is_refused_by_name():
    async def talk(address):
        async with connect(f"ws://{address}/ws") as owner:
            start, _ = await start_and_read(owner, 2)
        async with connect(f"ws://{address}/ws") as ws:
            answers = []
            for first in (10**12, -1, "3", True, 500):
                await ws.send(resume("r1", start["resume_token"], first))
                answers.append(await recv(ws))
            await ws.send(resume("r1", start["resume_token"], 2))
            assert (await recv(ws))["type"] == "resumed"
            rest = await until_terminal_async(ws)
        return answers, rest

    with running(script_engine(PIECES, step_s=0.2)) as (_, address):
        answers, rest = asyncio.run(talk(address))
    assert [a["code"] for a in answers] == ["invalid_request"] * 5
    assert all("from: must be" in a["message"] for a in answers[:4])
    assert re.search(r"from: this chat has sent tokens up to index \d+, so from may be at most \d+; got 500",
                     answers[4]["message"])
    assert text(rest) == "".join(PIECES[2:])


BIG = ["x" * 100] * 300  # about 36 KB of frames


def big_chat(request_id: str) -> str:
    return resumable(request_id).replace('"max_new_tokens": 64', '"max_new_tokens": 300')


def test_a_reader_that_keeps_up_gets_an_answer_longer_than_the_buffer_and_only_recent_frames_stay_kept():
    async def talk(address):
        async with connect(f"ws://{address}/ws") as ws:
            await ws.send(big_chat("long"))
            frames = await until_terminal_async(ws)
        token = frames[0]["resume_token"]
        async with connect(f"ws://{address}/ws") as ws:
            await ws.send(resume("long", token, 0))
            early = await recv(ws)
            await ws.send(resume("long", token, 290))
            assert (await recv(ws))["type"] == "resumed"
            return frames, early, await until_terminal_async(ws)

    with running(script_engine(BIG, step_s=SLOW, max_context=512), resume_buffer_bytes=4096, max_context=512,
                 max_new_tokens_cap=300) as (_, address):
        frames, early, late = asyncio.run(talk(address))
        kept = metric(address, "typewriter_resume_buffer_bytes")
    assert frames[-1]["reason"] == "length" and text(frames) == "".join(BIG)
    assert early["code"] == "not_found" and "no longer all kept" in early["message"]
    assert text(late) == "".join(BIG[290:]) and late[-1]["reason"] == "length"
    assert 0 < kept <= 4096 + len(json.dumps(frames[-1]))


def frozen_reader(address: str, frame: str) -> tuple[socket.socket, dict]:
    """A peer with a tiny receive window that sends `frame`, reads the start frame and then nothing more: a frozen
    tab, whose kernel and transport buffers fill."""
    host, port = address.split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: it sets the window
    sock.settimeout(10)
    sock.connect((host, int(port)))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((f"GET /ws HTTP/1.1\r\nHost: {address}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
    reply = b""
    while b"\r\n\r\n" not in reply:
        reply += sock.recv(1)
    assert b" 101 " in reply.split(b"\r\n", 1)[0]
    payload, mask = frame.encode(), os.urandom(4)
    sock.sendall(bytes([0x81, 0x80 | 126]) + len(payload).to_bytes(2, "big") + mask
                 + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))
    head = sock.recv(2, socket.MSG_WAITALL)  # the start frame: a text frame of 126 to 65,535 bytes
    assert head[0] == 0x81 and head[1] == 126, head
    size = int.from_bytes(sock.recv(2, socket.MSG_WAITALL), "big")
    return sock, json.loads(sock.recv(size, socket.MSG_WAITALL))


def test_a_chat_whose_reader_stops_reading_ends_with_resume_buffer_full_once_its_unsent_frames_outgrow_the_buffer():
    """Frames are dropped only once a reader was sent them: behind a reader that stops reading, unsent frames
    pile up until they reach the bound, and the chat ends, its slot freed."""
    huge = ["x" * 40000] * 300  # 12 MB: far more than the socket's buffers hold
    engine = script_engine(huge, step_s=0.002, max_context=512)

    async def look(address, token):
        async with connect(f"ws://{address}/ws") as ws:
            await ws.send(resume("big", token, 10**6))
            made = int(re.search(r"from may be at most (\d+)", (await recv(ws))["message"]).group(1))
            await ws.send(resume("big", token, made))  # nothing after the last kept token but the end
            assert (await recv(ws))["type"] == "resumed"
            return made, await until_terminal_async(ws)

    with running(engine, resume_buffer_bytes=65536, max_context=512, max_new_tokens_cap=300) as (_, address):
        sock, start = frozen_reader(address, big_chat("big"))
        try:
            wait_until(lambda: engine.stats().active == 0, "the chat has ended", timeout=60)
            made, frames = asyncio.run(look(address, start["resume_token"]))
            kept = metric(address, "typewriter_resume_buffer_bytes")
            cancelled = metric(address, 'typewriter_requests_total{reason="cancelled"}')
        finally:
            sock.close()
    assert [f["type"] for f in frames] == ["end"] and frames[0]["reason"] == "resume_buffer_full"
    assert made < 300 and cancelled == 1.0
    assert 0 < kept <= 65536 + len(json.dumps(frames[0]))


def test_the_total_bound_forgets_finished_chats_first_then_frames_already_sent():
    engine = script_engine(["y" * 50] * 30, step_s=SLOW, max_context=512)  # about 3,300 bytes of frames

    async def talk(address):
        async with connect(f"ws://{address}/ws") as a, connect(f"ws://{address}/ws") as b, \
                connect(f"ws://{address}/ws") as c:
            await a.send(resumable("a"))
            done = await until_terminal_async(a)  # finished, kept for its grace period
            await b.send(resumable("b"))
            await c.send(resumable("c"))
            second, third = await asyncio.gather(until_terminal_async(b), until_terminal_async(c))
            await a.send(resume("a", done[0]["resume_token"], 0))
            forgotten = await recv(a)
        return done, second, third, forgotten

    with running(engine, resume_buffer_bytes=4096, resume_buffer_total_bytes=5000) as (_, address):
        done, second, third, forgotten = asyncio.run(talk(address))
        kept = metric(address, "typewriter_resume_buffer_bytes")
    assert done[-1]["reason"] == "eos"
    assert forgotten["code"] == "not_found"  # its frames made room for the running chats
    for frames in (second, third):  # their readers kept up, so what they were sent made room for the rest
        assert frames[-1]["reason"] == "eos" and text(frames) == "y" * 1500
    assert kept <= 5000 + 2 * 200
