"""The response to one accepted `POST /v1/chat/completions`: its choices streamed as `chat.completion.chunk`
events, or gathered into one `chat.completion`. Log probabilities of tokens whose text is held back go out with the
next chunk that carries text, or with the choice's last. A step of the server's calculator is a paragraph of the
content, where it came in the answer: an OpenAI client has no other place to show it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.responses import JSONResponse
from starlette.types import Message, Scope, Send

from ...engine.request import Finished, Queued, Started, Token
from ..calculator import ToolStep
from ..chats import Cancel, ChatStream
from ..lifecycle import ChatEncoder
from ..tool_calls import ToolCallDelta
from .common import FAILURES, FINISH_REASONS, KEEPALIVE, STREAM_HEADERS, OwnedAnswer, failure, next_event, sse
from .completions_request import CompletionRequest

ChoiceEvent = Started | Token | ToolCallDelta | ToolStep | Finished


@dataclass
class Choice:
    index: int
    texts: list[str] = field(default_factory=list)
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)  # call index -> OpenAI's tool call object
    logprobs: list[dict[str, Any]] = field(default_factory=list)  # not yet sent, when streaming
    finished: Finished | None = None

    @property
    def end(self) -> Finished:
        if self.finished is None:
            raise RuntimeError(f"choice {self.index} has not finished")
        return self.finished

    def finish_reason(self) -> str:
        """`tool_calls` for an answer that called tools and ended of itself; one cut short says so."""
        reason = FINISH_REASONS[self.end.reason]
        return "tool_calls" if self.calls and reason == "stop" else reason


class Answer(OwnedAnswer):
    def __init__(self, stream: ChatStream, completion: CompletionRequest, model: str, release: Callable[[], None],
                 tokenizer: ChatEncoder, key: str, keepalive_s: float | None = None):
        super().__init__(stream, completion.stream, completion.chat.logprobs is not None, model, release, tokenizer,
                         key, keepalive_s)
        self.completion = completion
        self.choices = [Choice(i) for i in range(len(stream.choice_ids))]

    async def _events(self) -> AsyncIterator[tuple[Choice, ChoiceEvent] | Queued | None]:
        """(its choice, event) until every choice has finished; a failed choice cancels the others. A queue position
        comes alone; None: the stream has been quiet for `keepalive_s`."""
        running = len(self.choices)
        while running:
            event = await next_event(self.stream, self.keepalive_s if self.streaming else None)
            if event is None or isinstance(event, Queued):
                yield event
                continue
            choice = self.choices[self.stream.choice(event.request_id)]
            if isinstance(event, Started) and choice.index == 0:
                self.cached_tokens = event.cached_tokens
            if isinstance(event, Token) and self.logprobs is not None and event.logprobs is not None \
                    and self.logprobs.shown(event.token_id):
                choice.logprobs.append(self.logprobs.entry(event.token_id, event.logprobs))
            if isinstance(event, Finished):
                choice.finished, running = event, running - 1
                if event.reason in FAILURES and running:
                    self.stream.cancel(Cancel.DISCONNECT)
            yield choice, event

    async def _send_whole(self, scope: Scope, send: Send) -> None:
        async for item in self._events():
            if not isinstance(item, tuple):
                continue
            choice, event = item
            if isinstance(event, Token) and self.stream.shows(event):
                choice.texts.append(event.text)
            elif isinstance(event, ToolStep):
                choice.texts.append(event.as_text())
            elif isinstance(event, ToolCallDelta):
                self._add_call(choice, event)
        failed = next((f for c in self.choices if (f := failure(c.end)) is not None), None)
        if failed is not None:
            response = failed.response()
        else:
            response = JSONResponse({**self._envelope("chat.completion"),
                                     "choices": [self._whole_choice(c) for c in self.choices],
                                     "usage": self._usage()}, headers=self.headers)
        await response(scope, _no_receive, send)

    def _whole_choice(self, choice: Choice) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(choice.texts) or None}
        if choice.calls:
            message["tool_calls"] = [choice.calls[i] for i in sorted(choice.calls)]
        elif message["content"] is None:
            message["content"] = ""
        logprobs = {"content": choice.logprobs, "refusal": None} if self.logprobs is not None else None
        return {"index": choice.index, "message": message, "logprobs": logprobs,
                "finish_reason": choice.finish_reason()}

    @staticmethod
    def _add_call(choice: Choice, delta: ToolCallDelta) -> None:
        if delta.name is not None:
            choice.calls[delta.index] = {"id": delta.call_id, "type": "function",
                                         "function": {"name": delta.name, "arguments": ""}}
        choice.calls[delta.index]["function"]["arguments"] += delta.arguments

    async def _send_stream(self, send: Send) -> None:
        headers = [(b"content-type", b"text/event-stream; charset=utf-8")]
        headers += [(k.encode(), v.encode()) for k, v in (STREAM_HEADERS | self.headers).items()]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        async for chunk in self._chunks():
            await send({"type": "http.response.body", "body": chunk.encode(), "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _chunks(self) -> AsyncIterator[str]:
        usage_field = {"usage": None} if self.completion.include_usage else {}
        async for item in self._events():
            if item is None:
                yield KEEPALIVE
                continue
            if isinstance(item, Queued):
                yield f": queued {item.position}\n\n"
                continue
            choice, event = item
            if isinstance(event, Started):
                yield sse(self._chunk(choice, {"role": "assistant", "content": ""}) | usage_field)
            elif isinstance(event, Token):
                if self.stream.shows(event):
                    yield sse(self._chunk(choice, {"content": event.text}) | usage_field)
            elif isinstance(event, ToolStep):
                yield sse(self._chunk(choice, {"content": event.as_text()}) | usage_field)
            elif isinstance(event, ToolCallDelta):
                call = {"index": event.index, "function": {"arguments": event.arguments}}
                if event.name is not None:
                    call = {"index": event.index, "id": event.call_id, "type": "function",
                            "function": {"name": event.name, "arguments": event.arguments}}
                choice.calls[event.index] = call
                yield sse(self._chunk(choice, {"tool_calls": [call]}) | usage_field)
            elif (failed := failure(event)) is not None:  # the openai client raises an APIError for an "error"
                yield sse({"error": failed.body()})
                yield "data: [DONE]\n\n"
                return
            else:
                yield sse(self._chunk(choice, {}, choice.finish_reason()) | usage_field)
        if self.completion.include_usage:
            yield sse({**self._envelope("chat.completion.chunk"), "choices": [], "usage": self._usage()})
        yield "data: [DONE]\n\n"

    def _chunk(self, choice: Choice, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        logprobs = None
        if self.logprobs is not None and (choice.logprobs and ("content" in delta or finish_reason)):
            logprobs, choice.logprobs = {"content": choice.logprobs, "refusal": None}, []
        return {**self._envelope("chat.completion.chunk"),
                "choices": [{"index": choice.index, "delta": delta, "logprobs": logprobs,
                             "finish_reason": finish_reason}]}

    def _envelope(self, kind: str) -> dict[str, Any]:
        return {"id": self.completion.chat.id, "object": kind, "created": self.created, "model": self.model}

    def _usage(self) -> dict[str, Any]:
        """The prompt counted once (the other choices copy its cache); every choice's answer."""
        prompt = self.choices[0].end.prompt_tokens
        completion = sum(c.end.completion_tokens for c in self.choices)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}
