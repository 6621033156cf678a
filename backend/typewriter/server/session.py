"""One WebSocket connection: a reader that always reads, and a pump per chat that sends its events.

The engine calls back on its own thread; each callback only hands the event to the event loop with
`call_soon_threadsafe`, where it lands on the chat's asyncio.Queue. The reader keeps reading while the pump sends,
so a `stop` is seen at once. A client that stops reading lets events pile up on that queue; past
`settings.send_backlog` its chat is cancelled and further tokens are dropped, so memory stays bounded and the
engine never waits for a socket.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
import logging
import math
import time
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from ..errors import TypewriterError
from ..conversation import fit_conversation
from ..request import Event, Finished, FinishReason, GenerationRequest, Queued, Started, Token
from . import protocol as p
from .lifecycle import Phase, ServerState
from .limits import FrameRate

log = logging.getLogger("typewriter.server")
request_log = logging.getLogger("typewriter.requests")

class StreamState(enum.Enum):
    WAITING = "waiting"  # submitted, no slot yet
    RUNNING = "running"
    ENDED = "ended"


class Cancel(str, enum.Enum):
    """Why the server asked the engine to cancel a chat."""

    STOP = "stop"
    DISCONNECT = "disconnect"
    BACKLOG = "backlog"


class Stream:
    """One chat on one connection, from submission until its terminal frame."""

    def __init__(self, client_id: str, engine_id: str):
        self.client_id, self.engine_id = client_id, engine_id
        self.state = StreamState.WAITING
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self.submitted_at = time.monotonic()
        self.last_token_at: float | None = None
        self.cancelled: Cancel | None = None
        self.tokens_after_stop = 0
        self.dropped_messages = 0  # the oldest messages left out so the conversation fits the context

    def move(self, state: StreamState) -> None:
        allowed = {StreamState.WAITING: (StreamState.RUNNING, StreamState.ENDED),
                   StreamState.RUNNING: (StreamState.ENDED,), StreamState.ENDED: ()}
        if state is not self.state and state not in allowed[self.state]:
            raise RuntimeError(f"chat {self.client_id}: cannot go from {self.state.value} to {state.value}")
        self.state = state


class Session:
    def __init__(self, websocket: WebSocket, state: ServerState, client: str = "unknown"):
        """`client`: the address the abuse limits count this connection's chats against."""
        self.ws, self.server, self.client = websocket, state, client
        self.settings = state.settings
        self.stream: Stream | None = None
        self._open = True
        self._send_lock = asyncio.Lock()
        self._pumps: set[asyncio.Task] = set()

    async def run(self) -> None:
        """Serve an accepted connection until the client leaves or breaks the protocol."""
        self.server.metrics.connections.inc()
        try:
            await self._read()
        finally:
            self._open = False
            if self.stream is not None:
                self._cancel(self.stream, Cancel.DISCONNECT)
            if self._pumps:
                await asyncio.gather(*self._pumps)
            self.server.metrics.connections.dec()

    # ---- reading ----

    async def _read(self) -> None:
        limit = self.settings.max_message_bytes
        rate = FrameRate(self.settings.frames_per_second)
        while True:
            message = await self.ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            if not rate.allow():
                self.server.metrics.rejected.labels(code="frame_rate").inc()
                await self._close(p.CLOSE_POLICY_VIOLATION, f"more than {rate.per_second} frames a second; "
                                                            "slow down and reconnect")
                return
            text = message.get("text")
            if text is None:
                await self._close(p.CLOSE_UNSUPPORTED_DATA, "binary frames are not part of protocol v1; send JSON text")
                return
            if len(text) > limit or len(text.encode()) > limit:
                await self._close(p.CLOSE_MESSAGE_TOO_BIG, f"a frame may be at most {limit} bytes")
                return
            try:
                await self._handle(p.parse_frame(text, self.settings.max_messages))
            except p.ProtocolError as e:
                self.server.metrics.rejected.labels(code=e.code).inc()
                await self._send(p.error(e.code, e.message, e.request_id))

    async def _handle(self, message: p.ClientMessage) -> None:
        if isinstance(message, p.Ping):
            await self._send(p.pong())
        elif isinstance(message, p.Stop):
            stream = self.stream
            if stream is None or stream.client_id != message.id:
                raise p.ProtocolError("not_found", f"no chat with id {message.id!r} is running on this connection",
                                      message.id)
            self._cancel(stream, Cancel.STOP)
        else:
            await self._start(message)

    async def _start(self, chat: p.Chat) -> None:
        if self.stream is not None:
            raise p.ProtocolError(
                "busy", f"chat {self.stream.client_id!r} is still running on this connection; stop it or wait for "
                        "its end", chat.id)
        server = self.server
        if server.phase is Phase.STOPPING:
            raise p.ProtocolError("shutdown", "the server is shutting down; reconnect in a moment", chat.id)
        if not server.ready:
            raise p.ProtocolError("internal", "the server is not accepting chats (its engine stopped); see /readyz",
                                  chat.id)
        wait_s = server.limits.allow_chat(self.client)
        if wait_s is not None:
            raise p.ProtocolError("rate_limited", f"at most {server.limits.chats_per_minute} chats a minute from "
                                                  f"one address; try again in {math.ceil(wait_s)} s", chat.id)
        s = self.settings
        params = p.sampling_params(chat, s.max_new_tokens, s.max_new_tokens_cap, s.request_timeout_s)
        messages, system = self._system_prompt([{"role": m.role, "content": m.content} for m in chat.messages],
                                               chat.id)
        stream = Stream(chat.id, server.next_request_id())
        self.stream = stream  # busy from here, also while the prompt is encoded
        try:
            fitted = await asyncio.to_thread(
                fit_conversation, messages, lambda m: server.tokenizer.encode_chat(m, system),
                server.engine.max_context, params.max_new_tokens, chat.params.get("max_new_tokens"))
            stream.dropped_messages = fitted.dropped_messages
            params = dataclasses.replace(params, max_new_tokens=fitted.max_new_tokens)
            server.engine.submit(GenerationRequest(stream.engine_id, fitted.prompt_ids, params),
                                 self._on_event(stream))
        except TypewriterError as e:  # prompt_too_long, overloaded, invalid_request; EngineStopped is internal
            self.stream = None
            code = e.code if e.code in p.ERROR_CODES else "internal"
            message = str(e) or "the server is shutting down; reconnect later"
            raise p.ProtocolError(code, message, chat.id) from None
        except Exception:
            self.stream = None
            log.exception("chat %s could not be submitted", stream.engine_id)
            raise p.ProtocolError("internal", "the server could not start this chat; see the server log",
                                  chat.id) from None
        server.stream_opened()
        pump = asyncio.create_task(self._send_events(stream), name=f"pump-{stream.engine_id}")
        self._pumps.add(pump)
        pump.add_done_callback(self._pumps.discard)

    def _system_prompt(self, messages: list[dict[str, str]], chat_id: str) -> tuple[list[dict[str, str]], str | None]:
        """The messages and the system prompt to encode them with, by `client_system_prompt`: a client's own
        system message is refused, appended after the server's, or left to replace it."""
        s = self.settings
        if not messages or messages[0]["role"] != "system" or s.client_system_prompt == "replace":
            return messages, s.system_prompt
        if s.client_system_prompt == "refuse":
            raise p.ProtocolError("system_prompt_not_allowed", "this server keeps its own system prompt; send the "
                                  "conversation without a system message", chat_id)
        ours = self.server.tokenizer.default_system_prompt if s.system_prompt is None else s.system_prompt
        theirs = messages[0]["content"]
        return messages[1:], f"{ours}\n\n{theirs}" if ours and theirs else ours or theirs

    def _cancel(self, stream: Stream, why: Cancel) -> None:
        if stream.cancelled is None:
            stream.cancelled = why
        if self.server.engine is not None:
            self.server.engine.cancel(stream.engine_id)

    # ---- engine thread -> event loop ----

    def _on_event(self, stream: Stream):
        loop = asyncio.get_running_loop()

        def on_event(event: Event) -> None:  # engine thread: hand over, never block
            try:
                loop.call_soon_threadsafe(self._deliver, stream, event)
            except RuntimeError:  # the loop is closed: the process is exiting
                pass

        return on_event

    def _deliver(self, stream: Stream, event: Event) -> None:
        metrics, now = self.server.metrics, time.monotonic()
        if isinstance(event, Started):
            metrics.started(event)
        elif isinstance(event, Token):
            metrics.generated_tokens.inc()
            if stream.last_token_at is None:
                metrics.time_to_first_token.observe(now - stream.submitted_at)
            else:
                metrics.inter_token_latency.observe(now - stream.last_token_at)
            stream.last_token_at = now
            if stream.cancelled in (Cancel.BACKLOG, Cancel.DISCONNECT):
                return  # nobody will read it
        elif isinstance(event, Finished):
            metrics.finished(event)
            _log_request(stream, event)
        stream.events.put_nowait(event)
        if stream.events.qsize() > self.settings.send_backlog and stream.cancelled is None:
            log.warning("chat %s: the client is not reading (%d events waiting); cancelling it",
                        stream.engine_id, stream.events.qsize())
            self._cancel(stream, Cancel.BACKLOG)

    # ---- the pump: one chat's events -> frames ----

    async def _send_events(self, stream: Stream) -> None:
        try:
            while True:  # the engine ends every request it accepted, also when it fails, so this always returns
                event = await stream.events.get()
                frame = self._frame(stream, event)
                if isinstance(event, Finished):
                    self._ended(stream)  # before the send: a client that reads `end` may start its next chat
                if frame is not None:
                    await self._send(frame)
                if isinstance(event, Finished):
                    return
        finally:
            if stream.state is not StreamState.ENDED:  # the task was cancelled
                self._ended(stream)

    def _frame(self, stream: Stream, event: Event) -> dict[str, Any] | None:
        if isinstance(event, Queued):
            return p.queued(stream.client_id, event.position)
        if isinstance(event, Started):
            stream.move(StreamState.RUNNING)
            return p.start(stream.client_id, event.prompt_tokens, event.cached_tokens, stream.dropped_messages)
        if isinstance(event, Token):
            if not event.text:
                return None
            if stream.cancelled is Cancel.STOP:
                # Tokens still queued behind a stop were produced before it but never shown: send at most one.
                stream.tokens_after_stop += 1
                if stream.tokens_after_stop > 1:
                    return None
            return p.token(stream.client_id, event.index, event.text)
        if event.reason is FinishReason.ERROR:
            return p.error("internal", f"generation failed: {event.error}", stream.client_id)
        return p.end(stream.client_id, event)

    def _ended(self, stream: Stream) -> None:
        stream.move(StreamState.ENDED)
        if self.stream is stream:
            self.stream = None
        self.server.stream_closed()

    # ---- writing ----

    async def _send(self, frame: dict[str, Any]) -> None:
        if not self._open:
            return
        async with self._send_lock:
            try:
                await self.ws.send_text(p.encode(frame))
            except (WebSocketDisconnect, RuntimeError, OSError):
                self._open = False
                if self.stream is not None:
                    self._cancel(self.stream, Cancel.DISCONNECT)

    async def _close(self, code: int, reason: str) -> None:
        self._open = False
        async with self._send_lock:
            try:
                await self.ws.close(code, reason)
            except (RuntimeError, OSError):
                pass


def _log_request(stream: Stream, event: Finished) -> None:
    t = event.timings
    record = {
        "event": "chat_end", "id": stream.engine_id, "client_id": stream.client_id, "reason": event.reason.value,
        "prompt_tokens": event.prompt_tokens, "completion_tokens": event.completion_tokens,
        "queue_ms": round(t.queue_ms, 1), "ttft_ms": round(t.ttft_ms, 1), "total_ms": round(t.total_ms, 1),
        "tokens_per_s": round(t.tokens_per_s, 2),
    }
    if stream.cancelled is not None:
        record["cancelled_by"] = stream.cancelled.value
    if event.error:
        record["error"] = event.error
    request_log.info(json.dumps(record, ensure_ascii=False))
