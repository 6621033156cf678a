"""Which requests run: a bounded FIFO wait queue, a fixed set of slots, and a prompt-token budget per step.
Pure Python, no tensors.

`schedule` makes every decision of one engine step before any model work: which requests end now (cancelled,
past their deadline), which running ones take the decode step, and which prompt chunks are prefilled in the
same step. Prompt tokens per step are bounded by `budget` while answers are being decoded (grown with a large
batch and with the newcomers starting: `step_budget`), and by time: the chunks may add to a step at most what
step_cost.py predicts keeps it within STALL decode-only steps, or within the capacity bar while several newcomers
wait for their first token (a chunk far into its context costs more a token, its attention reading every cached
position), so a long prompt is prefilled over several steps and running answers never stall for long; with
nothing to decode the bound is `idle_budget`. Until the chunks' cost is known, a step prefills `budget` tokens
in chunks of COLD_CHUNK. Prefills continue first come, first served; newcomers then take free slots while budget is left,
each starting from the longest prefix of its prompt already cached (see prefix_cache.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from ..errors import Overloaded
from .prefix_cache import Held, PrefixCache
from .request import FinishReason
from .request_state import RequestState, Status
from .runner import PrefillChunk
from .step_cost import COLD_CHUNK, StepCost

# Rows per `budget` of prompt tokens a step: up to this many answers decoding, a step prefills at most `budget`
# tokens; twice as many rows, twice the budget (within the time rule).
BUDGET_ROWS = 8


@dataclass
class Plan:
    """One engine step, as decided by the scheduler."""

    ended: list[tuple[RequestState, FinishReason]] = field(default_factory=list)  # already out of the scheduler
    queued: list[tuple[RequestState, int]] = field(default_factory=list)  # (waiting request, its new position)
    admitted: list[RequestState] = field(default_factory=list)  # given a slot this step
    copies: list[tuple[int, int]] = field(default_factory=list)  # (source slot, target slot), before the chunks
    chunks: list[PrefillChunk] = field(default_factory=list)  # prompt tokens to prefill, in this order
    decode: list[RequestState] = field(default_factory=list)  # running, in slot order


class Scheduler:
    def __init__(self, slots: int, max_queue: int, max_chunk: int, budget: int, idle_budget: int | None = None,
                 queue_timeout_s: float | None = None, piece: Callable[[int], bytes] | None = None,
                 context: int | None = None, decode_prior: Callable[[int], float] | None = None):
        """`queue_timeout_s`: how long a request may wait for a slot before it ends with `queue_timeout`.
        `piece` (a token's bytes): a prompt may be rewritten to a cached conversation's tokens of the same text
        (prefix_cache.realign), growing only into the room `context` (a request's most positions) leaves it.
        `decode_prior(rows)`: a decode-only step's seconds measured before serving (step_cost.StepCost)."""
        self.piece, self.context = piece, context
        self.max_queue, self.queue_timeout_s = max_queue, queue_timeout_s
        self.max_chunk, self.budget = max_chunk, budget
        self.costs = StepCost(decode_prior)  # the engine tells it each step's time
        self._allowance_s: float | None = None  # what this step's chunks may still add (None: no time bound)
        self.idle_budget = max(budget, max_chunk) if idle_budget is None else idle_budget
        self.waiting: deque[RequestState] = deque()
        self.running: dict[int, RequestState] = {}  # slot -> request, prefilling or decoding
        self.prefilling: list[RequestState] = []  # in the order they were admitted
        self.free_slots = list(range(slots))
        self.cache = PrefixCache(slots)

    def add(self, request: RequestState) -> None:
        """Queue a new request; Overloaded when the queue is full. Those next in line take the free slots, so
        a burst may hold as many as there are free slots beyond `max_queue`."""
        if len(self.waiting) >= self.max_queue + len(self.free_slots):
            raise Overloaded(self.max_queue)
        self.waiting.append(request)

    def schedule(self, cancelled: Collection[str], now: float) -> Plan:
        plan = Plan()
        for request in [*self.running.values(), *self.waiting]:
            if request.id in cancelled:
                plan.ended.append((request, FinishReason.CANCELLED))
            elif request.deadline_passed(now):
                plan.ended.append((request, FinishReason.TIMEOUT))
            elif request.status is Status.WAITING and self._waited_too_long(request, now):
                plan.ended.append((request, FinishReason.QUEUE_TIMEOUT))
        for request, _ in plan.ended:
            self.finish(request)
        plan.decode = [s for _, s in sorted(self.running.items()) if s.status is Status.RUNNING]
        starting = len(self.prefilling) + min(len(self.waiting), len(self.free_slots))  # to their first token
        if plan.decode and not self.costs.ready:  # a few small chunks a step, until their cost is known
            budget, self._allowance_s = self.budget, None
        else:
            budget = self.step_budget(len(plan.decode), starting)
            self._allowance_s = self.costs.allowance_s(len(plan.decode), starting > 1) if plan.decode else None
        for request in self.prefilling:
            taken = self._chunk(plan, request, budget) if self._room(plan, budget) else 0
            if not taken:  # first come, first served: nobody later goes ahead
                break
            budget -= taken
        while self._room(plan, budget) and self.waiting and self.free_slots and not self._prefix_coming():
            request, copy_from = self._admit()
            plan.admitted.append(request)
            if copy_from is not None:
                plan.copies.append((copy_from, request.slot))
            taken = self._chunk(plan, request, budget)  # none: it has its slot, and prefills from the next step
            if not taken:
                break
            budget -= taken
        plan.queued = self._new_positions()
        return plan

    def step_budget(self, decode_rows: int, starting: int = 1) -> int:
        """Prompt tokens a step may prefill beside `decode_rows` answers: `budget`, grown with the rows beyond
        BUDGET_ROWS (a batch's step is longer, so the time rule allows it more) and with the requests `starting`
        (on their way to a first token: a class arriving together waits on the token cap otherwise, each
        newcomer's few uncached tokens taking a step of their own); with none decoding, `idle_budget`."""
        if not decode_rows:
            return self.idle_budget
        return self.budget * max(1, decode_rows // BUDGET_ROWS, starting)

    def prefilled(self, chunk: PrefillChunk) -> None:
        """The chunk's K/V are in the cache; a request whose prompt is complete starts decoding."""
        request = self.running[chunk.slot]
        request.prefilled = chunk.start + chunk.length
        if chunk.wants_logits:  # it completes the prompt: its logits give the first token
            self.prefilling.remove(request)
            request.move_to(Status.RUNNING)

    def finish(self, request: RequestState, reusable: bool = True) -> None:
        """Take a request out, freeing its slot; it is finished from here on. The slot's cache stays reusable
        unless `reusable` is False (a failed step may have left it half written)."""
        if request.status in (Status.PREFILLING, Status.RUNNING):
            if request in self.prefilling:
                self.prefilling.remove(request)
            del self.running[request.slot]
            self.cache.release(request.slot, request.cached_ids() if reusable else [], request.owner)
            self.free_slots.append(request.slot)
        elif request.status is Status.WAITING:
            self.waiting.remove(request)
        request.move_to(Status.FINISHED)

    def find(self, request_id: str) -> RequestState | None:
        for request in (*self.running.values(), *self.waiting):
            if request.id == request_id:
                return request
        return None

    def requests(self) -> list[RequestState]:
        """Every request not yet finished: those with a slot, then waiting ones in order."""
        return [*self.running.values(), *self.waiting]

    def _prefix_coming(self) -> bool:
        """Whether the next in line waits, first in line, to copy a prefix that another request is computing,
        instead of computing it again: the prompt of the request it follows (another choice of the same prompt),
        or the shared prefix (the server's system prompt) while a prefilling request still computes it (a class
        arriving together on a fresh server)."""
        nxt = self.waiting[0]
        leader = self.find(nxt.follows) if nxt.follows else None
        if leader is not None and leader.status in (Status.WAITING, Status.PREFILLING):
            return True
        n = nxt.shared_prefix
        return n > 0 and nxt.params.cache_prompt and any(
            request.prefilled < n <= len(request.prompt_ids) and request.params.cache_prompt
            and request.prompt_ids[:n] == nxt.prompt_ids[:n] for request in self.prefilling)

    def _waited_too_long(self, request: RequestState, now: float) -> bool:
        return self.queue_timeout_s is not None and now - request.submitted > self.queue_timeout_s

    def _chunk(self, plan: Plan, request: RequestState, budget: int) -> int:
        start = request.prefilled
        length = min(budget, self.max_chunk, len(request.prompt_ids) - start)
        allowance = self._allowance_s
        if plan.decode and allowance is None:  # the costs are not known yet: a small chunk
            length = min(length, COLD_CHUNK)
        elif plan.decode and allowance is not None:  # within what the step may still take
            if plan.chunks and self.costs.chunk_s(start, 1) > allowance:  # (the step's first chunk: one token at least)
                return 0
            length = self.costs.longest(start, length, allowance)
            self._allowance_s = allowance - self.costs.chunk_s(start, length)
        end = start + length
        prompt = request.prompt_ids
        plan.chunks.append(PrefillChunk(request.slot, start, prompt[start:end], wants_logits=end == len(prompt)))
        return length

    def _room(self, plan: Plan, budget: int) -> bool:
        """Whether this step may prefill another chunk: tokens left in the budget, and time left beside answers
        (the first chunk always: a prompt moves on however slow the step)."""
        return budget > 0 and (self._allowance_s is None or not plan.chunks or self._allowance_s >= 0)

    def _admit(self) -> tuple[RequestState, int | None]:
        """The next waiting request, placed where the longest prefix of its prompt is cached, and the slot whose
        cache must be copied into its own first (None: none)."""
        request = self.waiting.popleft()
        busy = sorted(self.running)
        room = self.context - len(request.prompt_ids) - request.params.max_new_tokens if self.context else 0
        place = self.cache.place(request.prompt_ids, self.free_slots, self._holds, busy, reuse=request.params.cache_prompt,
                                 piece=self.piece, room=room, owner=request.owner, shared=request.shared_prefix)
        if place.prompt is not None:  # the same text, as the cached conversation's tokens spell it
            request.prompt_ids = place.prompt
        self.free_slots.remove(place.slot)
        request.slot, request.prefilled, request.reused = place.slot, place.reused, place.reused
        request.move_to(Status.PREFILLING)
        self.running[request.slot] = request
        self.prefilling.append(request)
        return request, place.copy_from

    def _holds(self, slot: int) -> Held:
        request = self.running[slot]
        return Held(request.cached_ids(), request.owner)

    def _new_positions(self) -> list[tuple[RequestState, int]]:
        """Waiting requests whose place in line changed. One that only waits for its prefill turn (a slot is
        free for it) is not queued and hears nothing."""
        free = len(self.free_slots)
        changed = []
        for n, request in enumerate(self.waiting, start=1):
            position = n - free
            if position > 0 and request.last_position != position:
                request.last_position = position
                changed.append((request, position))
        return changed
