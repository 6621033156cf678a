"""A GGUF file's `tokenizer.ggml.*` metadata rebuilt as a `tokenizers.Tokenizer` (no torch, no sentencepiece):
`gpt2` is byte-level BPE with llama.cpp's pre-tokenizer regexes; `llama` is SentencePiece BPE with byte fallback,
whose merges are ranked by the joined piece's score, as llama.cpp and transformers' `SentencePieceExtractor` do.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as RawTokenizer

from ..errors import ModelFormatError
from ..heap import return_freed_memory

# GGUF `tokenizer.ggml.token_type` values (gguf.TokenType).
_CONTROL, _USER_DEFINED = 3, 4

# llama.cpp's pre-tokenizer regexes (llama-vocab.cpp), keyed by `tokenizer.ggml.pre`, applied in turn.
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
    **dict.fromkeys(("smollm", "starcoder", "refact", "codeshell"), (r"\p{N}", _GPT2_REGEX)),
    **dict.fromkeys(("llama3", "llama-bpe", "smaug-bpe"), (_LLAMA3_REGEX,)),
    "qwen2": (_QWEN2_REGEX,),
}
TOKENIZER_MODELS = ("gpt2", "llama")
METASPACE = "▁"


def raw_tokenizer_from_gguf(path: str | Path, fields: Mapping[str, Any]) -> RawTokenizer:
    return LateRawTokenizer(path, fields).build()


class LateRawTokenizer:
    """A GGUF file's tokenizer whose BPE model, the costly part (a quarter of a second on Qwen2.5's 150k tokens and
    merges, holding the GIL), is built by `build()` on first use, not at load
    (docs/measurements/2026-12-06-late-tokenizer.md). What a load reads of it (the added tokens and their ids, the
    vocabulary's size, a token's id, the decoder) comes from the file's lists meanwhile, as the built tokenizer
    answers it (tests/text/test_gguf_tokenizer_late.py holds the two equal); a bad file is refused here, at load."""

    def __init__(self, path: str | Path, fields: Mapping[str, Any]):
        get = fields.get
        kind = get("tokenizer.ggml.model")
        tokens: list[str] | None = get("tokenizer.ggml.tokens")
        if kind not in TOKENIZER_MODELS:
            raise ModelFormatError(f"{path}: tokenizer.ggml.model {kind!r} is not supported (supported: "
                                   "'gpt2' byte-level BPE, 'llama' SentencePiece BPE)")
        types: list[int] = get("tokenizer.ggml.token_type", [1] * len(tokens or []))
        if tokens is None or len(types) != len(tokens):
            raise ModelFormatError(f"{path}: tokenizer.ggml.tokens and token_type are missing or differ in length")
        self._fields, self._tokens, self._kind = fields, tokens, kind
        if kind == "gpt2":
            pre = get("tokenizer.ggml.pre")
            if pre not in PRE_TOKENIZER_REGEXES:
                raise ModelFormatError(f"{path}: tokenizer.ggml.pre {pre!r} is not a known pre-tokenizer (known: "
                                       f"{', '.join(sorted(PRE_TOKENIZER_REGEXES))})")
            self.normalizer: normalizers.Normalizer | None = None
            self.pre_tokenizer: pre_tokenizers.PreTokenizer | None = pre_tokenizers.Sequence(
                [pre_tokenizers.Split(Regex(rx), behavior="isolated") for rx in PRE_TOKENIZER_REGEXES[pre]]
                + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
            )
            self.decoder: decoders.Decoder = decoders.ByteLevel()
        else:
            scores: list[float] | None = get("tokenizer.ggml.scores")
            if scores is None or len(scores) != len(tokens):
                raise ModelFormatError(f"{path}: tokenizer.ggml.scores is missing or differs in length from the "
                                       "tokens; a 'llama' tokenizer ranks its merges by score")
            prefix = bool(get("tokenizer.ggml.add_space_prefix", True))
            self.normalizer = normalizers.Sequence(
                ([normalizers.Prepend(METASPACE)] if prefix else []) + [normalizers.Replace(" ", METASPACE)]
            )
            self.pre_tokenizer = None
            self.decoder = decoders.Sequence(
                [decoders.Replace(METASPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
                + ([decoders.Strip(" ", 1, 0)] if prefix else [])
            )
        self._ids = {t: i for i, t in enumerate(tokens)}  # as the BPE model's: a repeated text keeps its last id
        # Already in the vocab, so these keep their ids; registering them makes the text "<|im_start|>" one token.
        # A text both user-defined and control ends special, as the second registration leaves it.
        self._added = {t: AddedToken(t, special=False, normalized=False)
                       for t, k in zip(tokens, types) if k == _USER_DEFINED}
        self._added |= {t: AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types)
                        if k == _CONTROL}
        self._first = list(self._added.values())
        self._later: list[AddedToken] = []  # added by a caller before the tokenizer was built
        self._raw: RawTokenizer | None = None
        self._lock = threading.Lock()

    @property
    def built(self) -> bool:
        return self._raw is not None

    def build(self) -> RawTokenizer:
        """The whole tokenizer, built once; every thread asking meanwhile waits for that one."""
        raw = self._raw
        if raw is not None:
            return raw
        with self._lock:
            if self._raw is None:
                model = (_byte_level_bpe(self._fields, self._ids) if self._kind == "gpt2"
                         else _sentencepiece_bpe(self._fields, self._tokens, self._ids))
                raw = RawTokenizer(model)
                raw.normalizer, raw.pre_tokenizer, raw.decoder = self.normalizer, self.pre_tokenizer, self.decoder
                raw.add_tokens([t for t in self._first if not t.special])
                raw.add_special_tokens([t for t in self._first if t.special])
                raw.add_tokens(self._later)
                self._raw = raw
                # every fact comes from `raw` now: the lists it was built from go, and the heap the merges' pairs
                # took goes back to the system, as the load's did when the BPE was built there (about 20 MB on
                # Qwen2.5's: docs/measurements/2026-12-06-late-tokenizer.md)
                self._fields, self._tokens, self._ids = {}, [], {}
                return_freed_memory()
            return self._raw

    # What a load reads, answered from the lists until the tokenizer is built, and by it after.

    def no_truncation(self) -> None:
        """A GGUF's tokenizer is built with neither truncation nor padding."""
        if self._raw is not None:
            self._raw.no_truncation()

    def no_padding(self) -> None:
        if self._raw is not None:
            self._raw.no_padding()

    def add_tokens(self, tokens: list[AddedToken]) -> int:
        if self._raw is not None or any(t.content not in self._ids for t in tokens):
            return self.build().add_tokens(tokens)  # a new id: the built tokenizer says which
        new = list({t.content: t for t in tokens if t.content not in self._added}.values())
        self._added |= {t.content: t for t in new}
        self._later += new
        return len(new)

    def get_added_tokens_decoder(self) -> dict[int, AddedToken]:
        if self._raw is not None:
            return self._raw.get_added_tokens_decoder()
        return dict(sorted((self._ids[t.content], t) for t in self._added.values()))

    def get_vocab_size(self, with_added_tokens: bool = True) -> int:
        return self._raw.get_vocab_size(with_added_tokens) if self._raw is not None else len(self._ids)

    def token_to_id(self, token: str) -> int | None:
        return self._raw.token_to_id(token) if self._raw is not None else self._ids.get(token)

    def get_vocab(self, with_added_tokens: bool = True) -> dict[str, int]:
        return self.build().get_vocab(with_added_tokens)


def _byte_level_bpe(fields: Mapping[str, Any], ids: dict[str, int]) -> models.BPE:
    merges = [tuple(m.split(" ", 1)) for m in fields.get("tokenizer.ggml.merges", [])]
    return models.BPE(vocab=ids, merges=merges)


def _sentencepiece_bpe(fields: Mapping[str, Any], tokens: list[str], ids: dict[str, int]) -> models.BPE:
    scores: list[float] = fields["tokenizer.ggml.scores"]
    unk_id = fields.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if unk_id is not None and 0 <= unk_id < len(tokens) else None
    return models.BPE(vocab=ids, merges=sentencepiece_merges(tokens, scores),
                      unk_token=unk, fuse_unk=True, byte_fallback=True)


def sentencepiece_merges(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """Best-scoring joined piece first; ties to the lower ids of the joined piece, then of its halves."""
    ids = {t: i for i, t in enumerate(tokens)}
    ranked: list[tuple[float, int, int, int, str, str]] = []
    for n, (piece, score) in enumerate(zip(tokens, scores)):
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in ids and right in ids:
                ranked.append((-score, n, ids[left], ids[right], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]
