"""Constrained decoding: a JSON Schema, a regular expression or a Lark grammar, applied as a token mask in the step.

llguidance (docs/measurements/2026-12-04-constrained-decoding-libraries.md) reads each token as the bytes its
vocabulary spells, so no tokenizer library is needed; a special token gets a byte mark no text contains.

Every constraint's cost is bounded before it reaches the engine (docs/measurements/2026-12-05-constraint-cost-
bounds.md): llguidance's limits cap the work of each mask, and `compile` computes the first masks off the engine
thread, refusing a constraint they show too costly. The engine computes each row's next mask on a worker thread
while the step's forward pass runs, and a row whose mask is late sits out rather than hold the other rows.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ALL_COMPLETED, FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:  # llguidance is imported by the first constraint or the warm-up, not by a start (a thirtieth of
    # the embedded model's: docs/measurements/2026-12-06-late-tokenizer.md)
    import llguidance
    from llguidance._lib import JsonCompileOptions  # only in llguidance's stubs

from ..errors import InvalidRequest
from ..heap import return_freed_memory
from .request import Constraint, ConstraintKind

log = logging.getLogger("typewriter.engine")

@functools.cache
def parser_limits() -> llguidance.LLParserLimits:
    """Each limit is several times what the lessons' schemas, tool grammars and patterns need, and low enough that
    `0{100000}` or `a{1000000}` stop at their first token and an ambiguous grammar within its first rows (the
    study). Made once, when llguidance is first imported."""
    import llguidance

    return llguidance.LLParserLimits(initial_lexer_fuel=200_000, step_lexer_fuel=20_000, step_max_items=2_000,
                                     max_items_in_row=200, max_lexer_states=20_000, max_grammar_size=50_000,
                                     verbose_errors=False)


FIRST_MASK_CPU_S = 0.25  # the first mask builds the lexer, once, off the engine thread
MASK_CPU_S = 0.01  # any later mask: above the costliest the limits let through, far below a step
# The compiled constraints kept, in estimated bytes: in all, and for any one owner (a client).
CACHE_BYTES = 256 << 20
OWNER_BYTES = 32 << 20
# glibc keeps what an evicted matcher freed (several MB, spread over the compiling threads' arenas) unless trimmed,
# so the server's resident memory drifted tens of MB above the kept share; a trim after each eviction would make the
# next masks fault their pages back in, so once per this much evicted.
TRIM_AFTER_BYTES = 16 << 20
# A kept matcher's estimated bytes, above the resident memory the study measured for one (end to end, with the
# server's own share): per character of its grammar, per byte it forces (a lexer state each), and at least.
_BYTES_PER_CHAR, _BYTES_PER_FORCED, _BYTES_AT_LEAST = 80, 400, 32 << 10
# After the forward pass, how long a step waits for late masks: a share of the pass, and at least.
MASK_WAIT_SHARE, MASK_WAIT_MIN_S = 0.25, 0.002
# A mask whose last one took less CPU than this is computed on the engine thread as the step begins: handing it to a
# worker cost a constrained classroom's steps more (the engine thread waits on the GIL's switch interval) than the
# mask itself (docs/measurements/2026-12-05-bounds-classroom.md).
INLINE_MASK_S = 0.001
# No free whitespace: a small model fills it with newlines until its length runs out.
_JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False, "item_separator": ", ",
                                                "key_separator": ": "}
_REMEDY = ("use smaller repetition counts (such as {1000}) and fewer nested or ambiguous alternatives, or split the "
           "answer into several requests")


class Vocabulary(Protocol):
    eos_token_ids: frozenset[int]
    special_ids: frozenset[int]

    def token_bytes(self, token_id: int) -> bytes: ...


class ConstraintFailed(RuntimeError):
    """A limit reached mid-answer: the constraint could not consume a token its mask allowed. Names the field."""


def grammar_text(constraint: Constraint) -> str:
    import llguidance

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

    def __init__(self, vocabulary: Vocabulary, vocab_size: int, mask_threads: int = 4, cache_bytes: int = CACHE_BYTES,
                 owner_bytes: int = OWNER_BYTES):
        self.vocabulary, self.vocab_size = vocabulary, vocab_size
        self.eos = np.array(sorted(i for i in vocabulary.eos_token_ids if i < vocab_size), dtype=np.int64)
        self._tokenizer: llguidance.LLTokenizer | None = None  # built on first use: seconds on a big vocabulary
        self._kept = _Kept(cache_bytes, owner_bytes)
        self._lock = threading.Lock()
        self._mask_threads = mask_threads
        self._workers: ThreadPoolExecutor | None = None

    def compile(self, constraint: Constraint, owner: str = "") -> llguidance.LLMatcher:
        """A shared matcher, never to be advanced (`start` copies it); InvalidRequest if it does not compile or its
        masks cost too much. `owner` (a client's address or identity) is whose share of the cache it counts in."""
        key = (constraint.kind.value, constraint.source)
        with self._lock:
            if (kept := self._kept.get(owner, key)) is not None:
                return kept
        matcher, size = self._build(constraint)
        with self._lock:
            kept = self._kept.put(owner, key, matcher, size)
            trim = self._kept.evicted >= TRIM_AFTER_BYTES
            if trim:
                self._kept.evicted = 0
        if trim:
            return_freed_memory()
        return kept

    def start(self, constraint: Constraint) -> ConstrainedAnswer:
        """An answer's own copy of the constraint, from whichever owner's kept one; one evicted since its owner
        compiled it is built again and not kept, so that the engine never counts in anyone's share."""
        with self._lock:
            kept = self._kept.find((constraint.kind.value, constraint.source))
        matcher = kept if kept is not None else self._build(constraint)[0]
        return ConstrainedAnswer(matcher.deep_copy(), constraint.origin, self.vocab_size, self.eos)

    def _build(self, constraint: Constraint) -> tuple[llguidance.LLMatcher, int]:
        """A probed matcher and the bytes it is estimated to hold; InvalidRequest if either is too much."""
        import llguidance

        with self._lock:
            tokenizer = self._tokenizer = self._tokenizer or self._build_tokenizer()
        text = grammar_text(constraint)
        matcher = llguidance.LLMatcher(tokenizer, text, log_level=0, limits=parser_limits())
        if matcher.is_error():
            raise InvalidRequest(constraint.origin, f"cannot be used as a constraint: {_first_line(matcher.get_error())}")
        forced = self._probe(constraint, matcher)
        size = max(_BYTES_AT_LEAST, _BYTES_PER_CHAR * len(text) + _BYTES_PER_FORCED * forced)
        if size > self._kept.share:
            raise InvalidRequest(constraint.origin, f"too costly to keep: compiled, it would take about {size >> 20} "
                                                    f"MiB, more than one client may ({self._kept.share >> 20} MiB); "
                                                    f"{_REMEDY}")
        return matcher, size

    def warm(self) -> None:
        """Builds what every constraint needs (its tokenizers: a quarter of a second on a 49k vocabulary), so that the
        first request with one after a start does not wait for it (docs/measurements/2026-12-05-bounds-classroom.md).
        Never raises: a vocabulary llguidance cannot take (its Rust panics are BaseExceptions) fails the first
        constraint instead, as it did before this ran ahead."""
        try:
            with self._lock:
                self._tokenizer = self._tokenizer or self._build_tokenizer()
        except BaseException as e:  # on a thread of its own: nothing else would see it
            log.warning("constraints: their tokenizer could not be built ahead of the first one (%s: %s)",
                        type(e).__name__, _first_line(str(e)))

    def begin(self, answers: Sequence[ConstrainedAnswer]) -> None:
        """Start each answer's next mask on a worker thread, unless it has one coming."""
        if self._workers is None:
            self._workers = ThreadPoolExecutor(max(1, self._mask_threads), thread_name_prefix="typewriter-mask")
        for answer in answers:
            answer.begin(self._workers)

    def wait(self, answers: Sequence[ConstrainedAnswer], timeout_s: float, any_one: bool = False) -> None:
        """Until every answer's next mask is ready (`any_one`: one of them), or `timeout_s` passed."""
        pending = [a.next_mask for a in answers if a.next_mask is not None]
        if pending:
            wait(pending, timeout_s, FIRST_COMPLETED if any_one else ALL_COMPLETED)

    def close(self) -> None:
        if self._workers is not None:
            self._workers.shutdown(wait=False, cancel_futures=True)

    def _probe(self, constraint: Constraint, matcher: llguidance.LLMatcher) -> int:
        """The first mask and the one after the first token, each within its CPU time, else InvalidRequest; the
        bytes the grammar forces. The lexer the first mask builds stays in `matcher` for every copy of it."""
        first = _compute_mask(matcher, self.vocab_size, self.eos)
        if first.dead_end:
            raise InvalidRequest(constraint.origin, "no answer can match it: it allows no first token")
        if first.error is not None:
            raise InvalidRequest(constraint.origin, f"cannot be used as a constraint: {_first_line(first.error)}")
        _check_cost(constraint, first.cpu_s, FIRST_MASK_CPU_S, "its first token's mask")
        if first.tokens.size == 0:  # only the end: an empty answer
            return 0
        after = matcher.deep_copy()
        if not after.consume_token(int(first.tokens[0])) or after.is_error():
            raise InvalidRequest(constraint.origin, f"too costly to enforce ({_first_line(after.get_error())}); "
                                                    f"{_REMEDY}")
        second = _compute_mask(after, self.vocab_size, self.eos)
        if second.error is not None:  # a dead end after one token may be that token's: the engine ends it if so
            raise InvalidRequest(constraint.origin, f"too costly to enforce ({_first_line(second.error)}); {_REMEDY}")
        _check_cost(constraint, second.cpu_s, MASK_CPU_S, "a token's mask")
        return len(matcher.compute_ff_bytes())

    def _build_tokenizer(self) -> llguidance.LLTokenizer:
        """llguidance tokenizes the text a grammar forces through a callback, and this tokenizer's own greedy longest
        match, in Rust, is that callback (a Python one cost most of a forced mask). Built once without the mask's
        slices, which only masks use and which are most of a build that holds the GIL (the server answers nothing
        meanwhile), then given them: docs/measurements/2026-12-05-cached-start.md."""
        import llguidance

        spelled = _ByteVocabulary(self.vocabulary, self.vocab_size)
        eos = sorted(self.vocabulary.eos_token_ids)
        plain = llguidance.LLTokenizer(llguidance.TokenizerWrapper(spelled), n_vocab=self.vocab_size, eos_token=eos,
                                       slices=[])
        spelled.greedy = plain.greedy_tokenize
        return plain.with_slices(llguidance.LLTokenizer.general_slices())


@dataclass(frozen=True)
class _Mask:
    allowed: np.ndarray  # [vocab] bool
    tokens: np.ndarray  # the allowed ids but the end's
    cpu_s: float
    dead_end: bool  # nothing allowed but the end, where the text is not complete
    error: str | None  # llguidance stopped: a limit reached


def _compute_mask(matcher: llguidance.LLMatcher, vocab_size: int, eos: np.ndarray) -> _Mask:
    import llguidance.numpy as llg_numpy

    bitmask = np.empty((1, _words(vocab_size)), dtype=np.int32)  # [1, vocab / 32]
    began = time.thread_time()  # CPU time: another thread's load does not count against the constraint
    llg_numpy.fill_next_token_bitmask(matcher, bitmask, 0)
    cpu_s = time.thread_time() - began
    allowed = np.unpackbits(bitmask.view(np.uint8), bitorder="little")[:vocab_size].astype(bool)  # [vocab]
    tokens = np.flatnonzero(allowed)
    tokens = tokens[~np.isin(tokens, eos)]
    error = matcher.get_error() if matcher.is_error() else None
    dead = tokens.size == 0 and not matcher.is_accepting() and (error is None or error.startswith("NoExtension"))
    return _Mask(allowed, tokens, cpu_s, dead, None if dead else error)


def _check_cost(constraint: Constraint, cpu_s: float, limit_s: float, what: str) -> None:
    if cpu_s > limit_s:
        raise InvalidRequest(constraint.origin, f"too costly to enforce: {what} took {cpu_s * 1000:.0f} ms, more "
                                                f"than the {limit_s * 1000:.0f} ms allowed; {_REMEDY}")


class ConstrainedAnswer:
    """One answer's matcher. Its next mask is computed on a worker thread (`begin`) while the step runs; the engine
    samples once it is `ready`, and a row whose mask is late keeps its logits (`held`) and sits out until it is."""

    def __init__(self, matcher: llguidance.LLMatcher, origin: str, vocab_size: int, eos: np.ndarray):
        self.matcher, self.origin = matcher, origin
        self.vocab_size, self.eos = vocab_size, eos
        self.next_mask: Future[_Mask] | None = None
        self.held: np.ndarray | None = None  # [vocab] logits computed for a token whose mask was not ready
        self.consumed = 0
        self.forced = False  # the last mask allowed one token only
        self.last_cpu_s: float | None = None  # what its last mask took

    def begin(self, workers: ThreadPoolExecutor) -> None:
        if self.next_mask is not None:
            return
        if self.last_cpu_s is not None and self.last_cpu_s < INLINE_MASK_S:
            done: Future[_Mask] = Future()
            done.set_result(self._compute())
            self.next_mask = done
        else:
            self.next_mask = workers.submit(self._compute)

    def _compute(self) -> _Mask:
        mask = _compute_mask(self.matcher, self.vocab_size, self.eos)
        self.last_cpu_s = mask.cpu_s
        return mask

    @property
    def ready(self) -> bool:
        return self.next_mask is not None and self.next_mask.done()

    def failure(self) -> str | None:
        """Why the answer cannot go on (a message naming the field), once its mask is ready; None if it can."""
        mask = self._ready_mask()
        if mask.dead_end:
            return (f"{self.origin}: no token can follow the answer's {self.consumed} tokens (a dead end of the "
                    "constraint); the answer cannot be completed to match it")
        if mask.error is not None:
            return f"{self.origin}: the constraint became too costly to enforce ({_first_line(mask.error)})"
        if mask.cpu_s > 10 * MASK_CPU_S:
            return (f"{self.origin}: the constraint became too costly to enforce (a token's mask took "
                    f"{mask.cpu_s * 1000:.0f} ms)")
        return None

    def mask(self, logits: np.ndarray) -> np.ndarray:
        allowed = self._ready_mask().allowed
        # one token allowed: the grammar's own text, which the loop guard must not take for the model repeating itself
        self.forced = int(np.count_nonzero(allowed)) == 1
        masked = np.where(allowed, logits, -np.inf)
        self.next_mask = None
        return masked

    def consume(self, token_id: int) -> None:
        if not self.matcher.consume_token(token_id):  # a token its mask allowed: a limit reached
            raise ConstraintFailed(f"{self.origin}: the constraint became too costly to enforce "
                                   f"({_first_line(self.matcher.get_error())})")
        self.consumed += 1

    @property
    def complete(self) -> bool:
        return self.matcher.is_accepting()

    def _ready_mask(self) -> _Mask:
        if self.next_mask is None or not self.next_mask.done():
            raise RuntimeError("the constraint's mask was not computed for this step")
        return self.next_mask.result()


class _Kept:
    """Compiled matchers by owner and constraint, bounded in estimated bytes: no owner holds more than `share`, and
    past `total` the owner holding the most gives up its least recently used first, so no owner's compiles push
    another below what it holds itself."""

    def __init__(self, total: int, share: int):
        self.total, self.share = total, min(share, total)
        self._entries: OrderedDict[tuple[str, str, str], tuple[llguidance.LLMatcher, int]] = OrderedDict()
        self._held: Counter[str] = Counter()
        self._owners: dict[tuple[str, str], list[str]] = {}  # constraint -> the owners holding it
        self.evicted = 0  # estimated bytes evicted since the owner of this cache last handed freed memory back

    @property
    def bytes(self) -> int:
        return sum(self._held.values())

    def get(self, owner: str, key: tuple[str, str]) -> llguidance.LLMatcher | None:
        entry = self._entries.get((owner, *key))
        if entry is None:
            return None
        self._entries.move_to_end((owner, *key))
        return entry[0]

    def find(self, key: tuple[str, str]) -> llguidance.LLMatcher | None:
        owners = self._owners.get(key)
        return self._entries[(owners[-1], *key)][0] if owners else None

    def put(self, owner: str, key: tuple[str, str], matcher: llguidance.LLMatcher, size: int) -> llguidance.LLMatcher:
        if (kept := self.get(owner, key)) is not None:  # another thread compiled it meanwhile
            return kept
        while self._held[owner] + size > self.share:
            self._evict(owner)
        while self.bytes + size > self.total:
            self._evict(max(self._held, key=lambda o: self._held[o]))
        self._entries[(owner, *key)] = (matcher, size)
        self._held[owner] += size
        self._owners.setdefault(key, []).append(owner)
        return matcher

    def held(self, owner: str) -> int:
        return self._held[owner]

    def _evict(self, owner: str) -> None:
        """`owner`'s least recently used entry."""
        entry = next(k for k in self._entries if k[0] == owner)
        _, size = self._entries.pop(entry)
        self.evicted += size
        self._held[owner] -= size
        if not self._held[owner]:
            del self._held[owner]
        key = (entry[1], entry[2])
        self._owners[key].remove(owner)
        if not self._owners[key]:
            del self._owners[key]


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
        self.greedy: Callable[[str], list[int]] = lambda text: []  # set once a tokenizer over `tokens` exists

    def __call__(self, text: str) -> list[int]:
        """Greedy longest-match tokenizing: only for llguidance's own re-tokenizing, never for an answer."""
        if not isinstance(text, str):  # so that llguidance's wrapper hands over text, never bytes
            raise TypeError("text only")
        return self.greedy(text)


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
