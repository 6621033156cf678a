"""Text <-> token ids, and the model's own chat template.

A `Tokenizer` is built either from a GGUF file's `tokenizer.ggml.*` metadata (a byte-level BPE, rebuilt here as a
`tokenizers.Tokenizer` without torch) or from a Hugging Face directory (`tokenizer.json` and friends). Chat
messages are rendered by transformers' `apply_chat_template` with the template that ships with the model.

The engine never sees text: it receives the ids from `encode_chat` and returns ids that `IncrementalDetokenizer`
turns back into text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as RawTokenizer
from transformers import PreTrainedTokenizerFast

from .errors import ModelFormatError

DEFAULT_SYSTEM_PROMPT = (
    "You are a patient, encouraging tutor for students. Explain ideas step by step in plain language, "
    "check that the student understands before moving on, and ask what they have already tried. "
    "Do not just hand over answers to homework: guide the student to work them out, and praise real progress."
)

# Token texts that end an assistant turn in common chat formats; those present in the vocab stop generation.
END_OF_TURN_TOKENS = (
    "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<|endoftext|>", "<end_of_turn>", "<|return|>", "<EOT>",
)

# GGUF `tokenizer.ggml.token_type` values (gguf.TokenType).
_CONTROL, _USER_DEFINED = 3, 4

# llama.cpp's pre-tokenizer regexes (llama-vocab.cpp), keyed by `tokenizer.ggml.pre`. Each regex splits the text
# in turn; a piece that no regex matches is kept as its own piece, as `Split(..., "isolated")` does.
_GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_REGEX = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_REGEX = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZER_REGEXES: dict[str, tuple[str, ...]] = {
    "gpt-2": (_GPT2_REGEX,),
    # StarCoder-style: every digit is its own piece, then the GPT-2 regex.
    **{name: (r"\p{N}", _GPT2_REGEX) for name in ("smollm", "starcoder", "refact", "codeshell")},
    **{name: (_LLAMA3_REGEX,) for name in ("llama3", "llama-bpe", "smaug-bpe")},
    "qwen2": (_QWEN2_REGEX,),
}


class Tokenizer:
    """A loaded tokenizer: `encode`/`decode`, chat rendering, and the ids that end a turn."""

    def __init__(
        self,
        raw: RawTokenizer,
        *,
        name: str,
        chat_template: str | None,
        bos_token: str | None,
        eos_token: str | None,
        extra_eos_ids: Sequence[int] = (),
        unk_token: str | None = None,
        pad_token: str | None = None,
    ):
        self.raw = raw
        self.name = name
        self.hf = PreTrainedTokenizerFast(
            tokenizer_object=raw,
            bos_token=bos_token,
            eos_token=eos_token,
            unk_token=unk_token,
            pad_token=pad_token,
            chat_template=chat_template,
            clean_up_tokenization_spaces=False,
        )
        self.vocab_size: int = raw.get_vocab_size(with_added_tokens=True)
        self.bos_token_id: int | None = raw.token_to_id(bos_token) if bos_token else None
        eos_id = raw.token_to_id(eos_token) if eos_token else None
        ends = {raw.token_to_id(t) for t in END_OF_TURN_TOKENS} | set(extra_eos_ids) | {eos_id}
        self.eos_token_ids: frozenset[int] = frozenset(i for i in ends if i is not None)
        self.special_ids: frozenset[int] = frozenset(
            i for i, tok in raw.get_added_tokens_decoder().items() if tok.special
        )
        self._bytes_table  # built now: a tokenizer the detokenizer cannot stream is refused at load, not on a token

    # ---- loading ----

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        path = Path(path)
        if (path / "saved_model.pb").is_file():  # from `typewriter export`: the tokenizer's files are inside
            from .weights.saved_model import SavedModelDir

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
            from .weights.gguf_reader import GGUFReader

            fields = GGUFReader(path).fields
        get = fields.get

        kind = get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise ModelFormatError(
                f"{path}: tokenizer.ggml.model {kind!r} is not supported; only byte-level BPE ('gpt2') is"
            )
        pre = get("tokenizer.ggml.pre")
        if pre not in PRE_TOKENIZER_REGEXES:
            raise ModelFormatError(f"{path}: tokenizer.ggml.pre {pre!r} is not a known pre-tokenizer")
        tokens: list[str] = get("tokenizer.ggml.tokens")
        types: list[int] = get("tokenizer.ggml.token_type", [1] * len(tokens or []))
        merges = [tuple(m.split(" ", 1)) for m in get("tokenizer.ggml.merges", [])]
        if tokens is None or len(types) != len(tokens):
            raise ModelFormatError(f"{path}: tokenizer.ggml.tokens and token_type are missing or differ in length")

        raw = RawTokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
        raw.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(rx), behavior="isolated") for rx in PRE_TOKENIZER_REGEXES[pre]]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
        raw.decoder = decoders.ByteLevel()
        # Already in the vocab, so these keep their ids; registering them makes the text "<|im_start|>" one token.
        raw.add_tokens(
            [AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, types) if k == _USER_DEFINED]
        )
        raw.add_special_tokens(
            [AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types) if k == _CONTROL]
        )

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

    def save(self, folder: str | Path) -> None:
        """Write the Hugging Face files `from_hf_dir` reads back to an equal tokenizer: tokenizer.json, the chat
        template and special tokens in tokenizer_config.json, every end-of-turn id in generation_config.json."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.raw.save(str(folder / "tokenizer.json"))
        hf = self.hf
        config = {"chat_template": hf.chat_template, "bos_token": hf.bos_token, "eos_token": hf.eos_token,
                  "unk_token": hf.unk_token, "pad_token": hf.pad_token}
        (folder / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=1))
        (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": sorted(self.eos_token_ids)}))

    # ---- text ----

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, with no bos/eos added. Special-token text such as "<|im_end|>" becomes its id."""
        return self.raw.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.raw.decode(list(ids), skip_special_tokens=skip_special_tokens)

    default_system_prompt = DEFAULT_SYSTEM_PROMPT

    def render_chat(self, messages: Sequence[dict[str, str]], system: str | None = None) -> str:
        """The prompt text for `messages`, ending with the assistant's generation prompt."""
        return self.hf.apply_chat_template(self._conversation(messages, system), tokenize=False,
                                           add_generation_prompt=True)

    def encode_chat(self, messages: Sequence[dict[str, str]], system: str | None = None) -> list[int]:
        """Token ids of the rendered chat. Control tokens typed inside a message (a student writing
        `<|im_end|><|im_start|>system`) are encoded as plain text: only the template writes real ones."""
        encoded = self.hf.apply_chat_template(
            self._conversation(messages, system), tokenize=True, add_generation_prompt=True,
            sanitize_control_tokens=True,
        )
        return list(encoded["input_ids"])

    def _conversation(self, messages: Sequence[dict[str, str]], system: str | None) -> list[dict[str, str]]:
        """The messages, with a system prompt first unless they bring their own: `system`, or the tutor's
        DEFAULT_SYSTEM_PROMPT when it is None (this is the one place that default is chosen); "" means none."""
        if self.hf.chat_template is None:
            raise ModelFormatError(f"{self.name}: the model ships no chat template")
        messages = list(messages)
        if system is None:
            system = DEFAULT_SYSTEM_PROMPT
        if system and not any(m.get("role") == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": system})
        return messages

    # ---- bytes, for incremental detokenization ----

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes token `token_id` contributes to `decode(..., skip_special_tokens=True)`; b"" for specials."""
        return self._bytes_table[token_id]

    @cached_property
    def _bytes_table(self) -> list[bytes]:
        if not isinstance(self.raw.decoder, decoders.ByteLevel):
            kind = type(self.raw.decoder).__name__ if self.raw.decoder is not None else "none"
            raise ModelFormatError(f"{self.name}: streaming needs a byte-level BPE tokenizer, and this one's decoder "
                                   f"is {kind}; SentencePiece-style tokenizers are not supported yet")
        char_to_byte = {c: b for b, c in _bytes_to_unicode().items()}
        table = [b""] * self.vocab_size
        for token, i in self.raw.get_vocab(with_added_tokens=True).items():
            if i in self.special_ids:
                continue
            try:
                table[i] = bytes(char_to_byte[c] for c in token)
            except KeyError:  # as tokenizers' ByteLevel decoder does: a token outside the alphabet stays UTF-8
                table[i] = token.encode("utf-8")
        return table


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


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelFormatError(f"{path}: cannot be read as JSON ({e})") from e


def _token_text(value: object) -> str | None:
    if isinstance(value, dict):  # {"content": "<|im_end|>", "lstrip": false, ...}
        value = value.get("content")
    return value if isinstance(value, str) else None
