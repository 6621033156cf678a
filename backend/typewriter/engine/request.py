"""What a caller hands the engine (prompt token ids and sampling parameters) and what it gets back: zero or more
`Queued`, one `Started`, `Token`s, then exactly one `Finished`.
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
    QUEUE_TIMEOUT = "queue_timeout"
    CANCELLED = "cancelled"
    SHUTDOWN = "shutdown"
    ERROR = "error"
    # The answer's constraint could go no further (a dead end, or a limit reached mid-answer): the client's, not a
    # fault of the server's. `Finished.error` says which, starting with the constraint's field.
    CONSTRAINT = "constraint"
    REPETITION = "repetition"


class ConstraintKind(enum.StrEnum):
    JSON_SCHEMA = "json_schema"  # source: the schema as JSON text
    JSON_OBJECT = "json_object"  # source: constraints.json_object_schema()
    REGEX = "regex"
    GRAMMAR = "grammar"  # Lark, in llguidance's dialect (which may embed `%json {...}` schemas)


@dataclass(frozen=True)
class Constraint:
    """`origin`: the request field it came from, named in a refusal."""

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


# Below this many weights a model's default repetition penalty is SamplingParams' 1.1, at or above it 1 (off, as
# llama-server's, vLLM's and OpenAI's): the 135M loops without it at the page's temperature, while the 0.5B answered
# GSM8K less often right with it (docs/measurements/2026-12-05-tutor-correctness.md, "Generation, paired").
SMALL_MODEL_PARAMETERS = 300_000_000


def default_repetition_penalty(parameters: int) -> float:
    """The penalty a request gets when it names none, for a model of `parameters` weights (0: not known, small)."""
    return SamplingParams.repetition_penalty if parameters < SMALL_MODEL_PARAMETERS else 1.0


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    temperature: float = 0.2  # 0 means greedy
    top_p: float = 0.9
    top_k: int = 0  # 0 means off
    # a small model repeats itself without it; a server or command passes its model's (default_repetition_penalty)
    repetition_penalty: float = 1.1
    seed: int | None = None
    stop: tuple[str, ...] = ()
    timeout_s: float | None = None  # deadline from the moment generation starts
    ignore_eos: bool = False  # benchmarks only: run to max_new_tokens
    cache_prompt: bool = True  # False: reuse no cached prefix (benchmarks of an uncached first token)
    constraint: Constraint | None = None
    logprobs: int | None = None  # k: each token's log probability and its k likeliest alternatives
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
    """An answer begun elsewhere or before a restart, continued as the same assistant turn."""

    ids: tuple[int, ...]
    text: str | None = None  # what the client shows of them: the ids must stream exactly this (None: unchecked)


@dataclass(frozen=True)
class Share:
    """Whose service a request is charged to, for the fair scheduler: a client (a student, an API key, an address)
    within a group (a class), and the group's weight against the other groups'."""

    client: str = ""
    group: str = ""
    weight: float = 1.0

    def __post_init__(self) -> None:
        _check_float("share.weight", self.weight, 0.0, 1e6, low_open=True)


@dataclass
class GenerationRequest:
    id: str
    prompt_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    answer_start: AnswerStart | None = None  # its tokens count against max_new_tokens
    # An earlier request with the same prompt (another choice of `n`): this one waits to copy its cached prompt.
    follows: str | None = None
    # A slot's cache is reused only by its owner's requests, but for its first n tokens for each n in `shared_prefix`
    # (the class's prompt with the question's start, and without it), which every owner shares (prefix_cache.py).
    # None is an owner too: the CLI's and benchmarks'.
    owner: str | None = None
    shared_prefix: tuple[int, ...] = ()
    share: Share = field(default_factory=Share)


@dataclass(frozen=True)
class Queued:
    request_id: str
    position: int  # 1 = next to start


@dataclass(frozen=True)
class Started:
    request_id: str
    prompt_tokens: int
    queue_ms: float
    cached_tokens: int = 0  # prompt tokens found already cached


@dataclass(frozen=True)
class TokenLogprobs:
    logprob: float
    top: tuple[tuple[int, float], ...]  # (token id, log probability), most likely first


@dataclass(frozen=True)
class Token:
    request_id: str
    index: int  # 0-based index of the generated token
    token_id: int
    text: str  # may be "" while text is held back (incomplete character or partial stop sequence)
    logprobs: TokenLogprobs | None = None
    # The last Token of an answer ending by eos (reported, text ""), length or stop_sequence carries all held-back
    # text; text held back at a cancel, timeout or shutdown is dropped, as it was never shown.


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
    error: str | None = None


Event = Queued | Started | Token | Finished
