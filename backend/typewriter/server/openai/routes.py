"""OpenAI-compatible HTTP: `POST /v1/chat/completions`, `POST /v1/responses` and `GET /v1/models`, over the same
chats as the socket (docs/openai.md has the field mapping). A quiet stream carries a `: keep-alive` comment so that
no proxy's idle timeout cuts it, and a client that goes away has its chat cancelled, also while it is queued.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp

from ..chats import ChatStream, open_chat
from ..identity import Identity
from ..lifecycle import ChatEncoder, Phase, ServerState
from ..limits import client_address
from ..owners import CONVERSATION_KEY
from ..refusal import Refusal
from ..resume.registry import Resumes
from .common import error_response
from .completions_answer import Answer
from .completions_request import HONOURED, BadField, CompletionRequest, check_media_type, parse_body
from .responses_answer import ResponseAnswer
from .responses_request import HONOURED as RESPONSES_HONOURED
from .responses_request import ResponsesRequest
from .responses_request import parse_body as parse_responses_body
from .streams import HEADER, BadConversation, Streams, conversation_id

STATUS = {"invalid_json": 400, "invalid_request": 400, "system_prompt_not_allowed": 400, "prompt_too_long": 400,
          "overloaded": 503, "rate_limited": 429, "shutdown": 503, "internal": 500, "busy": 409, "not_found": 404,
          "loading": 503, "too_large": 413, "method_not_allowed": 405, "not_supported": 400,
          "unsupported_media_type": 415, "request_timeout": 408, "unauthorized": 401}
OVERLOADED_RETRY_S = 1  # a full queue moves within seconds: come back soon

Parsed = TypeVar("Parsed", CompletionRequest, ResponsesRequest)
Release = Callable[[], None]  # gives the client's connection back to the limits, once its answer is done


class OpenAI:
    def __init__(self, state: ServerState, resumes: Resumes | None = None):
        self.state = state
        self.model = state.settings.model.id
        self.created = int(time.time())
        self.resumes = resumes
        self.streams = Streams(state, resumes, lambda status, code, message, retry_after_s=None: self._refused(
            code, message, status=status, retry_after_s=retry_after_s)) if resumes is not None else None

    async def models(self, request: Request) -> Response:
        if not self.state.ready:
            return self._not_ready()
        model = {"id": self.model, "object": "model", "created": self.created, "owned_by": "typewriter"}
        return JSONResponse({"object": "list", "data": [model]})

    async def classroom(self, request: Request) -> Response:
        """`GET /v1/class`: the class of whoever asks (by their key or cookie), never another's."""
        client = self._client(request)
        if client is None:
            return self._unauthorized()
        return JSONResponse({"object": "class", "client": client.kind.value, **client.classroom.public()})

    def _client(self, request: Request) -> Identity | None:
        address = client_address(request.client.host if request.client else None, request.headers,
                                 self.state.limits.trusted)
        return self.state.identities.resolve(address, request.headers.get("authorization"),
                                             request.headers.get("cookie"))

    def _unauthorized(self) -> Response:
        return self._refused("unauthorized", "this server serves its classes only: send your class's key as "
                                             "'Authorization: Bearer <key>'", status=401)

    async def unknown(self, request: Request) -> Response:
        if request.url.path in ("/v1/chat/completions", "/v1/responses", "/v1/models", "/v1/class"):
            return error_response(405, "method_not_allowed", f"{request.method} is not allowed here; see docs/openai.md")
        return error_response(404, "not_found", f"no route {request.url.path}; this server has /v1/chat/completions, "
                                                "/v1/responses, /v1/models and /v1/class")

    async def chat_completions(self, request: Request) -> ASGIApp:
        keepalive_s = self.state.settings.resume.sse_keepalive_s

        def answer(stream: ChatStream, body: CompletionRequest, tokenizer: ChatEncoder, release: Release,
                   kept: str | None, key: str) -> ASGIApp:
            chat = Answer(stream, body, self.model, release, tokenizer, key, keepalive_s)
            if kept is None or self.streams is None:  # kept only where streams are (_kept_as)
                return chat
            return self.streams.keep(request, stream, chat._chunks(), kept, chat.release)

        return await self._accept(request, parse_body, answer, keepable=True, shows_steps=True)

    async def responses(self, request: Request) -> ASGIApp:
        keepalive_s = self.state.settings.resume.sse_keepalive_s

        def answer(stream: ChatStream, body: ResponsesRequest, tokenizer: ChatEncoder, release: Release,
                   kept: str | None, key: str) -> ASGIApp:
            return ResponseAnswer(stream, body, self.model, release, tokenizer, key, keepalive_s)

        return await self._accept(request, parse_responses_body, answer, shows_steps=True)

    async def _accept(self, request: Request, parse: Callable[[bytes, int], Parsed],
                      answer: Callable[[ChatStream, Parsed, ChatEncoder, Release, str | None, str], ASGIApp],
                      keepable: bool = False, shows_steps: bool = False) -> ASGIApp:
        """`answer` gets `kept`, the X-Conversation-Id the stream is kept under (or None), and the conversation key;
        `shows_steps`: the answer can show the calculator's steps (chats.py's open_chat)."""
        state, settings, tokenizer = self.state, self.state.settings, self.state.tokenizer
        if not state.ready or tokenizer is None:
            return self._not_ready()
        try:
            body = await _read_body(request, settings.socket.max_message_bytes, settings.limits.header_timeout_s)
            check_media_type(request.headers.get("content-type"))
            parsed = parse(body, settings.socket.max_messages)
            kept = self._kept_as(request, parsed) if keepable else None
        except BadField as e:
            return self._refused(e.code, e.message, e.param)
        except BadConversation as e:
            return self._refused(e.code, e.message, status=e.status)
        except ClientDisconnect:
            return Response(status_code=400)  # nobody reads it
        limits = state.limits
        client = self._client(request)
        if client is None:
            return self._unauthorized()
        refused = limits.connect(client)
        if refused:
            return self._refused("overloaded", refused, retry_after_s=OVERLOADED_RETRY_S)
        owner, key = state.owners.of_request(client, request.headers.get(CONVERSATION_KEY))
        try:
            stream = await open_chat(state, parsed.chat, client, owner, settings.answers.api_system_prompt, shows_steps)
        except Refusal as e:
            limits.disconnect(client)
            param = _field(e.message, parsed.names)
            message = e.message.replace(f"params.{param[1]}", param[0], 1) if param else e.message
            retry = OVERLOADED_RETRY_S if e.code == "overloaded" else e.retry_after_s
            return self._refused(e.code, message, param and param[0], retry)
        return answer(stream, parsed, tokenizer, lambda: limits.disconnect(client), kept, key)

    def _kept_as(self, request: Request, parsed: CompletionRequest | ResponsesRequest) -> str | None:
        """The conversation id a streamed request is kept under, if it named one and the server keeps chats."""
        value = request.headers.get(HEADER)
        if value is None or not parsed.stream or self.resumes is None or not self.resumes.enabled:
            return None
        return conversation_id(value)

    def _refused(self, code: str, message: str, param: str | None = None,
                 retry_after_s: float | None = None, status: int | None = None) -> Response:
        self.state.metrics.rejected.labels(code=code).inc()
        return error_response(status or STATUS.get(code, 400), code, message, param, retry_after_s)

    def _not_ready(self) -> Response:
        phase = self.state.phase
        if phase is Phase.STOPPING:
            return error_response(503, "shutdown", "the server is shutting down; retry in a moment", retry_after_s=1)
        if phase is Phase.LOADING:
            return error_response(503, "loading", "the model is still loading; retry when /readyz is 200",
                                  retry_after_s=5)
        return error_response(503, "internal", "the server is not serving chats; see /readyz")


async def _read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The body must come whole within `timeout_s`, as its header must, so that a trickle cannot hold a connection."""
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


def _field(message: str, names: dict[str, str]) -> tuple[str, str] | None:
    """(OpenAI field, our param) that a refusal such as `params.top_p: ...` or `tools: ...` names."""
    if message.startswith("params."):
        ours = message[len("params."):].split(":", 1)[0]
        return names.get(ours, ours), ours
    named = message.split(": ", 1)[0]
    if named.split(".")[0].split("[")[0] in (*HONOURED, *RESPONSES_HONOURED):
        return named, named
    return None
