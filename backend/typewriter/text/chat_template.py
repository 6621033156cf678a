"""The model's chat template, rendered and encoded as transformers' `apply_chat_template(..., tokenize=True,
sanitize_control_tokens=True)` does, without importing transformers: its import was a third of a cached start
(docs/measurements/2026-12-06-q6-and-start.md). The same sandbox, options, filters and globals; the control tokens
a client typed are marked in its strings and encoded as plain text, never as the tokens the template writes itself.
tests/text/test_chat_template.py holds every template and tokenizer form we load to transformers' ids.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from functools import cached_property
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace
from tokenizers import AddedToken
from tokenizers import Tokenizer as RawTokenizer

# Private-use characters wrapped around the control tokens in client strings (transformers' own pair).
MARK_START, MARK_END = "\U000f0000", "\U000f0001"

# Names a message's reasoning is passed under; templates read the first (transformers' aliasing).
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplate:
    def __init__(self, added: Iterable[AddedToken], raw: Callable[[], RawTokenizer], source: str,
                 special_tokens: Mapping[str, str | None]):
        """`added`: the tokenizer's added tokens; `raw`: the tokenizer, asked for on the first encoding (a GGUF's is
        built then); `special_tokens`: bos_token, eos_token, ... as the template may read them."""
        self.source = source
        self._tokenizer = raw
        environment = _environment()
        self._template = environment.from_string(source)
        self._special = {name: value for name, value in special_tokens.items() if value is not None}
        literal = _literal_text(environment, source)
        added = list(added)
        # Special tokens always, and the other added tokens the template writes, but whitespace (Gemma's "\n").
        control = [t.content for t in added if t.special or (t.content in literal and not t.content.isspace())]
        self._control = _alternatives(control)
        every_added = _alternatives([t.content for t in added])
        self._markers = re.compile(f"{MARK_START}({every_added.pattern}){MARK_END}|[{MARK_START}{MARK_END}]")

    def render(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None = None) -> str:
        """The prompt text, with the generation prompt; JSON-shaped inputs only reach the template."""
        chat = [_aliased({k: _plain(v) for k, v in m.items() if v is not None}) for m in messages]
        return self._template.render(messages=chat, tools=_plain(tools), documents=None, add_generation_prompt=True,
                                     **self._special)

    def encode(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None = None) -> list[int]:
        """The prompt's ids, each control token in a string value or dictionary key of `messages` or `tools`
        encoded as plain text."""
        return self._encode_marked(self.render(self.mark(list(messages)), self.mark(tools) if tools else None))

    def encode_text(self, text: str) -> list[int]:
        """`text` as a message's content is encoded: control tokens in it as plain text."""
        return self._encode_marked(self.mark(text))

    def mark(self, value: Any) -> Any:
        """`value` with its control tokens, in strings and dictionary keys, wrapped in the markers; markers a client
        typed are dropped first, so none can be forged."""
        if isinstance(value, str):
            value = value.replace(MARK_START, "").replace(MARK_END, "")
            return self._control.sub(f"{MARK_START}\\g<0>{MARK_END}", value)
        if isinstance(value, dict):
            return {self.mark(key) if isinstance(key, str) else key: self.mark(inner) for key, inner in value.items()}
        if isinstance(value, list | tuple):
            return [self.mark(inner) for inner in value]
        return value

    def _encode_marked(self, text: str) -> list[int]:
        """Marked tokens as plain text, the rest (the template's own control tokens) as usual. A lone marker (a
        template's `split()` cut a pair) is dropped but still parts the text, so no control token joins across it."""
        pieces = self._markers.split(text)  # [text, marked token or None, text, ...]
        ids = self._encode(pieces[0])
        for i, piece in enumerate(pieces[1:], start=1):
            if not piece:
                continue
            as_text = i % 2 == 1
            piece_ids = self._piece(piece, as_text)
            if as_text and self._tokenizer().token_to_id(piece) in piece_ids:
                raise ValueError(f"Can't sanitize {piece!r}: the tokenizer produces it from plain text")
            ids += piece_ids
        return ids

    def _piece(self, piece: str, as_text: bool) -> list[int]:
        """A piece from inside the chat: encoded after a newline, which is then taken off, so a SentencePiece
        tokenizer adds no prefix space of a text's start."""
        encode = self._encode_plain if as_text else self._encode
        ids = encode("\n" + piece)
        if ids[: len(self._newline)] == self._newline:
            return ids[len(self._newline):]
        return encode(piece)

    @cached_property
    def _newline(self) -> list[int]:
        return self._encode("\n")

    def _encode(self, text: str) -> list[int]:
        ids: list[int] = self._tokenizer().encode(text, add_special_tokens=False).ids
        return ids

    def _encode_plain(self, text: str) -> list[int]:
        """`text` through the tokenizer's pipeline without its added tokens, special or not."""
        raw = self._tokenizer()
        if raw.normalizer is not None:
            text = raw.normalizer.normalize_str(text)
        splits = [text] if raw.pre_tokenizer is None else [s for s, _ in raw.pre_tokenizer.pre_tokenize_str(text)]
        return [token.id for split in splits for token in raw.model.tokenize(split)]


def _alternatives(tokens: Sequence[str]) -> re.Pattern[str]:
    """Longest first, so a token wins over the tokens inside it; matches nothing when there are none."""
    return re.compile("|".join(map(re.escape, sorted(tokens, key=len, reverse=True))) or "(?!)")


def _aliased(message: dict[str, Any]) -> dict[str, Any]:
    reasoning = next((message[key] for key in _REASONING_FIELDS if message.get(key) is not None), None)
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


def _plain(value: Any) -> Any:
    """What the template sees: plain JSON types only, anything else an inert "<type>" string."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(key): _plain(inner) for key, inner in value.items()}
    if isinstance(value, list):
        return [_plain(inner) for inner in value]
    if isinstance(value, tuple):
        return tuple(_plain(inner) for inner in value)
    return f"<{type(value).__name__}>"


def _literal_text(environment: jinja2.Environment, source: str) -> str:
    """The template's literal text and string constants, joined by NULs so no search matches across two."""
    tree = environment.parse(source)
    literals = {node.data for node in tree.find_all(jinja2.nodes.TemplateData)}
    literals |= {node.value for node in tree.find_all(jinja2.nodes.Const) if isinstance(node.value, str)}
    return "\0".join(literals)


class _Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (training templates mark the assistant's part): its body."""

    tags = {"generation"}  # noqa: RUF012 - jinja2 declares it so

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        text: str = caller()
        return text


class _TemplateDict:
    """`dict` in a template: calls and `fromkeys`, no attribute of the type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _Namespace(Namespace):
    """A namespace that refuses underscore names, the way into CPython's internals."""

    def __init__(*args: Any, **kwargs: Any):  # Jinja's own signature trick, so `namespace(self=...)` works
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"Chat templates cannot store underscore-prefixed attributes on a namespace, but got {name!r}.")


def _raise(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """Jinja's own escapes HTML; templates expect JSON as written."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _environment() -> ImmutableSandboxedEnvironment:
    """A template is untrusted code: the sandbox, with transformers' options, filters and globals."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                       extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals |= {"raise_exception": _raise, "strftime_now": _strftime_now, "dict": _TemplateDict(),
                    "namespace": _Namespace}
    return env
