"""OpenAI-compatible HTTP: `POST /v1/chat/completions` (streamed as server-sent events or as one JSON) and
`GET /v1/models`, over the same chats as the socket (chats.py). docs/openai.md has the field mapping.

A streamed answer is `chat.completion.chunk` events ending in `data: [DONE]`; while it waits for a slot the
stream carries SSE comments (`: queued 3`), which clients skip. The client's connection is watched while the
answer runs: when it goes away the chat is cancelled within a decode step, also while it is still queued.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from ..engine.request import Finished, FinishReason, Queued, Started, Token
from . import protocol as p
from .chats import Cancel, ChatStream, open_chat
from .lifecycle import Phase, ServerState
from .limits import client_address
from .owners import CONVERSATION_KEY
from .openai_request import BadField, CompletionRequest, check_media_type, parse_body

FINISH_REASONS = {FinishReason.EOS: "stop", FinishReason.STOP_SEQUENCE: "stop", FinishReason.LENGTH: "length",
                  FinishReason.TIMEOUT: "length",  # ran out of its time budget: cut short, like a length limit
                  FinishReason.REPETITION: "stop"}  # the model was repeating itself: it had nothing more to say
# Ends that are no answer of the model's: an error in OpenAI's shape (HTTP status, protocol-style code).
FAILURES = {FinishReason.QUEUE_TIMEOUT: (503, "queue_timeout", "waited too long for a free slot; try again"),
            FinishReason.SHUTDOWN: (503, "shutdown", "the server is shutting down; retry in a moment"),
            FinishReason.CANCELLED: (499, "cancelled", "the request was cancelled"),
            FinishReason.ERROR: (500, "internal", "generation failed; see the server log")}
STATUS = {"invalid_json": 400, "invalid_request": 400, "system_prompt_not_allowed": 400, "prompt_too_long": 400,
          "overloaded": 503, "rate_limited": 429, "shutdown": 503, "internal": 500, "busy": 409, "not_found": 404,
          "loading": 503, "too_large": 413, "method_not_allowed": 405, "unsupported_media_type": 415,
          "request_timeout": 408}
OVERLOADED_RETRY_S = 1  # a full queue moves within seconds: come back soon
STREAM_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}  # no proxy may hold events back


def error_response(status: int, code: str, message: str, param: str | None = None,
                   retry_after_s: float | None = None) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    headers = {"retry-after": str(max(1, round(retry_after_s)))} if retry_after_s is not None else None
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}},
                        status_code=status, headers=headers)


class OpenAI:
    def __init__(self, state: ServerState):
        self.state = state
        self.created = int(time.time())

    async def models(self, request: Request) -> Response:
        if not self.state.ready:
            return self._not_ready()
        model = {"id": self.state.settings.model_id, "object": "model", "created": self.created,
                 "owned_by": "typewriter"}
        return JSONResponse({"object": "list", "data": [model]})

    async def unknown(self, request: Request) -> Response:
        if request.url.path in ("/v1/chat/completions", "/v1/models"):
            return error_response(405, "method_not_allowed", f"{request.method} is not allowed here; see docs/openai.md")
        return error_response(404, "not_found", f"no route {request.url.path}; this server has /v1/chat/completions "
                                                "and /v1/models")

    async def chat_completions(self, request: Request) -> Response:
        state, settings = self.state, self.state.settings
        if not state.ready:
            return self._not_ready()
        try:
            body = await _read_body(request, settings.max_message_bytes, settings.header_timeout_s)
            check_media_type(request.headers.get("content-type"))
            completion = parse_body(body, settings.max_messages)
        except BadField as e:
            return self._refused(e.code, e.message, e.param)
        except ClientDisconnect:
            return Response(status_code=400)  # nobody reads it
        limits = state.limits
        client = client_address(request.client.host if request.client else None, request.headers, limits.trusted)
        refused = limits.connect(client)
        if refused:
            return self._refused("overloaded", refused, retry_after_s=OVERLOADED_RETRY_S)
        owner, key = state.owners.conversation(request.headers.get(CONVERSATION_KEY))
        try:
            stream = await open_chat(state, completion.chat, client, owner)
        except p.ProtocolError as e:
            limits.disconnect(client)
            param = _field(e.message, completion)
            message = e.message.replace(f"params.{param[1]}", param[0], 1) if param else e.message
            retry = OVERLOADED_RETRY_S if e.code == "overloaded" else e.retry_after_s
            return self._refused(e.code, message, param and param[0], retry)
        return Answer(stream, completion, settings.model_id, lambda: limits.disconnect(client), key)

    def _refused(self, code: str, message: str, param: str | None = None,
                 retry_after_s: float | None = None) -> Response:
        self.state.metrics.rejected.labels(code=code).inc()
        return error_response(STATUS.get(code, 400), code, message, param, retry_after_s)

    def _not_ready(self) -> Response:
        phase = self.state.phase
        if phase is Phase.STOPPING:
            return error_response(503, "shutdown", "the server is shutting down; retry in a moment", retry_after_s=1)
        if phase is Phase.LOADING:
            return error_response(503, "loading", "the model is still loading; retry when /readyz is 200",
                                  retry_after_s=5)
        return error_response(503, "internal", "the server is not serving chats; see /readyz")


class Answer:
    """The response to one accepted completion: it owns the chat until its end was sent or its client left."""

    def __init__(self, stream: ChatStream, completion: CompletionRequest, model: str, release, key: str):
        """`key`: the conversation key to give back, so a next turn that sends it reuses this one (owners.py)."""
        self.stream, self.completion, self.model, self.release = stream, completion, model, release
        self.headers = {CONVERSATION_KEY: key}
        self.created = int(time.time())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watcher = asyncio.create_task(self._watch(receive))
        try:
            if self.completion.stream:
                await self._send_stream(send)
            else:
                await self._send_whole(scope, send)
        except OSError:  # the client went away mid-send (uvicorn's ClientDisconnected is one)
            self.stream.cancel(Cancel.DISCONNECT)
        except BaseException:  # anything else that ends the response ends its chat too: nobody would hear it
            self.stream.cancel(Cancel.DISCONNECT)
            raise
        finally:
            watcher.cancel()
            self.stream.end()
            self.release()

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.stream.cancel(Cancel.DISCONNECT)

    async def _send_whole(self, scope: Scope, send: Send) -> None:
        texts, event = [], None
        while not isinstance(event, Finished):
            event = await self.stream.next_event()
            if isinstance(event, Token) and self.stream.shows(event):
                texts.append(event.text)
        if event.reason in FAILURES:
            status, code, message = FAILURES[event.reason]
            response = error_response(status, code, message, retry_after_s=1 if status == 503 else None)
        else:
            response = JSONResponse({
                **self._envelope("chat.completion"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(texts)},
                             "logprobs": None, "finish_reason": FINISH_REASONS[event.reason]}],
                "usage": _usage(event)}, headers=self.headers)
        await response(scope, _no_receive, send)

    async def _send_stream(self, send: Send) -> None:
        headers = [(b"content-type", b"text/event-stream; charset=utf-8")]
        headers += [(k.encode(), v.encode()) for k, v in (STREAM_HEADERS | self.headers).items()]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        async for chunk in self._events():
            await send({"type": "http.response.body", "body": chunk.encode(), "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _events(self) -> AsyncIterator[str]:
        usage_field = {"usage": None} if self.completion.include_usage else {}
        while True:
            event = await self.stream.next_event()
            if isinstance(event, Queued):
                yield f": queued {event.position}\n\n"
            elif isinstance(event, Started):
                yield _sse(self._chunk({"role": "assistant", "content": ""}, None) | usage_field)
            elif isinstance(event, Token):
                if self.stream.shows(event):
                    yield _sse(self._chunk({"content": event.text}, None) | usage_field)
            else:
                break
        if event.reason in FAILURES:  # the openai client raises an APIError for an event with "error"
            _, code, message = FAILURES[event.reason]
            yield _sse({"error": {"message": message, "type": "server_error", "param": None, "code": code}})
        else:
            yield _sse(self._chunk({}, FINISH_REASONS[event.reason]) | usage_field)
            if self.completion.include_usage:
                yield _sse({**self._envelope("chat.completion.chunk"), "choices": [], "usage": _usage(event)})
        yield "data: [DONE]\n\n"

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
        return {**self._envelope("chat.completion.chunk"),
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}

    def _envelope(self, kind: str) -> dict[str, Any]:
        return {"id": self.completion.chat.id, "object": kind, "created": self.created, "model": self.model}


async def _read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The body, which must come whole within `timeout_s` (as its header must: connections.py), so a client
    trickling it cannot hold a connection for ever."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BadField(None, f"the body may be at most {limit} bytes", "too_large")
    body = bytearray()
    try:
        async with asyncio.timeout(timeout_s):
            async for part in request.stream():
                body += part
                if len(body) > limit:
                    raise BadField(None, f"the body may be at most {limit} bytes", "too_large")
    except TimeoutError:
        raise BadField(None, f"the body did not arrive whole within {timeout_s:g} s", "request_timeout") from None
    return bytes(body)


def _field(message: str, completion: CompletionRequest) -> tuple[str, str] | None:
    """(OpenAI field, our param) named by a refusal of our sampling params, like `params.top_p: ...`."""
    if message.startswith("params."):
        ours = message[len("params."):].split(":", 1)[0]
        return completion.names.get(ours, ours), ours
    return None


def _usage(event: Finished) -> dict[str, int]:
    return {"prompt_tokens": event.prompt_tokens, "completion_tokens": event.completion_tokens,
            "total_tokens": event.prompt_tokens + event.completion_tokens}


def _sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"


async def _no_receive() -> dict:
    return {"type": "http.disconnect"}
