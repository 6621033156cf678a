"""What a caller hands the engine and what it gets back.

A request carries prompt token ids (the engine knows nothing about chat templates) and its sampling
parameters. The engine answers with events: zero or more `Queued`, one `Started`, token deltas, then exactly
one `Finished`.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from ..config import DEFAULT_MAX_NEW_TOKENS
from ..errors import InvalidRequest


class FinishReason(enum.StrEnum):
    EOS = "eos"
    LENGTH = "length"
    STOP_SEQUENCE = "stop_sequence"
    TIMEOUT = "timeout"
    QUEUE_TIMEOUT = "queue_timeout"  # waited longer than the queue allows without getting a slot
    CANCELLED = "cancelled"
    SHUTDOWN = "shutdown"
    ERROR = "error"
    REPETITION = "repetition"  # the answer was repeating itself (repetition.py)


class ConstraintKind(enum.StrEnum):
    JSON_SCHEMA = "json_schema"  # source: the schema as JSON text
    JSON_OBJECT = "json_object"  # source: a schema for any object (constraints.json_object_schema)
    REGEX = "regex"
    GRAMMAR = "grammar"  # Lark, in llguidance's dialect (which may embed `%json {...}` schemas)


@dataclass(frozen=True)
class Constraint:
    """What every answer token must keep the text within (engine/constraints.py). `origin` names the request
    field it came from, for a refusal (`response_format`, `tools`)."""

    kind: ConstraintKind
    source: str
    origin: str = field(default="constraint", compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or not self.source:
            raise InvalidRequest(self.origin, "the constraint is empty")
        if len(self.source) > MAX_CONSTRAINT_LENGTH:
            raise InvalidRequest(self.origin, f"a constraint may be at most {MAX_CONSTRAINT_LENGTH} characters")


MAX_CONSTRAINT_LENGTH = 65_536
MAX_TOP_LOGPROBS = 20  # as OpenAI's API
MAX_STOP_SEQUENCES = 8
MAX_STOP_LENGTH = 128


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    temperature: float = 0.2  # 0 means greedy
    top_p: float = 0.9
    top_k: int = 0  # 0 means off
    repetition_penalty: float = 1.1  # a small model repeats itself without it
    seed: int | None = None
    stop: tuple[str, ...] = ()
    timeout_s: float | None = None  # deadline from the moment generation starts
    ignore_eos: bool = False  # benchmarks only: run to max_new_tokens
    # False: compute the whole prompt, reusing no cached prefix (benchmarks of an uncached first token; llama.cpp's
    # server has the same switch). Its K/V are kept for later requests as any prompt's are.
    cache_prompt: bool = True
    constraint: Constraint | None = None  # the answer keeps to it (engine/constraints.py)
    # None: no log probabilities; k: each token's log probability and the k most likely alternatives, in the
    # distribution the token was drawn from (engine/logprobs.py)
    logprobs: int | None = None
    # End an answer that repeats itself over and over (reason `repetition`, engine/repetition.py); off for a client
    # that wants repetition.
    loop_guard: bool = True

    def __post_init__(self) -> None:
        _check_int("max_new_tokens", self.max_new_tokens, 1, 1 << 20)
        _check_float("temperature", self.temperature, 0.0, 5.0)
        _check_float("top_p", self.top_p, 0.0, 1.0, low_open=True)
        _check_int("top_k", self.top_k, 0, 1 << 20)
        _check_float("repetition_penalty", self.repetition_penalty, 0.0, 10.0, low_open=True)
        if self.seed is not None:
            _check_int("seed", self.seed, 0, 2**63 - 1)
        if self.timeout_s is not None:
            _check_float("timeout_s", self.timeout_s, 0.0, 86400.0, low_open=True)
        if isinstance(self.stop, (str, bytes)) or not isinstance(self.stop, (tuple, list)):
            raise InvalidRequest("stop", "must be a list of strings")
        if len(self.stop) > MAX_STOP_SEQUENCES:
            raise InvalidRequest("stop", f"at most {MAX_STOP_SEQUENCES} stop sequences are allowed")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise InvalidRequest("stop", "every stop sequence must be a non-empty string")
            if len(s) > MAX_STOP_LENGTH:
                raise InvalidRequest("stop", f"a stop sequence may be at most {MAX_STOP_LENGTH} characters")
        object.__setattr__(self, "stop", tuple(self.stop))
        if self.constraint is not None and not isinstance(self.constraint, Constraint):
            raise InvalidRequest("constraint", "must be a Constraint")
        if self.constraint is not None and self.ignore_eos:
            raise InvalidRequest("ignore_eos", "cannot be combined with a constraint: a complete answer can only end")
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs, 0, MAX_TOP_LOGPROBS)
        if not isinstance(self.loop_guard, bool):
            raise InvalidRequest("loop_guard", f"must be true or false, got {self.loop_guard!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _check_int(name: str, value: object, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(name, f"must be an integer, got {value!r}")
    if not low <= value <= high:
        raise InvalidRequest(name, f"must be between {low} and {high}, got {value}")


def _check_float(name: str, value: object, low: float, high: float, low_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidRequest(name, f"must be a finite number, got {value!r}")
    if value > high or value < low or (low_open and value == low):
        bound = f"greater than {low}" if low_open else f"at least {low}"
        raise InvalidRequest(name, f"must be {bound} and at most {high}, got {value}")


@dataclass(frozen=True)
class AnswerStart:
    """The start of an answer generated earlier (on another server, or before a restart): the request continues
    it as the same assistant turn instead of beginning a new one."""

    ids: tuple[int, ...]  # the tokens generated so far, in order
    text: str | None = None  # what the client shows of them: the ids must stream exactly this (None: unchecked)


@dataclass
class GenerationRequest:
    id: str
    prompt_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    # Continue this answer: its ids follow the prompt, its tokens count against max_new_tokens, and the
    # generated tokens are numbered after them.
    answer_start: AnswerStart | None = None
    # The id of a request submitted before this one with the same prompt (another choice of `n`): this one takes
    # a slot only once that one's prompt is in the cache, and copies it instead of computing it again.
    follows: str | None = None
    # Whose conversation this is. What a slot caches is reused only by requests of the same owner, except the first
    # `shared_prefix` prompt tokens (a prefix the same for everyone: the server's system prompt), which any request
    # whose prompt starts with the same `shared_prefix` tokens may reuse (prefix_cache.py). None is an owner too:
    # the engine's direct callers (the CLI, benchmarks) share everything among themselves.
    owner: str | None = None
    shared_prefix: int = 0


# ---- events, engine thread -> caller ----


@dataclass(frozen=True)
class Queued:
    request_id: str
    position: int  # 1 = next to start


@dataclass(frozen=True)
class Started:
    request_id: str
    prompt_tokens: int
    queue_ms: float
    cached_tokens: int = 0  # prompt tokens whose K/V were already cached (not computed again)


@dataclass(frozen=True)
class TokenLogprobs:
    logprob: float  # of the token drawn
    top: tuple[tuple[int, float], ...]  # (token id, log probability), most likely first


@dataclass(frozen=True)
class Token:
    request_id: str
    index: int  # 0-based index of the generated token
    token_id: int
    text: str  # may be "" while text is held back (incomplete character or partial stop sequence)
    logprobs: TokenLogprobs | None = None  # when the request asked for them
    # The last Token of an answer that ends by eos, length or stop_sequence carries every held-back character
    # that belongs to the answer (the eos token itself is reported, with its text ""). Text still held back
    # when a request is cancelled, times out or is shut down is dropped: it was never shown.


@dataclass(frozen=True)
class Timings:
    queue_ms: float
    ttft_ms: float  # from submit to the first generated token
    total_ms: float  # from submit to the end
    tokens_per_s: float  # completion tokens over the decode time after the first token


@dataclass(frozen=True)
class Finished:
    request_id: str
    reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    timings: Timings
    error: str | None = None  # set when reason is ERROR


Event = Queued | Started | Token | Finished
