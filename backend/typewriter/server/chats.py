"""A chat handed to the engine, the same for every door. The engine calls back on its own thread; a reader that
falls `send_backlog` events behind has its chat cancelled, so that memory stays bounded and the engine never waits.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..engine.request import Constraint, ConstraintKind, Event, Finished, GenerationRequest, Started, Token
from ..errors import TypewriterError
from ..text.conversation import append_system, fit_conversation, kept_messages
from . import calculator
from .calculator import ToolStep
from .chat_request import Chat, sampling_params
from .identity import Identity
from .lifecycle import ChatEncoder, Phase, ServerState
from .owners import shared_lengths
from .refusal import ERROR_CODES, Refusal
from .resume import continuation
from .tool_calls import ToolCallDelta, ToolCallDone, ToolCallSplitter
from .tool_loop import ToolLoop

log = logging.getLogger("typewriter.server")
request_log = logging.getLogger("typewriter.requests")

StreamItem = Event | ToolCallDelta | ToolStep


class StreamState(enum.Enum):
    WAITING = "waiting"  # submitted, no slot yet
    RUNNING = "running"
    ENDED = "ended"


class Cancel(enum.StrEnum):
    STOP = "stop"
    DISCONNECT = "disconnect"
    BACKLOG = "backlog"
    ABANDONED = "abandoned"  # a kept chat nobody resumed within resume_grace_s
    BUFFER = "buffer"  # a kept chat whose frames outgrew resume_buffer_bytes


class ChatStream:
    """One submitted chat, from submission until its door has handled its `Finished` (or given up)."""

    def __init__(self, server: ServerState, chat_id: str, engine_id: str, dropped_messages: int = 0,
                 choice_ids: list[str] | None = None, splitters: dict[str, ToolCallSplitter] | None = None,
                 client: Identity | None = None):
        """`choice_ids`: the engine ids of every answer, the first `engine_id`; `splitters`: per answer, with tools;
        `client`: whose running chats it counts in (Limits.start_chats, done by the caller) until it ends, and
        whose class its tokens are counted for."""
        self.server, self.client = server, client
        self.chat_id, self.engine_id = chat_id, engine_id
        self.choice_ids = choice_ids or [engine_id]
        self.splitters = splitters or {}
        self._last_token: dict[str, Token] = {}
        self.dropped_messages = dropped_messages  # the oldest messages left out so the conversation fits
        self.continued: str | None = None  # how the start of the answer it continues was taken
        self.state = StreamState.WAITING
        self.events: asyncio.Queue[StreamItem] = asyncio.Queue()
        self.submitted_at = time.monotonic()
        self.last_token_at: float | None = None
        self.cancelled: Cancel | None = None
        self.steps: ToolLoop | None = None  # set when the chat is offered the server's calculator
        self._tokens_after_stop = 0
        server.stream_opened()

    def move(self, state: StreamState) -> None:
        allowed = {StreamState.WAITING: (StreamState.RUNNING, StreamState.ENDED),
                   StreamState.RUNNING: (StreamState.ENDED,), StreamState.ENDED: ()}
        if state is not self.state and state not in allowed[self.state]:
            raise RuntimeError(f"chat {self.chat_id}: cannot go from {self.state.value} to {state.value}")
        self.state = state

    async def next_event(self) -> StreamItem:
        """The next event; the engine ends every request it accepted, also when it fails, so a `Finished` comes."""
        event = await self.events.get()
        if isinstance(event, Started):
            self.move(StreamState.RUNNING)
        return event

    def cancel(self, why: Cancel) -> None:
        """Ask the engine to end this chat within a step; the first reason given is the one logged."""
        if self.cancelled is None:
            self.cancelled = why
        if self.server.engine is not None:
            for engine_id in [self.steps.engine_id] if self.steps is not None else self.choice_ids:
                self.server.engine.cancel(engine_id)

    def shows(self, token: Token) -> bool:
        """Tokens still queued behind a stop were made before it but never shown, and at most one of them is."""
        if not token.text:
            return False
        if self.cancelled is Cancel.STOP:
            self._tokens_after_stop += 1
            return self._tokens_after_stop <= 1
        return True

    def end(self) -> None:
        """The door is done with this chat (its end was sent, or its client is gone). Idempotent."""
        if self.state is not StreamState.ENDED:
            self.move(StreamState.ENDED)
            self.server.stream_closed()
            if self.client is not None:
                self.server.limits.end_chats(self.client, len(self.choice_ids))

    def choice(self, request_id: str) -> int:
        return self.choice_ids.index(request_id)

    def tool_calls(self, request_id: str) -> list[ToolCallDone]:
        splitter = self.splitters.get(request_id)
        return splitter.calls if splitter is not None else []

    def _split(self, event: Event) -> Sequence[StreamItem]:
        splitter = self.splitters.get(event.request_id)
        if splitter is None:
            return [event]
        if isinstance(event, Token):
            self._last_token[event.request_id] = event
            return splitter.split(event)
        if isinstance(event, Finished):
            return [*splitter.flush(self._last_token.get(event.request_id)), event]
        return [event]

    def cut(self, engine_id: str) -> None:
        """End one part of the answer (tool_loop.py) where a call is complete; the answer goes on."""
        if self.server.engine is not None:
            self.server.engine.cancel(engine_id)

    def submit(self, request: GenerationRequest) -> None:
        """A next part of the answer (tool_loop.py), its events delivered as the first part's are."""
        assert self.server.engine is not None  # a chat is only opened while the engine runs
        self.server.engine.submit(request, self.on_event(asyncio.get_running_loop()))

    def on_event(self, loop: asyncio.AbstractEventLoop) -> Callable[[Event], None]:
        def on_event(event: Event) -> None:  # engine thread: hand over, never block
            try:
                loop.call_soon_threadsafe(self._deliver, event)
            except RuntimeError:  # the loop is closed: the process is exiting
                pass

        return on_event

    def _deliver(self, event: Event) -> None:
        metrics, now = self.server.metrics, time.monotonic()
        if isinstance(event, Started):
            metrics.started(event)
        elif isinstance(event, Token):
            metrics.generated_tokens.inc()
            if self.client is not None:
                metrics.class_tokens.labels(self.client.classroom.name).inc()
            if self.last_token_at is None:
                metrics.time_to_first_token.observe(now - self.submitted_at)
            else:
                metrics.inter_token_latency.observe(now - self.last_token_at)
            self.last_token_at = now
            if self.cancelled in (Cancel.BACKLOG, Cancel.DISCONNECT):
                return
        self.put(self.steps.take(event) if self.steps is not None else self._split(event))

    def put(self, items: Sequence[StreamItem]) -> None:
        """Hand items to the door: the engine's, or the calculator's steps and the answer's end between parts."""
        metrics = self.server.metrics
        for item in items:
            if isinstance(item, Finished):
                metrics.finished(item)
                _log_request(self, item)
            elif isinstance(item, ToolStep):
                metrics.tool_steps.labels(outcome=item.error or "ok").inc()
            self.events.put_nowait(item)
        if self.events.qsize() > self.server.settings.socket.send_backlog and self.cancelled is None:
            log.warning("chat %s: the client is not reading (%d events waiting); cancelling it",
                        self.engine_id, self.events.qsize())
            self.cancel(Cancel.BACKLOG)


async def open_chat(server: ServerState, chat: Chat, client: Identity, owner: str, client_system: str,
                    shows_steps: bool = False) -> ChatStream:
    """Submit `chat` for `client` (whom the limits count, and the fair share charges, with its class's prompt and
    answer limits) as a turn of `owner`'s conversation; raises Refusal. `client_system`: how this door takes a
    client's own system message (refuse, append or replace); `shows_steps`: the door can show the calculator's
    steps, so the chat may be offered it (calculator.py)."""
    if server.phase is Phase.STOPPING:
        raise Refusal("shutdown", "the server is shutting down; reconnect in a moment", chat.id)
    engine, tokenizer = server.engine, server.tokenizer
    if not server.ready or engine is None or tokenizer is None:
        raise Refusal("internal", "the server is not accepting chats (its engine stopped); see /readyz",
                              chat.id)
    server.chat_came()
    limited = server.limits.allow_chat(client, chat.n)  # each of n choices is a chat
    if limited is not None:
        wait_s, why = limited
        raise Refusal("rate_limited", f"{why}; try again in {math.ceil(wait_s)} s", chat.id, wait_s)
    s, classroom = server.settings, client.classroom
    cap = min(classroom.max_tokens, s.answers.length_cap)
    penalty = engine.repetition_penalty if s.answers.repetition_penalty is None else s.answers.repetition_penalty
    params = sampling_params(chat, min(s.answers.default_length, cap), cap, s.engine.request_timeout_s, penalty)
    if chat.answer_start is not None and chat.n > 1:
        raise Refusal("invalid_request", "continue: an answer is continued as one choice; n must be 1",
                              chat.id)
    tool_format = tokenizer.tool_format if chat.tools is not None else None
    tools = chat.tools.for_template() if chat.tools is not None else None
    steps_format = tokenizer.tool_format if shows_steps and calculator.offered(
        chat, tokenizer.tool_format, s.answers.calculator) else None
    if steps_format is not None:
        tools = calculator.tools()
    if chat.tools is not None and (chat.tools.must_call or not tokenizer.tool_format.in_template):
        # a model shown the generic format in its prompt only is held to it whenever it calls
        grammar = tokenizer.tool_format.grammar(chat.tools.offered(), chat.tools.strict, chat.tools.must_call)
        params = dataclasses.replace(params, constraint=Constraint(ConstraintKind.GRAMMAR, grammar, "tools"))
    prompt = await server.class_prompt(classroom)
    messages, system = _system_prompt(tokenizer, [m.as_dict() for m in chat.messages], chat.id, prompt.system,
                                      client_system)
    engine_ids = [server.next_request_id() for _ in range(chat.n)]
    try:
        if params.constraint is not None:  # compiled off the event loop, and a bad one refused before any work;
            # kept in the share of the client the limits count (a student, a key, else the address), so that one
            # client's compiles never evict another's
            await asyncio.to_thread(engine.grammars.compile, params.constraint, client.id)
        fitted = await asyncio.to_thread(
            fit_conversation, messages, lambda m: tokenizer.encode_chat(m, system, tools),
            engine.max_context, params.max_new_tokens, chat.params.get("max_new_tokens"), tokenizer.count)
        params = dataclasses.replace(params, max_new_tokens=fitted.max_new_tokens)
        splitters = {i: ToolCallSplitter(i, tool_format) for i in engine_ids} if tool_format is not None else None
        if refused := server.limits.start_chats(client, chat.n):
            raise Refusal("rate_limited", refused, chat.id)
        stream = ChatStream(server, chat.id, engine_ids[0], fitted.dropped_messages, engine_ids, splitters, client)
        server.metrics.class_chats.labels(classroom.name).inc(chat.n)
        try:
            shared = shared_lengths(prompt.prefixes, fitted.prompt_ids)
            if steps_format is not None:
                stream.steps = ToolLoop(
                    stream, steps_format, GenerationRequest(engine_ids[0], fitted.prompt_ids, params, owner=owner,
                                                            shared_prefix=shared, share=client.share),
                    kept_messages(messages, fitted.dropped_messages),
                    lambda m: tokenizer.encode_chat(m, system, tools), engine.max_context, server.next_request_id,
                    lambda ids: shared_lengths(prompt.prefixes, ids))
            if chat.answer_start is not None:
                stream.continued = await continuation.submit(
                    engine, tokenizer, GenerationRequest(engine_ids[0], fitted.prompt_ids, params, owner=owner,
                                                         shared_prefix=shared, share=client.share),
                    chat.answer_start, stream.on_event(asyncio.get_running_loop()))
            for n, engine_id in enumerate(engine_ids if chat.answer_start is None else ()):
                seed = None if params.seed is None else (params.seed + n) % 2**63
                engine.submit(GenerationRequest(engine_id, fitted.prompt_ids,
                                                dataclasses.replace(params, seed=seed),
                                                follows=engine_ids[0] if n else None, owner=owner,
                                                shared_prefix=shared, share=client.share),
                              stream.on_event(asyncio.get_running_loop()))
        except BaseException:
            stream.cancel(Cancel.DISCONNECT)
            stream.end()
            raise
    except Refusal:
        raise
    except TypewriterError as e:  # prompt_too_long, overloaded, invalid_request; EngineStopped is internal
        code = e.code if e.code in ERROR_CODES else "internal"
        message = str(e) or "the server is shutting down; reconnect later"
        raise Refusal(code, message, chat.id) from None
    except Exception:
        log.exception("chat %s could not be submitted", engine_ids[0])
        raise Refusal("internal", "the server could not start this chat; see the server log",
                              chat.id) from None
    return stream


def _system_prompt(tokenizer: ChatEncoder, messages: list[dict[str, Any]],
                   chat_id: str, system: str | None, client_system: str) -> tuple[list[dict[str, Any]], str | None]:
    """By `client_system`, a client's own system message is refused, appended to the class's `system`, or
    replaces it."""
    if not messages or messages[0]["role"] != "system" or client_system == "replace":
        return messages, system
    if client_system == "refuse":
        raise Refusal("system_prompt_not_allowed", "this server keeps its own system prompt; send the "
                              "conversation without a system message", chat_id)
    ours = tokenizer.default_system_prompt if system is None else system
    return messages[1:], append_system(ours, messages[0]["content"])


def _log_request(stream: ChatStream, event: Finished) -> None:
    t = event.timings
    record = {
        "event": "chat_end", "id": stream.engine_id, "chat_id": stream.chat_id, "reason": event.reason.value,
        "prompt_tokens": event.prompt_tokens, "completion_tokens": event.completion_tokens,
        "queue_ms": round(t.queue_ms, 1), "ttft_ms": round(t.ttft_ms, 1), "total_ms": round(t.total_ms, 1),
        "tokens_per_s": round(t.tokens_per_s, 2),
    }
    if stream.cancelled is not None:
        record["cancelled_by"] = stream.cancelled.value
    if stream.steps is not None and stream.steps.steps:
        record["tool_steps"] = stream.steps.steps
    if event.error:
        record["error"] = event.error
    request_log.info(json.dumps(record, ensure_ascii=False))
