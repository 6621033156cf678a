"""The response to one accepted `POST /v1/responses`: a `response` object, or OpenAI's stream of typed events
(docs/openai.md lists them). A step of the server's calculator is a paragraph of the message's text, as on chat
completions.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.responses import JSONResponse
from starlette.types import Message, Scope, Send

from ...engine.request import Finished, FinishReason, Queued, Started, Token
from ..calculator import ToolStep
from ..chats import ChatStream
from ..lifecycle import ChatEncoder
from ..tool_calls import ToolCallDelta
from .common import KEEPALIVE, STREAM_HEADERS, OwnedAnswer, failure, next_event, sse
from .responses_request import ResponsesRequest


class ResponseAnswer(OwnedAnswer):
    def __init__(self, stream: ChatStream, request: ResponsesRequest, model: str, release: Callable[[], None],
                 tokenizer: ChatEncoder, key: str, keepalive_s: float | None = None):
        super().__init__(stream, request.stream, request.chat.logprobs is not None, model, release, tokenizer, key,
                         keepalive_s)
        self.request = request
        self.output: list[dict[str, Any]] = []  # items, completed or open
        self.text_item: dict[str, Any] | None = None  # the message item text goes to, while open
        self.calls: dict[int, dict[str, Any]] = {}  # call index -> its function_call item
        self.pending_logprobs: list[dict[str, Any]] = []
        self.sequence = 0
        self.finished: Finished | None = None


    async def _send_whole(self, scope: Scope, send: Send) -> None:
        async for _ in self._events():
            pass
        finished = self.finished
        assert finished is not None  # the events end with the chat's Finished
        if (failed := failure(finished)) is not None:
            response = failed.response()
        else:
            response = JSONResponse(self._response(self._status(finished), finished), headers=self.headers)
        await response(scope, _no_receive, send)

    async def _send_stream(self, send: Send) -> None:
        headers = [(b"content-type", b"text/event-stream; charset=utf-8")]
        headers += [(k.encode(), v.encode()) for k, v in (STREAM_HEADERS | self.headers).items()]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        async for chunk in self._events():
            await send({"type": "http.response.body", "body": chunk.encode(), "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _events(self) -> AsyncIterator[str]:
        yield self._event("response.created", response=self._response("in_progress"))
        while True:
            event = await next_event(self.stream, self.keepalive_s if self.streaming else None)
            if event is None:
                yield KEEPALIVE
            elif isinstance(event, Queued):
                yield f": queued {event.position}\n\n"
            elif isinstance(event, Started):
                self.cached_tokens = event.cached_tokens
                yield self._event("response.in_progress", response=self._response("in_progress"))
            elif isinstance(event, Token):
                if self.logprobs is not None and event.logprobs is not None and self.logprobs.shown(event.token_id):
                    self.pending_logprobs.append(self.logprobs.entry(event.token_id, event.logprobs))
                if self.stream.shows(event):
                    for chunk in self._text(event.text):
                        yield chunk
            elif isinstance(event, ToolStep):
                for chunk in self._text(event.as_text()):
                    yield chunk
            elif isinstance(event, ToolCallDelta):
                for chunk in self._call(event):
                    yield chunk
            elif isinstance(event, Finished):
                self.finished = finished = event
                break
        for chunk in self._close_text():
            yield chunk
        for index in sorted(self.calls):
            for chunk in self._close_call(index):
                yield chunk
        if (failed := failure(finished)) is not None:
            yield self._event("response.failed", response=self._response("failed") | {"error": {
                "code": failed.code, "message": failed.message}})
            return
        status = self._status(finished)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        yield self._event(kind, response=self._response(status, finished))

    def _text(self, text: str) -> list[str]:
        out = []
        if self.text_item is None:
            self.text_item = {"id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant",
                              "status": "in_progress", "content": []}
            self.output.append(self.text_item)
            out.append(self._event("response.output_item.added", output_index=len(self.output) - 1,
                                   item=self.text_item | {"content": []}))
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            self.text_item["content"].append(part)
            out.append(self._event("response.content_part.added", item_id=self.text_item["id"],
                                   output_index=len(self.output) - 1, content_index=0, part=dict(part)))
        part = self.text_item["content"][0]
        part["text"] += text
        logprobs, self.pending_logprobs = self.pending_logprobs, []
        part["logprobs"] += logprobs
        out.append(self._event("response.output_text.delta", item_id=self.text_item["id"],
                               output_index=self.output.index(self.text_item), content_index=0, delta=text,
                               logprobs=logprobs))
        return out

    def _close_text(self) -> list[str]:
        if self.text_item is None:
            return []
        item, index = self.text_item, self.output.index(self.text_item)
        part = item["content"][0]
        part["logprobs"] += self.pending_logprobs
        item["status"], self.text_item = "completed", None
        return [self._event("response.output_text.done", item_id=item["id"], output_index=index, content_index=0,
                            text=part["text"], logprobs=part["logprobs"]),
                self._event("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                            part=part),
                self._event("response.output_item.done", output_index=index, item=item)]

    def _call(self, delta: ToolCallDelta) -> list[str]:
        out = []
        if delta.name is not None:
            out += self._close_text()
            item = {"id": f"fc_{uuid.uuid4().hex[:24]}", "type": "function_call", "call_id": delta.call_id,
                    "name": delta.name, "arguments": "", "status": "in_progress"}
            self.calls[delta.index] = item
            self.output.append(item)
            out.append(self._event("response.output_item.added", output_index=len(self.output) - 1, item=dict(item)))
        item = self.calls[delta.index]
        if delta.arguments:
            item["arguments"] += delta.arguments
            out.append(self._event("response.function_call_arguments.delta", item_id=item["id"],
                                   output_index=self.output.index(item), delta=delta.arguments))
        return out

    def _close_call(self, index: int) -> list[str]:
        item = self.calls[index]
        item["status"] = "completed"
        at = self.output.index(item)
        return [self._event("response.function_call_arguments.done", item_id=item["id"], output_index=at,
                            name=item["name"], arguments=item["arguments"]),
                self._event("response.output_item.done", output_index=at, item=item)]

    def _event(self, kind: str, **fields: Any) -> str:
        self.sequence += 1
        return sse({"type": kind, "sequence_number": self.sequence - 1, **fields}, kind)

    @staticmethod
    def _status(finished: Finished) -> str:
        return "incomplete" if finished.reason in (FinishReason.LENGTH, FinishReason.TIMEOUT) else "completed"

    def _response(self, status: str, finished: Finished | None = None) -> dict[str, Any]:
        echo = self.request.echo
        body = {"id": self.request.chat.id, "object": "response", "created_at": self.created, "status": status,
                "error": None, "incomplete_details": None, "model": self.model, "output": list(self.output),
                "parallel_tool_calls": False, "store": False, "usage": None, **echo}
        if status == "incomplete":
            body["incomplete_details"] = {"reason": "max_output_tokens"}
        if finished is not None:
            body["usage"] = {"input_tokens": finished.prompt_tokens,
                             "input_tokens_details": {"cached_tokens": self.cached_tokens},
                             "output_tokens": finished.completion_tokens,
                             "output_tokens_details": {"reasoning_tokens": 0},
                             "total_tokens": finished.prompt_tokens + finished.completion_tokens}
        return body


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}
