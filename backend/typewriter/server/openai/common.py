"""What `/v1/chat/completions` and `/v1/responses` share: error bodies, finish reasons in OpenAI's terms, server-sent
events, log probabilities, and the life of an answer that owns its chat."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from ...engine.request import Finished, FinishReason, TokenLogprobs
from ..chats import Cancel, ChatStream, StreamItem
from ..lifecycle import ChatEncoder
from ..owners import CONVERSATION_KEY

FINISH_REASONS = {FinishReason.EOS: "stop", FinishReason.STOP_SEQUENCE: "stop", FinishReason.LENGTH: "length",
                  FinishReason.TIMEOUT: "length",  # ran out of its time budget: cut short, like a length limit
                  FinishReason.REPETITION: "stop"}  # the model was repeating itself: it had nothing more to say
# Ends that are no answer of the model's: an error in OpenAI's shape (HTTP status, protocol-style code).
FAILURES = {FinishReason.QUEUE_TIMEOUT: (503, "queue_timeout", "waited too long for a free slot; try again"),
            FinishReason.SHUTDOWN: (503, "shutdown", "the server is shutting down; retry in a moment"),
            FinishReason.CANCELLED: (499, "cancelled", "the request was cancelled"),
            FinishReason.ERROR: (500, "internal", "generation failed; see the server log"),
            # the client's constraint could go no further (a dead end, a limit): the engine's message names its field
            FinishReason.CONSTRAINT: (400, "invalid_request", "the answer's constraint could go no further")}
STREAM_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}  # no proxy may hold events back
KEEPALIVE = ": keep-alive\n\n"  # an SSE comment: clients skip it, proxies see the stream is alive


class OwnedAnswer:
    """An ASGI response that owns its chat until its end was sent or its client left: whatever ends the response
    early cancels the chat. A subclass sends it streamed or whole."""

    def __init__(self, stream: ChatStream, streaming: bool, logprobs: bool, model: str, release: Callable[[], None],
                 tokenizer: ChatEncoder, key: str, keepalive_s: float | None = None):
        """`key`: the conversation key given back in a header; `keepalive_s`: None for no keep-alive comments."""
        self.stream, self.streaming, self.model, self.release = stream, streaming, model, release
        self.keepalive_s = keepalive_s
        self.headers = {CONVERSATION_KEY: key}
        self.created = int(time.time())
        self.logprobs = LogprobWriter(tokenizer) if logprobs else None
        self.cached_tokens = 0

    async def _send_stream(self, send: Send) -> None:
        raise NotImplementedError

    async def _send_whole(self, scope: Scope, send: Send) -> None:
        raise NotImplementedError

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watcher = asyncio.create_task(self._watch(receive))
        try:
            if self.streaming:
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


async def next_event(stream: ChatStream, quiet_s: float | None) -> StreamItem | None:
    """None when none came for `quiet_s`: a keep-alive is due (the queue's get is safe to cancel)."""
    if quiet_s is None:
        return await stream.next_event()
    try:
        return await asyncio.wait_for(stream.next_event(), quiet_s)
    except TimeoutError:
        return None


@dataclass(frozen=True)
class Failure:
    status: int
    code: str
    message: str
    param: str | None

    @property
    def kind(self) -> str:
        return "invalid_request_error" if self.status < 500 else "server_error"

    def body(self) -> dict[str, Any]:
        return {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}

    def response(self) -> JSONResponse:
        return error_response(self.status, self.code, self.message, self.param,
                              retry_after_s=1 if self.status == 503 else None)


def failure(finished: Finished) -> Failure | None:
    """How an end that is no answer of the model's is told in OpenAI's shape; None for an answer. A constraint's end
    carries the engine's own message, which starts with the constraint's field."""
    if finished.reason not in FAILURES:
        return None
    status, code, message = FAILURES[finished.reason]
    if finished.reason is FinishReason.CONSTRAINT and finished.error:
        return Failure(status, code, finished.error, finished.error.split(": ", 1)[0])
    return Failure(status, code, message, None)


def error_response(status: int, code: str, message: str, param: str | None = None,
                   retry_after_s: float | None = None) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    headers = {"retry-after": str(max(1, round(retry_after_s)))} if retry_after_s is not None else None
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}},
                        status_code=status, headers=headers)


def sse(data: dict[str, Any], event: str | None = None) -> str:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"


class LogprobWriter:
    def __init__(self, tokenizer: ChatEncoder):
        self.tokenizer = tokenizer

    def entry(self, token_id: int, logprobs: TokenLogprobs) -> dict[str, Any]:
        return {**self._token(token_id, logprobs.logprob),
                "top_logprobs": [self._token(i, p) for i, p in logprobs.top]}

    def shown(self, token_id: int) -> bool:
        """An end-of-answer token is no text and is not listed, as OpenAI lists none."""
        return token_id not in self.tokenizer.eos_token_ids

    def _token(self, token_id: int, logprob: float) -> dict[str, Any]:
        piece = self.tokenizer.token_bytes(token_id)
        return {"token": piece.decode("utf-8", "replace"), "logprob": max(logprob, -9999.0), "bytes": list(piece)}
