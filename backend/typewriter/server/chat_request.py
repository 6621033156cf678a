"""What a chat is, whatever door it came through, read from protocol v1's `chat` object by one set of strict rules:
an unknown field or parameter is refused with a named code, never dropped or changed, and every string must be text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, TypeGuard

from ..engine.request import Constraint, SamplingParams
from ..errors import InvalidRequest
from ..text.conversation import check_question
from .refusal import Refusal
from .structured import Tools, parse_response_format, parse_tools

MAX_ID_LENGTH = 64
MAX_INDEX = 2**31 - 1
ROLES = ("system", "user", "assistant", "tool")
PARAMS = ("max_new_tokens", "temperature", "top_p", "top_k", "repetition_penalty", "seed", "stop", "loop_guard")
CHAT_FIELDS = ("type", "id", "messages", "params", "response_format", "tools", "tool_choice", "resumable", "continue")

# A JSON escape of a UTF-16 surrogate: how a lone one (which no UTF-8 text holds) gets into parsed JSON.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE_ESCAPE_BYTES = re.compile(_SURROGATE_ESCAPE.pattern.encode())


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text of an object


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant's calls (content may then be "")
    tool_call_id: str | None = None  # a tool message's: the call it answers

    def as_dict(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [{"id": c.id, "type": "function",
                                      "function": {"name": c.name, "arguments": c.arguments}} for c in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


@dataclass(frozen=True)
class Continue:
    """The start of this chat's answer that the client already holds (a `chat` frame's `continue`)."""

    text: str
    ids: tuple[int, ...] | None  # the token ids it was streamed as, when the client kept them


@dataclass(frozen=True)
class Chat:
    id: str
    messages: tuple[ChatMessage, ...]
    params: dict[str, Any]  # validated names; values are checked when sampling params are built
    resumable: bool = False  # kept for a client that loses its socket
    answer_start: Continue | None = None
    response_format: Constraint | None = None
    tools: Tools | None = None
    n: int = 1  # answers to the same prompt
    logprobs: int | None = None  # alternatives per token, besides the token's own
    own_tools: bool = False  # the client sent tools or a tool_choice (even "none"): the server offers none of its own


def parse_chat(frame: dict[str, Any], max_messages: int) -> Chat:
    request_id = readable_id(frame.get("id"))
    refuse_unencodable(frame, request_id)
    return read_chat(frame, request_id, max_messages)


def read_chat(frame: dict[str, Any], request_id: str | None, max_messages: int) -> Chat:
    only_fields(frame, CHAT_FIELDS, request_id)
    chat_id = check_id(frame, request_id)
    raw_messages = frame.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise Refusal("invalid_request", "messages: must be a non-empty list of {role, content} objects", chat_id)
    if len(raw_messages) > max_messages:
        raise Refusal(
            "invalid_request", f"messages: at most {max_messages} messages per chat, got {len(raw_messages)}", chat_id)
    messages = tuple(_parse_message(i, m, chat_id) for i, m in enumerate(raw_messages))
    for i, m in enumerate(messages[1:], start=1):
        if m.role == "system":
            raise Refusal("invalid_request", f"messages[{i}].role: only the first message may be \"system\"",
                                chat_id)
    if messages[-1].role not in ("user", "tool"):
        raise Refusal("invalid_request", "messages: the last message must be the user's (or a tool's result)",
                            chat_id)
    try:
        if messages[-1].role == "user":
            check_question(messages[-1].content, f"messages[{len(messages) - 1}].content")
        response_format = parse_response_format(frame["response_format"]) if "response_format" in frame else None
        tools = parse_tools(frame.get("tools"), frame.get("tool_choice"))
    except InvalidRequest as e:
        raise Refusal("invalid_request", str(e), chat_id) from None
    if response_format is not None and tools is not None:
        raise Refusal("not_supported", "response_format: cannot be combined with tools; send one of them",
                            chat_id)
    params = frame.get("params", {})
    if not isinstance(params, dict):
        raise Refusal("invalid_request", "params: must be an object", chat_id)
    unknown = sorted(k for k in params if k not in PARAMS)
    if unknown:
        raise Refusal(
            "invalid_request", f"params.{unknown[0]}: unknown parameter; known: {', '.join(PARAMS)}", chat_id)
    resumable = frame.get("resumable", False)
    if not isinstance(resumable, bool):
        raise Refusal("invalid_request", "resumable: must be true or false", chat_id)
    answer_start = _parse_continue(frame["continue"], chat_id) if "continue" in frame else None
    return Chat(chat_id, messages, dict(params), resumable=resumable, answer_start=answer_start,
                response_format=response_format, tools=tools, own_tools="tools" in frame or "tool_choice" in frame)


def check_text(raw: str | bytes, value: object, request_id: str | None = None) -> None:
    """Refuse a value holding a lone surrogate ("\\udfff"), which JSON can carry and UTF-8 cannot. Only an escape in
    `raw`, what was decoded, can make one, so most frames are not walked."""
    if isinstance(raw, str):
        suspect = _SURROGATE_ESCAPE.search(raw) is not None or not encodable(raw)
    else:
        suspect = _SURROGATE_ESCAPE_BYTES.search(raw) is not None
    if suspect:
        refuse_unencodable(value, request_id)


def refuse_unencodable(value: object, request_id: str | None = None) -> None:
    if (where := unencodable(value)) is not None:
        raise Refusal("invalid_request", f"{where}: holds a lone surrogate (a \\ud800-\\udfff escape without "
                                               "its pair), which is not text; send UTF-8 text", request_id)


def unencodable(value: object) -> str | None:
    """Where (`params.stop[1]`) the first string UTF-8 cannot encode is, key or value. Iterative: frames nest deeply."""
    stack: list[tuple[str, object]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            if not encodable(item):
                return path or "the frame"
        elif isinstance(item, dict):
            for key, inner in item.items():
                if not encodable(key):
                    return f"a field name in {path or 'the frame'}"
                stack.append((f"{path}.{key}" if path else key, inner))
        elif isinstance(item, list):
            stack.extend((f"{path}[{i}]", inner) for i, inner in enumerate(item))
    return None


def sampling_params(chat: Chat, default_max_new_tokens: int, max_new_tokens_cap: int,
                    timeout_s: float | None, default_repetition_penalty: float) -> SamplingParams:
    """The chat's params over the server's defaults; an out-of-range value is `invalid_request`, never clamped."""
    values = {"max_new_tokens": default_max_new_tokens, "repetition_penalty": default_repetition_penalty,
              **chat.params}
    max_new = values["max_new_tokens"]
    if isinstance(max_new, int) and not isinstance(max_new, bool) and max_new > max_new_tokens_cap:
        raise Refusal(
            "invalid_request", f"params.max_new_tokens: this server allows at most {max_new_tokens_cap}, got {max_new}",
            chat.id)
    try:
        return SamplingParams(**values, timeout_s=timeout_s, constraint=chat.response_format, logprobs=chat.logprobs)
    except InvalidRequest as e:
        raise Refusal("invalid_request", f"params.{e}", chat.id) from None


def _parse_continue(value: object, chat_id: str) -> Continue:
    if not isinstance(value, dict):
        raise Refusal("invalid_request", "continue: must be an object {\"text\", \"ids\"}", chat_id)
    extra = sorted(k for k in value if k not in ("text", "ids"))
    if extra:
        raise Refusal("invalid_request", f"continue.{extra[0]}: unknown field; known: text, ids", chat_id)
    text, ids = value.get("text"), value.get("ids")
    if not isinstance(text, str) or not text:
        raise Refusal("invalid_request", "continue.text: must be the answer's text so far, a non-empty string",
                            chat_id)
    if ids is not None and not (isinstance(ids, list) and ids and all(is_index(i) for i in ids)):
        raise Refusal("invalid_request", "continue.ids: must be a non-empty list of token ids (integers "
                                               "from 0), as the token frames' ids gave them", chat_id)
    return Continue(text, tuple(ids) if ids is not None else None)


def is_index(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_INDEX


def _parse_message(i: int, message: object, chat_id: str) -> ChatMessage:
    if not isinstance(message, dict):
        raise Refusal("invalid_request", f"messages[{i}]: must be an object with role and content", chat_id)
    known = {"assistant": ("role", "content", "tool_calls"), "tool": ("role", "content", "tool_call_id")}
    role = message.get("role")
    fields = known.get(role, ("role", "content")) if isinstance(role, str) else ("role", "content")
    extra = sorted(k for k in message if k not in fields)
    if extra:
        raise Refusal("invalid_request", f"messages[{i}].{extra[0]}: unknown field; known: {', '.join(fields)}",
                            chat_id)
    role, content = message.get("role"), message.get("content")
    if role not in ROLES:
        raise Refusal("invalid_request",
                            f"messages[{i}].role: must be one of {', '.join(ROLES)}, got {short(role)}", chat_id)
    calls = message.get("tool_calls") or []
    if content is None and calls:
        content = ""
    if not isinstance(content, str):
        raise Refusal("invalid_request", f"messages[{i}].content: must be a string", chat_id)
    try:
        tool_calls = tuple(parse_tool_call(f"messages[{i}].tool_calls[{j}]", c) for j, c in enumerate(calls)) \
            if isinstance(calls, list) else None
    except InvalidRequest as e:
        raise Refusal("invalid_request", str(e), chat_id) from None
    if tool_calls is None:
        raise Refusal("invalid_request", f"messages[{i}].tool_calls: must be a list", chat_id)
    call_id = message.get("tool_call_id")
    if role == "tool" and not (isinstance(call_id, str) and call_id):
        raise Refusal("invalid_request", f"messages[{i}].tool_call_id: must name the call this result answers",
                            chat_id)
    return ChatMessage(role, content, tool_calls, call_id)


def parse_tool_call(where: str, call: object) -> ToolCall:
    """An assistant's earlier call, in OpenAI's shape: {"id", "type": "function", "function": {name, arguments}}."""
    if not isinstance(call, dict) or call.get("type", "function") != "function" \
            or not isinstance(call.get("function"), dict):
        raise InvalidRequest(where, 'must be {"id", "type": "function", "function": {"name", "arguments"}}')
    function = call["function"]
    name, arguments, call_id = function.get("name"), function.get("arguments"), call.get("id")
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"{where}.function.name", "must be the called function's name")
    if not isinstance(call_id, str) or not call_id:
        raise InvalidRequest(f"{where}.id", "must be the call's id")
    if not isinstance(arguments, str):
        raise InvalidRequest(f"{where}.function.arguments", "must be JSON text of an object")
    try:
        if not isinstance(json.loads(arguments), dict):
            raise ValueError("not an object")
    except (ValueError, RecursionError):  # RecursionError: brackets nested thousands deep fit in a small body
        raise InvalidRequest(f"{where}.function.arguments", "must be JSON text of an object") from None
    return ToolCall(call_id, name, arguments)


def only_fields(frame: dict[str, Any], allowed: tuple[str, ...], request_id: str | None) -> None:
    extra = sorted(k for k in frame if k not in allowed)
    if extra:
        raise Refusal(
            "invalid_request", f"{extra[0]}: unknown field for type {frame['type']!r}; known: {', '.join(allowed)}",
            request_id)


def check_id(frame: dict[str, Any], request_id: str | None) -> str:
    if request_id is None:
        raise Refusal("invalid_request", f"id: must be a string of 1 to {MAX_ID_LENGTH} characters, "
                                               f"got {short(frame.get('id'))}")
    return request_id


def readable_id(value: object) -> str | None:
    """The id to echo in an error: only a well-formed one, so a client never sees an id it did not send."""
    if isinstance(value, str) and 1 <= len(value) <= MAX_ID_LENGTH and encodable(value):
        return value
    return None


def encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def short(value: object) -> str:
    try:
        text = repr(value)
    except RecursionError:
        return "a deeply nested value"
    return text if len(text) <= 80 else text[:77] + "..."
