"""The sync client: the same API as aio.py without `await`; `stop()` may also be called from another thread."""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Unpack

from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

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


class Client:
    """A connection to a Typewriter server, opened on first use and again after the server closed it.
    The arguments are AsyncClient's: `url`, `api_key`, `open_timeout`, `timeout` (per frame), `retry`, `resumable`."""

    def __init__(self, url: str = DEFAULT_URL, *, api_key: str | None = None, open_timeout: float = 10.0,
                 timeout: float | None = None, retry: Retry | int | bool | None = None, resumable: bool = True):
        self.url = ws_url(url)
        self.resumable = resumable
        self.open_timeout, self.timeout, self.retry = open_timeout, timeout, Retry.of(retry)
        self._headers = auth_headers(api_key)
        self._ws: ClientConnection | None = None
        self._current: Chat | None = None
        self._ids = itertools.count(1)

    def __enter__(self) -> Client:
        self.connect()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def connect(self) -> None:
        """Open the socket now rather than at the first chat (to fail early on a wrong URL or key)."""
        self._connection()

    def close(self) -> None:
        """Close the socket; a running chat is stopped first (a resumable one would run on for the server's grace)."""
        ws, self._ws, current, self._current = self._ws, None, self._current, None
        if current is not None and not current.done:
            current._state.error = ClientError("the client was closed before this chat ended")
            if ws is not None and current._state.sent:
                with contextlib.suppress(ConnectionClosed, OSError, TimeoutError):
                    ws.send(encode(current._state.stop_frame()))
        if ws is not None:
            ws.__exit__(None, None, None)

    def chat(self, prompt: str | Sequence[Message], /, *, system: str | None = None, id: str | None = None,
             resumable: bool | None = None, **params: Unpack[Params]) -> Chat:
        """A chat about `prompt`: a user message, or a list of {"role", "content"} messages ending with the user's."""
        return self._chat(lambda: messages_of(prompt, system), dict(params), id, resumable=resumable)

    def complete(self, prompt: str | Sequence[Message], /, *, system: str | None = None,
                 **params: Unpack[Params]) -> Result:
        """The whole answer at once."""
        return self.chat(prompt, system=system, **params).result()

    def conversation(self, system: str | None = None, **params: Unpack[Params]) -> Conversation:
        return Conversation(self, system, **params)

    def _chat(self, messages: Callable[[], list[Message]], params: dict[str, Any], chat_id: str | None = None,
              on_end: Callable[[Result], None] | None = None, resumable: bool | None = None) -> Chat:
        return Chat(self, chat_id or f"c{next(self._ids)}", messages, checked_params(params), on_end,
                    self.resumable if resumable is None else resumable)

    def _connection(self) -> ClientConnection:
        if self._ws is None:
            try:
                opening = connect(self.url, additional_headers=self._headers, open_timeout=self.open_timeout)
                self._ws = opening.__enter__()  # held open across calls; close() exits it
            except InvalidStatus as e:
                raise refused_error(e) from None
            except CONNECT_ERRORS as e:
                raise connect_error(self.url, e, self.open_timeout) from None
        return self._ws

    def _send(self, frame: dict[str, Any]) -> None:
        ws = self._connection()
        try:
            ws.send(encode(frame))
        except ConnectionClosed as e:
            self._ws = None
            raise closed_error(e) from None

    def _recv(self) -> dict[str, Any]:
        ws = self._connection()
        try:
            return decode(ws.recv(timeout=self.timeout))
        except ConnectionClosed as e:
            self._ws = None
            raise closed_error(e) from None
        except TimeoutError:
            self.close()  # the chat's state is unknown: closing cancels it on the server
            raise ChatTimeout(f"no frame from the server within {self.timeout} s; the connection is closed") from None

    def _claim(self, chat: Chat) -> None:
        previous, self._current = self._current, chat
        if previous is not None and previous is not chat and previous._state.sent and not previous.done:
            previous.stop()
            try:
                previous.result()
            except ClientError:
                pass  # it is over either way


class Chat:
    """One chat: iterate it for text deltas, or `events()` for typed events; `stop()`; `result()`."""

    def __init__(self, client: Client, chat_id: str, messages: Callable[[], list[Message]], params: dict[str, Any],
                 on_end: Callable[[Result], None] | None, resumable: bool):
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

    def __iter__(self) -> Iterator[str]:
        return (event.text for event in self.events() if isinstance(event, TokenEvent))

    def events(self) -> Iterator[Event]:
        """Queued, Started, TokenEvent and Ended events, as the frames arrive."""
        return iter(self._next, None)

    def result(self) -> Result:
        """Read the chat to its end; its Result (raises the chat's error if it failed)."""
        while self._next() is not None:
            pass
        return self._state.result()

    def stop(self) -> None:
        """Ask the server to stop; reading goes on to the `end` frame (reason `cancelled`)."""
        state = self._state
        if state.over or state.stop_requested:
            return
        state.stop_requested = True
        if state.sent:
            try:
                self._client._send(state.stop_frame())
            except ServerClosed:
                pass  # the next read raises it

    def _next(self) -> Event | None:
        state = self._state
        while not state.over:
            try:
                if not state.sent:
                    self._send_chat()
                event = state.feed(self._client._recv())
            except ClientError as e:
                delay = state.retry_delay(e, self._client.retry)
                if delay is None:
                    state.error = e
                    raise
                time.sleep(delay)
                continue
            if isinstance(event, Ended) and self._on_end is not None:
                self._on_end(state.result())
            if event is not None:
                return event
        if state.error is not None:
            raise state.error
        return None

    def _send_chat(self) -> None:
        state = self._state
        if state.tries == 0:
            self._client._claim(self)
            state.messages = self._messages()
        state.tries += 1
        self._client._send(state.request_frame())
        state.sent = True
        if state.stop_requested:  # stop() came before the chat was sent, or before the connection dropped
            self._client._send(state.stop_frame())


class Conversation:
    """Each `say()` sends the history plus the question; both join `messages` once answered (if stopped, partly)."""

    def __init__(self, client: Client, system: str | None = None, **params: Unpack[Params]):
        self.client, self.params = client, dict(params)
        self._history = History(system)

    @property
    def messages(self) -> list[Message]:
        return [dict(m) for m in self._history.messages]

    def say(self, text: str, **params: Unpack[Params]) -> Chat:
        return self.client._chat(lambda: self._history.asking(text), self.params | params,
                                 on_end=lambda result: self._history.answered(text, result))
