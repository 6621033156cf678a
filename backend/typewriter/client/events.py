"""Typed events mirroring protocol v1's server frames (match on them), and the result of a whole chat."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

REASONS = ("eos", "length", "stop_sequence", "tool_calls", "repetition", "cancelled", "resume_buffer_full", "timeout",
           "queue_timeout", "shutdown")


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class Timings:
    """Milliseconds waiting for a slot, to the first token and to the end; the decode speed after the first token."""

    queue_ms: float
    ttft_ms: float
    total_ms: float
    tokens_per_s: float


@dataclass(frozen=True)
class Queued:
    """Every slot is busy; `position` 1 is next. Arrives again whenever the position changes."""

    id: str
    position: int


@dataclass(frozen=True)
class Started:
    """The chat has a slot; `dropped_messages` of the oldest messages were left out to fit the model's context."""

    id: str
    prompt_tokens: int
    cached_tokens: int
    dropped_messages: int


@dataclass(frozen=True)
class TokenEvent:
    """New answer text; never retracted. `index` is the generated token's index and may skip."""

    id: str
    index: int
    text: str


@dataclass(frozen=True)
class ToolCallEvent:
    """A whole call of one of the chat's tools (`arguments`: JSON text); calls arrive before `Ended`."""

    id: str
    index: int
    call_id: str
    name: str
    arguments: str

    def as_message(self) -> dict[str, Any]:
        """As an assistant message's `tool_calls` entry, to send the conversation back with the call's result."""
        return {"id": self.call_id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class Ended:
    """The chat is over: `reason` is one of REASONS (`cancelled` after `stop()`)."""

    id: str
    reason: str
    usage: Usage
    timings: Timings


Event = Queued | Started | TokenEvent | ToolCallEvent | Ended


@dataclass(frozen=True)
class Result:
    """A whole chat: the answer's text (the partial text after a stop), why it ended, and what it cost."""

    id: str
    text: str
    reason: str
    usage: Usage
    timings: Timings
    started: Started | None = None  # None when the chat ended before it got a slot (queue_timeout, shutdown)
    tool_calls: tuple[ToolCallEvent, ...] = ()  # the calls the answer made, when the chat offered tools

    @property
    def cancelled(self) -> bool:
        return self.reason == "cancelled"


def parse_event(frame: dict[str, Any]) -> Event | None:
    kind = frame.get("type")
    if kind == "queued":
        return Queued(frame["id"], frame["position"])
    if kind == "start":
        return Started(frame["id"], frame["prompt_tokens"], frame.get("cached_tokens", 0),
                       frame.get("dropped_messages", 0))
    if kind == "token":
        return TokenEvent(frame["id"], frame["index"], frame["text"])
    if kind == "tool_call":
        return ToolCallEvent(frame["id"], frame["index"], frame["call_id"], frame["name"], frame["arguments"])
    if kind == "end":
        usage, timings = frame.get("usage", {}), frame.get("timings", {})
        return Ended(frame["id"], frame["reason"],
                     Usage(usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)),
                     Timings(*(float(timings.get(name, 0.0)) for name in ("queue_ms", "ttft_ms", "total_ms",
                                                                           "tokens_per_s"))))
    return None
