"""A GGUF file's `tokenizer.ggml.*` metadata rebuilt as a `tokenizers.Tokenizer` (no torch, no sentencepiece):
`gpt2` is byte-level BPE with llama.cpp's pre-tokenizer regexes; `llama` is SentencePiece BPE with byte fallback,
whose merges are ranked by the joined piece's score, as llama.cpp and transformers' `SentencePieceExtractor` do.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as RawTokenizer

from ..errors import ModelFormatError

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
    get = fields.get
    kind = get("tokenizer.ggml.model")
    tokens: list[str] | None = get("tokenizer.ggml.tokens")
    if kind not in TOKENIZER_MODELS:
        raise ModelFormatError(f"{path}: tokenizer.ggml.model {kind!r} is not supported (supported: "
                               "'gpt2' byte-level BPE, 'llama' SentencePiece BPE)")
    types: list[int] = get("tokenizer.ggml.token_type", [1] * len(tokens or []))
    if tokens is None or len(types) != len(tokens):
        raise ModelFormatError(f"{path}: tokenizer.ggml.tokens and token_type are missing or differ in length")

    raw = _byte_level_bpe(path, fields, tokens) if kind == "gpt2" else _sentencepiece_bpe(path, fields, tokens)
    # Already in the vocab, so these keep their ids; registering them makes the text "<|im_start|>" one token.
    raw.add_tokens(
        [AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, types) if k == _USER_DEFINED]
    )
    raw.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types) if k == _CONTROL]
    )
    return raw


def _byte_level_bpe(path: str | Path, fields: Mapping[str, Any], tokens: list[str]) -> RawTokenizer:
    pre = fields.get("tokenizer.ggml.pre")
    if pre not in PRE_TOKENIZER_REGEXES:
        raise ModelFormatError(f"{path}: tokenizer.ggml.pre {pre!r} is not a known pre-tokenizer (known: "
                               f"{', '.join(sorted(PRE_TOKENIZER_REGEXES))})")
    merges = [tuple(m.split(" ", 1)) for m in fields.get("tokenizer.ggml.merges", [])]
    raw = RawTokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    raw.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(rx), behavior="isolated") for rx in PRE_TOKENIZER_REGEXES[pre]]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    raw.decoder = decoders.ByteLevel()
    return raw


def _sentencepiece_bpe(path: str | Path, fields: Mapping[str, Any], tokens: list[str]) -> RawTokenizer:
    scores: list[float] | None = fields.get("tokenizer.ggml.scores")
    if scores is None or len(scores) != len(tokens):
        raise ModelFormatError(f"{path}: tokenizer.ggml.scores is missing or differs in length from the tokens; "
                               "a 'llama' tokenizer ranks its merges by score")
    vocab = {t: i for i, t in enumerate(tokens)}
    unk_id = fields.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if unk_id is not None and 0 <= unk_id < len(tokens) else None
    model = models.BPE(vocab=vocab, merges=sentencepiece_merges(tokens, scores), unk_token=unk, fuse_unk=True,
                       byte_fallback=True)
    raw = RawTokenizer(model)
    prefix = bool(fields.get("tokenizer.ggml.add_space_prefix", True))
    raw.normalizer = normalizers.Sequence(
        ([normalizers.Prepend(METASPACE)] if prefix else []) + [normalizers.Replace(" ", METASPACE)]
    )
    raw.decoder = decoders.Sequence(
        [decoders.Replace(METASPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
        + ([decoders.Strip(" ", 1, 0)] if prefix else [])
    )
    return raw


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
