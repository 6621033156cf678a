"""Protocol v1 (docs/protocol.md): client frames parsed into typed messages, server frames built as dicts. Nothing
here knows about sockets or the engine; a `chat` frame's body is read by chat_request.py, as every door's chat is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ...engine.request import Finished, FinishReason
from ..chat_request import MAX_INDEX, Chat, check_id, check_text, is_index, only_fields, read_chat, readable_id, short
from ..refusal import ERROR_CODES, Refusal

MAX_TOKEN_LENGTH = 128  # a resume token is 43 characters; anything far longer is not one

CLOSE_UNSUPPORTED_DATA = 1003  # a binary frame
CLOSE_POLICY_VIOLATION = 1008  # a cross-origin handshake, or a flood of frames
CLOSE_MESSAGE_TOO_BIG = 1009  # a frame over max_message_bytes
CLOSE_INTERNAL_ERROR = 1011  # a frame for this socket could not be sent; its chat was cancelled
CLOSE_SERVICE_RESTART = 1012  # the server is shutting down: reconnect in a moment
CLOSE_TRY_AGAIN_LATER = 1013  # the model is still loading, or failed to load


@dataclass(frozen=True)
class Resume:
    id: str
    token: str
    first_index: int  # the first token index the client has not seen


@dataclass(frozen=True)
class Stop:
    id: str


@dataclass(frozen=True)
class Ping:
    pass


ClientMessage = Chat | Stop | Ping | Resume


def parse_frame(text: str, max_messages: int) -> ClientMessage:
    try:
        frame = json.loads(text, parse_constant=_reject_constant)
    except ValueError as e:
        raise Refusal("invalid_json", f"the frame is not valid JSON: {e}") from None
    except RecursionError:  # a few thousand "[" fit in a frame
        raise Refusal("invalid_json", "the frame nests arrays or objects too deeply") from None
    if not isinstance(frame, dict):
        raise Refusal("invalid_request", "a frame must be a JSON object with a \"type\" field")
    request_id = readable_id(frame.get("id"))
    check_text(text, frame, request_id)
    kind = frame.get("type")
    if kind == "chat":
        return read_chat(frame, request_id, max_messages)
    if kind == "stop":
        only_fields(frame, ("type", "id"), request_id)
        return Stop(check_id(frame, request_id))
    if kind == "ping":
        only_fields(frame, ("type",), request_id)
        return Ping()
    if kind == "resume":
        return _parse_resume(frame, request_id)
    raise Refusal("invalid_request", f"type: must be \"chat\", \"stop\", \"ping\" or \"resume\", got "
                                           f"{short(kind)}", request_id)


def _parse_resume(frame: dict[str, Any], request_id: str | None) -> Resume:
    only_fields(frame, ("type", "id", "token", "from"), request_id)
    chat_id = check_id(frame, request_id)
    token, first = frame.get("token"), frame.get("from")
    if not isinstance(token, str) or not 1 <= len(token) <= MAX_TOKEN_LENGTH:
        raise Refusal("invalid_request", "token: must be the resume_token of the chat's start frame", chat_id)
    if not is_index(first):
        raise Refusal("invalid_request", f"from: must be the index after the last token you have (0 if "
                                               f"none), an integer from 0 to {MAX_INDEX}, got {short(first)}",
                            chat_id)
    return Resume(chat_id, token, first)


def queued(request_id: str, position: int) -> dict[str, Any]:
    return {"type": "queued", "id": request_id, "position": position}


def resumed(request_id: str) -> dict[str, Any]:
    return {"type": "resumed", "id": request_id}


def start(request_id: str, prompt_tokens: int, cached_tokens: int = 0, dropped_messages: int = 0) -> dict[str, Any]:
    return {"type": "start", "id": request_id, "prompt_tokens": prompt_tokens, "cached_tokens": cached_tokens,
            "dropped_messages": dropped_messages}


def token(request_id: str, index: int, text: str) -> dict[str, Any]:
    return {"type": "token", "id": request_id, "index": index, "text": text}


def tool_call(request_id: str, index: int, call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"type": "tool_call", "id": request_id, "index": index, "call_id": call_id, "name": name,
            "arguments": arguments}


def tool_step(request_id: str, index: int, name: str, expression: str, result: str,
              error: str | None) -> dict[str, Any]:
    return {"type": "tool_step", "id": request_id, "index": index, "name": name, "expression": expression,
            "result": result, "error": error}


def end(request_id: str, finished: Finished, tool_calls: bool = False) -> dict[str, Any]:
    """`tool_calls`: the answer called tools, so that its reason, if it ended of itself, is `tool_calls`."""
    assert finished.reason not in (FinishReason.ERROR, FinishReason.CONSTRAINT)  # each an `error` frame
    t = finished.timings
    natural = finished.reason in (FinishReason.EOS, FinishReason.STOP_SEQUENCE)
    return {
        "type": "end",
        "id": request_id,
        "reason": "tool_calls" if tool_calls and natural else finished.reason.value,
        "usage": {"prompt_tokens": finished.prompt_tokens, "completion_tokens": finished.completion_tokens},
        "timings": {"queue_ms": round(t.queue_ms, 3), "ttft_ms": round(t.ttft_ms, 3),
                    "total_ms": round(t.total_ms, 3), "tokens_per_s": round(t.tokens_per_s, 3)},
    }


def error(code: str, message: str, request_id: str | None = None) -> dict[str, Any]:
    assert code in ERROR_CODES, code
    return {"type": "error", "id": request_id, "code": code, "message": message}


def pong() -> dict[str, Any]:
    return {"type": "pong"}


def encode(frame: dict[str, Any]) -> str:
    return json.dumps(frame, ensure_ascii=False, separators=(",", ":"))


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")
