"""Tools for a model whose chat template has no tool format of its own (the generic ToolFormat), as llama.cpp's
server gives one: the tools are described at the end of the system turn, and earlier calls and their results are
written into the conversation as text, so the template sees only plain messages. Whatever a client sent (a tool's
description, a parameter's name, a call's arguments, a result) reaches the template as a message's content, which
is encoded as plain text.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from .conversation import append_system
from .tool_format import ToolFormat

Message = dict[str, Any]


def describe(functions: Sequence[dict[str, Any]], fmt: ToolFormat) -> str:
    """The system turn's paragraph on `functions` (OpenAI's function objects) and how to call one."""
    lines = [json.dumps({k: f[k] for k in ("name", "description", "parameters") if k in f}, ensure_ascii=False)
             for f in functions]
    return ("You can call these tools. Each line is one tool as JSON: its name, what it does, and the JSON Schema "
            "of its arguments.\n" + "\n".join(lines) + "\nTo call a tool, answer with only this, the arguments "
            "matching its schema:\n" + fmt.open + '{"name": "the tool\'s name", "arguments": {...}}' + fmt.close)


def with_tools(messages: Sequence[Message], functions: Sequence[dict[str, Any]] | None,
               fmt: ToolFormat) -> list[Message]:
    """`messages` (the system message first, if any) for a template without tools: `functions` described in the
    system turn, an assistant's calls written as it would write them, tool results as the user's turn."""
    out: list[Message] = []
    for i, message in enumerate(messages):
        if message["role"] == "tool":
            result = f"<tool_response>\n{message['content']}\n</tool_response>"
            if i and messages[i - 1]["role"] == "tool":  # a call's results answer in one turn
                out[-1] = {"role": "user", "content": f"{out[-1]['content']}\n{result}"}
            else:
                out.append({"role": "user", "content": result})
        elif message.get("tool_calls"):
            calls = [call_text(c["function"], fmt) for c in message["tool_calls"]]
            out.append({"role": "assistant", "content": "\n".join(filter(None, [message.get("content"), *calls]))})
        else:
            out.append(message)
    if functions:
        paragraph = describe(functions, fmt)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": append_system(out[0]["content"], paragraph)}
        else:
            out.insert(0, {"role": "system", "content": paragraph})
    return out


def call_text(function: dict[str, Any], fmt: ToolFormat) -> str:
    """A call as the model writes one: `function` is {"name", "arguments": an object or its JSON text}."""
    arguments = function["arguments"]
    arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
    call = json.dumps({"name": function["name"], "arguments": arguments}, ensure_ascii=False)
    return f"{fmt.open}{call}{fmt.close}"
