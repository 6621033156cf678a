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

from .errors import CLOSE_ABNORMAL, CLOSE_TRY_AGAIN_LATER, ChatError, ConnectFailed, HandshakeRefused, ServerClosed
from .events import Ended, Event, Result, Started, TokenEvent, ToolCallEvent, parse_event

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


class ChatState:
    """One chat as its frames arrive: the text so far, its start and end, and whether to try it again."""

    def __init__(self, chat_id: str, messages: list[Message], params: dict[str, Any]):
        self.id, self.messages, self.params = chat_id, messages, params
        self.parts: list[str] = []
        self.tool_calls: list[ToolCallEvent] = []
        self.started: Started | None = None
        self.ended: Ended | None = None
        self.error: Exception | None = None
        self.answered = False  # a frame about this chat arrived: from then on it is never retried
        self.tries = 0
        self.stop_requested = False

    def chat_frame(self) -> dict[str, Any]:
        frame: dict[str, Any] = {"type": "chat", "id": self.id, "messages": self.messages}
        params = {k: v for k, v in self.params.items() if k not in FRAME_OPTIONS}
        if params:
            frame["params"] = params
        frame |= {k: v for k, v in self.params.items() if k in FRAME_OPTIONS}
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
        """None for a frame about something else (a pong, an earlier chat's); raises an error frame as ChatError."""
        if frame.get("type") == "error":
            if frame.get("id") not in (self.id, None):
                return None
            if frame.get("code") == "not_found" and self.stop_requested:
                return None  # the stop crossed the end on the wire
            raise ChatError(str(frame.get("code", "internal")), str(frame.get("message", "")), frame.get("id"))
        if frame.get("id") != self.id or (event := parse_event(frame)) is None:
            return None
        self.answered = True
        if isinstance(event, Started):
            self.started = event
        elif isinstance(event, TokenEvent):
            self.parts.append(event.text)
        elif isinstance(event, ToolCallEvent):
            self.tool_calls.append(event)
        elif isinstance(event, Ended):
            self.ended = event
        return event

    def retry_delay(self, error: Exception, policy: Retry | None) -> float | None:
        """Seconds to wait before sending the chat again after `error`, or None to raise it."""
        if policy is None or not retryable(error) or self.answered or self.stop_requested:
            return None
        if self.tries >= policy.attempts:
            return None
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
