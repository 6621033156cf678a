"""A fake engine and tokenizer with the real engine's interface, for fast server tests.

The engine runs one thread with the real scheduling shape: `max_active` slots, a bounded wait queue with
`Queued` positions, one scripted token per slot per step, cancel honoured at the next step, and exactly one
`Finished` per request.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

from typewriter.errors import EngineStopped, Overloaded, PromptTooLong
from typewriter.request import Finished, FinishReason, GenerationRequest, Queued, Started, Timings, Token


@dataclass(frozen=True)
class FakeStats:
    active: int
    queued: int


@dataclass
class _Slot:
    request: GenerationRequest
    on_event: object
    submitted: float
    started: float = 0.0
    first_token: float = 0.0
    produced: int = 0
    cancelled: bool = False
    last_position: int = 0


@dataclass
class FakeEngine:
    tokens: list[str] = field(default_factory=lambda: ["Hello", ",", " world", "!"])
    step_s: float = 0.005
    max_active: int = 2
    max_queue: int = 2
    max_context: int = 256
    model_name: str = "fake-model"

    def __post_init__(self) -> None:
        self.submitted: list[GenerationRequest] = []
        self._lock = threading.Condition()
        self._waiting: deque[_Slot] = deque()
        self._active: list[_Slot] = []
        self._stopping = False
        self._dead = False
        self._thread = threading.Thread(target=self._loop, name="fake-engine", daemon=True)
        self._thread.start()

    # ---- the engine interface ----

    def submit(self, request: GenerationRequest, on_event) -> None:
        needed = len(request.prompt_ids) + request.params.max_new_tokens
        if needed > self.max_context:
            raise PromptTooLong(len(request.prompt_ids), request.params.max_new_tokens, self.max_context)
        with self._lock:
            if self._stopping or self._dead:
                raise EngineStopped("the engine is shutting down")
            if len(self._active) >= self.max_active and len(self._waiting) >= self.max_queue:
                raise Overloaded(self.max_queue)
            self.submitted.append(request)
            self._waiting.append(_Slot(request, on_event, time.monotonic()))
            self._lock.notify()

    def cancel(self, request_id: str) -> bool:
        with self._lock:
            for slot in [*self._active, *self._waiting]:
                if slot.request.id == request_id:
                    slot.cancelled = True
                    return True
        return False

    def stats(self) -> FakeStats:
        with self._lock:
            return FakeStats(len(self._active), len(self._waiting))

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._dead

    def shutdown(self) -> None:
        with self._lock:
            self._stopping = True
            self._lock.notify()
        self._thread.join(timeout=5)

    def die(self) -> None:
        """Simulate the engine thread crashing: it stops without sending any Finished."""
        with self._lock:
            self._dead = True
            self._lock.notify()
        self._thread.join(timeout=5)

    # ---- the step loop ----

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not (self._active or self._waiting or self._stopping or self._dead):
                    self._lock.wait()
                if self._dead:
                    return
                if self._stopping:
                    for slot in [*self._active, *self._waiting]:
                        self._finish(slot, FinishReason.SHUTDOWN)
                    self._active.clear()
                    self._waiting.clear()
                    return
                self._step()
            time.sleep(self.step_s)

    def _step(self) -> None:
        for slot in [s for s in self._waiting if s.cancelled]:
            self._waiting.remove(slot)
            self._finish(slot, FinishReason.CANCELLED)
        while self._waiting and len(self._active) < self.max_active:
            slot = self._waiting.popleft()
            slot.started = time.monotonic()
            self._active.append(slot)
            slot.on_event(Started(slot.request.id, len(slot.request.prompt_ids), (slot.started - slot.submitted) * 1e3))
        for position, slot in enumerate(self._waiting, start=1):
            if slot.last_position != position:
                slot.last_position = position
                slot.on_event(Queued(slot.request.id, position))
        for slot in list(self._active):
            if slot.cancelled:
                self._active.remove(slot)
                self._finish(slot, FinishReason.CANCELLED)
                continue
            index = slot.produced
            last = index + 1 >= min(len(self.tokens), slot.request.params.max_new_tokens)
            if slot.produced == 0:
                slot.first_token = time.monotonic()
            slot.produced += 1
            slot.on_event(Token(slot.request.id, index, 1000 + index, self.tokens[index]))
            if last:
                self._active.remove(slot)
                reason = FinishReason.EOS if index + 1 == len(self.tokens) else FinishReason.LENGTH
                self._finish(slot, reason)

    def _finish(self, slot: _Slot, reason: FinishReason) -> None:
        now = time.monotonic()
        start = slot.started or now
        decode_s = now - (slot.first_token or now)
        timings = Timings(
            queue_ms=(start - slot.submitted) * 1e3,
            ttft_ms=((slot.first_token or now) - slot.submitted) * 1e3,
            total_ms=(now - slot.submitted) * 1e3,
            tokens_per_s=(slot.produced - 1) / decode_s if slot.produced > 1 and decode_s > 0 else 0.0,
        )
        slot.on_event(Finished(slot.request.id, reason, len(slot.request.prompt_ids), slot.produced, timings))


class FakeTokenizer:
    """One token per whitespace-separated word, plus one per message; records what it was asked."""

    name = "fake-words"

    def __init__(self) -> None:
        self.calls: list[tuple[list[dict[str, str]], str | None]] = []

    def encode_chat(self, messages, system=None) -> list[int]:
        self.calls.append((list(messages), system))
        words = sum(len(m["content"].split()) + 1 for m in messages)
        return list(range(words))


def factory(engine: FakeEngine, tokenizer: FakeTokenizer | None = None, gate: threading.Event | None = None):
    """An engine factory for create_app; with `gate`, loading blocks until the gate is set."""

    def load(settings, progress):
        progress("loading fake weights")
        if gate is not None:
            gate.wait(timeout=10)
        progress("warmed up")
        return engine, tokenizer or FakeTokenizer()

    return load
