"""One request's life inside the engine: its status, slot, tokens, and the text pipeline of its answer.

`take(token_id)` is the per-token part of an engine step, testable without a thread or a model: append the
token, detokenize it, hold back a possible partial stop sequence, and say whether the answer has ended (eos,
stop sequence, length) and with what final text.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection

import numpy as np

from ..text.detokenizer import IncrementalDetokenizer
from .repetition import LoopGuard
from .request import Event, FinishReason, GenerationRequest, Timings
from .sampling import Sampler
from ..text.stops import StopMatcher


class Status(enum.Enum):
    WAITING = "waiting"  # for a slot
    PREFILLING = "prefilling"  # has a slot; its prompt goes into the cache chunk by chunk
    RUNNING = "running"  # decoding, one token per step
    FINISHED = "finished"


_ALLOWED = {
    Status.WAITING: {Status.PREFILLING, Status.FINISHED},
    Status.PREFILLING: {Status.RUNNING, Status.FINISHED},
    Status.RUNNING: {Status.FINISHED},
    Status.FINISHED: set(),
}


class RequestState:
    def __init__(self, request: GenerationRequest, on_event: Callable[[Event], None], tokenizer,
                 eos_ids: Collection[int], now: float):
        self.id = request.id
        self.params = request.params
        self.on_event = on_event
        self.status = Status.WAITING
        self.slot = -1
        self.prompt_ids = list(request.prompt_ids)
        self.owner, self.shared_prefix = request.owner, request.shared_prefix  # whose cache it may reuse
        self.output_ids: list[int] = []
        self.prefilled = 0  # prompt tokens whose K/V are in the slot's cache
        self.reused = 0  # of those, how many were found already cached (prefix reuse)
        self.eos_ids = eos_ids
        self.sampler = Sampler(request.params)
        self.detokenizer = IncrementalDetokenizer(tokenizer)
        self.stops = StopMatcher(request.params.stop)
        self.loops = LoopGuard() if request.params.loop_guard else None
        self.last_position = 0  # the queue position last reported
        self.submitted = now
        self.started = 0.0
        self.first_token = 0.0

    def move_to(self, status: Status) -> None:
        if status not in _ALLOWED[self.status]:
            raise RuntimeError(f"request {self.id}: {self.status.value} -> {status.value} is not allowed")
        self.status = status

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def computed(self) -> int:
        """Positions 0..computed-1 of the slot hold this sequence's K/V: the prompt so far while prefilling, then
        the prompt and every generated token but the last (it is fed by the next decode step)."""
        if not self.output_ids:
            return self.prefilled
        return self.num_tokens - 1

    def cached_ids(self) -> list[int]:
        """The token ids whose K/V this sequence's slot holds."""
        return (self.prompt_ids + self.output_ids)[: self.computed]

    def deadline_passed(self, now: float) -> bool:
        timeout = self.params.timeout_s
        return timeout is not None and self.started > 0 and now - self.started > timeout

    # ---- one token ----

    def sample(self, logits: np.ndarray) -> int:
        """The next token id from this sequence's row of logits [vocab]."""
        return self.sampler.sample(logits, self.prompt_ids + self.output_ids)

    def take(self, token_id: int, now: float) -> tuple[str, FinishReason | None]:
        """Append a generated token. Returns the answer text it makes certain (possibly "") and why the answer
        ends here, or None if it goes on. The text of the final token carries everything still held back that
        belongs to the answer, except an unfinished UTF-8 character (dropped); a completed stop sequence and what
        follows it are never returned."""
        self.output_ids.append(token_id)
        if len(self.output_ids) == 1:
            self.first_token = now
        if token_id in self.eos_ids and not self.params.ignore_eos:
            self.detokenizer.flush()  # an unfinished character is dropped, never sent as U+FFFD
            return self.stops.flush(), FinishReason.EOS
        text, stopped = self.stops.push(self.detokenizer.push(token_id))
        if stopped:
            return text, FinishReason.STOP_SEQUENCE
        if len(self.output_ids) >= self.params.max_new_tokens:
            self.detokenizer.flush()
            return text + self.stops.flush(), FinishReason.LENGTH
        if self.loops is not None and self.loops.push(token_id):
            self.detokenizer.flush()
            return text + self.stops.flush(), FinishReason.REPETITION
        return text, None

    def timings(self, now: float) -> Timings:
        n = len(self.output_ids)
        decode_s = now - self.first_token if n > 1 else 0.0
        return Timings(
            queue_ms=((self.started or now) - self.submitted) * 1000,
            ttft_ms=(self.first_token - self.submitted) * 1000 if n else 0.0,
            total_ms=(now - self.submitted) * 1000,
            tokens_per_s=(n - 1) / decode_s if decode_s > 0 else 0.0,
        )
