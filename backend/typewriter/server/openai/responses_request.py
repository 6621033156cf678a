"""A `POST /v1/responses` body read into a protocol v1 chat (docs/openai.md). The server keeps no response, so
`store: true`, `previous_response_id` and the like are refused by name: the conversation comes in `input`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from ...engine.request import MAX_TOP_LOGPROBS, Constraint
from ...errors import InvalidRequest
from ..chat_request import Chat, ChatMessage, parse_tool_call, short
from ..structured import parse_response_format, parse_tools
from .completions_request import BadField, read_object, text_content

SAMPLING = {"max_output_tokens": "max_new_tokens", "temperature": "temperature", "top_p": "top_p",
            "top_k": "top_k", "repetition_penalty": "repetition_penalty", "seed": "seed", "stop": "stop"}
HONOURED = ("model", "input", "instructions", "stream", "text", "tools", "tool_choice", "include", "top_logprobs",
            "store", "previous_response_id", "conversation", "background", *SAMPLING)
IGNORED = ("user", "metadata", "service_tier", "parallel_tool_calls", "prompt_cache_key", "safety_identifier",
           "reasoning", "truncation", "max_tool_calls", "stream_options")
LOGPROBS_INCLUDE = "message.output_text.logprobs"
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


@dataclass(frozen=True)
class ResponsesRequest:
    chat: Chat
    stream: bool
    model: str | None
    echo: dict[str, Any]  # request fields the response repeats (tools, tool_choice, text, ...)
    names: dict[str, str]  # our param name -> the field it came from


def parse_body(body: bytes, max_messages: int) -> ResponsesRequest:
    fields = read_object(body, "input")
    unknown = sorted(k for k in fields if k not in HONOURED and k not in IGNORED)
    if unknown:
        raise BadField(unknown[0], "unknown field; see docs/openai.md for the fields this server reads")
    _refuse_state(fields)
    stream = fields.get("stream", False)
    if not isinstance(stream, bool):
        raise BadField("stream", "must be true or false")
    model = fields.get("model")
    if model is not None and not isinstance(model, str):
        raise BadField("model", "must be a string")
    params, names = {}, {}
    for theirs, ours in SAMPLING.items():
        if theirs in fields:
            params[ours] = [fields[theirs]] if ours == "stop" and isinstance(fields[theirs], str) else fields[theirs]
            names[ours] = theirs
    messages = _messages(fields, max_messages)
    try:
        response_format = _text_format(fields.get("text"))
        tools = parse_tools(fields.get("tools"), fields.get("tool_choice"), flat=True)
    except InvalidRequest as e:
        raise BadField(e.field, str(e).split(": ", 1)[1]) from None
    if response_format is not None and tools is not None:
        raise BadField("text.format", "cannot be combined with tools; send one of them", "not_supported")
    logprobs = _logprobs(fields)
    if logprobs is not None and tools is not None:
        raise BadField("include", "log probabilities cannot be combined with tools", "not_supported")
    chat = Chat(f"resp_{uuid.uuid4().hex[:24]}", messages, params, response_format=response_format, tools=tools,
                  logprobs=logprobs, own_tools="tools" in fields or "tool_choice" in fields)
    echo = {"tools": fields.get("tools", []), "tool_choice": fields.get("tool_choice", "auto"),
            "text": fields.get("text", {"format": {"type": "text"}}), "instructions": fields.get("instructions"),
            "metadata": fields.get("metadata", {}), "temperature": fields.get("temperature"),
            "top_p": fields.get("top_p"), "max_output_tokens": fields.get("max_output_tokens")}
    return ResponsesRequest(chat, stream, model, echo, names)


def _refuse_state(fields: dict[str, Any]) -> None:
    if fields.get("store", False) is not False:
        raise BadField("store", "this server keeps no responses; send \"store\": false (the conversation goes in "
                                "input each time)")
    for name in ("previous_response_id", "conversation"):
        if name in fields:
            raise BadField(name, "this server keeps no responses; send the whole conversation in input")
    if fields.get("background", False) is not False:
        raise BadField("background", "responses run in the foreground only; leave it out")


def _logprobs(fields: dict[str, Any]) -> int | None:
    include = fields.get("include", [])
    if not isinstance(include, list) or any(i != LOGPROBS_INCLUDE for i in include):
        raise BadField("include", f"only [\"{LOGPROBS_INCLUDE}\"] is supported")
    top = fields.get("top_logprobs")
    if top is not None and (not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= MAX_TOP_LOGPROBS):
        raise BadField("top_logprobs", f"must be an integer from 0 to {MAX_TOP_LOGPROBS}")
    if top is not None and not include:
        raise BadField("top_logprobs", f"only with \"include\": [\"{LOGPROBS_INCLUDE}\"]")
    return (top or 0) if include else None


def _text_format(text: object) -> Constraint | None:
    """`text.format` is `response_format` with the json_schema fields flattened into it."""
    if text is None:
        return None
    if not isinstance(text, dict) or set(text) - {"format", "verbosity"}:
        raise InvalidRequest("text", "must be an object with format")
    fmt = text.get("format", {"type": "text"})
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        fmt = {"type": "json_schema", "json_schema": {k: v for k, v in fmt.items() if k != "type"}}
    return parse_response_format(fmt, "text.format")


def _messages(fields: dict[str, Any], max_messages: int) -> tuple[ChatMessage, ...]:
    raw = fields.get("input")
    if isinstance(raw, str):
        raw = [{"role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise BadField("input", "must be a string or a non-empty list of messages and function call items")
    messages: list[ChatMessage] = []
    instructions = fields.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise BadField("instructions", "must be a string")
        messages.append(ChatMessage("system", instructions))
    for i, item in enumerate(raw):
        messages += _item(f"input[{i}]", item, messages)
    if len(messages) > max_messages:
        raise BadField("input", f"at most {max_messages} messages per request, got {len(messages)}")
    for m in messages[1:]:
        if m.role == "system":
            raise BadField("input", "only the first message may be a system (or developer) message, and "
                                    "instructions count as one")
    if messages[-1].role not in ("user", "tool"):
        raise BadField("input", "the last item must be the user's message (or a function call's output)")
    return tuple(messages)


def _item(where: str, item: object, before: list[ChatMessage]) -> list[ChatMessage]:
    """The messages one input item adds; a function call joins the assistant message just before it."""
    if not isinstance(item, dict):
        raise BadField(where, "must be an object")
    kind = item.get("type", "message")
    if kind == "function_call":
        try:
            call = parse_tool_call(where, {"id": item.get("call_id"), "type": "function",
                                             "function": {"name": item.get("name"), "arguments": item.get("arguments")}})
        except InvalidRequest as e:
            raise BadField(e.field.replace(".function", ""), str(e).split(": ", 1)[1]) from None
        if before and before[-1].role == "assistant":
            last = before.pop()
            return [ChatMessage("assistant", last.content, last.tool_calls + (call,))]
        return [ChatMessage("assistant", "", (call,))]
    if kind == "function_call_output":
        output, call_id = item.get("output"), item.get("call_id")
        if not isinstance(output, str) or not isinstance(call_id, str) or not call_id:
            raise BadField(where, "a function_call_output needs call_id and output (a string)")
        return [ChatMessage("tool", output, (), call_id)]
    if kind != "message":
        raise BadField(f"{where}.type", "only message, function_call and function_call_output items are supported")
    role = item.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise BadField(f"{where}.role", f"must be one of {', '.join(ROLES)}, got {short(role)}")
    return [ChatMessage(ROLES[role], _content(where, item.get("content")))]


def _content(where: str, content: object) -> str:
    return text_content(where, content, ("input_text", "output_text"), "input_text and output_text")
