"""One request's life inside the engine: its status, slot, tokens, and the text pipeline of its answer."""

from __future__ import annotations

import enum
import time
from collections.abc import Callable

from .detokenizer import IncrementalDetokenizer
from .request import Event, FinishReason, GenerationRequest
from .sampling import Sampler
from .stops import StopMatcher


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


_ALLOWED = {
    Status.WAITING: {Status.RUNNING, Status.FINISHED},
    Status.RUNNING: {Status.FINISHED},
    Status.FINISHED: set(),
}


class Sequence:
    def __init__(self, request: GenerationRequest, on_event: Callable[[Event], None], tokenizer):
        self.request = request
        self.id = request.id
        self.params = request.params
        self.on_event = on_event
        self.status = Status.WAITING
        self.slot = -1
        self.prompt_ids = list(request.prompt_ids)
        self.output_ids: list[int] = []
        self.sampler = Sampler(request.params)
        self.detokenizer = IncrementalDetokenizer(tokenizer)
        self.stops = StopMatcher(request.params.stop)
        self.finish_reason: FinishReason | None = None
        self.last_position = 0  # the queue position last reported
        self.submitted = time.perf_counter()
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
    def history(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    def deadline_passed(self, now: float) -> bool:
        timeout = self.params.timeout_s
        return timeout is not None and self.started > 0 and now - self.started > timeout
