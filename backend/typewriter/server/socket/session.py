"""One WebSocket connection speaking protocol v1: a reader that keeps reading while frames go out, so that a `stop`
is seen at once, and the one chat it runs at a time. A chat whose frames can no longer reach its client is cancelled
(a resumable one waits for its client instead).
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from ..chat_request import Chat
from ..chats import Cancel, ChatStream, StreamState, open_chat
from ..identity import Identity
from ..lifecycle import ServerState
from ..limits import FrameRate
from ..refusal import Refusal
from ..resume.kept_chat import KeptChat, Reader
from ..resume.registry import Resumes
from . import frames as p
from .pump import frames
from .resumable import SocketChat

log = logging.getLogger("typewriter.server")


class Session(Reader):
    def __init__(self, websocket: WebSocket, state: ServerState, client: Identity | None = None,
                 resumes: Resumes | None = None):
        """`client`: whom the limits count (None: its address alone, unknown); `resumes`: None when chats are never
        kept."""
        self.ws, self.server = websocket, state
        self.client = client or state.identities.address("unknown")
        self.owner = state.owners.of_socket(self.client)
        self.settings = state.settings
        self.resumes = resumes
        self.stream: ChatStream | None = None
        self.kept: SocketChat | None = None
        self._opening: str | None = None  # the id of a chat being checked and encoded: busy already
        self._open = True
        self._send_lock = asyncio.Lock()
        self._pumps: set[asyncio.Task[None]] = set()

    async def run(self) -> KeptChat | None:
        """Serve the socket until it closes; returns the kept chat it leaves running with nobody attached, if any
        (it holds this socket's place among its client's connections until it ends: KeptChat.hold)."""
        self.server.metrics.connections.inc()
        left: KeptChat | None = None
        try:
            await self._read()
        finally:
            self._open = False
            if self.kept is not None:
                self.kept.detach(self)  # it runs on for the grace period, for its client to resume
                left = self.kept
            elif self.stream is not None:
                self.stream.cancel(Cancel.DISCONNECT)
            if self._pumps:
                await asyncio.gather(*self._pumps)
            self.server.metrics.connections.dec()
        return left

    async def _read(self) -> None:
        limit = self.settings.socket.max_message_bytes
        rate = FrameRate(self.settings.limits.frames_per_second)
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
                await self._handle(p.parse_frame(text, self.settings.socket.max_messages))
            except Refusal as e:
                self.server.metrics.rejected.labels(code=e.code).inc()
                await self._send(p.error(e.code, e.message, e.request_id))
                if e.code == "shutdown":  # so that the client reconnects now, not after a flood of refusals
                    await self._close(p.CLOSE_SERVICE_RESTART, "shutdown")
                    return

    async def _handle(self, message: p.ClientMessage) -> None:
        if isinstance(message, p.Ping):
            await self._send(p.pong())
        elif isinstance(message, p.Stop):
            stream = self.stream
            if stream is None or stream.chat_id != message.id:
                raise Refusal("not_found", f"no chat with id {message.id!r} is running on this connection",
                                      message.id)
            stream.cancel(Cancel.STOP)
        elif isinstance(message, p.Resume):
            await self._resume(message)
        else:
            await self._start(message)

    def _check_idle(self, request_id: str) -> None:
        busy = self.stream.chat_id if self.stream is not None else \
            self.kept.chat_id if self.kept is not None else self._opening
        if busy is not None:
            raise Refusal(
                "busy", f"chat {busy!r} is still running on this connection; stop it or wait for its end",
                request_id)

    async def _start(self, chat: Chat) -> None:
        self._check_idle(chat.id)
        self._opening = chat.id
        try:
            stream = await open_chat(self.server, chat, self.client, self.owner,
                                     self.server.settings.answers.client_system_prompt, shows_steps=True)
        finally:
            self._opening = None
        self.stream = stream
        if chat.resumable and self.resumes is not None and self.resumes.enabled:
            self.kept = self.resumes.keep(SocketChat(self.resumes, stream))
            self.kept.attach(self, 0)
            return
        pump = asyncio.create_task(self._send_frames(stream), name=f"pump-{stream.engine_id}")
        self._pumps.add(pump)
        pump.add_done_callback(self._pumps.discard)

    async def _resume(self, resume: p.Resume) -> None:
        self._check_idle(resume.id)
        limits, resumes = self.server.limits, self.resumes
        wait_s = limits.looking_blocked(self.client.address)
        if wait_s is not None:
            raise Refusal("rate_limited", "too many resumes of chats that are not kept here; try again in "
                                          f"{math.ceil(wait_s)} s", resume.id, wait_s)
        chat = resumes.find(resume.token) if resumes is not None else None
        if resumes is None or not isinstance(chat, SocketChat) or chat.chat_id != resume.id \
                or not chat.readable_by(self.client):
            limits.missed(self.client.address)
            if resumes is not None:
                resumes.counted("not_found")
            raise Refusal("not_found", f"no chat {resume.id!r} with that token is kept here (it ended over "
                                               "resume_grace_s ago, or another server or a restart had it); send "
                                               "it again as a chat with continue", resume.id)
        try:
            chat.check_from(resume.first_index)
        except Refusal as e:
            resumes.counted("lost" if e.code == "not_found" else "refused")
            raise
        resumes.counted("resumed")
        self.kept, self.stream = chat, (None if chat.ended else chat.stream)
        await self._send(p.resumed(resume.id))
        chat.attach(self, chat.position(resume.first_index))

    async def deliver(self, text: str) -> bool:
        await self._send_text(text)
        return self._open

    def released(self, chat: KeptChat) -> None:
        if self.kept is chat:
            self.kept = None
            if self.stream is chat.stream:
                self.stream = None

    async def _send_frames(self, stream: ChatStream) -> None:
        try:
            async for out in frames(stream):
                if out.last:
                    self._ended(stream)  # before the send: a client that reads `end` may start its next chat
                await self._send(out.frame)
        except Exception:  # a bug; logged here, so no task ends with an exception nobody retrieves
            log.exception("chat %s: its events could not be turned into frames", stream.engine_id)
            await self._broken()
        finally:
            if stream.state is not StreamState.ENDED:  # the task was cancelled, or failed: nobody will hear it
                stream.cancel(Cancel.DISCONNECT)
                self._ended(stream)

    def _ended(self, stream: ChatStream) -> None:
        stream.end()
        if self.stream is stream:
            self.stream = None

    async def _send(self, frame: dict[str, Any]) -> None:
        """Send a frame; never raises. If it cannot be made or sent, the socket's chat is cancelled."""
        try:
            text = p.encode(frame)
        except Exception:
            log.exception("a %s frame could not be sent (it could not be encoded); closing the socket", frame.get("type"))
            await self._broken()
            return
        await self._send_text(text)

    async def _send_text(self, text: str) -> None:
        """Send an encoded frame; never raises (see `_send`)."""
        if not self._open:
            return
        async with self._send_lock:
            try:
                await self.ws.send_text(text)
                return
            except (WebSocketDisconnect, RuntimeError, OSError):  # the client is gone
                self._open = False
                if self.stream is not None and self.kept is None:  # a kept chat waits for its client instead
                    self.stream.cancel(Cancel.DISCONNECT)
                return
            except Exception:
                log.exception("a frame could not be sent; closing the socket")
        await self._broken()

    async def _broken(self) -> None:
        """Close with 1011 so that the client knows its chat ended and nothing runs on unheard."""
        if self.stream is not None:
            self.stream.cancel(Cancel.DISCONNECT)
        await self._close(p.CLOSE_INTERNAL_ERROR, "the server could not send a frame; see its log")

    async def _close(self, code: int, reason: str) -> None:
        self._open = False
        async with self._send_lock:
            try:
                await self.ws.close(code, reason)
            except (RuntimeError, OSError):
                pass
