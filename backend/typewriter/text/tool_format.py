"""How a model writes a tool call, read off its chat template: the grammar that constrains one and the parser that
finds calls in the streamed answer. A template that writes Hermes-style `<tool_call>` itself is used as it is; any
other gets the generic format (tool_prompt.py), as llama.cpp's server gives one: the same call, the tools described
in the system turn by the server. FENCED_JSON is how Qwen2.5-Coder models write a call when not forced: a Markdown
```json block holding the call's object; the server reads it only for its own calculator (server/tool_loop.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# As engine/constraints.py's JSON options, so a forced call reads like any forced JSON.
_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class ToolFormat:
    name: str
    open: str
    close: str
    in_template: bool = True  # the chat template describes the tools and writes earlier calls itself

    def grammar(self, tools: Sequence[dict[str, Any]], strict: bool = True, forced: bool = True) -> str:
        """A Lark grammar (llguidance's dialect). Forced: every sentence is one valid call of one of `tools`. Not
        forced: any text, or text and then one valid call, the call held to its schema from its opening on (a lazy
        lexeme ends at the first opening, so text can never carry an unchecked call)."""
        calls = [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                  "properties": {"name": {"const": t["name"]},
                                 "arguments": t.get("parameters") or {"type": "object"}}} for t in tools]
        schema = {"anyOf": calls} if len(calls) > 1 else calls[0]
        schema = {**schema, "x-guidance": {**_JSON_STYLE, "lenient": not strict}}
        call = f"call: %json {json.dumps(schema)}\n"
        opening, rest = self.open.rstrip(), self.open[len(self.open.rstrip()):]
        if forced:
            return f"start: {json.dumps(self.open)} call {json.dumps(self.close)}\n{call}"
        return (f"start: TEXT | text_then_open {json.dumps(rest)} call {json.dumps(self.close)}\n"
                f"text_then_open[lazy]: TEXT {json.dumps(opening)}\nTEXT: /(.|\\n)*/\n{call}")


HERMES = ToolFormat("hermes", "<tool_call>\n", "\n</tool_call>")
# Hermes's markers, shown to the model as plain text in the system turn (tool_prompt.py): they keep a call apart
# from the text around it, so the parser and the grammars are Hermes's own.
GENERIC = ToolFormat("generic", "<tool_call>\n", "\n</tool_call>", in_template=False)
FENCED_JSON = ToolFormat("fenced-json", "```json\n", "\n```")


def tool_format(chat_template: str | None) -> ToolFormat:
    if chat_template and re.search(r"\btools\b", chat_template) and "<tool_call>" in chat_template:
        return HERMES
    return GENERIC


@dataclass(frozen=True)
class TextPiece:
    text: str


@dataclass(frozen=True)
class CallStarted:
    index: int
    name: str


@dataclass(frozen=True)
class CallArguments:
    index: int
    text: str  # the next piece of the arguments' JSON


Piece = TextPiece | CallStarted | CallArguments


class ToolCallParser:
    """Splits a streamed answer into text and tool calls, holding back what may be a call's opening or closing; a
    call's name goes out once read, then its arguments piece by piece, as OpenAI streams them. With `names`, only a
    call of one of them is a call, read whole at its closing, and anything else between the markers is text."""

    _HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*(?=\S)')

    def __init__(self, fmt: ToolFormat, names: frozenset[str] | None = None):
        self.open, self.close = fmt.open.strip(), fmt.close.strip()
        self.names = names
        self.calls: list[dict[str, str]] = []  # {"name", "arguments"}, as each completes
        self._text = ""  # outside a call, not yet sent
        self._call: str | None = None  # after the opening, while inside a call
        self._args_at: int | None = None  # set once the name was read
        self._sent = 0

    def push(self, text: str) -> list[Piece]:
        out: list[Piece] = []
        while text:
            if self._call is None:
                self._text += text
                text = ""
                at = self._text.find(self.open)
                if at < 0:
                    keep = _partial_suffix(self._text, self.open)
                    out += _text(self._text[: len(self._text) - keep])
                    self._text = self._text[len(self._text) - keep:]
                    return out
                out += _text(self._text[:at])
                text, self._text, self._call, self._args_at, self._sent = self._text[at + len(self.open):], "", "", \
                    None, 0
            else:
                self._call += text
                text = ""
                end = self._call.find(self.close)
                if end < 0:
                    return out + self._partial_call()
                body, text = self._call[:end], self._call[end + len(self.close):]
                out += self._complete(body)
        return out

    def flush(self) -> list[Piece]:
        """A call cut short ends with what it had if its name went out, else is dropped: it was never shown. With
        `names`, what was held is text: it was never known to be a call."""
        if self._call is not None and self.names is not None:
            held, self._call = self.open + self._call, None
            return _text(held)
        if self._call is not None:
            return self._complete(self._call) if self._args_at is not None else []
        rest, self._text = self._text, ""
        return _text(rest)

    def _partial_call(self) -> list[Piece]:
        out: list[Piece] = []
        assert self._call is not None
        if self.names is not None:  # read whole at its closing: until then it may be text
            return out
        if self._args_at is None:
            head = self._HEAD.match(self._call)
            if head is None:
                return out
            self._args_at = head.end()
            out.append(CallStarted(len(self.calls), json.loads(f'"{head.group(1)}"')))
        args = self._call[self._args_at:]
        args = args[: len(args) - _partial_suffix(args, self.close)].rstrip()
        safe = len(args) - 1 if args.endswith("}") else len(args)  # perhaps the call object's own closing brace
        if safe > self._sent:
            out.append(CallArguments(len(self.calls), args[self._sent:safe]))
            self._sent = safe
        return out

    def _complete(self, body: str) -> list[Piece]:
        self._call = None
        if self._args_at is None:  # not the usual shape (or all in one piece): read it whole
            try:
                call = json.loads(body)
                name, arguments = call["name"], call.get("arguments", call.get("parameters", {}))
            except (ValueError, KeyError, TypeError, AttributeError, RecursionError):  # brackets nested past
                return _text(self.open + body + self.close)  # the reader's recursion, too: not a call after all
            if not isinstance(name, str) or (self.names is not None and name not in self.names):
                return _text(self.open + body + self.close)
            arguments = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
            index = len(self.calls)
            self.calls.append({"name": name, "arguments": arguments})
            return [CallStarted(index, name), CallArguments(index, arguments)]
        args = body[self._args_at:].rstrip()
        args = args[:-1] if args.endswith("}") else args  # the call object's closing brace
        out: list[Piece] = [CallArguments(len(self.calls), args[self._sent:])] if len(args) > self._sent else []
        head = self._HEAD.match(body)
        assert head is not None  # it matched this call's start when its name was read
        name = json.loads(f'"{head.group(1)}"')
        self.calls.append({"name": name, "arguments": args.rstrip()})
        return out


def _text(text: str) -> list[Piece]:
    return [TextPiece(text)] if text else []


def _partial_suffix(text: str, marker: str) -> int:
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
