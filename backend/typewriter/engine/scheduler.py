"""Which requests run: a bounded wait queue, a fixed set of slots of which at most `open` run at once (slot_cap.py
moves it), and prompt chunks bounded per step by tokens and by time (step_cost.py), so running answers never stall
for long behind a long prompt. Who takes a free slot and whose prompt gets the step's budget first follow fair shares
(fairness.py): the least-served class, within it the least-served student, first come, first served within one
student (and so for callers that give no share). While a client waits with fewer slots than its fair share, one
holding more than its own parks its latest request: the slot is freed, and the request waits again to resume where
it was, its prompt and answer so far prefilled anew (from its own cached tokens when the slot is still untouched).
With `keep_for_readers_s`, a student whose answer ended that recently (reading it) still counts for one slot: the
readers' shares of the slots are kept free, less any a client with a request in here may hold by its own share,
and the others share the rest. So on a machine whose step slows with every row, one student's many chats do not
slow a class that reads (not work-conserving while someone reads; docs/measurements/2026-12-05-fairness.md).
Newcomers take free slots from the longest cached prefix (prefix_cache.py). Pure Python.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from ..errors import Overloaded
from .fairness import ANSWER_COST, FairShare, prompt_cost, slot_shares
from .prefix_cache import Held, PrefixCache
from .request import FinishReason
from .request_state import RequestState, Status
from .runner import PrefillChunk
from .step_cost import COLD_CHUNK, StepCost

# Up to this many decoding rows a step prefills `budget` tokens; twice the rows, twice the budget.
BUDGET_ROWS = 8
ANSWER_MEMORY = 16  # finished answers whose lengths count most in the length a waiting request is expected to get
SLACK = 1e-9  # slot shares are sums of fractions: compared with this much room for rounding


@dataclass
class Plan:
    ended: list[tuple[RequestState, FinishReason]] = field(default_factory=list)  # already out of the scheduler
    queued: list[tuple[RequestState, int]] = field(default_factory=list)  # (waiting request, its new position)
    admitted: list[RequestState] = field(default_factory=list)  # parked ones resuming among them
    parked: list[RequestState] = field(default_factory=list)  # gave their slot back this step
    copies: list[tuple[int, int]] = field(default_factory=list)  # (source slot, target slot), before the chunks
    chunks: list[PrefillChunk] = field(default_factory=list)  # prompt tokens to prefill, in this order
    decode: list[RequestState] = field(default_factory=list)  # running, in slot order


class Scheduler:
    def __init__(self, slots: int, max_queue: int, max_chunk: int, budget: int, idle_budget: int | None = None,
                 queue_timeout_s: float | None = None, piece: Callable[[int], bytes] | None = None,
                 context: int | None = None, decode_prior: Callable[[int], float] | None = None,
                 keep_for_readers_s: float = 0.0):
        """`piece`: a token's bytes, to rewrite a prompt to a cached conversation's tokens (prefix_cache.realign);
        `keep_for_readers_s` 0: a client's share counts only while it has a request in here (work-conserving)."""
        self.piece, self.context = piece, context
        self.max_queue, self.queue_timeout_s = max_queue, queue_timeout_s
        self.max_chunk, self.budget = max_chunk, budget
        self.costs = StepCost(decode_prior)
        self._allowance_s: float | None = None  # what this step's chunks may still add (None: no time bound)
        self.idle_budget = max(budget, max_chunk) if idle_budget is None else idle_budget
        self.waiting: deque[RequestState] = deque()  # in arrival order; `order()` is the order they go in
        self.running: dict[int, RequestState] = {}  # slot -> request, prefilling or decoding
        self.prefilling: list[RequestState] = []  # in the order they were admitted
        self.free_slots = list(range(slots))
        self.open = slots  # newcomers wait once this many run
        self.cache = PrefixCache(slots)
        self.fair = FairShare()
        self.typical_answer = 0.0  # tokens: the mean of the first finished answers, then a moving average
        self.answers_seen = 0
        self._admissions = 0
        self.keep_for_readers_s = keep_for_readers_s
        self.readers: dict[tuple[str, str], tuple[float, float]] = {}  # client -> (its last request ended, weight)
        self._now = 0.0  # the last step's clock, when a request ends between steps
        self._changes = 0  # requests that came or ended and readers that went: what the slots kept depend on
        self._kept_at: tuple[tuple[int, int], int] | None = None  # ((changes, open), slots kept) last worked out

    def add(self, request: RequestState) -> None:
        """Overloaded when full; a burst may hold as many beyond `max_queue` as there are free slots."""
        queued = sum(1 for r in self.waiting if not r.parks)  # a parked request holds no place in the bound
        if queued >= self.max_queue + len(self.open_slots()):
            raise Overloaded(self.max_queue)
        self.waiting.append(request)
        self.fair.arrive(request.share)
        self.readers.pop(_key(request), None)
        self._changes += 1

    def schedule(self, cancelled: Collection[str], now: float) -> Plan:
        plan = Plan()
        self._now = now
        if self.readers:
            kept = {k: v for k, v in self.readers.items() if self._reading(v[0], now)}
            if len(kept) < len(self.readers):
                self.readers, self._changes = kept, self._changes + 1
        for request in self.running.values():
            self._charge_answer(request)
        for request in [*self.running.values(), *self.waiting]:
            if request.id in cancelled:
                plan.ended.append((request, FinishReason.CANCELLED))
            elif request.deadline_passed(now):
                plan.ended.append((request, FinishReason.TIMEOUT))
            elif request.status is Status.WAITING and self._waited_too_long(request, now):
                plan.ended.append((request, FinishReason.QUEUE_TIMEOUT))
        for request, _ in plan.ended:
            self.finish(request)
        self._park_for_waiting(plan)
        plan.decode = [s for _, s in sorted(self.running.items()) if s.status is Status.RUNNING]
        starting = len(self.prefilling) + min(len(self.waiting), len(self.open_slots()))  # to their first token
        if plan.decode and not self.costs.ready:  # a few small chunks a step, until their cost is known
            budget, self._allowance_s = self.budget, None
        else:
            budget = self.step_budget(len(plan.decode), starting)
            self._allowance_s = self.costs.allowance_s(len(plan.decode), starting > 1) if plan.decode else None
        for request in self.fair.by_service(self.prefilling):
            taken = self._chunk(plan, request, budget) if self._room(plan, budget) else 0
            if not taken:  # least served first: nobody more served goes ahead
                break
            budget -= taken
        held: list[RequestState] = []  # each waits to copy a prefix being computed, and a free slot is kept for it
        while self._room(plan, budget) and len(self.open_slots()) > len(held):
            order = self.order()
            nxt = next((r for r in order[:self._starting(order)] if r not in held and r not in plan.parked), None)
            if nxt is None:
                break
            if self._prefix_coming(nxt):
                held.append(nxt)
                continue
            copy_from = self._admit(nxt)
            plan.admitted.append(nxt)
            if copy_from is not None:
                plan.copies.append((copy_from, nxt.slot))
            taken = self._chunk(plan, nxt, budget)  # none: it has its slot, and prefills from the next step
            if not taken:
                break
            budget -= taken
        plan.queued = self._new_positions()
        return plan

    def step_budget(self, decode_rows: int, starting: int = 1) -> int:
        """Grown with the requests `starting`, else a class arriving together gets a step per newcomer."""
        if not decode_rows:
            return self.idle_budget
        return self.budget * max(1, decode_rows // BUDGET_ROWS, starting)

    def order(self) -> list[RequestState]:
        """The waiting requests in the order they will take slots if nothing else changes (their queue positions).
        What the requests in slots are still expected to cost is counted as served already, so that a client
        whose answers are under way goes after one whose are not, as it will once they are generated. While more
        wait than slots are free, those that bring their client up to its slot share go first (in that order), so a
        slot is never given to a request that would be parked for another at the next step."""
        owed = [(r.share, self._prompt_cost(r.prefilled, len(r.fill_ids) - r.prefilled if r in self.prefilling else 0)
                 + max(0.0, self._expected_answer(r) - len(r.output_ids)) * ANSWER_COST)
                for r in self.running.values()]
        fair = self.fair.order(list(self.waiting), self._expected_cost, owed)
        if len(fair) <= len(self.open_slots()) and not self.readers:
            return fair
        held, shares = self._holdings()
        short = {k: math.ceil(shares[k] - held[k] - SLACK) for k in shares}
        first, rest = [], []
        for request in fair:
            key = _key(request)
            if short[key] > 0:
                short[key] -= 1
                first.append(request)
            else:
                rest.append(request)
        return first + rest

    def prefilled(self, chunk: PrefillChunk) -> None:
        request = self.running[chunk.slot]
        self.fair.charge(request.share, self._prompt_cost(chunk.start, chunk.length))
        request.prefilled = chunk.start + chunk.length
        if chunk.wants_logits:
            self.prefilling.remove(request)
            request.move_to(Status.RUNNING)

    def finish(self, request: RequestState, reusable: bool = True) -> None:
        """`reusable` False: a failed step may have left the slot's cache half written."""
        if request.status is not Status.FINISHED:
            self._changes += 1
            self._charge_answer(request)
            self.fair.leave(request.share)
            if self.keep_for_readers_s > 0 and not self.fair.requests(request.share):
                self.readers[_key(request)] = (self._now, request.share.weight)
        if request.output_ids:
            self.answers_seen += 1
            self.typical_answer += (len(request.output_ids) - self.typical_answer) / min(self.answers_seen,
                                                                                        ANSWER_MEMORY)
        if request.status in (Status.PREFILLING, Status.RUNNING):
            self._free_slot(request, request.cached_ids() if reusable else [])
        elif request.status is Status.WAITING:
            self.waiting.remove(request)
        request.move_to(Status.FINISHED)

    def open_slots(self) -> list[int]:
        """The free slots a newcomer may take: none once `open` requests run, else those numbered below `open`, so
        the caches of slots past it stay untouched until it rises."""
        if len(self.running) >= self.open:
            return []
        return [slot for slot in self.free_slots if slot < self.open]

    def readers_kept(self, now: float) -> int:
        """The clients kept a share as readers at `now`."""
        return sum(1 for ended, _ in self.readers.values() if self._reading(ended, now))

    def _reading(self, ended: float, now: float) -> bool:
        """Whether a client whose last request ended at `ended` is still kept as a reader at `now`."""
        return now - ended < self.keep_for_readers_s

    def find(self, request_id: str) -> RequestState | None:
        for request in (*self.running.values(), *self.waiting):
            if request.id == request_id:
                return request
        return None

    def requests(self) -> list[RequestState]:
        return [*self.running.values(), *self.waiting]

    def _prefix_coming(self, nxt: RequestState) -> bool:
        """Whether `nxt` should wait to copy a prefix another request is computing: the prompt of the request it
        follows, or the shared prefix (a class arriving together on a fresh server)."""
        leader = self.find(nxt.follows) if nxt.follows else None
        if leader is not None and leader.status in (Status.WAITING, Status.PREFILLING) and not leader.parks:
            return True  # a parked leader waits behind its followers: they go on without it
        return nxt.params.cache_prompt and any(
            request.prefilled < n <= len(request.prompt_ids) and request.params.cache_prompt
            and request.prompt_ids[:n] == nxt.prompt_ids[:n] for n in nxt.shared_prefix for request in self.prefilling)

    def _waited_too_long(self, request: RequestState, now: float) -> bool:
        """A parked request has started: its deadline bounds it, not the queue's."""
        return self.queue_timeout_s is not None and not request.parks and now - request.submitted > self.queue_timeout_s

    def _holdings(self) -> tuple[Counter[tuple[str, str]], dict[tuple[str, str], float]]:
        """(slots each client holds, its fair share of the open slots less those kept for readers), for every client
        with a request in here."""
        held, demand, weights = self._demand()
        return held, slot_shares(demand, weights, self.open - self._kept())

    def _demand(self) -> tuple[Counter[tuple[str, str]], Counter[tuple[str, str]], dict[str, float]]:
        """(slots each client holds, requests each has in here, each group's weight)."""
        held = Counter(_key(r) for r in self.running.values())
        demand = held + Counter(_key(r) for r in self.waiting)
        return held, demand, {r.share.group: r.share.weight for r in (*self.running.values(), *self.waiting)}

    def _kept(self) -> int:
        """The slots kept for readers: what their shares come to, each reader asking for one beside the clients with
        requests in here, less any slot such a client may hold by its own share. So a student with
        nothing running never waits for a reader's slot, and clients that ask for more than the slots between them
        share them by their weights and counters as if nobody read. Worked out again only once requests came or
        ended, readers went or the open count moved: a parked or admitted request asks for what it asked before."""
        if not self.readers:
            return 0
        if self._kept_at is not None and self._kept_at[0] == (self._changes, self.open):
            return self._kept_at[1]
        _, demand, weights = self._demand()  # only when worked out again: the step's admissions ask every time
        everyone = demand + Counter(dict.fromkeys(self.readers, 1))
        shares = slot_shares(everyone, {g: w for (g, _), (_, w) in self.readers.items()} | weights, self.open)
        entitled = sum(min(n, math.ceil(shares[k] - SLACK)) for k, n in demand.items())
        kept = min(math.ceil(sum(shares[k] for k in self.readers) - SLACK), max(0, self.open - entitled))
        self._kept_at = (self._changes, self.open), kept
        return kept

    def _starting(self, order: list[RequestState]) -> int:
        """How many of `order` (the waiting requests as `order()` gives them), from its first, may take the free
        slots now: as many as are free, less those kept for readers."""
        return min(max(0, len(self.open_slots()) - self._kept()), len(order))

    def _park_for_waiting(self, plan: Plan) -> None:
        """While a waiting client holds fewer slots than its fair share (fairness.slot_shares), one that would still
        hold its own share with a slot fewer parks its latest request, the furthest over its share first. A request
        whose constrained token waits on its mask is not parked: its held logits would be lost. Nor is one whose slot
        the waiter could not take: none while more run than `open` (the count was lowered), nor a slot past it."""
        if not self.waiting or len(self.running) > self.open:
            return
        order = self.order()
        starting = self._starting(order)
        if starting == len(order):
            return
        held, shares = self._holdings()
        for waiter in order[starting:]:  # those before it take the free slots
            key = _key(waiter)
            if held[key] >= shares[key] - SLACK:
                break  # those short of their share come first in the order: none is left
            victims = [r for r in self.running.values() if held[_key(r)] - 1 >= shares[_key(r)] - SLACK
                       and r.slot < self.open and (r.constraint is None or r.constraint.held is None)]
            if not victims:
                break
            victim = max(victims, key=lambda r: (held[_key(r)] - shares[_key(r)], r.admission))
            self._park(victim)
            plan.parked.append(victim)
            held[_key(victim)] -= 1
            held[key] += 1

    def _park(self, request: RequestState) -> None:
        self._charge_answer(request)
        self._free_slot(request, request.cached_ids())
        request.park()
        self.waiting.append(request)

    def _free_slot(self, request: RequestState, cached: list[int]) -> None:
        """Takes a request out of its slot, leaving `cached` there for whoever reuses it."""
        if request in self.prefilling:
            self.prefilling.remove(request)
        del self.running[request.slot]
        self.cache.release(request.slot, cached, request.owner)
        self.free_slots.append(request.slot)

    def _chunk(self, plan: Plan, request: RequestState, budget: int) -> int:
        start = request.prefilled
        fill = request.fill_ids
        length = min(budget, self.max_chunk, len(fill) - start)
        allowance = self._allowance_s
        if plan.decode and allowance is None:  # the costs are not known yet: a small chunk
            length = min(length, COLD_CHUNK)
        elif plan.decode and allowance is not None:
            if plan.chunks and self.costs.chunk_s(start, 1) > allowance:  # the step's first chunk always goes
                return 0
            length = self.costs.longest(start, length, allowance)
            self._allowance_s = allowance - self.costs.chunk_s(start, length)
        end = start + length
        plan.chunks.append(PrefillChunk(request.slot, start, fill[start:end], wants_logits=end == len(fill)))
        return length

    def _room(self, plan: Plan, budget: int) -> bool:
        """The first chunk always goes, so a prompt moves on however slow the step."""
        return budget > 0 and (self._allowance_s is None or not plan.chunks or self._allowance_s >= 0)

    def _admit(self, request: RequestState) -> int | None:
        """Gives a waiting request a slot; returns the slot whose cache is copied into its own first (None: none)."""
        self.waiting.remove(request)
        busy = sorted(self.running)
        room = self.context - len(request.prompt_ids) - request.params.max_new_tokens if self.context else 0
        # A parked request's answer is under way: its tokens are never rewritten (`piece` None).
        place = self.cache.place(request.fill_ids, self.open_slots(), self._holds, busy,
                                 reuse=request.params.cache_prompt,
                                 piece=None if request.parks else self.piece, room=room, owner=request.owner,
                                 shared=request.shared_prefix)
        if place.prompt is not None:  # the same text, as the cached conversation's tokens spell it
            request.prompt_ids = place.prompt
        self.free_slots.remove(place.slot)
        request.slot, request.prefilled = place.slot, place.reused
        if not request.parks:
            request.reused = place.reused  # what its usage reports as cached
        self._admissions += 1
        request.admission = self._admissions
        request.move_to(Status.PREFILLING)
        self.running[request.slot] = request
        self.prefilling.append(request)
        return place.copy_from

    def _holds(self, slot: int) -> Held:
        request = self.running[slot]
        return Held(request.cached_ids(), request.owner)

    def _charge_answer(self, request: RequestState) -> None:
        """Charges the tokens it generated since the last time."""
        new = len(request.output_ids) - request.charged
        if new:
            self.fair.charge(request.share, new * ANSWER_COST)
            request.charged += new

    def _prompt_cost(self, start: int, length: int) -> float:
        return prompt_cost(self.costs, self.open, start, length)  # a full batch: the slots open now

    def _expected_answer(self, request: RequestState) -> float:
        """Tokens its answer is expected to have: as many as the typical one, half its allowance before any ended."""
        most = request.params.max_new_tokens
        return min(most, self.typical_answer if self.answers_seen else most / 2)

    def _expected_cost(self, request: RequestState) -> float:
        """What a waiting request will cost: its whole prompt (what is cached is known only once placed) and its
        expected answer."""
        return self._prompt_cost(0, len(request.prompt_ids)) + self._expected_answer(request) * ANSWER_COST

    def _new_positions(self) -> list[tuple[RequestState, int]]:
        """Places in the fair order, for those whose place changed. One with a slot free for it (that waits for
        the step's budget, or for a prefix to copy) is next: one never queued hears nothing, one told a place
        hears it is first, so that no page shows a place it has left."""
        order = self.order()
        starting = self._starting(order)
        changed = []
        for n, request in enumerate(order, start=1):
            position = n - starting if n > starting else (1 if request.last_position else 0)
            if request.parks:  # its answer is under way: its page shows the answer, not a place
                continue
            if position > 0 and request.last_position != position:
                request.last_position = position
                changed.append((request, position))
        return changed


def _key(request: RequestState) -> tuple[str, str]:
    return request.share.group, request.share.client
