"""The engine: one thread owns the model and calls `step()`; callers submit requests from any thread. Events reach
each request's `on_event` on the engine thread, so the callback must never block (server/chats.py hands them to
asyncio). The engine knows nothing about chat templates or sockets: requests are token ids.
"""

from __future__ import annotations

import enum
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ..config import MOST_DRAFT_TOKENS
from ..errors import EngineStopped, InvalidRequest, PromptTooLong
from ..text.detokenizer import Spelling
from .capacity import typical_position
from .constraints import MASK_WAIT_MIN_S, MASK_WAIT_SHARE, ConstraintFailed, Grammars
from .drafting import Drafts
from .request import (
    Event,
    Finished,
    FinishReason,
    GenerationRequest,
    Queued,
    Started,
    Token,
    default_repetition_penalty,
)
from .request_state import RequestState, Status
from .runner import PrefillChunk, Runner
from .scheduler import Plan, Scheduler
from .slot_cap import SlotCap

log = logging.getLogger("typewriter.engine")

# A fault ends only the requests it concerns; this many faulty steps in a row mean the model state itself is broken.
MAX_FAULTY_STEPS = 3
# With nothing else to run, how long a step waits for a late mask before it looks for cancels again.
LATE_MASK_POLL_S = 0.05


class EngineFault(RuntimeError):
    """The engine cannot go on."""


class EngineState(enum.Enum):
    IDLE = "idle"  # built, no thread yet: `step()` may be driven by hand
    RUNNING = "running"
    STOPPING = "stopping"  # every request ends with `shutdown`
    STOPPED = "stopped"
    FAILED = "failed"  # for good: every request ended with `error`, and no new ones


_NEXT = {
    EngineState.IDLE: {EngineState.RUNNING, EngineState.STOPPING},
    EngineState.RUNNING: {EngineState.STOPPING, EngineState.FAILED},
    EngineState.STOPPING: {EngineState.STOPPED, EngineState.FAILED},
    EngineState.STOPPED: set(),
    EngineState.FAILED: set(),
}


class Vocabulary(Spelling, Protocol):
    eos_token_ids: frozenset[int]

    def token_bytes(self, token_id: int) -> bytes: ...


@dataclass(frozen=True)
class EngineStats:
    active: int
    queued: int
    groups: Mapping[str, tuple[int, int]] = field(default_factory=dict)  # share.group -> (active, queued)
    readers: int = 0  # clients kept a share of the slots while they read (scheduler.keep_for_readers_s)


@dataclass(frozen=True)
class StepStats:
    seconds: float
    decode_rows: int  # 0: the step only prefilled
    parked: int = 0  # requests that gave their slot back to a client short of its share
    drafted: int = 0  # draft tokens checked (engine/drafting.py)
    taken: int = 0  # of them, taken as the answer's


class Engine:
    def __init__(self, runner: Runner, tokenizer: Vocabulary, max_queue: int, prefill_budget: int,
                 model_name: str = "model", clock: Callable[[], float] = time.perf_counter,
                 queue_timeout_s: float | None = None, parameters: int = 0, keep_for_readers_s: float = 0.0,
                 draft_tokens: int = 0):
        """`queue_timeout_s` None: a request waits for a slot as long as it takes; `parameters`: the model's
        weights' count, which sets the repetition penalty a request gets when it names none (0: not known);
        `keep_for_readers_s`: how long a client whose answer ended keeps its share of the slots (scheduler.py);
        `draft_tokens`: the most tokens a step guesses for an answer from its conversation and checks (0: none;
        drafting.py), where the runner checks drafts."""
        self.runner = runner
        self.tokenizer = tokenizer
        self.eos_ids = frozenset(tokenizer.eos_token_ids)
        _ = tokenizer.token_text.wordy  # the repetition penalty's words: worked out here, not on a first request
        self.model_name = model_name
        self.repetition_penalty = default_repetition_penalty(parameters)
        self.max_context = runner.max_len
        self.max_queue = max_queue
        self.draft_tokens = min(draft_tokens, MOST_DRAFT_TOKENS, runner.max_chunk - 1) if runner.checks_drafts else 0
        self.vocab_size = runner.vocab_size
        self.scheduler = Scheduler(runner.slots, max_queue, runner.max_chunk, prefill_budget,
                                   queue_timeout_s=queue_timeout_s, piece=_piece(tokenizer), context=runner.max_len,
                                   decode_prior=_decode_prior(runner), keep_for_readers_s=keep_for_readers_s)
        sizing, model = runner.sizing, runner.step_model
        self.scheduler.open = min(sizing.slots, runner.slots)
        # None: the count is fixed (set, or no step model to weigh the steps against)
        self.slot_cap = SlotCap(model, self.scheduler.open, runner.slots, runner.max_len) if (
            sizing.adapts and model is not None) else None
        self.grammars = Grammars(tokenizer, runner.vocab_size, mask_threads=runner.slots)
        self.clock = clock
        self.state = EngineState.IDLE
        self.decode_steps = 0
        self.on_step: Callable[[StepStats], None] | None = None  # on the engine thread: must never block
        self._lock = threading.Condition()  # guards the scheduler, `_cancelled` and `state`; reentrant
        self._cancelled: set[str] = set()
        self._faulty_steps = 0
        self._runner_s = 0.0  # the last step's runner call alone, what the capacity probe timed
        self._taken = 0  # the last step's draft tokens taken
        self._thread = threading.Thread(target=self._run, name="typewriter-engine", daemon=True)

    def start(self) -> Engine:
        with self._lock:
            self._move(EngineState.RUNNING)
        self._thread.start()
        return self

    @property
    def max_active(self) -> int:
        """The slots open to newcomers now."""
        return self.scheduler.open

    @property
    def alive(self) -> bool:
        return self.state is EngineState.RUNNING and self._thread.is_alive()

    @property
    def failed(self) -> bool:
        return self.state is EngineState.FAILED

    def submit(self, request: GenerationRequest, on_event: Callable[[Event], None]) -> None:
        n, budget = len(request.prompt_ids), request.params.max_new_tokens
        if n == 0:
            raise InvalidRequest("prompt", "the prompt has no tokens")
        if n + budget > self.max_context:
            raise PromptTooLong(n, budget, self.max_context)
        if not all(0 <= t < self.vocab_size for t in request.prompt_ids):  # no embedding row; a negative one wraps
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
        """The request ends with `cancelled` at the start of the next step."""
        with self._lock:
            if self.scheduler.find(request_id) is None:
                return False
            self._cancelled.add(request_id)
            self._lock.notify()
            return True

    def stats(self) -> EngineStats:
        with self._lock:
            groups: dict[str, tuple[int, int]] = {}
            for request in self.scheduler.running.values():
                active, queued = groups.get(request.share.group, (0, 0))
                groups[request.share.group] = (active + 1, queued)
            for request in self.scheduler.waiting:
                active, queued = groups.get(request.share.group, (0, 0))
                groups[request.share.group] = (active, queued + 1)
            return EngineStats(len(self.scheduler.running), len(self.scheduler.waiting), groups,
                               self.scheduler.readers_kept(self.clock()))

    def prepare(self, request: GenerationRequest) -> None:
        if (compiler := self.runner.compiler) is not None:
            compiler.prepare_answer(len(request.prompt_ids), request.params.max_new_tokens)

    def describe_runtime(self) -> dict[str, Any]:
        slots = self.runner.sizing.describe() | {"count": self.max_active}
        if self.slot_cap is not None and (change := self.slot_cap.last) is not None:
            slots["last_change"] = {"from": change.before, "to": change.after, "why": change.why}
        return {**self.runner.describe(), "slots": slots, "draft_tokens": self.draft_tokens}

    def describe_slots(self) -> str:
        """The start-up line's: how many slots, why, and whether they move."""
        return self.runner.sizing.summary()

    def shutdown(self, timeout: float | None = 30.0) -> None:
        self.runner.close()
        self.grammars.close()
        with self._lock:
            if self.state is EngineState.IDLE:
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
        """For a synchronous caller; cancels the request if abandoned."""
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

    def step(self) -> None:
        """Decide, compute, take each token, emit; on the engine thread or a test's."""
        began = self.clock()
        with self._lock:
            cancelled, self._cancelled = self._cancelled, set()
            plan = self.scheduler.schedule(cancelled, self.clock())
        for request, reason in plan.ended:
            self._emit(request, Finished(request.id, reason, len(request.prompt_ids), len(request.output_ids),
                                     request.timings(self.clock())))
        for request, position in plan.queued:
            self._emit(request, Queued(request.id, position))
        for request in plan.parked:
            log.debug("request %s parked: its client holds more than its share of slots while another waits",
                      request.id)
        for request in plan.admitted:
            if request.parks:  # resuming: it started long ago
                continue
            request.started = self.clock()
            queue_ms = (request.started - request.submitted) * 1000
            self._emit(request, Started(request.id, len(request.prompt_ids), queue_ms, cached_tokens=request.reused))
        faults = 0  # failed runner calls; one request's own fault never counts
        by_slot = {request.slot: request for request in plan.admitted}
        for source, target in plan.copies:
            try:
                self.runner.copy_slot(source, target)
            except Exception:
                faults += self._fail([by_slot[target]], "a cache copy")
        chunks, decode = self._runnable(plan)
        chunks = [c for c in chunks if c.slot in self.scheduler.running]  # not those whose copy failed
        late = [r for r in decode if r.constraint is not None and r.constraint.held is not None]  # sit this step out
        decode = [r for r in decode if r not in late]
        positions = sum(request.num_tokens - 1 for request in decode)  # before each takes its token
        drafts = self._drafts(chunks, decode)
        faults += self._compute(chunks, decode, late, drafts)
        if chunks or decode:
            took = self.clock() - began
            # A checked guess's rows are neither decode rows nor a prompt's (a few in a step bound by memory): taught
            # as a prompt's chunk they would make prompt tokens look dear, and the prompts' chunks beside answers small.
            if not faults and not drafts:
                with self._lock:
                    self.scheduler.costs.observe(len(decode), [(c.start, c.length) for c in chunks], took)
                if decode and not chunks:  # the probe timed decode rows alone
                    self._weigh_slots(len(decode), positions, self._runner_s)
            self._observe(StepStats(took, len(decode), len(plan.parked), sum(len(d) for _, d in drafts),
                                    self._taken))
        self._faulty_steps = self._faulty_steps + 1 if faults else 0
        if self._faulty_steps >= MAX_FAULTY_STEPS:
            raise EngineFault(f"{self._faulty_steps} steps in a row failed; the model state may be unusable")

    def _runnable(self, plan: Plan) -> tuple[list[PrefillChunk], list[RequestState]]:
        """What compiled programs can run now; the rest sit out while theirs compile, unless nothing could run."""
        if (compiler := self.runner.compiler) is None:
            return plan.chunks, plan.decode
        chunks = [c for c in plan.chunks if compiler.can_run("prefill", c.length, c.start + c.length)]
        rows = [request for request in plan.decode if compiler.can_run("decode", len(plan.decode), request.num_tokens)]
        if not chunks and not rows:
            return plan.chunks, plan.decode
        return chunks, rows

    def _compute(self, chunks: list[PrefillChunk], batch: list[RequestState], late: list[RequestState],
                 drafts: Sequence[tuple[RequestState, list[int]]]) -> int:
        """1 if any of it failed (ending exactly the requests it concerned), else 0. `late`: rows holding logits
        whose mask was not ready; each takes its token in the first step its mask is. `drafts`: rows of `batch`
        checked as a chunk each (the last token and the guess) instead of decoded."""
        self._taken = 0
        if not chunks and not batch:
            self.grammars.wait([r.constraint for r in late if r.constraint], LATE_MASK_POLL_S, any_one=True)
            self._take_ready([(request, None) for request in late])
            return 0
        prefilling = [self.scheduler.running[c.slot] for c in chunks]
        # Each mask depends only on the tokens already taken: computed on worker threads during the forward pass.
        sampled = batch + [request for c, request in zip(chunks, prefilling) if c.wants_logits]
        self.grammars.begin([request.constraint for request in sampled if request.constraint])
        checking = [request for request, _ in drafts]
        rows = [request for request in batch if request not in checking]
        checks = [PrefillChunk(request.slot, request.num_tokens - 1, [request.output_ids[-1], *draft],
                               every_logits=True) for request, draft in drafts]
        began, wall = self.clock(), time.perf_counter()
        try:
            out = self.runner.step([request.slot for request in rows], [request.output_ids[-1] for request in rows],
                                   [request.num_tokens - 1 for request in rows], [*chunks, *checks])
        except Exception:
            return self._fail(prefilling + batch, "a step")
        self._runner_s = self.clock() - began
        forward_s = time.perf_counter() - wall  # late masks are waited for in real time, whatever the engine's clock
        decode_failed = False
        for fault in out.faults:
            requests = [(prefilling + checking)[i] for i in fault.chunks] + (rows if fault.decode else [])
            decode_failed |= fault.decode
            log.error("%s failed for %s; ending only those requests", fault.what, ", ".join(s.id for s in requests),
                      exc_info=fault.error)
            self._end_failed(requests, fault.what)
        takes: list[tuple[RequestState, np.ndarray | None]] = []
        for chunk, request, logits in zip(chunks, prefilling, out.prefilled):
            if request.status is not Status.FINISHED:
                with self._lock:
                    self.scheduler.prefilled(chunk)
                if logits is not None:
                    takes.append((request, logits))
        if rows and not decode_failed:
            takes += zip(rows, out.decoded)
        if (rows and not decode_failed) or checks:
            self.decode_steps += 1
        takes += [(request, None) for request in late]
        # A late mask holds its own row back, never the others, beyond a share of the step.
        self.grammars.wait([r.constraint for r, _ in takes if r.constraint], max(MASK_WAIT_MIN_S,
                                                                                  MASK_WAIT_SHARE * forward_s))
        self._take_ready(takes)
        for (request, draft), logits in zip(drafts, out.prefilled[len(chunks):]):
            self._taken += self._check(request, draft, logits)
        return 1 if out.faults else 0

    def _drafts(self, chunks: list[PrefillChunk], batch: list[RequestState]) -> list[tuple[RequestState, list[int]]]:
        """The draft of an answer decoding alone in a step that prefills nothing, where it has one: a row more costs
        a step a tenth to a sixth of its time on the smaller models, which every answer in it would pay, and a class
        of 32 drafting beside other answers ran slower (docs/measurements/2026-12-06-drafts.md)."""
        if not self.draft_tokens or chunks or len(batch) != 1:
            return []
        (request,) = batch
        if request.constraint is not None:  # its masks are made a token ahead, on other threads
            return []
        if request.drafts is None:
            request.drafts = Drafts(self.draft_tokens)
        # room: the answer's tokens left after this row's, and the cache's positions after the chunk's first (the
        # guess's own length, at most draft_tokens, is Drafts')
        room = min(request.params.max_new_tokens - request.last_index - 2, self.max_context - request.num_tokens)
        draft = request.drafts.propose(request.prompt_ids, request.output_ids, room)
        return [(request, draft)] if draft else []

    def _check(self, request: RequestState, draft: list[int], logits: np.ndarray | None) -> int:
        """Each row's token taken in turn, as a decode step takes it, up to the first that is not the draft's or
        ends the answer: of the draft, the tokens taken with the answer going on after them."""
        if logits is None or request.status is Status.FINISHED:  # its chunk failed
            return 0
        taken = 0
        for guess, row in zip([*draft, None], logits):
            if not self._take(request, row) or request.output_ids[-1] != guess:
                break
            taken += 1
        assert request.drafts is not None
        request.drafts.checked(len(draft), taken)
        return taken

    def _take_ready(self, takes: list[tuple[RequestState, np.ndarray | None]]) -> None:
        """Take each row's token whose mask is ready; a row whose mask is not holds its logits (None: it held them)."""
        for request, logits in takes:
            answer = request.constraint
            if request.status is Status.FINISHED:
                continue
            if answer is None:
                if logits is not None:
                    self._take(request, logits)
                continue
            if logits is not None:
                answer.held = logits
            if answer.held is None or not answer.ready:
                continue
            try:
                failure = answer.failure()
            except Exception:
                self._fail([request], "a constraint's mask")
                continue
            if failure is not None:
                self._finish(request, FinishReason.CONSTRAINT, failure)
                continue
            held, answer.held = answer.held, None
            self._take(request, held)

    def _take(self, request: RequestState, logits: np.ndarray) -> bool:
        """Whether the answer goes on."""
        try:
            token_id = request.sample(logits)
            text, reason = request.take(token_id, self.clock())
        except ConstraintFailed as e:  # a limit reached mid-answer: the client's constraint, not a fault
            self._finish(request, FinishReason.CONSTRAINT, str(e))
            return False
        except Exception:
            self._fail([request], "sampling or detokenizing")
            return False
        self._emit(request, Token(request.id, request.last_index, token_id, text, request.logprobs))
        if reason is not None:
            self._finish(request, reason)
        return reason is None

    def _fail(self, requests: list[RequestState], what: str) -> int:
        """From an except block: log once and end exactly `requests`; 1, a fault."""
        log.exception("%s failed for %s; ending only those requests", what, ", ".join(s.id for s in requests))
        self._end_failed(requests, what)
        return 1

    def _end_failed(self, requests: list[RequestState], what: str) -> None:
        """Their slots' cache is forgotten: it may be half written."""
        for request in requests:
            self._finish(request, FinishReason.ERROR, f"{what} failed on the server", reusable=False)

    def _finish(self, request: RequestState, reason: FinishReason, error: str | None = None, reusable: bool = True) -> None:
        with self._lock:
            if request.status is Status.FINISHED:
                return
            self.scheduler.finish(request, reusable)
        self._emit(request, Finished(request.id, reason, len(request.prompt_ids), len(request.output_ids),
                                 request.timings(self.clock()), error))

    def _weigh_slots(self, rows: int, positions: int, seconds: float) -> None:
        """`seconds`: the runner's part of a decode-only step, as the probe timed its steps, so the machine's speed
        is compared like with like (what sampling adds: docs/measurements/2026-12-05-adaptive-slots.md)."""
        if self.slot_cap is None:
            return
        with self._lock:
            scheduler = self.scheduler
            waiting = 0 if scheduler.open_slots() else len(scheduler.waiting)
        change = self.slot_cap.observe(rows, positions, seconds, waiting)
        if change is not None:
            with self._lock:
                self.scheduler.open = change.after
            log.info("slots %d -> %d, %s", change.before, change.after, change.why)

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

    def _run(self) -> None:
        try:
            while self._wait_for_work():
                self.step()
        except BaseException as e:  # never die silently: every request, and every later submit, hears of it
            log.exception("engine thread failed")
            with self._lock:
                self._move(EngineState.FAILED)  # submit refuses from here, so nothing waits forever
                self._end_all(FinishReason.ERROR, f"{type(e).__name__}: {e}")
            return
        with self._lock:
            self._end_all(FinishReason.SHUTDOWN)
            self._move(EngineState.STOPPED)

    def _wait_for_work(self) -> bool:
        """False once shutdown was asked."""
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
    """A special token's bytes are a mark no text contains (0xff is never in UTF-8)."""
    def piece(token_id: int) -> bytes:
        return tokenizer.token_bytes(token_id) or b"\xff%d\xff" % token_id

    return piece


def _decode_prior(runner: Runner) -> Callable[[int], float] | None:
    model = runner.step_model
    if model is None:
        return None
    position = typical_position(runner.max_len)
    return lambda rows: model.step_s(rows, position)
