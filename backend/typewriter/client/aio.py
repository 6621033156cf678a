"""The async client: one WebSocket, one chat at a time on it; a chat left unread is stopped when the next starts."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Sequence
from typing import Any, Unpack

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from .errors import ChatTimeout, ClientError, ServerClosed
from .events import Ended, Event, Result, TokenEvent
from .protocol import (
    CONNECT_ERRORS,
    DEFAULT_URL,
    ChatState,
    History,
    Message,
    Params,
    Retry,
    auth_headers,
    checked_params,
    closed_error,
    connect_error,
    decode,
    encode,
    messages_of,
    refused_error,
    ws_url,
)

STOP_SEND_S = 1.0  # how long `close()` gives the stop of a running chat on a connection that may be dead


class AsyncClient:
    """A connection to a Typewriter server, opened on first use and again after the server closed it. `timeout`: per
    frame (None: as long as the connection lives); `retry`: a Retry, a number of attempts or True; `resumable`: a chat
    survives a dropped connection (it reconnects, with `retry`'s backoff or Retry's defaults, and resumes)."""

    def __init__(self, url: str = DEFAULT_URL, *, api_key: str | None = None, open_timeout: float = 10.0,
                 timeout: float | None = None, retry: Retry | int | bool | None = None, resumable: bool = True):
        self.url = ws_url(url)
        self.resumable = resumable
        self.open_timeout, self.timeout, self.retry = open_timeout, timeout, Retry.of(retry)
        self._headers = auth_headers(api_key)
        self._ws: ClientConnection | None = None
        self._current: AsyncChat | None = None
        self._ids = itertools.count(1)

    async def __aenter__(self) -> AsyncClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def connect(self) -> None:
        """Open the socket now rather than at the first chat (to fail early on a wrong URL or key)."""
        await self._connection()

    async def close(self) -> None:
        """Close the socket; a running chat is stopped first (a resumable one would run on for the server's grace)."""
        ws, self._ws, current, self._current = self._ws, None, self._current, None
        if current is not None and not current.done:
            current._state.error = ClientError("the client was closed before this chat ended")
            if ws is not None and current._state.sent:
                with contextlib.suppress(ConnectionClosed, OSError, TimeoutError):
                    await asyncio.wait_for(ws.send(encode(current._state.stop_frame())), STOP_SEND_S)
        if ws is not None:
            await ws.close()

    def chat(self, prompt: str | Sequence[Message], /, *, system: str | None = None, id: str | None = None,
             resumable: bool | None = None, **params: Unpack[Params]) -> AsyncChat:
        """A chat about `prompt`: a user message, or a list of {"role", "content"} messages ending with the user's."""
        return self._chat(lambda: messages_of(prompt, system), dict(params), id, resumable=resumable)

    async def complete(self, prompt: str | Sequence[Message], /, *, system: str | None = None,
                       **params: Unpack[Params]) -> Result:
        """The whole answer at once."""
        return await self.chat(prompt, system=system, **params).result()

    def conversation(self, system: str | None = None, **params: Unpack[Params]) -> AsyncConversation:
        return AsyncConversation(self, system, **params)

    def _chat(self, messages: Callable[[], list[Message]], params: dict[str, Any], chat_id: str | None = None,
              on_end: Callable[[Result], None] | None = None, resumable: bool | None = None) -> AsyncChat:
        return AsyncChat(self, chat_id or f"c{next(self._ids)}", messages, checked_params(params), on_end,
                         self.resumable if resumable is None else resumable)

    async def _connection(self) -> ClientConnection:
        if self._ws is None:
            try:
                self._ws = await connect(self.url, additional_headers=self._headers, open_timeout=self.open_timeout)
            except InvalidStatus as e:
                raise refused_error(e) from None
            except CONNECT_ERRORS as e:
                raise connect_error(self.url, e, self.open_timeout) from None
        return self._ws

    async def _send(self, frame: dict[str, Any]) -> None:
        ws = await self._connection()
        try:
            await ws.send(encode(frame))
        except ConnectionClosed as e:
            self._ws = None
            raise closed_error(e) from None

    async def _recv(self) -> dict[str, Any]:
        ws = await self._connection()
        try:
            return decode(await asyncio.wait_for(ws.recv(), self.timeout))
        except ConnectionClosed as e:
            self._ws = None
            raise closed_error(e) from None
        except TimeoutError:
            await self.close()  # the chat's state is unknown: closing cancels it on the server
            raise ChatTimeout(f"no frame from the server within {self.timeout} s; the connection is closed") from None

    async def _claim(self, chat: AsyncChat) -> None:
        previous, self._current = self._current, chat
        if previous is not None and previous is not chat and previous._state.sent and not previous.done:
            await previous.stop()
            try:
                await previous.result()
            except ClientError:
                pass  # it is over either way


class AsyncChat:
    """One chat: iterate it for text deltas, or `events()` for typed events; `stop()`; `result()`."""

    def __init__(self, client: AsyncClient, chat_id: str, messages: Callable[[], list[Message]],
                 params: dict[str, Any], on_end: Callable[[Result], None] | None, resumable: bool):
        self._client, self._messages, self._on_end = client, messages, on_end
        self._state = ChatState(chat_id, [], params, resumable)

    @property
    def id(self) -> str:
        return self._state.id

    @property
    def text(self) -> str:
        """The answer so far."""
        return self._state.text

    @property
    def done(self) -> bool:
        return self._state.over

    def __aiter__(self) -> AsyncChat:
        return self

    async def __anext__(self) -> str:
        while (event := await self._next()) is not None:
            if isinstance(event, TokenEvent):
                return event.text
        raise StopAsyncIteration

    def events(self) -> _Events:
        """Queued, Started, TokenEvent and Ended events, as the frames arrive."""
        return _Events(self)

    async def result(self) -> Result:
        """Read the chat to its end; its Result (raises the chat's error if it failed)."""
        while await self._next() is not None:
            pass
        return self._state.result()

    async def stop(self) -> None:
        """Ask the server to stop; reading goes on to the `end` frame (reason `cancelled`)."""
        state = self._state
        if state.over or state.stop_requested:
            return
        state.stop_requested = True
        if state.sent:
            try:
                await self._client._send(state.stop_frame())
            except ServerClosed:
                pass  # the next read raises it

    async def _next(self) -> Event | None:
        state = self._state
        while not state.over:
            try:
                if not state.sent:
                    await self._send_chat()
                event = state.feed(await self._client._recv())
            except ClientError as e:
                delay = state.retry_delay(e, self._client.retry)
                if delay is None:
                    state.error = e
                    raise
                await asyncio.sleep(delay)
                continue
            if isinstance(event, Ended) and self._on_end is not None:
                self._on_end(state.result())
            if event is not None:
                return event
        if state.error is not None:
            raise state.error
        return None

    async def _send_chat(self) -> None:
        state = self._state
        if state.tries == 0:
            await self._client._claim(self)
            state.messages = self._messages()
        state.tries += 1
        await self._client._send(state.request_frame())
        state.sent = True
        if state.stop_requested:  # stop() came before the chat was sent, or before the connection dropped
            await self._client._send(state.stop_frame())


class _Events:
    def __init__(self, chat: AsyncChat):
        self._chat = chat

    def __aiter__(self) -> _Events:
        return self

    async def __anext__(self) -> Event:
        event = await self._chat._next()
        if event is None:
            raise StopAsyncIteration
        return event


class AsyncConversation:
    """Each `say()` sends the history plus the question; both join `messages` once answered (if stopped, partly)."""

    def __init__(self, client: AsyncClient, system: str | None = None, **params: Unpack[Params]):
        self.client, self.params = client, dict(params)
        self._history = History(system)

    @property
    def messages(self) -> list[Message]:
        return [dict(m) for m in self._history.messages]

    def say(self, text: str, **params: Unpack[Params]) -> AsyncChat:
        return self.client._chat(lambda: self._history.asking(text), self.params | params,
                                 on_end=lambda result: self._history.answered(text, result))
