"""Constrained decoding: a JSON Schema, a regular expression or a Lark grammar, applied as a token mask in the step.

llguidance (docs/measurements/2026-12-04-constrained-decoding-libraries.md) reads each token as the bytes its
vocabulary spells, so no tokenizer library is needed; a special token gets a byte mark no text contains.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import llguidance
import llguidance.numpy as llg_numpy

if TYPE_CHECKING:  # only in llguidance's stubs
    from llguidance._lib import JsonCompileOptions
import numpy as np

from ..errors import InvalidRequest
from .request import Constraint, ConstraintKind

CACHE_SIZE = 128
_MAX_TOKEN_BYTES = 64
# No free whitespace: a small model fills it with newlines until its length runs out.
_JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False, "item_separator": ", ",
                                                "key_separator": ": "}


class Vocabulary(Protocol):
    eos_token_ids: frozenset[int]
    special_ids: frozenset[int]

    def token_bytes(self, token_id: int) -> bytes: ...


def grammar_text(constraint: Constraint) -> str:
    if constraint.kind is ConstraintKind.JSON_SCHEMA or constraint.kind is ConstraintKind.JSON_OBJECT:
        try:
            return llguidance.LLMatcher.grammar_from_json_schema(constraint.source, defaults=_JSON_OPTIONS)
        except ValueError as e:
            raise InvalidRequest(constraint.origin, f"not a JSON Schema: {e}") from None
    if constraint.kind is ConstraintKind.REGEX:
        return llguidance.LLMatcher.grammar_from_regex(constraint.source)
    return llguidance.LLMatcher.grammar_from_lark(constraint.source)


class Grammars:
    """Thread-safe: the server compiles a constraint before submitting, to refuse a bad one at once, and the engine
    thread finds it here when the request starts."""

    def __init__(self, vocabulary: Vocabulary, vocab_size: int):
        self.vocabulary, self.vocab_size = vocabulary, vocab_size
        self._tokenizer: llguidance.LLTokenizer | None = None  # built on first use: seconds on a big vocabulary
        self._compiled: OrderedDict[tuple[str, str], llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()
        self._executor: llguidance.LLExecutor | None = None

    def compile(self, constraint: Constraint) -> llguidance.LLMatcher:
        """A shared matcher, never to be advanced (`start` copies it); InvalidRequest if it does not compile."""
        key = (constraint.kind, constraint.source)
        with self._lock:
            if key in self._compiled:
                self._compiled.move_to_end(key)
                return self._compiled[key]
            tokenizer = self._tokenizer = self._tokenizer or self._build_tokenizer()
        matcher = llguidance.LLMatcher(tokenizer, grammar_text(constraint), log_level=0)
        if matcher.is_error():
            raise InvalidRequest(constraint.origin, f"cannot be used as a constraint: {_first_line(matcher.get_error())}")
        with self._lock:
            self._compiled[key] = matcher
            while len(self._compiled) > CACHE_SIZE:
                self._compiled.popitem(last=False)
        return matcher

    def start(self, constraint: Constraint) -> ConstrainedAnswer:
        return ConstrainedAnswer(self.compile(constraint).deep_copy())

    def fill_masks(self, answers: Sequence[ConstrainedAnswer]) -> None:
        if not answers:
            return
        bitmask = np.empty((len(answers), _words(self.vocab_size)), dtype=np.int32)  # [rows, vocab / 32]
        if len(answers) == 1:
            llg_numpy.fill_next_token_bitmask(answers[0].matcher, bitmask, 0)
        else:
            if self._executor is None:
                self._executor = llguidance.LLExecutor()
            llg_numpy.fill_next_token_bitmask_par(self._executor, [(a.matcher, i) for i, a in enumerate(answers)],
                                                  bitmask)
        allowed = np.unpackbits(bitmask.view(np.uint8), axis=1, bitorder="little")  # [rows, words * 32]
        for answer, row in zip(answers, allowed):
            answer.allowed = row[: self.vocab_size].astype(bool)

    def _build_tokenizer(self) -> llguidance.LLTokenizer:
        return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_ByteVocabulary(self.vocabulary, self.vocab_size)),
                                      n_vocab=self.vocab_size, eos_token=sorted(self.vocabulary.eos_token_ids))


class ConstrainedAnswer:
    def __init__(self, matcher: llguidance.LLMatcher):
        self.matcher = matcher
        self.allowed: np.ndarray | None = None  # [vocab] bool, set by Grammars.fill_masks for the next token

    def mask(self, logits: np.ndarray) -> np.ndarray:
        if self.allowed is None:
            raise RuntimeError("the constraint's mask was not computed for this step")
        masked = np.where(self.allowed, logits, -np.inf)
        self.allowed = None
        return masked

    def consume(self, token_id: int) -> None:
        if not self.matcher.consume_token(token_id):
            raise RuntimeError(f"the constraint refused token {token_id}: {self.matcher.get_error()}")

    @property
    def complete(self) -> bool:
        return self.matcher.is_accepting()


class _ByteVocabulary:
    def __init__(self, vocabulary: Vocabulary, vocab_size: int):
        self.eos_token_id = min(vocabulary.eos_token_ids)
        self.bos_token_id = None
        special = set(vocabulary.special_ids) | set(vocabulary.eos_token_ids)
        tokens, marked = [], []
        for i in range(vocab_size):
            piece = b"" if i in special else _bytes_or_none(vocabulary, i)
            if not piece:
                piece = b"\xff<%d>" % i
                marked.append(i)
            tokens.append(piece)
        self.tokens, self.special_token_ids = tokens, marked
        self._ids = {piece: i for i, piece in reversed(list(enumerate(tokens)))}  # the lowest id per spelling

    def __call__(self, text: bytes | str) -> list[int]:
        """Greedy longest-match tokenizing: only for llguidance's own re-tokenizing, never for an answer."""
        data = text.encode("utf-8") if isinstance(text, str) else text
        out, i = [], 0
        while i < len(data):
            for n in range(min(_MAX_TOKEN_BYTES, len(data) - i), 0, -1):
                if (token := self._ids.get(data[i : i + n])) is not None:
                    out.append(token)
                    i += n
                    break
            else:
                i += 1  # a byte no token spells: dropped
        return out


def _bytes_or_none(vocabulary: Vocabulary, token_id: int) -> bytes:
    try:
        return vocabulary.token_bytes(token_id)
    except IndexError:  # past the tokenizer's vocabulary: the model's logits are wider (Qwen2.5)
        return b""


def _words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def _first_line(error: str) -> str:
    return error.strip().splitlines()[0][:300] if error.strip() else "unknown error"


def json_object_schema() -> str:
    return json.dumps({"type": "object"})
