"""The engine: one thread owns the model and calls `step()`; callers submit requests from any thread.

`step()` is the whole engine: the scheduler decides (cancellations, deadlines, admission, queue positions, which
prompt chunks fit the step's budget), the runner computes (the prefill chunks and one batched decode step, in
one `Runner.step` call: runner.py), each request takes its token and says what text is now certain and
whether it is done, and the events go out. The thread only waits for work and calls
`step()`; tests call it directly. Events reach each request's `on_event` callback on the engine thread; the
callback must not block (the server hands them to asyncio with `loop.call_soon_threadsafe`). The engine knows
nothing about chat templates or sockets.
"""

from __future__ import annotations

import enum
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..errors import EngineStopped, InvalidRequest, PromptTooLong
from ..text.detokenizer import Spelling
from .capacity import typical_position
from .constraints import Grammars
from .request import Event, Finished, FinishReason, GenerationRequest, Queued, Started, Token
from .request_state import RequestState, Status
from .runner import PrefillChunk, Runner
from .scheduler import Plan, Scheduler

log = logging.getLogger("typewriter.engine")

# A fault ends only the requests it concerns; this many steps in a row with a failed runner call (copy, prefill
# chunk or decode) mean the model state itself is broken, and the engine fails as a whole.
MAX_FAULTY_STEPS = 3


class EngineFault(RuntimeError):
    """The engine cannot go on."""


class EngineState(enum.Enum):
    IDLE = "idle"  # built, no thread yet: `step()` may be driven by hand
    RUNNING = "running"  # the thread runs steps
    STOPPING = "stopping"  # shutdown asked: every request ends with `shutdown`
    STOPPED = "stopped"
    FAILED = "failed"  # thread died or steps kept failing: all requests ended with `error`, no new ones


_NEXT = {
    EngineState.IDLE: {EngineState.RUNNING, EngineState.STOPPING},
    EngineState.RUNNING: {EngineState.STOPPING, EngineState.FAILED},
    EngineState.STOPPING: {EngineState.STOPPED, EngineState.FAILED},
    EngineState.STOPPED: set(),
    EngineState.FAILED: set(),
}


class Vocabulary(Spelling, Protocol):
    """What the engine needs of a tokenizer (text/tokenizer.py's): the ids that end an answer and each token's
    bytes. It never sees text going in: requests arrive as token ids."""

    eos_token_ids: frozenset[int]

    def token_bytes(self, token_id: int) -> bytes: ...


@dataclass(frozen=True)
class EngineStats:
    active: int
    queued: int


@dataclass(frozen=True)
class StepStats:
    """What one computing step cost, for an observer (the server's metrics): its seconds on the engine's clock
    and the rows of its decode step (0 when it only prefilled)."""

    seconds: float
    decode_rows: int


class Engine:
    def __init__(self, runner: Runner, tokenizer: Vocabulary, max_queue: int, prefill_budget: int,
                 model_name: str = "model", clock: Callable[[], float] = time.perf_counter,
                 queue_timeout_s: float | None = None):
        """`prefill_budget`: prompt tokens prefilled per step while answers are decoded (with none decoding, a
        step prefills up to the runner's largest chunk); `queue_timeout_s`: how long a request may wait for a
        slot (None: as long as it takes). The runner's decode steps as measured before serving (its
        `step_model`, int8-lite's capacity probe) size the scheduler's chunks until it has measured its own."""
        self.runner = runner
        self.tokenizer = tokenizer
        self.eos_ids = frozenset(tokenizer.eos_token_ids)
        self.model_name = model_name
        self.max_context = runner.max_len
        self.max_active = runner.slots
        self.max_queue = max_queue
        self.vocab_size = runner.vocab_size
        self.scheduler = Scheduler(runner.slots, max_queue, runner.max_chunk, prefill_budget,
                                   queue_timeout_s=queue_timeout_s, piece=_piece(tokenizer), context=runner.max_len,
                                   decode_prior=_decode_prior(runner))
        self.grammars = Grammars(tokenizer, runner.vocab_size)  # compiled constraints, kept (constraints.py)
        self.clock = clock
        self.state = EngineState.IDLE
        self.decode_steps = 0  # for tests and metrics
        # Called on the engine thread after each step that ran the model; must be cheap and never block.
        self.on_step: Callable[[StepStats], None] | None = None
        self._lock = threading.Condition()  # guards the scheduler, `_cancelled` and `state`; reentrant
        self._cancelled: set[str] = set()
        self._faulty_steps = 0  # consecutive steps with a failed runner call
        self._thread = threading.Thread(target=self._run, name="typewriter-engine", daemon=True)

    # ---- caller side (any thread) ----

    def start(self) -> Engine:
        with self._lock:
            self._move(EngineState.RUNNING)
        self._thread.start()
        return self

    @property
    def alive(self) -> bool:
        return self.state is EngineState.RUNNING and self._thread.is_alive()

    @property
    def failed(self) -> bool:
        """For good: its thread died or its steps kept failing."""
        return self.state is EngineState.FAILED

    def submit(self, request: GenerationRequest, on_event: Callable[[Event], None]) -> None:
        n, budget = len(request.prompt_ids), request.params.max_new_tokens
        if n == 0:
            raise InvalidRequest("prompt", "the prompt has no tokens")
        if n + budget > self.max_context:
            raise PromptTooLong(n, budget, self.max_context)
        if not all(0 <= t < self.vocab_size for t in request.prompt_ids):  # out of range would fail inside XLA
            raise InvalidRequest("prompt_ids", f"every token id must be between 0 and {self.vocab_size - 1}")
        start = request.answer_start.ids if request.answer_start else ()
        if not all(isinstance(t, int) and 0 <= t < self.vocab_size for t in start):
            raise InvalidRequest("continue.ids", f"every token id must be between 0 and {self.vocab_size - 1}")
        constraint = request.params.constraint
        answer = self.grammars.start(constraint) if constraint is not None else None  # raises InvalidRequest
        state = RequestState(request, on_event, self.tokenizer, self.eos_ids, self.clock(), answer)
        with self._lock:
            if self.state not in (EngineState.IDLE, EngineState.RUNNING):
                raise EngineStopped(f"the engine is not running ({self.state.value})")
            if self.scheduler.find(request.id):
                raise InvalidRequest("id", f"a request with id {request.id!r} is already running")
            self.scheduler.add(state)  # raises Overloaded
            self._lock.notify()

    def cancel(self, request_id: str) -> bool:
        """Ask for a request to end with `cancelled`; it does at the start of the next step."""
        with self._lock:
            if self.scheduler.find(request_id) is None:
                return False
            self._cancelled.add(request_id)
            self._lock.notify()
            return True

    def stats(self) -> EngineStats:
        with self._lock:
            return EngineStats(active=len(self.scheduler.running), queued=len(self.scheduler.waiting))

    def prepare(self, request: GenerationRequest) -> None:
        """Start compiling what this request's answer will need, where the runner compiles (for a caller that
        serves one at a time)."""
        if (compiler := self.runner.compiler) is not None:
            compiler.prepare_answer(len(request.prompt_ids), request.params.max_new_tokens)

    def describe_runtime(self) -> dict[str, Any]:
        """The runner's own account of itself (runner.py's `describe`) and how its slots were sized, for
        /readyz."""
        return {**self.runner.describe(), "slots": self.runner.sizing.describe()}

    def shutdown(self, timeout: float | None = 30.0) -> None:
        """End every running and waiting request with reason `shutdown`, then stop the thread (and any
        background compiling)."""
        self.runner.close()
        with self._lock:
            if self.state is EngineState.IDLE:  # no thread: end them here
                self._move(EngineState.STOPPING)
                self._end_all(FinishReason.SHUTDOWN)
                self._move(EngineState.STOPPED)
                return
            if self.state is EngineState.RUNNING:
                self._move(EngineState.STOPPING)
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

    # ---- one step ----

    def step(self) -> None:
        """Decide, compute, take each token, emit. Runs on the engine thread (or a test's)."""
        began = self.clock()
        with self._lock:
            cancelled, self._cancelled = self._cancelled, set()
            plan = self.scheduler.schedule(cancelled, self.clock())
        for request, reason in plan.ended:
            self._emit(request, Finished(request.id, reason, len(request.prompt_ids), len(request.output_ids),
                                     request.timings(self.clock())))
        for request, position in plan.queued:
            self._emit(request, Queued(request.id, position))
        for request in plan.admitted:
            request.started = self.clock()
            queue_ms = (request.started - request.submitted) * 1000
            self._emit(request, Started(request.id, len(request.prompt_ids), queue_ms, cached_tokens=request.reused))
        faults = 0  # failed runner calls; a sampling or detokenizing fault is one request's and never counts
        by_slot = {request.slot: request for request in plan.admitted}
        for source, target in plan.copies:
            try:
                self.runner.copy_slot(source, target)
            except Exception:
                faults += self._fail([by_slot[target]], "a cache copy")
        chunks, decode = self._runnable(plan)
        chunks = [c for c in chunks if c.slot in self.scheduler.running]  # not those whose copy failed
        faults += self._compute(chunks, decode)
        if chunks or decode:
            took = self.clock() - began
            if not faults:
                with self._lock:
                    self.scheduler.costs.observe(len(decode), [(c.start, c.length) for c in chunks], took)
            self._observe(StepStats(took, len(decode)))
        self._faulty_steps = self._faulty_steps + 1 if faults else 0
        if self._faulty_steps >= MAX_FAULTY_STEPS:
            raise EngineFault(f"{self._faulty_steps} steps in a row failed; the model state may be unusable")

    def _runnable(self, plan: Plan) -> tuple[list[PrefillChunk], list[RequestState]]:
        """The chunks and decode rows that programs compiled by now can run. The others sit this step out while
        the programs they need compile in the background, unless nothing could run: then all go, and wait."""
        if (compiler := self.runner.compiler) is None:
            return plan.chunks, plan.decode
        chunks = [c for c in plan.chunks if compiler.can_run("prefill", c.length, c.start + c.length)]
        rows = [request for request in plan.decode if compiler.can_run("decode", len(plan.decode), request.num_tokens)]
        if not chunks and not rows:
            return plan.chunks, plan.decode
        return chunks, rows

    def _compute(self, chunks: list[PrefillChunk], batch: list[RequestState]) -> int:
        """The chunks and the decode rows in one runner call; returns 1 if any of it failed (a failed call ends
        exactly the requests it concerned), else 0."""
        if not chunks and not batch:
            return 0
        prefilling = [self.scheduler.running[c.slot] for c in chunks]  # whose prompt each chunk is
        try:
            out = self.runner.step([request.slot for request in batch], [request.output_ids[-1] for request in batch],
                                   [request.num_tokens - 1 for request in batch], chunks)
        except Exception:
            return self._fail(prefilling + batch, "a step")
        decode_failed = False
        for fault in out.faults:
            requests = [prefilling[i] for i in fault.chunks] + (batch if fault.decode else [])
            decode_failed |= fault.decode
            log.error("%s failed for %s; ending only those requests", fault.what, ", ".join(s.id for s in requests),
                      exc_info=fault.error)
            self._end_failed(requests, fault.what)
        takes: list[tuple[RequestState, np.ndarray]] = []  # first tokens, then the decode rows
        for chunk, request, logits in zip(chunks, prefilling, out.prefilled):
            if request.status is not Status.FINISHED:
                with self._lock:
                    self.scheduler.prefilled(chunk)
                if logits is not None:  # the chunk completes its prompt
                    takes.append((request, logits))
        if batch and not decode_failed:
            self.decode_steps += 1
            takes += zip(batch, out.decoded)
        self._constrain([request for request, _ in takes])
        for request, row in takes:
            if request.status is not Status.FINISHED:  # not one whose mask failed
                self._take(request, row)
        return 1 if out.faults else 0

    def _constrain(self, requests: list[RequestState]) -> None:
        """The masks of this step's constrained rows, all in one call; a fault ends those requests only."""
        constrained = [request for request in requests if request.constraint is not None]
        try:
            self.grammars.fill_masks([request.constraint for request in constrained if request.constraint])
        except Exception:
            self._fail(constrained, "a constraint's mask")

    def _take(self, request: RequestState, logits: np.ndarray) -> None:
        """Sample, detokenize and emit one token; a fault here ends only this request."""
        try:
            token_id = request.sample(logits)
            text, reason = request.take(token_id, self.clock())
        except Exception:
            self._fail([request], "sampling or detokenizing")
            return
        self._emit(request, Token(request.id, request.last_index, token_id, text, request.logprobs))
        if reason is not None:
            self._finish(request, reason)

    def _fail(self, requests: list[RequestState], what: str) -> int:
        """An exception in `what` concerned exactly `requests`: log it once, and end them. Call from an except
        block; returns 1, a fault."""
        log.exception("%s failed for %s; ending only those requests", what, ", ".join(s.id for s in requests))
        self._end_failed(requests, what)
        return 1

    def _end_failed(self, requests: list[RequestState], what: str) -> None:
        """End `requests` with `error` and forget their slots' cache (possibly half written); every other request
        goes on."""
        for request in requests:
            self._finish(request, FinishReason.ERROR, f"{what} failed on the server", reusable=False)

    def _finish(self, request: RequestState, reason: FinishReason, error: str | None = None, reusable: bool = True) -> None:
        with self._lock:
            if request.status is Status.FINISHED:
                return
            self.scheduler.finish(request, reusable)
        self._emit(request, Finished(request.id, reason, len(request.prompt_ids), len(request.output_ids),
                                 request.timings(self.clock()), error))

    def _observe(self, stats: StepStats) -> None:
        if (observer := self.on_step) is None:
            return
        try:
            observer(stats)
        except Exception:  # a broken observer loses its figures, never the engine
            log.exception("the step observer failed; no more step figures")
            self.on_step = None

    def _emit(self, request: RequestState, event: Event) -> None:
        try:
            request.on_event(event)
        except Exception:  # a broken consumer loses its own request, never the engine
            log.exception("event callback of request %s failed; cancelling it", request.id)
            with self._lock:
                self._cancelled.add(request.id)

    # ---- the thread ----

    def _run(self) -> None:
        try:
            while self._wait_for_work():
                self.step()
        except BaseException as e:  # never die silently: every request, and every later submit, hears of it
            log.exception("engine thread failed")
            with self._lock:
                self._move(EngineState.FAILED)  # from here submit refuses, so nothing can wait forever
                self._end_all(FinishReason.ERROR, f"{type(e).__name__}: {e}")
            return
        with self._lock:
            self._end_all(FinishReason.SHUTDOWN)
            self._move(EngineState.STOPPED)

    def _wait_for_work(self) -> bool:
        """Block until there is something to do; False once shutdown was asked."""
        with self._lock:
            while self.state is EngineState.RUNNING and not (self.scheduler.requests() or self._cancelled):
                self._lock.wait()
            return self.state is EngineState.RUNNING

    def _end_all(self, reason: FinishReason, error: str | None = None) -> None:
        for request in self.scheduler.requests():
            self._finish(request, reason, error)

    def _move(self, state: EngineState) -> None:
        """Caller holds the lock."""
        if state not in _NEXT[self.state]:
            raise RuntimeError(f"engine: {self.state.value} -> {state.value} is not allowed")
        self.state = state


def _piece(tokenizer: Vocabulary) -> Callable[[int], bytes]:
    """A token's bytes for prefix_cache.realign: its text's, or for a special token (no text) a mark of its own
    that no text contains (0xff is never in UTF-8)."""
    def piece(token_id: int) -> bytes:
        return tokenizer.token_bytes(token_id) or b"\xff%d\xff" % token_id

    return piece


def _decode_prior(runner: Runner) -> Callable[[int], float] | None:
    """A decode-only step's seconds for `rows`, from the runner's own measurement at a class's typical reach."""
    model = runner.step_model
    if model is None:
        return None
    position = typical_position(runner.max_len)
    return lambda rows: model.step_s(rows, position)
