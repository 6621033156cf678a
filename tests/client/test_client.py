"""typewriter.client: unit tests against a fake protocol-v1 server in this process, then end-to-end tests against
`typewriter serve` with the tiny model, and the notebook examples/tutor.ipynb executed against that server.

The fake server answers a chat about "hi" with max_new_tokens n as the tokens "hi:", " 1", ..., " n-1" (reason
`length`), and can be told to turn chats away (`overloaded`), close new sockets with 1013, send queue positions,
stream slowly, or say nothing. A resumable chat gets a resume token and token ids (token i has id 1000 + i) and is
kept: the fake can drop the connection after some tokens or before a chat's first frame (no close frame, as a lost
network), refuse the sockets after a drop, resume the chat from any index, forget it (`not_found`, as another
replica would), and go on after a `continue`. End to end, a relay between the client and real servers cuts the
connection mid-answer, and may send the client to another replica after the cut.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import urllib.request

import pytest
from helpers import wait_until
from real_server import ROOT, real_server
from tiny_model import HOLD_TOKENS, LONG_CONTEXT, LONG_SETTINGS
from websockets.asyncio.server import ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Response

from typewriter.client import (
    AsyncClient,
    ChatError,
    ChatTimeout,
    Client,
    ClientError,
    Ended,
    HandshakeRefused,
    Queued,
    Result,
    Retry,
    ServerClosed,
    Started,
    TokenEvent,
    ws_url,
)

FAST_RETRY = Retry(attempts=4, backoff_s=0.01, max_backoff_s=0.02, jitter=False)

# ---- the fake server ----


def tokens_for(frame: dict) -> list[str]:
    content = frame["messages"][-1]["content"]
    return [f"{content}:"] + [f" {i}" for i in range(1, frame.get("params", {}).get("max_new_tokens", 5))]


def answer_for(content: str, max_new_tokens: int = 5) -> str:
    return "".join(tokens_for({"messages": [{"content": content}], "params": {"max_new_tokens": max_new_tokens}}))


class FakeServer:
    """Protocol v1 as a script, on 127.0.0.1 in a thread of its own (so the sync client can block on it)."""

    def __init__(self):
        self.chats: list[dict] = []  # every chat frame received, in order
        self.stops: list[str] = []
        self.authorizations: list[str | None] = []
        self.api_key: str | None = None
        self.close_1013 = 0  # the next this many sockets are closed at once with 1013
        self.overloaded = 0  # the next this many chats get `overloaded`
        self.queue_positions: list[int] = []
        self.token_delay_s = 0.0
        self.silent = False  # chats get no answer at all
        self.received: list[dict] = []  # every frame but pings, in order
        self.kept: dict[str, dict] = {}  # resume token -> the resumable chat's frame
        self.drop_after: int | None = None  # a chat's connection breaks after this many tokens (once)
        self.drop_on_chat = False  # the next chat's connection breaks before any frame of it is sent (once)
        self.refuse_after_drop = 0  # after the drop, this many new sockets are closed at once with 1013
        self.forget = False  # a resume finds nothing kept
        self.answering: set[asyncio.Task] = set()
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(self._serve(), self.loop).result(5)
        self.url = "http://127.0.0.1:%d" % self.server.sockets[0].getsockname()[1]

    async def _serve(self):
        return await serve(self._handle, "127.0.0.1", 0, process_request=self._check_key)

    def close(self) -> None:
        async def shut():
            for task in self.answering:
                task.cancel()
            self.server.close()
            await self.server.wait_closed()
        asyncio.run_coroutine_threadsafe(shut(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()

    def _check_key(self, ws: ServerConnection, request) -> Response | None:
        self.authorizations.append(request.headers.get("Authorization"))
        if self.api_key is None or request.headers.get("Authorization") == f"Bearer {self.api_key}":
            return None
        body = json.dumps({"error": {"code": "unauthorized", "message": "send the API key"}}).encode()
        return Response(401, "Unauthorized", Headers({"Content-Type": "application/json"}), body)

    async def _handle(self, ws: ServerConnection) -> None:
        if self.close_1013 > 0:
            self.close_1013 -= 1
            await ws.close(1013, "the model is loading")
            return
        running: dict = {}  # id -> the stop event of the chat being answered
        async for text in ws:
            frame = json.loads(text)
            if frame["type"] != "ping":
                self.received.append(frame)
            if frame["type"] == "resume":
                await self._resume(ws, frame, running)
            elif frame["type"] == "stop":
                self.stops.append(frame["id"])
                if frame["id"] in running:
                    running[frame["id"]].set()
                else:
                    await self._send(ws, error("not_found", "no such chat", frame["id"]))
            elif frame["type"] == "ping":
                await self._send(ws, {"type": "pong"})
            else:
                await self._chat(ws, frame, running)

    async def _chat(self, ws: ServerConnection, frame: dict, running: dict) -> None:
        self.chats.append(frame)
        chat_id, params = frame["id"], frame.get("params", {})
        if self.drop_on_chat:
            self.drop_on_chat = False
            ws.transport.abort()  # no close frame: the client sees 1006, as after a lost network
        elif running:
            await self._send(ws, error("busy", "a chat is running", chat_id))
        elif self.overloaded > 0:
            self.overloaded -= 1
            await self._send(ws, error("overloaded", "the wait queue is full", chat_id))
        elif params.get("temperature", 0) > 5:
            await self._send(ws, error("invalid_request", "params.temperature: must be at most 5", chat_id))
        elif frame["messages"][-1]["content"] == "too many frames":
            await ws.close(1008, "more than 20 frames a second; slow down and reconnect")
        elif not self.silent:
            running[chat_id] = asyncio.Event()
            task = asyncio.create_task(self._answer(ws, frame, running))
            self.answering.add(task)
            task.add_done_callback(self.answering.discard)

    async def _resume(self, ws: ServerConnection, frame: dict, running: dict) -> None:
        kept = self.kept.get(frame["token"])
        if self.forget or kept is None or kept["id"] != frame["id"]:
            await self._send(ws, error("not_found", "no such chat is kept here", frame["id"]))
            return
        await self._send(ws, {"type": "resumed", "id": frame["id"]})
        running[frame["id"]] = asyncio.Event()
        task = asyncio.create_task(self._answer(ws, kept, running, first=frame["from"]))
        self.answering.add(task)
        task.add_done_callback(self.answering.discard)

    async def _answer(self, ws: ServerConnection, frame: dict, running: dict, first: int | None = None) -> None:
        with contextlib.suppress(ConnectionClosed):  # the client left mid-answer
            await self._stream(ws, frame, running, first)

    async def _stream(self, ws: ServerConnection, frame: dict, running: dict, first: int | None = None) -> None:
        """The chat's frames; `first`: resumed, from this token index on (as if it had run on meanwhile)."""
        chat_id, stop = frame["id"], running[frame["id"]]
        token = f"tok-{chat_id}" if frame.get("resumable") else None
        if token is not None:
            self.kept[token] = frame
        continued = len(frame.get("continue", {}).get("ids", []))
        resume = {"resume_token": token} if token is not None and first is None else {}
        for position in self.queue_positions if first is None else ():
            await self._send(ws, {"type": "queued", "id": chat_id, "position": position} | resume)
        if first is None:
            await self._send(ws, {"type": "start", "id": chat_id, "prompt_tokens": 7, "cached_tokens": 3,
                                  "dropped_messages": 0} | resume)
        sent, reason = 0, "length"
        for index, text in enumerate(tokens_for(frame)):
            if index < max(first or 0, continued):
                continue
            if self.drop_after is not None and sent == self.drop_after:
                self.drop_after, self.close_1013 = None, self.refuse_after_drop
                ws.transport.abort()  # no close frame: the client sees 1006, as after a lost network
                return
            ids = {"ids": [1000 + index]} if token is not None else {}
            await self._send(ws, {"type": "token", "id": chat_id, "index": index, "text": text} | ids)
            sent += 1
            if stop.is_set():  # at most one more token after a stop, as the real server
                reason = "cancelled"
                break
            await asyncio.sleep(self.token_delay_s)
        running.pop(chat_id)
        await self._send(ws, {"type": "end", "id": chat_id, "reason": reason,
                              "usage": {"prompt_tokens": 7, "completion_tokens": sent},
                              "timings": {"queue_ms": 0.5, "ttft_ms": 2.0, "total_ms": 9.0, "tokens_per_s": 40.0}})

    @staticmethod
    async def _send(ws: ServerConnection, frame: dict) -> None:
        await ws.send(json.dumps(frame))


def error(code: str, message: str, chat_id: str | None) -> dict:
    return {"type": "error", "id": chat_id, "code": code, "message": message}


@pytest.fixture
def fake():
    server = FakeServer()
    yield server
    server.close()


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 20))


# ---- the async API ----


def test_deltas_concatenate_to_the_result_text(fake):
    async def scenario():
        async with AsyncClient(fake.url) as client:
            chat = client.chat("hi", max_new_tokens=4)
            deltas = [delta async for delta in chat]
            return deltas, await chat.result()

    deltas, result = run(scenario())
    assert deltas == ["hi:", " 1", " 2", " 3"]
    assert (result.text, result.reason) == ("hi: 1 2 3", "length")
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (7, 4)
    assert result.timings.ttft_ms == 2.0 and result.started.cached_tokens == 3


def test_events_mirror_the_frames(fake):
    fake.queue_positions = [2, 1]

    async def scenario():
        async with AsyncClient(fake.url) as client:
            return [event async for event in client.chat("hi", max_new_tokens=2).events()]

    events = run(scenario())
    assert events[:3] == [Queued("c1", 2), Queued("c1", 1), Started("c1", 7, 3, 0)]
    assert events[3:5] == [TokenEvent("c1", 0, "hi:"), TokenEvent("c1", 1, " 1")]
    assert isinstance(events[5], Ended) and events[5].reason == "length" and events[5].usage.completion_tokens == 2
    assert len(events) == 6


def test_the_chat_frame_carries_the_messages_and_only_the_params_given(fake):
    async def scenario():
        async with AsyncClient(fake.url) as client:
            await client.complete([{"role": "user", "content": "hi"}], system="Be terse.", temperature=0,
                                  stop="\n", seed=None, loop_guard=False)

    run(scenario())
    assert fake.chats == [{"type": "chat", "id": "c1", "params": {"temperature": 0, "stop": ["\n"], "loop_guard": False},
                           "messages": [{"role": "system", "content": "Be terse."},
                                        {"role": "user", "content": "hi"}], "resumable": True}]


def test_stop_mid_answer_ends_cancelled_and_keeps_the_partial_text(fake):
    fake.token_delay_s = 0.01

    async def scenario():
        async with AsyncClient(fake.url) as client:
            chat = client.chat("count", max_new_tokens=500)
            deltas = []
            async for delta in chat:
                deltas.append(delta)
                if len(deltas) == 3:
                    await chat.stop()
            return deltas, await chat.result(), await client.complete("next", max_new_tokens=2)

    deltas, result, after = run(scenario())
    assert result.reason == "cancelled" and result.cancelled
    assert result.text == "".join(deltas) and 3 <= len(deltas) < 500
    assert answer_for("count", 500).startswith(result.text)
    assert fake.stops == ["c1"]
    assert after.text == "next: 1"  # the connection goes on


def test_an_error_frame_raises_chat_error_with_its_code_and_the_connection_goes_on(fake):
    async def scenario():
        async with AsyncClient(fake.url) as client:
            chat = client.chat("hi", temperature=9)
            with pytest.raises(ChatError) as refused:
                await chat.result()
            with pytest.raises(ChatError):  # the chat stays failed
                await chat.result()
            return refused.value, await client.complete("hi", max_new_tokens=2)

    refused, after = run(scenario())
    assert (refused.code, refused.chat_id) == ("invalid_request", "c1")
    assert "temperature" in refused.message
    assert after.text == "hi: 1"


def test_close_1013_raises_server_closed_with_the_code_and_reason(fake):
    fake.close_1013 = 1

    async def scenario():
        async with AsyncClient(fake.url) as client:
            await client.complete("hi")

    with pytest.raises(ServerClosed) as closed:
        run(scenario())
    assert (closed.value.close_code, closed.value.reason) == (1013, "the model is loading")
    assert len(fake.chats) == 0


def test_a_close_mid_chat_raises_server_closed(fake):
    async def scenario():
        async with AsyncClient(fake.url) as client:
            await client.complete("too many frames")

    with pytest.raises(ServerClosed) as closed:
        run(scenario())
    assert closed.value.close_code == 1008 and "slow down" in closed.value.reason


def test_retry_on_overloaded_sends_the_chat_again_until_it_is_taken(fake):
    fake.overloaded = 2

    async def scenario():
        async with AsyncClient(fake.url, retry=FAST_RETRY) as client:
            return await client.complete("hi", max_new_tokens=2)

    assert run(scenario()).text == "hi: 1"
    assert [c["id"] for c in fake.chats] == ["c1", "c1", "c1"]


def test_retry_on_1013_opens_a_new_connection(fake):
    fake.close_1013 = 2

    async def scenario():
        async with AsyncClient(fake.url, retry=FAST_RETRY) as client:
            return await client.complete("hi", max_new_tokens=2)

    assert run(scenario()).text == "hi: 1"
    assert len(fake.authorizations) == 3 and len(fake.chats) == 1


def test_retry_gives_up_after_its_attempts(fake):
    fake.overloaded = 10

    async def scenario():
        async with AsyncClient(fake.url, retry=FAST_RETRY) as client:
            await client.complete("hi")

    with pytest.raises(ChatError) as refused:
        run(scenario())
    assert refused.value.code == "overloaded" and len(fake.chats) == FAST_RETRY.attempts


def test_without_retry_overloaded_is_raised_at_once(fake):
    fake.overloaded = 1

    async def scenario():
        async with AsyncClient(fake.url) as client:
            await client.complete("hi")

    with pytest.raises(ChatError, match="overloaded"):
        run(scenario())
    assert len(fake.chats) == 1


def test_retry_delays_double_up_to_their_maximum_and_attempts_are_bounded():
    policy = Retry(attempts=6, backoff_s=0.5, max_backoff_s=3.0, jitter=False)
    assert [policy.delay(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert 0.25 <= Retry(backoff_s=0.5).delay(1) <= 0.5
    assert Retry.of(True) == Retry() and Retry.of(3).attempts == 3 and Retry.of(None) is None
    with pytest.raises(ValueError, match="attempts"):
        Retry(attempts=1000)
    with pytest.raises(ValueError, match="max_backoff_s"):
        Retry(backoff_s=1.0, max_backoff_s=3600.0)


def test_a_chat_left_unread_is_stopped_when_the_next_one_starts(fake):
    fake.token_delay_s = 0.01

    async def scenario():
        async with AsyncClient(fake.url) as client:
            first = client.chat("long", max_new_tokens=500)
            async for _ in first:
                break
            second = await client.complete("hi", max_new_tokens=2)
            return first, second

    first, second = run(scenario())
    assert second.text == "hi: 1"
    assert first.done and fake.stops == ["c1"]


def test_a_silent_server_raises_chat_timeout(fake):
    fake.silent = True

    async def scenario():
        async with AsyncClient(fake.url, timeout=0.2) as client:
            await client.complete("hi")

    with pytest.raises(ChatTimeout):
        run(scenario())


def test_closing_the_client_ends_its_running_chat_with_an_error(fake):
    fake.token_delay_s = 0.01

    async def scenario():
        client = AsyncClient(fake.url)
        chat = client.chat("long", max_new_tokens=500)
        await anext(chat)
        await client.close()
        with pytest.raises(ClientError, match="closed"):
            await chat.result()
        return chat.text

    assert run(scenario()) == "long:"
    # a resumable chat would otherwise run on for the server's grace; the fake reads the stop on its own thread,
    # after the client has closed, so it is awaited rather than expected at once
    wait_until(lambda: fake.stops == ["c1"], "the stop frame reaching the server")


def test_the_api_key_is_sent_and_a_refused_handshake_carries_the_status_and_code(fake):
    fake.api_key = "s3cret"

    async def scenario(key):
        async with AsyncClient(fake.url, api_key=key) as client:
            return await client.complete("hi", max_new_tokens=2)

    assert run(scenario("s3cret")).text == "hi: 1"
    with pytest.raises(HandshakeRefused) as refused:
        run(scenario("wrong"))
    assert (refused.value.status, refused.value.code) == (401, "unauthorized")
    assert fake.authorizations == ["Bearer s3cret", "Bearer wrong"]


def test_async_conversation_keeps_the_history_and_sends_it_each_turn(fake):
    async def scenario():
        async with AsyncClient(fake.url) as client:
            talk = client.conversation(system="Be kind.", max_new_tokens=3)
            first = [delta async for delta in talk.say("a")]
            await talk.say("b", max_new_tokens=2).result()
            return first, talk.messages

    first, messages = run(scenario())
    assert "".join(first) == "a: 1 2"
    assert messages == [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "a"},
                        {"role": "assistant", "content": "a: 1 2"}, {"role": "user", "content": "b"},
                        {"role": "assistant", "content": "b: 1"}]
    assert fake.chats[1]["messages"] == messages[:4] and fake.chats[1]["params"] == {"max_new_tokens": 2}


# ---- the sync API ----


def test_sync_client_streams_deltas_and_stops(fake):
    fake.token_delay_s = 0.01
    with Client(fake.url) as client:
        assert list(client.chat("hi", max_new_tokens=3)) == ["hi:", " 1", " 2"]
        chat = client.chat("count", max_new_tokens=500)
        for _delta in chat:
            if len(chat.text) >= 5:
                chat.stop()
        result = chat.result()
        assert result.reason == "cancelled" and answer_for("count", 500).startswith(result.text)
        assert [type(e).__name__ for e in client.chat("hi", max_new_tokens=1).events()] == ["Started", "TokenEvent",
                                                                                           "Ended"]


def test_sync_stop_from_another_thread(fake):
    fake.token_delay_s = 0.01
    with Client(fake.url) as client:
        chat = client.chat("count", max_new_tokens=500)
        next(iter(chat))
        threading.Timer(0.05, chat.stop).start()
        result = chat.result()
    assert result.reason == "cancelled" and 1 < result.usage.completion_tokens < 500


def test_sync_errors_and_retry(fake):
    fake.overloaded, fake.close_1013 = 1, 1
    with Client(fake.url, retry=FAST_RETRY) as client:
        assert client.complete("hi", max_new_tokens=2).text == "hi: 1"
        with pytest.raises(ChatError) as refused:
            client.complete("hi", temperature=9)
    assert refused.value.code == "invalid_request"


def test_sync_conversation_keeps_a_stopped_partial_answer_and_not_a_failed_turn(fake):
    fake.token_delay_s = 0.01
    with Client(fake.url) as client:
        talk = client.conversation()
        chat = talk.say("long", max_new_tokens=500)
        for _ in chat:
            chat.stop()
        partial = chat.result().text
        with pytest.raises(ChatError):
            talk.say("bad", temperature=9).result()
        talk.say("c", max_new_tokens=1).result()
    assert talk.messages == [{"role": "user", "content": "long"}, {"role": "assistant", "content": partial},
                             {"role": "user", "content": "c"}, {"role": "assistant", "content": "c:"}]
    assert partial and answer_for("long", 500).startswith(partial)


# ---- resuming after a dropped connection ----


def drop_and_read(fake: FakeServer, kind: str, content: str = "hi", max_new_tokens: int = 6, **client_options):
    """A chat through a connection that the fake drops mid-answer: (its events, its result), with the sync or the
    async client."""
    options = {"retry": FAST_RETRY} | client_options
    if kind == "sync":
        with Client(fake.url, **options) as client:
            chat = client.chat(content, max_new_tokens=max_new_tokens)
            return list(chat.events()), chat.result()

    async def scenario():
        async with AsyncClient(fake.url, **options) as client:
            chat = client.chat(content, max_new_tokens=max_new_tokens)
            return [event async for event in chat.events()], await chat.result()

    return run(scenario())


def texts(events) -> list[str]:
    return [e.text for e in events if isinstance(e, TokenEvent)]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_chat_dropped_mid_answer_resumes_from_the_first_token_it_lacks_and_yields_each_once(fake, kind):
    fake.drop_after = 2
    events, result = drop_and_read(fake, kind)
    assert texts(events) == ["hi:", " 1", " 2", " 3", " 4", " 5"]
    assert [type(e).__name__ for e in events].count("Started") == 1
    assert result.text == answer_for("hi", 6) and result.reason == "length"
    assert fake.received[1] == {"type": "resume", "id": "c1", "token": "tok-c1", "from": 2}
    assert [f["type"] for f in fake.received] == ["chat", "resume"]  # taken over, never asked again


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_chat_no_server_keeps_is_sent_again_continued_after_the_text_and_ids_it_holds(fake, kind):
    fake.drop_after, fake.forget = 2, True
    events, result = drop_and_read(fake, kind)
    assert texts(events) == ["hi:", " 1", " 2", " 3", " 4", " 5"]
    assert [type(e).__name__ for e in events].count("Started") == 1  # the continuation's own start is not shown
    assert result.text == answer_for("hi", 6)
    assert [f["type"] for f in fake.received] == ["chat", "resume", "chat"]
    assert fake.received[2] == fake.received[0] | {"continue": {"text": "hi: 1", "ids": [1000, 1001]}}


def test_reconnecting_after_a_drop_rides_out_a_refused_socket_and_gives_up_after_its_attempts(fake):
    fake.drop_after, fake.refuse_after_drop = 2, 2  # the server is full for the first two reconnects
    assert texts(drop_and_read(fake, "async")[0]) == ["hi:", " 1", " 2", " 3", " 4", " 5"]

    fake.drop_after, fake.refuse_after_drop = 2, 100
    with pytest.raises(ServerClosed) as closed:
        drop_and_read(fake, "async")
    assert closed.value.close_code == 1013 and fake.close_1013 == 100 - FAST_RETRY.attempts


def test_a_stop_that_met_the_drop_goes_out_after_the_resume(fake):
    fake.drop_after = 2

    async def scenario():
        async with AsyncClient(fake.url, retry=FAST_RETRY) as client:
            chat = client.chat("count", max_new_tokens=500)
            async for delta in chat:
                if delta == " 1":
                    await chat.stop()  # the connection is already gone, or goes before the stop arrives
            return await chat.result()

    result = run(scenario())
    assert result.reason == "cancelled" and answer_for("count", 500).startswith(result.text)
    assert [f["type"] for f in fake.received][-2:] == ["resume", "stop"]


def test_a_stopped_chat_that_no_server_keeps_ends_cancelled_with_the_text_it_has(fake):
    fake.drop_after, fake.forget = 2, True

    async def scenario():
        async with AsyncClient(fake.url, retry=FAST_RETRY) as client:
            chat = client.chat("count", max_new_tokens=500)
            async for delta in chat:
                if delta == " 1":
                    await chat.stop()
            return await chat.result(), await client.complete("next", max_new_tokens=2)

    result, after = run(scenario())
    assert (result.text, result.reason) == ("count: 1", "cancelled")
    assert "chat" not in [f["type"] for f in fake.received][1:-1]  # never asked again
    assert after.text == "next: 1"  # the stop's own not_found does not reach the next chat


def test_a_drop_before_any_frame_of_the_chat_is_raised_not_sent_again(fake):
    fake.drop_on_chat = True  # the server may have taken it: sending it again might run it twice
    with pytest.raises(ServerClosed) as closed:
        drop_and_read(fake, "async")
    assert closed.value.close_code == 1006 and len(fake.chats) == 1


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_chat_sent_without_resumable_raises_the_drop(fake, kind):
    fake.drop_after = 2
    with pytest.raises(ServerClosed) as closed:
        drop_and_read(fake, kind, resumable=False)
    assert closed.value.close_code == 1006
    assert [f["type"] for f in fake.received] == ["chat"] and "resumable" not in fake.received[0]


def test_urls_and_params_are_checked_before_anything_is_sent():
    assert ws_url("http://127.0.0.1:8000") == "ws://127.0.0.1:8000/ws"
    assert ws_url("https://tutor.school.org/") == "wss://tutor.school.org/ws"
    assert ws_url("https://tutor.school.org/typewriter") == "wss://tutor.school.org/typewriter/ws"
    assert ws_url("ws://localhost:9/ws") == "ws://localhost:9/ws"
    with pytest.raises(ValueError, match="http://HOST:PORT"):
        ws_url("127.0.0.1:8000")
    with pytest.raises(TypeError, match="max_tokens"):
        Client().chat("hi", max_tokens=3)


def test_importing_the_client_loads_neither_tensorflow_nor_the_server():
    code = "import sys, typewriter.client; print(' '.join(sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            timeout=60).stdout.split()
    assert "tensorflow" not in loaded
    assert [m for m in loaded if m.split(".")[0] in ("tensorflow", "numpy", "starlette", "uvicorn")] == []
    assert [m for m in loaded if m.startswith("typewriter.") and not m.startswith("typewriter.client")] == []


# ---- end to end: `typewriter serve` with the tiny model ----

API_KEY = "notebook-key"
SERVER_SETTINGS = {
    # the tiny model with a long context (`long_tiny_gguf`): an answer a test stops, cuts or holds a slot with is
    # thousands of tokens, with the loop guard off (HOLD), so it is still running when the test acts however fast the
    # machine; 160 tokens took the tiny model tens of milliseconds, and CI's machine ended them first
    **LONG_SETTINGS,
    "TYPEWRITER_MAX_NEW_TOKENS": "48",
    "TYPEWRITER_SYSTEM_PROMPT": "Be brief.",  # the tutor's default is long in byte tokens
    "TYPEWRITER_CLIENT_SYSTEM_PROMPT": "append",
    "TYPEWRITER_MAX_ACTIVE": "1",
    "TYPEWRITER_MAX_QUEUE": "0",  # a second chat while one runs is `overloaded`
    # one token a step: the client is under test here, not the engine's guesses
    "TYPEWRITER_DRAFT_TOKENS": "0",
    "TYPEWRITER_CHATS_PER_MINUTE": "100000",
    "TYPEWRITER_API_KEY": API_KEY,
}
LONG = "Why is the sky blue? Explain it to a twelve-year-old."  # 90 tokens; the tiny model answers at length
GREEDY = {"temperature": 0.0}
HOLD = {"max_new_tokens": HOLD_TOKENS, "loop_guard": False, **GREEDY}
# an answer cut mid-way and resumed: its tokens wait in the server's resume buffer (256 KiB) meanwhile
RESUMED = {"max_new_tokens": 1500, "loop_guard": False, **GREEDY}
NOTEBOOK = ROOT / "examples" / "tutor.ipynb"


def end_to_end(test):
    """Marks a test that starts (or shares) a real server."""
    return pytest.mark.e2e(pytest.mark.slow(test))


@pytest.fixture(scope="module")
def server(tmp_path_factory, long_tiny_gguf) -> str:
    env = SERVER_SETTINGS | {"TYPEWRITER_MODEL_PATH": str(long_tiny_gguf)}
    with real_server(env, tmp_path_factory.mktemp("client") / "server.log") as base:
        yield base


@pytest.fixture(scope="module")
def other_server(tmp_path_factory, long_tiny_gguf) -> str:
    """A second replica of `server`: the same model and settings, none of its kept chats."""
    env = SERVER_SETTINGS | {"TYPEWRITER_MODEL_PATH": str(long_tiny_gguf)}
    with real_server(env, tmp_path_factory.mktemp("client") / "other.log") as base:
        yield base


def metric(base: str, name: str) -> float:
    """The sum of a metric's samples whose line starts with `name` (a name, or a name and its labels)."""
    request = urllib.request.Request(f"{base}/metrics", headers={"Authorization": f"Bearer {API_KEY}"})
    with urllib.request.urlopen(request, timeout=5) as response:
        return sum(float(line.split()[-1]) for line in response.read().decode().splitlines()
                   if line.startswith(name))


def overloaded_count(base: str) -> float:
    return metric(base, 'typewriter_rejected_requests_total{code="overloaded"}')


def chats_ended(base: str) -> float:
    return metric(base, "typewriter_requests_total")


def resumes(base: str, outcome: str) -> float:
    return metric(base, f'typewriter_resumes_total{{outcome="{outcome}"}}')


class Relay:
    """A TCP relay on 127.0.0.1 in front of a server, in a thread of its own: `cut()` breaks every connection
    through it at once as a lost network does (a reset each way, no close frame), and a connection made after
    `upstream` changes goes to the new server, as a balancer sends a client to another replica."""

    def __init__(self, upstream: str):
        self.upstream, self.connections = upstream, 0
        self.live: list[asyncio.StreamWriter] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = self._call(asyncio.start_server(self._relay, "127.0.0.1", 0))
        self.url = "http://127.0.0.1:%d" % self.server.sockets[0].getsockname()[1]

    def _call(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(10)

    def __enter__(self) -> Relay:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.cut()
        self.server.close()
        self._call(self.server.wait_closed())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        host, port = self.upstream.removeprefix("http://").rsplit(":", 1)
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        self.connections += 1
        self.live += [writer, up_writer]
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    def cut(self) -> None:
        async def reset_all() -> None:
            live, self.live = self.live, []
            for writer in live:
                with contextlib.suppress(OSError):  # linger 0: closing sends a reset, not a close
                    writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                                               struct.pack("ii", 1, 0))
                writer.transport.abort()

        self._call(reset_all())


def through_a_drop(relay: Relay, kind: str, cut_after: int, elsewhere: str | None = None,
                   **params) -> tuple[list[TokenEvent], Result]:
    """A greedy chat about LONG through `relay`, cut once `cut_after` tokens have come (and sent on to `elsewhere`
    from then on, if given): (its token events, its result), with the sync or the async client."""
    options = {"api_key": API_KEY, "timeout": 60, "retry": FAST_RETRY}
    params = {**RESUMED, **params}

    def seen(event, tokens: list[TokenEvent]) -> None:
        if isinstance(event, TokenEvent):
            tokens.append(event)
            if len(tokens) == cut_after:
                relay.upstream = elsewhere or relay.upstream
                relay.cut()

    if kind == "sync":
        tokens: list[TokenEvent] = []
        with Client(relay.url, **options) as client:
            chat = client.chat(LONG, **params)
            for event in chat.events():
                seen(event, tokens)
            return tokens, chat.result()

    async def scenario():
        tokens: list[TokenEvent] = []
        async with AsyncClient(relay.url, **options) as client:
            chat = client.chat(LONG, **params)
            async for event in chat.events():
                seen(event, tokens)
            return tokens, await chat.result()

    return run(scenario())


@end_to_end
def test_e2e_deltas_events_and_results_agree(server):
    with Client(server, api_key=API_KEY, timeout=60) as client:
        chat = client.chat(LONG, max_new_tokens=32, **GREEDY)
        events = list(chat.events())
        again = client.complete(LONG, max_new_tokens=32, **GREEDY)
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    assert isinstance(events[0], Started) and isinstance(events[-1], Ended)
    assert chat.result().text == "".join(t.text for t in tokens) == again.text != ""
    assert again.reason in ("length", "eos") and again.usage.completion_tokens <= 32
    assert again.started.cached_tokens > 0  # the same prompt again


@end_to_end
def test_e2e_stop_mid_answer_keeps_a_prefix_of_the_whole_answer(server):
    async def scenario():
        async with AsyncClient(server, api_key=API_KEY, timeout=60) as client:
            whole = await client.complete(LONG, **HOLD)
            chat = client.chat(LONG, **HOLD)
            async for _ in chat:
                await chat.stop()
            return whole, await chat.result()

    whole, stopped = run(scenario())
    assert stopped.reason == "cancelled" and stopped.usage.completion_tokens < whole.usage.completion_tokens
    assert stopped.text and whole.text.startswith(stopped.text)


@end_to_end
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_e2e_a_chat_whose_connection_drops_mid_answer_resumes_and_ends_as_without_the_drop(server, kind):
    with Client(server, api_key=API_KEY, timeout=60) as client:
        whole = client.complete(LONG, **RESUMED)
    ended, resumed, missed = chats_ended(server), resumes(server, "resumed"), resumes(server, "not_found")
    with Relay(server) as relay:
        tokens, result = through_a_drop(relay, kind, cut_after=5)
        connections = relay.connections
    assert len(tokens) > 5 and connections == 2, "the connection was not cut mid-answer"
    assert "".join(t.text for t in tokens) == result.text == whole.text, "a character repeated or missing"
    indexes = [t.index for t in tokens]
    assert indexes == sorted(set(indexes))  # each token once, in order
    assert result.reason == whole.reason and result.usage.completion_tokens == whole.usage.completion_tokens
    assert (resumes(server, "resumed"), resumes(server, "not_found")) == (resumed + 1, missed)
    wait_until(lambda: chats_ended(server) > ended, "the server counted the chat's end", timeout=10)
    assert chats_ended(server) == ended + 1  # one chat, taken over, never asked again


@end_to_end
def test_e2e_a_chat_whose_connection_drops_to_another_replica_continues_there_as_without_the_drop(server,
                                                                                                other_server):
    with Client(server, api_key=API_KEY, timeout=60) as client:
        whole = client.complete(LONG, **RESUMED)
    ended, missed = chats_ended(other_server), resumes(other_server, "not_found")
    with Relay(server) as relay:  # the connection after the cut goes to a replica that never had the chat
        tokens, result = through_a_drop(relay, "async", cut_after=5, elsewhere=other_server)
    assert len(tokens) > 5
    assert "".join(t.text for t in tokens) == result.text == whole.text, "greedy, continued with the ids it had"
    assert resumes(other_server, "not_found") == missed + 1  # it asked there first, then sent it continued
    wait_until(lambda: chats_ended(other_server) > ended, "the replica counted the chat's end", timeout=10)
    assert chats_ended(other_server) == ended + 1


@end_to_end
def test_e2e_conversation_sends_its_history_and_reuses_the_cache(server):
    with Client(server, api_key=API_KEY, timeout=60) as client:
        talk = client.conversation(system="Answer in one line.", max_new_tokens=16, **GREEDY)
        first = talk.say("What is a prime number?").result()
        second = talk.say("Is 91 one?").result()
    assert [m["role"] for m in talk.messages] == ["system", "user", "assistant", "user", "assistant"]
    assert talk.messages[2]["content"] == first.text and talk.messages[4]["content"] == second.text
    assert second.started.prompt_tokens > first.started.prompt_tokens
    assert second.started.cached_tokens >= first.started.prompt_tokens - 1  # the first turn's prompt is cached


@end_to_end
def test_e2e_errors_carry_the_protocol_codes(server):
    with Client(server, api_key=API_KEY, timeout=60) as client:
        with pytest.raises(ChatError) as invalid:
            client.complete("hi", temperature=9)
        with pytest.raises(ChatError) as too_long:
            client.complete("x" * (LONG_CONTEXT + 100))
        assert client.complete("hi", max_new_tokens=2).reason in ("length", "eos")  # the connection goes on
    with pytest.raises(HandshakeRefused) as refused:
        Client(server, api_key="wrong").connect()
    assert (invalid.value.code, too_long.value.code) == ("invalid_request", "prompt_too_long")
    assert "temperature" in invalid.value.message
    assert (refused.value.status, refused.value.code) == (401, "unauthorized")


@end_to_end
def test_e2e_loop_guard_false_lets_a_repeating_answer_run_to_its_length(server):
    with Client(server, api_key=API_KEY, timeout=60) as client:
        guarded = client.complete(LONG, max_new_tokens=160, **GREEDY)
        free = client.complete(LONG, max_new_tokens=160, loop_guard=False, **GREEDY)
    assert guarded.reason == "repetition" and guarded.usage.completion_tokens < 160  # the greedy answer loops
    assert (free.reason, free.usage.completion_tokens) == ("length", 160)
    assert free.text.startswith(guarded.text)  # the same answer, only not cut


@end_to_end
def test_e2e_a_chat_turned_away_as_overloaded_is_retried_until_the_slot_is_free(server):
    refused_before = overloaded_count(server)

    async def scenario():
        async with (AsyncClient(server, api_key=API_KEY, timeout=60) as holder,
                    AsyncClient(server, api_key=API_KEY, timeout=60,
                                retry=Retry(attempts=20, backoff_s=0.05, max_backoff_s=0.2)) as patient):
            running = holder.chat(LONG, **HOLD)
            await anext(running)  # the only slot is taken
            waiting = asyncio.create_task(patient.complete("hi", max_new_tokens=4))
            while overloaded_count(server) == refused_before and not running.done:
                await asyncio.sleep(0.02)
            await running.stop()
            return await running.result(), await waiting

    held, retried = run(scenario())
    assert held.reason == "cancelled"  # had it ended by itself, nothing would have been refused
    assert overloaded_count(server) > refused_before
    assert retried.reason in ("length", "eos")


@end_to_end
def test_e2e_the_notebook_streams_the_answer_into_its_output(server, tmp_path, monkeypatch):
    """examples/tutor.ipynb in a kernel of this venv's Python: its display holds the greedy answer the client
    gets for the same question."""
    import nbformat
    from nbclient import NotebookClient

    kernels = tmp_path / "jupyter" / "kernels" / "typewriter-venv"
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python (typewriter venv)", "language": "python"}))
    for name, value in {"JUPYTER_PATH": tmp_path / "jupyter", "JUPYTER_RUNTIME_DIR": tmp_path / "runtime",
                        "JUPYTER_CONFIG_DIR": tmp_path / "config", "IPYTHONDIR": tmp_path / "ipython",
                        "JUPYTER_PLATFORM_DIRS": "1", "TYPEWRITER_URL": server, "TYPEWRITER_API_KEY": API_KEY}.items():
        monkeypatch.setenv(name, str(value))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    notebook.cells.append(nbformat.v4.new_code_cell("import json; print(json.dumps([QUESTION, PARAMS]))"))
    NotebookClient(notebook, timeout=120, kernel_name="typewriter-venv",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()

    question, params = json.loads(notebook.cells[-1].outputs[0]["text"])
    with Client(server, api_key=API_KEY, timeout=60) as client:
        expected = client.complete(question, **params)
    answer_cell, follow_up_cell = notebook.cells[1], notebook.cells[2]
    shown = [o for o in answer_cell.outputs if o["output_type"] == "display_data"]
    assert len(shown) == 1 and shown[0]["data"]["text/markdown"] == expected.text != ""
    assert answer_cell.outputs[-1]["text"].startswith(f"{expected.reason}: {expected.usage.completion_tokens} tokens")
    follow_ups = [o["data"]["text/markdown"] for o in follow_up_cell.outputs if o["output_type"] == "display_data"]
    assert follow_ups[0] == "**What is a prime number?**" and follow_ups[2] == "**Is 91 a prime number?**"
    assert follow_up_cell.outputs[-1]["text"] == "4 messages in the conversation\n"


@end_to_end
def test_e2e_the_example_script_streams_a_question_and_its_follow_up(server):
    env = os.environ | {"TYPEWRITER_URL": server, "TYPEWRITER_API_KEY": API_KEY}
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "client_example.py"), "What is a prime number?"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("> What is a prime number?\n")
    assert "> Can you give me an example?\n" in done.stdout and done.stdout.count(" tokens/s]") == 2
