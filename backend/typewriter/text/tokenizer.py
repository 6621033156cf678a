"""Text <-> token ids, and the model's own chat template, from a GGUF file (gguf_tokenizer.py) or a Hugging Face
directory. Each token's bytes are worked out once at load (`TokenText`), so the detokenizer can stream any kind
loaded here; the engine never sees text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import AddedToken
from tokenizers import Tokenizer as RawTokenizer

from ..errors import ModelFormatError
from .chat_template import ChatTemplate
from .gguf_tokenizer import LateRawTokenizer
from .token_text import LeadingSpace, TokenText
from .tool_format import ToolFormat, tool_format
from .tool_prompt import with_tools

# What each model follows of it: docs/measurements/2026-12-04-tutor-answers.md.
DEFAULT_SYSTEM_PROMPT = (
    "You are a patient, encouraging tutor for students. Always answer in the language the student writes in. "
    "Explain ideas step by step in plain language, check that the student understands before moving on, and ask "
    "what they have already tried. Do not just hand over answers to homework: guide the student to work them "
    "out, and praise real progress. Write mathematical formulas in LaTeX between $ signs, and code in Markdown "
    "code blocks. If you are not sure of something, say so instead of guessing."
)

# Token texts that end an assistant turn in common chat formats; those present in the vocab stop generation.
END_OF_TURN_TOKENS = (
    "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<|endoftext|>", "<end_of_turn>", "<|return|>", "<EOT>",
)

# For a model that ships no chat template (GPT-2): a transcript it continues after "Tutor:".
PLAIN_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' %}{{ message['content'] + '\n\n' }}"
    "{% elif message['role'] == 'user' %}{{ 'Student: ' + message['content'] + '\n\n' }}"
    "{% else %}{{ 'Tutor: ' + message['content'] + '\n\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Tutor:' }}{% endif %}"
)


class Tokenizer:
    def __init__(
        self,
        raw: RawTokenizer | LateRawTokenizer,
        *,
        name: str,
        chat_template: str | None,
        bos_token: str | None,
        eos_token: str | None,
        extra_eos_ids: Sequence[int] = (),
        unk_token: str | None = None,
        pad_token: str | None = None,
        tokens: Sequence[str] | None = None,
    ):
        """`tokens`: each id's token where the caller holds them (a GGUF file's list), so that they are not read
        back out of `raw`. A LateRawTokenizer is built on the first encoding, or by `prepare`."""
        self._raw = raw
        self.name = name
        # A tokenizer.json may set truncation or padding (for training); a prompt is never cut or padded here: the
        # conversation is fitted to the context by text/conversation.py instead.
        raw.no_truncation()
        raw.no_padding()
        self.special_tokens = {"bos_token": bos_token, "eos_token": eos_token, "unk_token": unk_token,
                               "pad_token": pad_token}
        # A named token the vocabulary holds as an ordinary piece (SentencePiece's "<unk>") becomes a special added
        # token, as transformers makes it: typed by a client it is then a control token, encoded as plain text.
        added = {token.content for token in raw.get_added_tokens_decoder().values()}
        named = dict.fromkeys(t for t in self.special_tokens.values() if t is not None and t not in added)
        if named:
            raw.add_tokens([AddedToken(token, special=True) for token in named])
        self.plain_chat = chat_template is None
        self.tool_format: ToolFormat = tool_format(chat_template)
        self.template = ChatTemplate(raw.get_added_tokens_decoder().values(), lambda: self.raw,
                                     PLAIN_CHAT_TEMPLATE if chat_template is None else chat_template,
                                     self.special_tokens)
        self.vocab_size: int = raw.get_vocab_size(with_added_tokens=True)
        self.bos_token_id: int | None = raw.token_to_id(bos_token) if bos_token else None
        eos_id = raw.token_to_id(eos_token) if eos_token else None
        ends = {raw.token_to_id(t) for t in END_OF_TURN_TOKENS} | set(extra_eos_ids) | {eos_id}
        self.eos_token_ids: frozenset[int] = frozenset(i for i in ends if i is not None)
        self.special_ids: frozenset[int] = frozenset(
            i for i, tok in raw.get_added_tokens_decoder().items() if tok.special
        )
        self.token_text: TokenText = _spell_tokens(raw, self.special_ids, name, tokens)

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        path = Path(path)
        if (path / "saved_model.pb").is_file():  # `typewriter export` puts the tokenizer's files inside
            from ..weights.saved_model import SavedModelDir

            exported = SavedModelDir(path)
            tokenizer = cls.from_hf_dir(exported.tokenizer_dir)
            tokenizer.name = exported.manifest.get("tokenizer_name", path.name)
            return tokenizer
        if path.is_dir():
            return cls.from_hf_dir(path)
        if path.suffix == ".gguf":
            return cls.from_gguf(path)
        raise ModelFormatError(f"{path}: expected a .gguf file or a directory with tokenizer.json")

    @classmethod
    def from_gguf(cls, path: str | Path, fields: Mapping[str, Any] | None = None) -> Tokenizer:
        """`fields`: the file's metadata if the caller has read it already."""
        if fields is None:
            from ..weights.gguf_reader import GGUFReader

            fields = GGUFReader(path).fields
        get = fields.get
        raw = LateRawTokenizer(path, fields)
        tokens: list[str] = get("tokenizer.ggml.tokens") or []

        def token(key: str) -> str | None:
            i = get(f"tokenizer.ggml.{key}_token_id")
            return tokens[i] if i is not None and 0 <= i < len(tokens) else None

        return cls(
            raw,
            name=get("general.name") or Path(path).stem,
            chat_template=get("tokenizer.chat_template"),
            bos_token=token("bos"),
            eos_token=token("eos"),
            unk_token=token("unknown"),
            pad_token=token("padding"),
            tokens=tokens,
        )

    @classmethod
    def from_hf_dir(cls, path: str | Path) -> Tokenizer:
        path = Path(path)
        if not (path / "tokenizer.json").is_file():
            raise ModelFormatError(f"{path}: no tokenizer.json; only fast (tokenizers) tokenizers are supported")
        raw = RawTokenizer.from_file(str(path / "tokenizer.json"))
        config = _read_json(path / "tokenizer_config.json")
        template = config.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template}
            template = named.get("default") or next(iter(named.values()), None)
        if (path / "chat_template.jinja").is_file():
            template = (path / "chat_template.jinja").read_text(encoding="utf-8")

        extra_eos: list[int] = []
        for extra in ("generation_config.json", "config.json"):
            eos = _read_json(path / extra).get("eos_token_id")
            extra_eos += eos if isinstance(eos, list) else [] if eos is None else [eos]

        return cls(
            raw,
            name=path.name,
            chat_template=template,
            bos_token=_token_text(config.get("bos_token")),
            eos_token=_token_text(config.get("eos_token")),
            extra_eos_ids=extra_eos,
            unk_token=_token_text(config.get("unk_token")),
            pad_token=_token_text(config.get("pad_token")),
        )

    @property
    def raw(self) -> RawTokenizer:
        """The `tokenizers` tokenizer, built here if it is a GGUF's not built yet."""
        raw = self._raw
        return raw.build() if isinstance(raw, LateRawTokenizer) else raw

    def prepare(self) -> None:
        """Build now what is otherwise built on the first encoding (a GGUF's BPE): the server calls it once idle."""
        _ = self.raw

    def save(self, folder: str | Path) -> None:
        """The Hugging Face files `from_hf_dir` reads back to an equal tokenizer."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.raw.save(str(folder / "tokenizer.json"))
        config = {"chat_template": self.template.source, **self.special_tokens}
        (folder / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=1))
        (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": sorted(self.eos_token_ids)}))

    def encode(self, text: str) -> list[int]:
        """No bos/eos added; special-token text such as "<|im_end|>" becomes its id."""
        return self.raw.encode(text, add_special_tokens=False).ids

    def count(self, text: str, limit: int) -> int:
        """Tokens in `text`, or any number over `limit` once past it: a huge text costs what `limit` tokens of it
        cost. Pieces are cut before a space, so a piece's first token may differ from `encode`'s."""
        total = start = 0
        while start < len(text) and total <= limit:
            end = len(text) if len(text) - start <= COUNT_PIECE else _piece_end(text, start + COUNT_PIECE)
            total += len(self.raw.encode(text[start:end], add_special_tokens=False).ids)
            start = end
        return total

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.raw.decode(list(ids), skip_special_tokens=skip_special_tokens)

    default_system_prompt = DEFAULT_SYSTEM_PROMPT

    def render_chat(self, messages: Sequence[dict[str, str]], system: str | None = None) -> str:
        return self.template.render(self._conversation(messages, system))

    def encode_chat(self, messages: Sequence[dict[str, Any]], system: str | None = None,
                    tools: Sequence[dict[str, Any]] | None = None) -> list[int]:
        """Control tokens a client typed, in a message or in `tools` (OpenAI's tool objects), dictionary keys
        included, are encoded as plain text: only the template writes real ones. A template without a tool format
        never sees tools: they, and earlier calls, become the messages' text (tool_prompt.py)."""
        conversation = self._conversation(messages, system)
        if not self.tool_format.in_template:
            conversation = with_tools(conversation, [t["function"] for t in tools or ()], self.tool_format)
            tools = None
        return self.template.encode(conversation, tools)

    def encode_text(self, text: str) -> list[int]:
        """A client's text (an answer's start) as a message's content is encoded: control tokens as plain text."""
        return self.template.encode_text(text)

    def chat_prefix(self, system: str | None = None) -> list[int]:
        """The ids every chat rendered with `system` begins with, whatever its messages: the prefix the cache
        shares between conversations."""
        a, b = (self.encode_chat([{"role": "user", "content": text}], system) for text in ("a", "b"))
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        return a[:n]

    def _conversation(self, messages: Sequence[dict[str, Any]], system: str | None) -> list[dict[str, Any]]:
        """`system` None: DEFAULT_SYSTEM_PROMPT, chosen here only; "": none. Tool-call arguments go in as objects:
        templates write them with `tojson`."""
        messages = [_arguments_as_objects(m) for m in messages]
        if system is None:
            system = DEFAULT_SYSTEM_PROMPT
        if system and not any(m.get("role") == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": system})
        return messages

    def token_bytes(self, token_id: int) -> bytes:
        """What the token adds to `decode(..., skip_special_tokens=True)`; b"" for specials."""
        return self.token_text.table[token_id]


def _arguments_as_objects(message: dict[str, Any]) -> dict[str, Any]:
    calls = message.get("tool_calls")
    if not calls:
        return message
    objects = []
    for call in calls:
        function = dict(call["function"])
        if isinstance(function.get("arguments"), str):
            function["arguments"] = json.loads(function["arguments"])
        objects.append({**call, "function": function})
    return {**message, "tool_calls": objects}


COUNT_PIECE = 4096  # characters


def _piece_end(text: str, end: int) -> int:
    """Before the last word within 256 characters of `end`, where the pre-tokenizer parts words anyway."""
    for i in range(end, max(end - 256, 1), -1):
        if text[i - 1].isspace() and not text[i].isspace():
            return i - 1
    return end


_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_SUPPORTED_DECODERS = ("ByteLevel; SentencePiece-style: Sequence[Replace('▁', ' '), ByteFallback, Fuse, Strip] "
                       "or Metaspace")


def _spell_tokens(raw: RawTokenizer | LateRawTokenizer, special_ids: frozenset[int], name: str,
                  tokens: Sequence[str] | None = None) -> TokenText:
    """A decoder the stream could not follow token by token is refused here, at load, not on the first answer."""
    # the decoder's own JSON: the whole tokenizer's (to_str) is slow to write and parse
    decoder: dict[str, Any] = (json.loads(raw.decoder.__getstate__()) if raw.decoder is not None
                               else {"type": "none"})
    steps = decoder["decoders"] if decoder["type"] == "Sequence" else [decoder]
    kinds = [step["type"] for step in steps]
    if tokens is not None:  # every id its own token, one the tokenizer's vocabulary shadows included (as llama.cpp)
        vocab = [(i, token) for i, token in enumerate(tokens) if i not in special_ids]
    else:
        vocab = [(i, token) for token, i in raw.get_vocab(with_added_tokens=True).items() if i not in special_ids]
    size = max(raw.get_vocab_size(with_added_tokens=True), len(tokens or ()))

    def refuse(why: str) -> ModelFormatError:
        return ModelFormatError(f"{name}: tokenizer.json decoder {json.dumps(decoder)[:200]} {why} "
                                f"(supported: {_SUPPORTED_DECODERS})")

    if kinds == ["ByteLevel"]:
        # Each alphabet character becomes its byte as latin-1; any other fails the encoding (those up to 255 map
        # to U+FFFF first). All tokens at once where every one is in the alphabet, one by one where not.
        to_latin1: dict[int, int | str] = {ord(c): b for b, c in _bytes_to_unicode().items()}
        to_latin1 |= {c: "\uffff" for c in range(256) if c not in to_latin1}
        table = [b""] * size
        try:
            spelled = "".join(token for _, token in vocab).translate(to_latin1).encode("latin-1")
        except UnicodeEncodeError:
            for i, token in vocab:
                try:
                    table[i] = token.translate(to_latin1).encode("latin-1")
                except UnicodeEncodeError:  # outside the alphabet: UTF-8, as tokenizers' ByteLevel decoder does
                    table[i] = token.encode("utf-8")
        else:  # one byte a character
            end = 0
            for i, token in vocab:
                start, end = end, end + len(token)
                table[i] = spelled[start:end]
        return TokenText(table, LeadingSpace.KEEP)

    if kinds == ["Metaspace"]:
        replacement = decoder.get("replacement", "▁")
        scheme = decoder.get("prepend_scheme", "always" if decoder.get("add_prefix_space", True) else "never")
        table, first = [b""] * size, [b""] * size
        for i, token in vocab:
            table[i] = token.replace(replacement, " ").encode("utf-8")
            first[i] = token.replace(replacement, "").encode("utf-8")
        if scheme == "never":
            return TokenText(table, LeadingSpace.KEEP)
        return TokenText(table, LeadingSpace.FIRST_TOKEN, first)

    replaces = [s for s in steps if s["type"] == "Replace"]
    if not replaces or set(kinds) - {"Replace", "ByteFallback", "Fuse", "Strip"}:
        raise refuse("is not one the stream can follow")
    replace = replaces[0]
    pattern = replace["pattern"].get("String")
    if len(replaces) > 1 or pattern is None or replace["content"] != " ":
        raise refuse("replaces something other than one piece with a space")
    strips = [n for n, s in enumerate(steps) if s["type"] == "Strip"]
    leading = LeadingSpace.KEEP
    if strips:
        strip = steps[strips[0]]
        fused = "Fuse" in kinds and kinds.index("Fuse") < strips[0]
        if len(strips) > 1 or not fused or strip["content"] != " " or strip["start"] > 1 or strip["stop"]:
            raise refuse("strips something other than one leading space of the joined text")
        leading = LeadingSpace.STRIP_ONE if strip["start"] == 1 else LeadingSpace.KEEP
    byte_fallback = "ByteFallback" in kinds
    table = [b""] * size
    for i, token in vocab:
        byte = _BYTE_TOKEN.fullmatch(token) if byte_fallback else None
        table[i] = bytes([int(byte[1], 16)]) if byte else token.replace(pattern, " ").encode("utf-8")
    return TokenText(table, leading)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (a space is "Ġ", a newline "Ċ")."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping, extra = {}, 0
    for b in range(256):
        if b in printable:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        read: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        return read
    except (OSError, ValueError) as e:
        raise ModelFormatError(f"{path}: cannot be read as JSON ({e})") from e


def _token_text(value: object) -> str | None:
    if isinstance(value, dict):  # {"content": "<|im_end|>", "lstrip": false, ...}
        value = value.get("content")
    return value if isinstance(value, str) else None
