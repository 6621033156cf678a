"""OpenAI streams that outlive their connection (docs/openai.md, "Resuming a stream"): a streamed chat completion
sent with `X-Conversation-Id` is kept, and its response carries `X-Resume-Token`, a secret the server made for it.
Only a client that presents that token may read it again (`GET /v1/stream/<id>?from=N`), stop it (`DELETE`) or
replace it (a new request with the same id and the token); the id routes the request (a balancer hashes it), the
token owns the stream, and is never in a URL or a log. A look-up that finds nothing counts against the client.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import math
import re
import secrets
from collections.abc import AsyncIterator, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ..chats import Cancel, ChatStream
from ..identity import Identity
from ..lifecycle import ServerState
from ..limits import client_address
from ..resume.kept_chat import KeptChat, Reader
from ..resume.registry import Resumes

CONVERSATION_ID = re.compile(r"[A-Za-z0-9._:-]{16,128}")
HEADER = "x-conversation-id"
TOKEN_HEADER = "x-resume-token"
STREAM_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
                  (b"x-accel-buffering", b"no")]
_FULL = {"error": {"message": "the answer outgrew the server's resume buffer and was ended; ask again",
                   "type": "server_error", "param": None, "code": "resume_buffer_full"}}
FULL_EVENT = f"data: {json.dumps(_FULL, separators=(',', ':'))}\n\ndata: [DONE]\n\n"


class BadConversation(ValueError):
    """The X-Conversation-Id header or a stream's `from` cannot be used; `code` and `status` say how to answer."""

    def __init__(self, status: int, code: str, message: str, retry_after_s: float | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.retry_after_s = status, code, message, retry_after_s


def conversation_id(value: str) -> str:
    if not CONVERSATION_ID.fullmatch(value):
        raise BadConversation(400, "invalid_request", "X-Conversation-Id: must be 16 to 128 letters, digits or "
                                                      "._:- characters; use a random id such as a UUID, as it is "
                                                      "the key to the kept stream")
    return value


class SseChat(KeptChat):
    """One kept stream: its items are SSE chunks, each keyed by the byte offset it starts at."""

    def __init__(self, registry: Resumes, stream: ChatStream, chunks: AsyncIterator[str], conversation: str):
        self._chunks = chunks
        self.offset = 0
        self.conversation = conversation
        self.token = secrets.token_urlsafe(32)  # its owner's key: in its response's headers, nowhere else
        super().__init__(registry, stream, self.token)

    @property
    def next_key(self) -> int:
        return self.offset

    async def _produce(self) -> None:
        pending = None  # one chunk behind, so that the last one goes in as the end
        async for chunk in self._chunks:
            if pending is not None:
                self._add(pending)
            pending = chunk
        self._add(FULL_EVENT if self.overflowed else pending or "", last=True)
        self.finish()

    def _add(self, chunk: str, last: bool = False) -> None:
        self.append(self.offset, chunk, last)
        if not self.overflowed or last:
            self.offset += len(chunk.encode())

    def start_of(self, offset: int) -> tuple[int, int]:
        """(the position of the item holding byte `offset`, how many of its bytes come before it)."""
        at = max(0, bisect.bisect_right(self.keys, offset) - 1)
        return self.base + at, offset - self.keys[at] if self.keys else 0


class StreamReader(Reader):
    """An HTTP response that reads a kept stream from a position: what was kept, then live, up to its end."""

    def __init__(self, chat: SseChat, position: int, skip: int = 0, release: Callable[[], None] = lambda: None,
                 headers: list[tuple[bytes, bytes]] | None = None):
        """`release` gives its connection's place back (or the chat holds it, if it runs on without a reader)."""
        self.chat, self.position, self.skip, self.release = chat, position, skip, release
        self.headers = STREAM_HEADERS + (headers or [])
        self._ending = False
        self._done = asyncio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._send = send
        watcher = asyncio.create_task(self._watch(receive))
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.headers})
            self.chat.attach(self, self.position)
            await self._done.wait()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:  # the client went away mid-send
            self.chat.detach(self)
        finally:
            watcher.cancel()
            self.chat.hold(self.release)  # gives it back at once unless the chat runs on with nobody attached

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.chat.detach(self)
        self._done.set()

    async def deliver(self, text: str) -> bool:
        data = text.encode()
        if self.skip:
            data, self.skip = data[self.skip:], 0
        try:
            await self._send({"type": "http.response.body", "body": data, "more_body": True})
        except OSError:
            self._done.set()
            return False
        if self._ending:
            self._done.set()
        return True

    def released(self, chat: KeptChat) -> None:
        if chat.reader is self and chat.final is not None:
            self._ending = True  # the end is the next item this reader is sent
        else:
            self._done.set()  # another reader took the stream over


class Streams:
    def __init__(self, state: ServerState, resumes: Resumes, refused: Callable[..., Response]):
        """`refused(status, code, message, retry_after_s=None)`: an error in the OpenAI API's shape."""
        self.state, self.resumes, self.refused = state, resumes, refused

    def keep(self, request: Request, stream: ChatStream, chunks: AsyncIterator[str], conversation: str,
             release: Callable[[], None]) -> StreamReader:
        """Keep `stream` under `conversation`; a request that presents the token of the stream kept under that
        conversation replaces it (a next turn), any other keeps its own."""
        previous = self.resumes.find(request.headers.get(TOKEN_HEADER, ""))
        if isinstance(previous, SseChat) and previous.conversation == conversation and (
                stream.client is None or previous.readable_by(stream.client)):
            self.resumes.drop(previous)
        chat = self.resumes.keep(SseChat(self.resumes, stream, chunks, conversation))
        return StreamReader(chat, 0, 0, release, [(TOKEN_HEADER.encode(), chat.token.encode())])

    def _find(self, request: Request, client: Identity) -> SseChat:
        """The stream the request's conversation id and token name, if `client` may read it (its own, or one kept
        for an address: a class key never reads another class's stream, nor a student a classmate's)."""
        conversation = conversation_id(request.path_params["conversation_id"])
        wait_s = self.state.limits.looking_blocked(client.address)
        if wait_s is not None:
            raise BadConversation(429, "rate_limited", "too many look-ups of streams that are not kept here; try "
                                                       f"again in {math.ceil(wait_s)} s", wait_s)
        chat = self.resumes.find(request.headers.get(TOKEN_HEADER, ""))
        if not isinstance(chat, SseChat) or chat.conversation != conversation or not chat.readable_by(client):
            self.resumes.counted("not_found")
            self.state.limits.missed(client.address)
            raise BadConversation(404, "not_found", "no stream is kept for this conversation id and X-Resume-Token: "
                                                    "send the token its response carried; it ended over "
                                                    "resume_grace_s ago, or another server or a restart had it")
        return chat

    def _client(self, request: Request) -> Identity:
        address = client_address(request.client.host if request.client else None, request.headers,
                                 self.state.limits.trusted)
        return self.state.identities.counted(address, request.headers.get("authorization"),
                                             request.headers.get("cookie"))

    async def replay(self, request: Request) -> Response | StreamReader:
        client = self._client(request)
        try:
            chat = self._find(request, client)
            first = _offset(request.query_params.get("from", "0"), chat.offset)
            if chat.lost(first):
                self.resumes.counted("lost")
                raise BadConversation(400, "offset_lost", f"from: the stream's bytes before {chat.kept_from} are "
                                                          "no longer kept; ask again")
        except BadConversation as e:
            return self.refused(e.status, e.code, e.message, retry_after_s=e.retry_after_s)
        limits = self.state.limits
        refused = limits.connect(client)
        if refused:
            return self.refused(503, "overloaded", refused)
        self.resumes.counted("resumed")
        position, skip = chat.start_of(first)
        return StreamReader(chat, position, skip, lambda: limits.disconnect(client))

    async def stop(self, request: Request) -> Response:
        """Stop the stream's answer: 204 whether or not it was still running."""
        try:
            chat = self._find(request, self._client(request))
        except BadConversation as e:
            return self.refused(e.status, e.code, e.message, retry_after_s=e.retry_after_s)
        if not chat.ended:
            chat.stream.cancel(Cancel.STOP)
        return Response(status_code=204)


def _offset(value: str, made: int) -> int:
    if not value.isdigit() or len(value) > 18:
        raise BadConversation(400, "invalid_request", f"from: must be a byte offset from 0 to {made}, got "
                                                      f"{value[:40]!r}")
    offset = int(value)
    if offset > made:
        raise BadConversation(400, "invalid_request", f"from: the stream has sent {made} bytes so far, so from may "
                                                      f"be at most {made}; got {offset}")
    return offset
