"""One request's life inside the engine; `take` is the per-token part of a step, testable without a thread or model.
A continued answer (`AnswerStart`) is replayed through the same pipeline first, so greedy and seeded draws go on
exactly as if it had never stopped.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection

import numpy as np

from ..errors import InvalidRequest
from ..text.detokenizer import IncrementalDetokenizer, Spelling
from ..text.stops import StopMatcher
from .constraints import ConstrainedAnswer
from .drafting import Drafts
from .logprobs import token_logprobs
from .repetition import LoopGuard
from .request import AnswerStart, Event, FinishReason, GenerationRequest, Timings, TokenLogprobs
from .sampling import Sampler, Seen
from .wrap_up import WrapUp


class Status(enum.Enum):
    WAITING = "waiting"  # for a slot (again, once parked)
    PREFILLING = "prefilling"  # has a slot; its prompt goes into the cache chunk by chunk
    RUNNING = "running"  # decoding, one token per step
    FINISHED = "finished"


_ALLOWED = {
    Status.WAITING: {Status.PREFILLING, Status.FINISHED},
    Status.PREFILLING: {Status.RUNNING, Status.WAITING, Status.FINISHED},
    Status.RUNNING: {Status.WAITING, Status.FINISHED},
    Status.FINISHED: set(),
}


class RequestState:
    def __init__(self, request: GenerationRequest, on_event: Callable[[Event], None], tokenizer: Spelling,
                 eos_ids: Collection[int], now: float, constraint: ConstrainedAnswer | None = None):
        self.id = request.id
        self.follows = request.follows
        self.constraint = constraint
        self.logprobs: TokenLogprobs | None = None
        self.params = request.params
        self.on_event = on_event
        self.status = Status.WAITING
        self.slot = -1
        start = request.answer_start
        # The model reads an answer's start as prompt: its K/V are prefilled, and its tokens are not generated.
        self.prompt_ids = list(request.prompt_ids) + (list(start.ids) if start else [])
        self.continued = len(start.ids) if start else 0  # answer tokens generated before this request
        self.owner, self.shared_prefix = request.owner, request.shared_prefix
        self.share = request.share  # whose service it is (fairness.py)
        self.charged = 0  # generated tokens already charged to its share
        self.output_ids: list[int] = []
        self.prefilled = 0  # tokens of `fill_ids` whose K/V are in the slot's cache
        self.parks = 0  # times it gave its slot back to a client short of its share (scheduler.py)
        self.admission = 0  # when it last took a slot, in the scheduler's count of admissions
        self.reused = 0  # of those, found already cached
        self.eos_ids = eos_ids
        self.sampler = Sampler(request.params)
        # The repetition penalty weighs the answer's own words (those it continues included), not the prompt's, which
        # an answer should reuse (the question's numbers, names, language), nor its digits and symbols, which a
        # worked sum repeats by nature: weighing either made maths answers wrong
        # (docs/measurements/2026-12-05-tutor-correctness.md).
        self._wordy = tokenizer.token_text.wordy
        self.penalised = Seen(t for t in (start.ids if start else ()) if self._is_word(t))
        self.detokenizer = IncrementalDetokenizer(tokenizer)
        self.stops = StopMatcher(request.params.stop)
        self.loops = LoopGuard() if request.params.loop_guard else None
        self.wrap_up: WrapUp | None = None  # steering a constrained answer that loops to its end
        self.drafts: Drafts | None = None  # its guesses from the conversation, once the engine drafts for it
        self._table = tokenizer.token_text.table
        self.last_position = 0
        self.submitted = now
        self.started = 0.0
        self.first_token = 0.0
        if start is not None:
            self._replay(start)

    def move_to(self, status: Status) -> None:
        if status not in _ALLOWED[self.status]:
            raise RuntimeError(f"request {self.id}: {self.status.value} -> {status.value} is not allowed")
        self.status = status

    @property
    def last_index(self) -> int:
        """The answer-wide index of the latest generated token (after those it continues)."""
        return self.continued + len(self.output_ids) - 1

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def fill_ids(self) -> list[int]:
        """What is prefilled before it decodes: the prompt, and once parked the answer so far, so that the last
        chunk's logits give its next token."""
        return self.prompt_ids + self.output_ids if self.output_ids else self.prompt_ids

    @property
    def computed(self) -> int:
        """Positions 0..computed-1 of the slot hold this request's K/V: `fill_ids` so far while prefilling, then
        the prompt and every generated token but the last (it is fed by the next decode step)."""
        if self.status is Status.PREFILLING or not self.output_ids:
            return self.prefilled
        return self.num_tokens - 1

    def park(self) -> None:
        """Out of its slot and waiting again; its answer so far is prefilled anew when it has a slot."""
        self.move_to(Status.WAITING)
        self.slot, self.prefilled = -1, 0
        self.parks += 1

    def cached_ids(self) -> list[int]:
        return (self.prompt_ids + self.output_ids)[: self.computed]

    def deadline_passed(self, now: float) -> bool:
        timeout = self.params.timeout_s
        return timeout is not None and self.started > 0 and now - self.started > timeout

    def sample(self, logits: np.ndarray) -> int:
        if self.constraint is not None:
            logits = self.constraint.mask(logits)
        if self.wrap_up is not None:
            logits = self.wrap_up.steer(logits)
        token_id = self.sampler.sample(logits, self.penalised)
        if self.params.logprobs is not None:
            self.logprobs = token_logprobs(self.params, logits, self.penalised, token_id, self.params.logprobs)
        return token_id

    def take(self, token_id: int, now: float) -> tuple[str, FinishReason | None]:
        """The text this token makes certain (maybe "") and why the answer ends here (None: it goes on). A final
        token's text carries all held back but an unfinished UTF-8 character; never a stop sequence or what follows."""
        self.output_ids.append(token_id)
        if self._is_word(token_id):
            self.penalised.add(token_id)
        if len(self.output_ids) == 1:
            self.first_token = now
        if self.constraint is not None:
            self.constraint.consume(token_id)
        if self.wrap_up is not None:
            self.wrap_up.push(token_id)
        forced = self.constraint is not None and self.constraint.forced
        return self._pipe(token_id, self.last_index + 1, forced)

    def _is_word(self, token_id: int) -> bool:
        return not 0 <= token_id < self._wordy.size or bool(self._wordy[token_id])

    def _pipe(self, token_id: int, answer_tokens: int, forced: bool = False) -> tuple[str, FinishReason | None]:
        if token_id in self.eos_ids and not self.params.ignore_eos:
            self.detokenizer.flush()  # an unfinished character is dropped, never sent as U+FFFD
            # a loop steered to its end says so, as a loop cut in plain text does
            return self.stops.flush(), FinishReason.EOS if self.wrap_up is None else FinishReason.REPETITION
        text, stopped = self.stops.push(self.detokenizer.push(token_id))
        if stopped:
            return text, FinishReason.STOP_SEQUENCE
        if answer_tokens >= self.params.max_new_tokens:
            self.detokenizer.flush()
            return text + self.stops.flush(), FinishReason.LENGTH
        if self.loops is not None and not forced and self.loops.push(token_id):
            # A constrained answer is cut only where its constraint could end, so what was sent still matches it;
            # elsewhere it is steered to an end.
            if self.constraint is None or self.constraint.complete:
                self.detokenizer.flush()
                return text + self.stops.flush(), FinishReason.REPETITION
            if self.wrap_up is None:
                answer = b"".join(self._table[i] for i in self.output_ids)
                self.wrap_up = WrapUp(self._table, answer, self.output_ids)
        return text, None

    def _replay(self, start: AnswerStart) -> None:
        """Its text is dropped (the client has it); InvalidRequest if it ended or does not stream as `start.text`."""
        shown = []
        for n, token_id in enumerate(start.ids, 1):
            if self.constraint is not None:  # the constraint goes on from where the answer is
                try:
                    self.constraint.consume(token_id)
                except RuntimeError:
                    raise InvalidRequest("continue.ids", f"token {n - 1} of the answer's start does not follow "
                                                         "its response_format") from None
            text, reason = self._pipe(token_id, n)
            if reason is not None:
                raise InvalidRequest("continue", f"the answer already ended at its token {n - 1} "
                                                     f"({reason.value}); there is nothing to continue")
            shown.append(text)
        if start.text is not None and "".join(shown) != start.text:
            raise InvalidRequest("continue.ids", "these tokens do not spell continue.text with this server's "
                                                 "tokenizer")
        self.sampler.skip(len(start.ids))

    def timings(self, now: float) -> Timings:
        n = len(self.output_ids)
        decode_s = now - self.first_token if n > 1 else 0.0
        return Timings(
            queue_ms=((self.started or now) - self.submitted) * 1000,
            ttft_ms=(self.first_token - self.submitted) * 1000 if n else 0.0,
            total_ms=(now - self.submitted) * 1000,
            tokens_per_s=(n - 1) / decode_s if decode_s > 0 else 0.0,
        )
