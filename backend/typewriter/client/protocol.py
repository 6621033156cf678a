"""Protocol v1 from the client's side, without I/O, so that the async and sync clients only move frames between a
socket and these."""

from __future__ import annotations

import json
import random
import socket
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypedDict
from urllib.parse import urlsplit, urlunsplit

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI

from .errors import (
    CLOSE_ABNORMAL,
    CLOSE_MESSAGE_TOO_BIG,
    CLOSE_TRY_AGAIN_LATER,
    CLOSE_UNSUPPORTED_DATA,
    ChatError,
    ConnectFailed,
    HandshakeRefused,
    ServerClosed,
)
from .events import Ended, Event, Queued, Result, Started, Timings, TokenEvent, ToolCallEvent, Usage, parse_event

DEFAULT_URL = "http://127.0.0.1:8000"
SCHEMES = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}
MAX_RETRY_ATTEMPTS = 20
MAX_RETRY_DELAY_S = 60.0

# {"role", "content"}, an assistant's with "tool_calls", a tool's with "tool_call_id" (OpenAI's shapes)
Message = dict[str, Any]


class Params(TypedDict, total=False):
    """Sampling parameters of a chat, and what its answer must keep to; the server checks each value and refuses
    one out of range. `response_format`, `tools` and `tool_choice` take OpenAI's shapes (docs/protocol.md)."""

    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: int
    repetition_penalty: float
    seed: int | None
    stop: str | Sequence[str]
    loop_guard: bool
    response_format: dict[str, Any]
    tools: list[dict[str, Any]]
    tool_choice: str | dict[str, Any]


PARAMS = tuple(Params.__annotations__)
FRAME_OPTIONS = ("response_format", "tools", "tool_choice")  # sent beside `params` in the chat frame


def ws_url(url: str) -> str:
    """The socket's URL for a server's base URL: http -> ws, https -> wss, and the path /ws unless given."""
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES or not parts.netloc:
        raise ValueError(f"{url!r}: give the server's address as http://HOST:PORT (or https://, ws://, wss://)")
    path = parts.path if parts.path.endswith("/ws") else parts.path.rstrip("/") + "/ws"
    return urlunsplit((SCHEMES[parts.scheme], parts.netloc, path, parts.query, ""))


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def checked_params(params: dict[str, Any]) -> dict[str, Any]:
    """Known names only (a typo is a TypeError here, not a round trip), None left out, a stop string as a list."""
    unknown = sorted(set(params) - set(PARAMS))
    if unknown:
        raise TypeError(f"unknown chat parameter {unknown[0]!r}; known: {', '.join(PARAMS)}")
    sent = {name: value for name, value in params.items() if value is not None}
    if isinstance(sent.get("stop"), str):
        sent["stop"] = [sent["stop"]]
    elif "stop" in sent:
        sent["stop"] = list(sent["stop"])
    return sent


def messages_of(prompt: str | Sequence[Message], system: str | None = None) -> list[Message]:
    """A chat's messages: a prompt string is one user message; `system` goes first."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    return messages


def encode(frame: dict[str, Any]) -> str:
    return json.dumps(frame, ensure_ascii=False, allow_nan=False)


def decode(text: str | bytes) -> dict[str, Any]:
    try:
        frame = json.loads(text)
    except ValueError:
        raise ChatError("invalid_frame", f"the server sent a frame that is not JSON: {text!r:.200}") from None
    if not isinstance(frame, dict):
        raise ChatError("invalid_frame", f"the server sent a frame that is not a JSON object: {text!r:.200}")
    return frame


def closed_error(e: ConnectionClosed) -> ServerClosed:
    if e.rcvd is None:
        return ServerClosed(CLOSE_ABNORMAL, "the connection broke")
    return ServerClosed(e.rcvd.code, e.rcvd.reason)


# What opening a socket raises, other than an HTTP refusal (InvalidStatus, which is HandshakeRefused).
CONNECT_ERRORS = (OSError, InvalidHandshake, InvalidURI)


def connect_error(url: str, e: Exception, open_timeout: float) -> ConnectFailed:
    parts = urlsplit(url)
    host, port = parts.hostname, parts.port or (443 if parts.scheme in ("wss", "https") else 80)
    if isinstance(e, ConnectionRefusedError):
        reason = f"connection refused: nothing listens on port {port} of {host}; is the server running on this port?"
    elif isinstance(e, socket.gaierror):
        reason = f"the host name {host!r} does not resolve ({e.strerror})"
    elif isinstance(e, TimeoutError):
        reason = f"no handshake within {open_timeout} s (open_timeout)"
    elif isinstance(e, ssl.SSLError):
        reason = f"TLS failed ({e.reason or e}); is it an https:// or wss:// server?"
    elif isinstance(e, InvalidURI):
        reason = f"not a WebSocket URL ({e})"
    elif isinstance(e, InvalidHandshake):
        reason = f"what answered is not a WebSocket server ({e}); is this a Typewriter server's address?"
    else:
        reason = f"{e.strerror or e}" if isinstance(e, OSError) else str(e)
    return ConnectFailed(url, reason)


def refused_error(e: InvalidStatus) -> HandshakeRefused:
    """The HTTP refusal of a handshake, with the server's `{"error": {"code", "message"}}` when it sent one."""
    status, body = e.response.status_code, e.response.body or b""
    try:
        error = json.loads(body)["error"]
        return HandshakeRefused(status, str(error["code"]), str(error["message"]))
    except (ValueError, KeyError, TypeError):
        return HandshakeRefused(status, f"http_{status}", body.decode(errors="replace")[:200] or "no reason given")


@dataclass(frozen=True)
class Retry:
    """Retry a chat turned away before an answer (`overloaded`, close 1013); `attempts` counts the first try. `jitter`
    takes up to half off each wait, so that clients turned away together do not come back together."""

    attempts: int = 5
    backoff_s: float = 0.5
    max_backoff_s: float = 10.0
    jitter: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.attempts <= MAX_RETRY_ATTEMPTS:
            raise ValueError(f"Retry.attempts: must be from 1 to {MAX_RETRY_ATTEMPTS}, got {self.attempts}")
        if not 0 <= self.backoff_s <= self.max_backoff_s <= MAX_RETRY_DELAY_S:
            raise ValueError(f"Retry: need 0 <= backoff_s <= max_backoff_s <= {MAX_RETRY_DELAY_S}, got "
                             f"backoff_s={self.backoff_s}, max_backoff_s={self.max_backoff_s}")

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry number `retry` (1 for the first)."""
        delay: float = min(self.max_backoff_s, self.backoff_s * 2 ** (retry - 1))
        return delay * random.uniform(0.5, 1.0) if self.jitter else delay

    @staticmethod
    def of(retry: Retry | int | bool | None) -> Retry | None:
        """`retry=` as given to a client: a Retry, a number of attempts, True for the defaults, or None/False."""
        if retry is None or retry is False:
            return None
        if retry is True:
            return Retry()
        if isinstance(retry, int):
            return Retry(attempts=retry)
        if isinstance(retry, Retry):
            return retry
        raise TypeError(f"retry: give a Retry, a number of attempts, True or None, not {retry!r}")


def retryable(error: Exception) -> bool:
    return (isinstance(error, ChatError) and error.code == "overloaded") or (
        isinstance(error, ServerClosed) and error.close_code == CLOSE_TRY_AGAIN_LATER)


def dropped(error: Exception) -> bool:
    """The connection was lost, or could not be opened again: not closed for a frame this client sent (1003, 1009),
    which sending again would repeat."""
    if isinstance(error, ServerClosed):
        return error.close_code not in (CLOSE_UNSUPPORTED_DATA, CLOSE_MESSAGE_TOO_BIG)
    return isinstance(error, ConnectFailed)


class ChatState:
    """One chat as its frames arrive: the text so far, its start and end, and whether to try it again.

    A resumable chat also keeps what resuming needs (protocol v1, "Resuming an answer"): the `resume_token` of its
    `queued` or `start` frame, the first token index it lacks and the token ids of its text. After its connection
    drops, `request_frame` is a `resume` while a server may keep the chat, else the chat again with `continue`."""

    def __init__(self, chat_id: str, messages: list[Message], params: dict[str, Any], resumable: bool = False):
        self.id, self.messages, self.params, self.resumable = chat_id, messages, params, resumable
        self.parts: list[str] = []
        self.tool_calls: list[ToolCallEvent] = []
        self.started: Started | None = None
        self.ended: Ended | None = None
        self.error: Exception | None = None
        self.answered = False  # a frame about this chat arrived: from then on it is never retried, only resumed
        self.tries = 0
        self.sent = False  # the request is out on the current connection
        self.stop_requested = False
        self.token = ""  # the resume token; "" while no server is known to keep the chat
        self.next_index = 0  # the first token index not received
        self.ids: list[int] = []  # the token ids of the text received, from index 0 on
        self.dropped = False  # its connection dropped once: the next request takes the chat up again
        self.resuming = False  # the request out is a `resume`
        self.reconnects = 0  # reconnects in a row with no frame of the chat since

    def chat_frame(self) -> dict[str, Any]:
        frame: dict[str, Any] = {"type": "chat", "id": self.id, "messages": self.messages}
        params = {k: v for k, v in self.params.items() if k not in FRAME_OPTIONS}
        if params:
            frame["params"] = params
        frame |= {k: v for k, v in self.params.items() if k in FRAME_OPTIONS}
        if self.resumable:
            frame["resumable"] = True
        return frame

    def request_frame(self) -> dict[str, Any]:
        """The frame that sends the chat: at first the chat; after a drop a `resume` from the first token this client
        lacks while a server may keep it, else the chat again, continued after the text so far (the ids with it when
        they cover it, so that a greedy answer goes on exactly as it would have)."""
        self.resuming = self.dropped and bool(self.token)
        if self.resuming:
            return {"type": "resume", "id": self.id, "token": self.token, "from": self.next_index}
        frame = self.chat_frame()
        if self.dropped and self.parts:
            ids = {"ids": self.ids} if len(self.ids) == self.next_index else {}
            frame["continue"] = {"text": self.text} | ids
        return frame

    def stop_frame(self) -> dict[str, Any]:
        return {"type": "stop", "id": self.id}

    @property
    def over(self) -> bool:
        return self.ended is not None or self.error is not None

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def feed(self, frame: dict[str, Any]) -> Event | None:
        """None for a frame about something else (a pong, an earlier chat's) or already had (a resumed chat's);
        raises an error frame as ChatError."""
        if frame.get("type") == "error":
            if frame.get("id") not in (self.id, None):
                return None
            if frame.get("code") == "not_found" and self.resuming:
                return self._not_kept()
            if frame.get("code") == "not_found" and self.stop_requested:
                return None  # the stop crossed the end on the wire
            raise ChatError(str(frame.get("code", "internal")), str(frame.get("message", "")), frame.get("id"))
        if frame.get("id") != self.id:
            return None
        if frame.get("type") == "resumed":
            self.resuming, self.reconnects = False, 0
            return None
        if (event := parse_event(frame)) is None:
            return None
        self.answered = True
        if isinstance(event, (Queued, Started)):
            self.token = str(frame.get("resume_token") or self.token)
            if self.started is not None:
                return None  # a continuation's own queue and start: this answer is already under way
        if isinstance(event, Started):
            self.started = event
        elif isinstance(event, TokenEvent):
            if event.index < self.next_index:
                return None  # replayed, and already had
            self.next_index = event.index + 1
            self.ids += frame.get("ids") or []
            self.reconnects = 0
            self.parts.append(event.text)
        elif isinstance(event, ToolCallEvent):
            self.tool_calls.append(event)
        elif isinstance(event, Ended):
            self.ended = event
        return event

    def _not_kept(self) -> Ended | None:
        """A `resume` answered `not_found`: no server keeps the chat (it ended long ago, or another replica or a
        restart had it). Stopped, it is over with the text it has; else it is sent again, continued."""
        self.token, self.resuming, self.sent = "", False, False
        if not self.stop_requested:
            return None
        prompt = self.started.prompt_tokens if self.started is not None else 0
        self.ended = Ended(self.id, "cancelled", Usage(prompt, self.next_index), Timings(0.0, 0.0, 0.0, 0.0))
        return self.ended

    def resume_delay(self, error: Exception, policy: Retry | None) -> float | None:
        """Seconds to wait before taking this chat up again on a new connection after `error`, or None to raise it.
        Only a resumable chat that has had a frame of its own is resumed: before that, nothing says whether the server
        took it, and sending it again might run it twice. `policy` (else Retry's defaults) bounds the reconnects in
        a row that bring no frame of the chat."""
        overloaded = isinstance(error, ChatError) and error.code == "overloaded"  # a continuation turned away
        if not self.resumable or not (self.answered or self.dropped) or self.over:
            return None
        if not (dropped(error) or (overloaded and self.dropped)):
            return None
        policy = policy or Retry()
        if self.reconnects >= policy.attempts:
            return None
        self.reconnects += 1
        self.dropped, self.sent = True, False
        return policy.delay(self.reconnects)

    def retry_delay(self, error: Exception, policy: Retry | None) -> float | None:
        """Seconds to wait before sending the chat again after `error` (resuming it, if it is resumable and was
        dropped), or None to raise it."""
        resume = self.resume_delay(error, policy)
        if resume is not None:
            return resume
        if policy is None or not retryable(error) or self.answered or self.stop_requested:
            return None
        if self.tries >= policy.attempts:
            return None
        self.sent = False
        return policy.delay(self.tries)

    def result(self) -> Result:
        if self.error is not None:
            raise self.error
        if self.ended is None:
            raise RuntimeError(f"chat {self.id} has not ended yet")
        return Result(self.id, self.text, self.ended.reason, self.ended.usage, self.ended.timings, self.started,
                      tuple(self.tool_calls))


class History:
    def __init__(self, system: str | None = None, messages: Sequence[Message] = ()):
        self.messages: list[Message] = messages_of(list(messages), system)

    def asking(self, text: str) -> list[Message]:
        return [*self.messages, {"role": "user", "content": text}]

    def answered(self, text: str, result: Result) -> None:
        """Append the question and its answer (the partial one after a stop), with the tool calls it made."""
        answer: Message = {"role": "assistant", "content": result.text}
        if result.tool_calls:
            answer["tool_calls"] = [call.as_message() for call in result.tool_calls]
        self.messages += [{"role": "user", "content": text}, answer]
