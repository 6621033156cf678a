"""The engine: one thread owns the model and runs the step loop; callers submit requests from any thread.

Each loop iteration: apply cancellations and deadlines, admit at most one waiting request into a free slot
(prefill, which yields its first token), then one decode step over every running slot. Tokens are sampled, detokenized and
checked for stops here, and each request's events go to its `on_event` callback, on this thread; the callback
must not block (the server hands them to asyncio with `loop.call_soon_threadsafe`). The engine knows nothing
about chat templates or sockets.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .errors import EngineStopped, InvalidRequest, PromptTooLong
from .request import Event, Finished, FinishReason, GenerationRequest, Queued, Started, Timings, Token
from .scheduler import Scheduler
from .sequence import Sequence, Status

if TYPE_CHECKING:
    from .runner import ModelRunner

log = logging.getLogger("typewriter.engine")


@dataclass(frozen=True)
class EngineStats:
    active: int
    queued: int


class Engine:
    def __init__(self, runner: ModelRunner, tokenizer, max_queue: int = 16, model_name: str = "model"):
        self.runner = runner
        self.tokenizer = tokenizer
        self.eos_ids = frozenset(tokenizer.eos_token_ids)
        self.model_name = model_name
        self.max_context = runner.max_len
        self.max_active = runner.slots
        self.max_queue = max_queue
        self.vocab_size = runner.vocab_size
        self.scheduler = Scheduler(runner.slots, max_queue)
        self._lock = threading.Condition()
        self._cancelled: set[str] = set()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="typewriter-engine", daemon=True)
        self._error: BaseException | None = None
        self.steps = 0  # decode steps run, for tests and metrics

    # ---- caller side (any thread) ----

    def start(self) -> Engine:
        self._thread.start()
        return self

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._closing

    def submit(self, request: GenerationRequest, on_event: Callable[[Event], None]) -> None:
        n, budget = len(request.prompt_ids), request.params.max_new_tokens
        if n == 0:
            raise InvalidRequest("prompt", "the prompt has no tokens")
        if n > self.runner.max_prompt or n + budget > self.max_context:
            raise PromptTooLong(n, budget, self.max_context)
        if not all(0 <= t < self.vocab_size for t in request.prompt_ids):  # out of range would fail inside XLA
            raise InvalidRequest("prompt_ids", f"every token id must be between 0 and {self.vocab_size - 1}")
        seq = Sequence(request, on_event, self.tokenizer)
        with self._lock:
            if not self.alive:
                raise EngineStopped("the engine is not running")
            if self.scheduler.find(request.id):
                raise InvalidRequest("id", f"a request with id {request.id!r} is already running")
            self.scheduler.add(seq)  # raises Overloaded
            self._lock.notify()

    def cancel(self, request_id: str) -> bool:
        with self._lock:
            if self.scheduler.find(request_id) is None:
                return False
            self._cancelled.add(request_id)
            self._lock.notify()
            return True

    def stats(self) -> EngineStats:
        with self._lock:
            return EngineStats(active=len(self.scheduler.running), queued=len(self.scheduler.waiting))

    def shutdown(self, timeout: float | None = 30.0) -> None:
        """End every running and waiting request with reason `shutdown`, then stop the thread."""
        with self._lock:
            self._closing = True
            self._lock.notify()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def stream(self, request: GenerationRequest) -> Iterator[Event]:
        """Events of one request, for a synchronous caller (the CLI); cancels the request if abandoned."""
        events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self.submit(request, events.put)
        try:
            while True:
                event = events.get()
                yield event
                if isinstance(event, Finished):
                    return
        finally:
            self.cancel(request.id)

    async def astream(self, request: GenerationRequest) -> AsyncIterator[Event]:
        """Events of one request for asyncio code: the loop only awaits a queue, never TensorFlow."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Event] = asyncio.Queue()
        self.submit(request, lambda e: loop.call_soon_threadsafe(events.put_nowait, e))
        try:
            while True:
                event = await events.get()
                yield event
                if isinstance(event, Finished):
                    return
        finally:
            self.cancel(request.id)

    # ---- engine thread ----

    def _run(self) -> None:
        try:
            while True:
                with self._lock:
                    while not (self._closing or self.scheduler.waiting or self.scheduler.running):
                        self._lock.wait()
                    if self._closing:
                        break
                self._iteration()
        except BaseException as e:  # the engine must never die silently: end every request with the error
            log.exception("engine thread failed")
            self._error = e
            self._end_all(FinishReason.ERROR, f"{type(e).__name__}: {e}")
            with self._lock:
                self._closing = True
            return
        self._end_all(FinishReason.SHUTDOWN)

    def _iteration(self) -> None:
        now = time.perf_counter()
        with self._lock:
            cancelled, self._cancelled = self._cancelled, set()
            for seq in list(self.scheduler.running.values()) + list(self.scheduler.waiting):
                if seq.id in cancelled:
                    self._finish(seq, FinishReason.CANCELLED)
                elif seq.deadline_passed(now):
                    self._finish(seq, FinishReason.TIMEOUT)
            # One prefill per iteration: a burst of newcomers costs running answers one prefill between decode
            # steps, not one per newcomer.
            admitted = self.scheduler.admit()
            self._report_positions()
        if admitted is not None:
            self._prefill(admitted)
        with self._lock:
            running = dict(self.scheduler.running)
        if any(s is not admitted and s.status is Status.RUNNING for s in running.values()):
            self._decode_step(running)

    def _prefill(self, seq: Sequence) -> None:
        seq.started = time.perf_counter()
        queue_ms = (seq.started - seq.submitted) * 1000
        self._emit(seq, Started(seq.id, len(seq.prompt_ids), queue_ms))
        logits = self.runner.prefill(seq.slot, seq.prompt_ids)
        self._accept(seq, logits)

    def _decode_step(self, running: dict[int, Sequence]) -> None:
        n = max(running) + 1
        tokens = np.zeros([n], np.int32)
        positions = np.zeros([n], np.int32)
        for slot, seq in running.items():
            tokens[slot] = seq.output_ids[-1]
            positions[slot] = seq.num_tokens - 1
        logits = self.runner.decode(tokens, positions)
        self.steps += 1
        for slot, seq in running.items():
            if seq.status is Status.RUNNING:
                self._accept(seq, logits[slot])

    def _accept(self, seq: Sequence, logits: np.ndarray) -> None:
        """Sample the next token and send what text is now certain; finish the request if it is done."""
        token_id = seq.sampler.sample(logits, seq.history)
        seq.output_ids.append(token_id)
        if len(seq.output_ids) == 1:
            seq.first_token = time.perf_counter()
        index = len(seq.output_ids) - 1
        reason = None
        if token_id in self.eos_ids and not seq.params.ignore_eos:
            reason = FinishReason.EOS
            text, _ = seq.stops.push(seq.detokenizer.flush())
            text += seq.stops.flush()
        else:
            text, stopped = seq.stops.push(seq.detokenizer.push(token_id))
            if stopped:
                reason = FinishReason.STOP_SEQUENCE
            elif len(seq.output_ids) >= seq.params.max_new_tokens:
                more, stopped = seq.stops.push(seq.detokenizer.flush())  # an unfinished character may end a stop
                text += more if stopped else more + seq.stops.flush()
                reason = FinishReason.STOP_SEQUENCE if stopped else FinishReason.LENGTH
        self._emit(seq, Token(seq.id, index, token_id, text))
        if reason is not None:
            with self._lock:
                self._finish(seq, reason)

    def _finish(self, seq: Sequence, reason: FinishReason, error: str | None = None) -> None:
        """Caller holds the lock."""
        if seq.status is Status.FINISHED:
            return
        self.scheduler.remove(seq)
        seq.move_to(Status.FINISHED)
        seq.finish_reason = reason
        now = time.perf_counter()
        n = len(seq.output_ids)
        decode_s = now - seq.first_token if n > 1 else 0.0
        timings = Timings(
            queue_ms=((seq.started or now) - seq.submitted) * 1000,
            ttft_ms=(seq.first_token - seq.submitted) * 1000 if n else 0.0,
            total_ms=(now - seq.submitted) * 1000,
            tokens_per_s=(n - 1) / decode_s if decode_s > 0 else 0.0,
        )
        self._emit(seq, Finished(seq.id, reason, len(seq.prompt_ids), n, timings, error))

    def _report_positions(self) -> None:
        """Caller holds the lock. A request that waits for a slot hears its position whenever it changes; one that
        only waits for its prefill turn (a slot is free for it) is not queued."""
        free = len(self.scheduler.free_slots)
        for n, seq in enumerate(self.scheduler.waiting, start=1):
            position = n - free
            if position > 0 and seq.last_position != position:
                seq.last_position = position
                self._emit(seq, Queued(seq.id, position))

    def _end_all(self, reason: FinishReason, error: str | None = None) -> None:
        with self._lock:
            for seq in list(self.scheduler.running.values()) + list(self.scheduler.waiting):
                self._finish(seq, reason, error)

    def _emit(self, seq: Sequence, event: Event) -> None:
        try:
            seq.on_event(event)
        except Exception:  # a broken consumer loses its own request, never the engine
            log.exception("event callback of request %s failed; cancelling it", seq.id)
            self._cancelled.add(seq.id)
