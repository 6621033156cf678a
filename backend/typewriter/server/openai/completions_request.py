"""An OpenAI `POST /v1/chat/completions` body read into a protocol v1 chat (docs/openai.md has the mapping). An
unknown field is refused, as protocol v1 does, so that a typo never passes.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from ...engine.request import MAX_TOP_LOGPROBS
from ...errors import InvalidRequest
from ...text.conversation import check_question
from ..chat_request import Chat, ChatMessage, check_text, parse_tool_call, short
from ..refusal import Refusal
from ..structured import parse_response_format, parse_tools

# OpenAI's name -> ours. max_tokens and max_completion_tokens are the same thing under two names.
SAMPLING = {"max_tokens": "max_new_tokens", "max_completion_tokens": "max_new_tokens", "temperature": "temperature",
            "top_p": "top_p", "seed": "seed", "stop": "stop",
            "top_k": "top_k", "repetition_penalty": "repetition_penalty",  # extensions, as in vLLM
            "loop_guard": "loop_guard"}  # an extension: false lets an answer repeat itself
HONOURED = ("model", "messages", "stream", "stream_options", "n", "response_format", "tools", "tool_choice",
            "frequency_penalty", "presence_penalty", "logprobs", "top_logprobs", "logit_bias", *SAMPLING)
IGNORED = ("user", "store", "metadata", "service_tier", "parallel_tool_calls", "prompt_cache_key",
           "safety_identifier", "reasoning_effort", "verbosity")
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
MESSAGE_FIELDS = ("role", "content", "name", "refusal", "tool_calls", "function_call", "audio", "tool_call_id")
MAX_CHOICES = 8  # `n`: each choice holds a slot while it runs


class BadField(Exception):
    """A refused body, with a protocol-style code; `param` is the OpenAI field at fault (None: the whole body)."""

    def __init__(self, param: str | None, message: str, code: str = "invalid_request"):
        self.message = f"{param}: {message}" if param else message
        super().__init__(self.message)
        self.code, self.param = code, param


@dataclass(frozen=True)
class CompletionRequest:
    chat: Chat
    stream: bool
    include_usage: bool
    model: str | None
    names: dict[str, str]  # our param name -> the OpenAI field it came from, to name it in a later refusal


def check_media_type(content_type: str | None) -> None:
    """Only a JSON body runs a chat. A page on another site can make a student's browser POST a form or text/plain
    body here without asking first; a JSON one needs a CORS preflight, which this server never grants."""
    media_type = (content_type or "").split(";", 1)[0].strip().lower()
    if media_type != "application/json":
        raise BadField(None, f"the body must be sent as Content-Type: application/json, got {media_type or 'none'}",
                       "unsupported_media_type")


def read_object(body: bytes, needs: str) -> dict[str, Any]:
    """Null fields are left out (clients send null for "not given"); `needs`: the field it must have, for the message."""
    try:
        fields = json.loads(body, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadField(None, f"the body is not valid JSON: {e}", "invalid_json") from None
    except RecursionError:
        raise BadField(None, "the body nests arrays or objects too deeply", "invalid_json") from None
    if not isinstance(fields, dict):
        raise BadField(None, f"the body must be a JSON object with \"{needs}\"")
    try:
        check_text(body, fields)
    except Refusal as e:
        raise BadField(None, e.message) from None
    return {k: v for k, v in fields.items() if v is not None}


def parse_body(body: bytes, max_messages: int) -> CompletionRequest:
    fields = read_object(body, "messages")
    unknown = sorted(k for k in fields if k not in HONOURED and k not in IGNORED)
    if unknown:
        raise BadField(unknown[0], "unknown field; see docs/openai.md for the fields this server reads")
    _refuse_unsupported(fields)
    model = fields.get("model")
    if model is not None and not isinstance(model, str):
        raise BadField("model", "must be a string")
    stream = fields.get("stream", False)
    if not isinstance(stream, bool):
        raise BadField("stream", "must be true or false")
    options = fields.get("stream_options", {})
    if not isinstance(options, dict) or sorted(options) not in ([], ["include_usage"]):
        raise BadField("stream_options", "must be an object with at most include_usage")
    if options and not stream:
        raise BadField("stream_options", "only allowed with \"stream\": true")
    include_usage = options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise BadField("stream_options.include_usage", "must be true or false")
    params, names = _sampling(fields)
    chat_id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
    messages = _messages(fields.get("messages"), max_messages)
    try:
        response_format = parse_response_format(fields["response_format"]) if "response_format" in fields else None
        tools = parse_tools(fields.get("tools"), fields.get("tool_choice"))
    except InvalidRequest as e:
        raise BadField(e.field, str(e).split(": ", 1)[1]) from None
    if response_format is not None and tools is not None:
        raise BadField("response_format", "cannot be combined with tools; send one of them", "not_supported")
    logprobs = _logprobs(fields)
    if logprobs is not None and tools is not None:
        raise BadField("logprobs", "cannot be combined with tools; leave one of them out", "not_supported")
    chat = Chat(chat_id, messages, params, response_format=response_format, tools=tools, n=fields.get("n", 1),
                  logprobs=logprobs, own_tools="tools" in fields or "tool_choice" in fields)
    return CompletionRequest(chat, stream, include_usage, model, names)


def _refuse_unsupported(fields: dict[str, Any]) -> None:
    n = fields.get("n", 1)
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_CHOICES:
        raise BadField("n", f"must be an integer from 1 to {MAX_CHOICES}")
    for name in ("frequency_penalty", "presence_penalty"):
        if fields.get(name, 0) != 0:
            raise BadField(name, "additive penalties are not supported; leave it out (or 0) and use "
                                 "repetition_penalty (1 is off; by default 1.1 on a model under 0.3B weights, else 1) instead")
    if fields.get("logit_bias", {}) != {}:
        raise BadField("logit_bias", "not supported; leave it out", "not_supported")


def _logprobs(fields: dict[str, Any]) -> int | None:
    """None: none asked; else how many alternatives each token lists (`top_logprobs`, 0 without it)."""
    wanted, top = fields.get("logprobs", False), fields.get("top_logprobs")
    if not isinstance(wanted, bool):
        raise BadField("logprobs", "must be true or false")
    if top is not None and (not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= MAX_TOP_LOGPROBS):
        raise BadField("top_logprobs", f"must be an integer from 0 to {MAX_TOP_LOGPROBS}")
    if top is not None and not wanted:
        raise BadField("top_logprobs", "only with \"logprobs\": true")
    return (top or 0) if wanted else None


def _sampling(fields: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    if "max_tokens" in fields and "max_completion_tokens" in fields \
            and fields["max_tokens"] != fields["max_completion_tokens"]:
        raise BadField("max_completion_tokens", "differs from max_tokens; send one of them")
    params, names = {}, {}
    for theirs, ours in SAMPLING.items():
        if theirs in fields:
            value = fields[theirs]
            params[ours] = [value] if ours == "stop" and isinstance(value, str) else value
            names[ours] = theirs
    return params, names


def _messages(raw: object, max_messages: int) -> tuple[ChatMessage, ...]:
    if not isinstance(raw, list) or not raw:
        raise BadField("messages", "must be a non-empty list of {role, content} objects")
    if len(raw) > max_messages:
        raise BadField("messages", f"at most {max_messages} messages per request, got {len(raw)}")
    messages = tuple(_message(i, m) for i, m in enumerate(raw))
    for i, m in enumerate(messages[1:], start=1):
        if m.role == "system":
            raise BadField(f"messages[{i}].role", "only the first message may be a system (or developer) message")
    if messages[-1].role not in ("user", "tool"):
        raise BadField("messages", "the last message must be the user's (or a tool's result)")
    if messages[-1].role == "user":
        try:
            check_question(messages[-1].content, f"messages[{len(messages) - 1}].content")
        except InvalidRequest as e:
            raise BadField(e.field, e.problem) from None
    return messages


def _message(i: int, message: object) -> ChatMessage:
    where = f"messages[{i}]"
    if not isinstance(message, dict):
        raise BadField(where, "must be an object with role and content")
    extra = sorted(k for k in message if k not in MESSAGE_FIELDS)
    if extra:
        raise BadField(f"{where}.{extra[0]}", "unknown field; known: role, content, name")
    for name in ("function_call", "audio"):
        if message.get(name) not in (None, []):
            raise BadField(f"{where}.{name}", "not supported (function_call is tool_calls' old name; audio is not "
                                              "read); leave it out", "not_supported")
    role = message.get("role")
    if not isinstance(role, str) or role not in ROLES:
        kinds = "function messages are tool messages now; " if role == "function" else ""
        raise BadField(f"{where}.role", f"{kinds}must be one of {', '.join(ROLES)}, got {short(role)}")
    calls = message.get("tool_calls") or []
    if calls and role != "assistant":
        raise BadField(f"{where}.tool_calls", "only an assistant message carries tool calls")
    if not isinstance(calls, list):
        raise BadField(f"{where}.tool_calls", "must be a list")
    try:
        tool_calls = tuple(parse_tool_call(f"{where}.tool_calls[{j}]", c) for j, c in enumerate(calls))
    except InvalidRequest as e:
        raise BadField(e.field, str(e).split(": ", 1)[1]) from None
    call_id = message.get("tool_call_id")
    if role == "tool" and not (isinstance(call_id, str) and call_id):
        raise BadField(f"{where}.tool_call_id", "must name the call this result answers")
    if role != "tool" and call_id is not None:
        raise BadField(f"{where}.tool_call_id", "only a tool message answers a call")
    content = message.get("content")
    content = "" if content is None and tool_calls else _content(where, content)
    return ChatMessage(ROLES[role], content, tool_calls, call_id)


def _content(where: str, content: object) -> str:
    return text_content(where, content, ("text",), '{"type": "text", "text": ...}')


def text_content(where: str, content: object, types: tuple[str, ...], shown: str) -> str:
    """A message's content: a string, or a list of text parts of `types` (`shown` in the error), joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadField(f"{where}.content", "must be a string or a list of text parts")
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in types or not isinstance(part.get("text"), str):
            raise BadField(f"{where}.content[{j}]", f"only {shown} parts are supported; this model reads text")
        texts.append(part["text"])
    return "".join(texts)


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")
