"""Which requests run: a bounded FIFO wait queue and a fixed set of slots. Pure Python, no tensors.

`schedule` makes every decision of one engine step before any model work: which requests end now (cancelled,
past their deadline), which waiting one takes a free slot (at most one: its prefill sits between two decode steps,
so a burst of newcomers costs running answers one prefill per step, not one per newcomer), which waiting ones
hear a new queue position, and which running ones take the decode step.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field

from .errors import Overloaded
from .request import FinishReason
from .sequence import Sequence, Status


@dataclass
class Plan:
    """One engine step, as decided by the scheduler."""

    ended: list[tuple[Sequence, FinishReason]] = field(default_factory=list)  # already out of the scheduler
    queued: list[tuple[Sequence, int]] = field(default_factory=list)  # (waiting sequence, its new position)
    prefill: Sequence | None = None  # admitted into a slot this step
    decode: list[Sequence] = field(default_factory=list)  # running before this step, in slot order


class Scheduler:
    def __init__(self, slots: int, max_queue: int):
        self.max_queue = max_queue
        self.waiting: deque[Sequence] = deque()
        self.running: dict[int, Sequence] = {}  # slot -> sequence
        self.free_slots = list(range(slots))  # kept sorted: the lowest free slot keeps the decode batch small

    def add(self, seq: Sequence) -> None:
        """Queue a new sequence; Overloaded when the queue is full. Those next in line take the free slots, so
        a burst may hold as many as there are free slots beyond `max_queue`."""
        if len(self.waiting) >= self.max_queue + len(self.free_slots):
            raise Overloaded(self.max_queue)
        self.waiting.append(seq)

    def schedule(self, cancelled: Collection[str], now: float) -> Plan:
        plan = Plan()
        for seq in [*self.running.values(), *self.waiting]:
            if seq.id in cancelled:
                plan.ended.append((seq, FinishReason.CANCELLED))
            elif seq.deadline_passed(now):
                plan.ended.append((seq, FinishReason.TIMEOUT))
        for seq, _ in plan.ended:
            self.finish(seq)
        plan.decode = [self.running[slot] for slot in sorted(self.running)]
        plan.prefill = self._admit()
        plan.queued = self._new_positions()
        return plan

    def finish(self, seq: Sequence) -> None:
        """Take a sequence out, freeing its slot; it is finished from here on."""
        if seq.status is Status.RUNNING:
            del self.running[seq.slot]
            self.free_slots.append(seq.slot)
            self.free_slots.sort()
        elif seq.status is Status.WAITING:
            self.waiting.remove(seq)
        seq.move_to(Status.FINISHED)

    def find(self, request_id: str) -> Sequence | None:
        for seq in (*self.running.values(), *self.waiting):
            if seq.id == request_id:
                return seq
        return None

    def sequences(self) -> list[Sequence]:
        """Every sequence not yet finished: running ones, then waiting ones in order."""
        return [*self.running.values(), *self.waiting]

    def _admit(self) -> Sequence | None:
        """The next waiting sequence, now placed in the lowest free slot; None if none waits or none is free."""
        if not self.waiting or not self.free_slots:
            return None
        seq = self.waiting.popleft()
        seq.slot = self.free_slots.pop(0)
        seq.move_to(Status.RUNNING)
        self.running[seq.slot] = seq
        return seq

    def _new_positions(self) -> list[tuple[Sequence, int]]:
        """Waiting sequences whose place in line changed. One that only waits for its prefill turn (a slot is
        free for it) is not queued and hears nothing."""
        free = len(self.free_slots)
        changed = []
        for n, seq in enumerate(self.waiting, start=1):
            position = n - free
            if position > 0 and seq.last_position != position:
                seq.last_position = position
                changed.append((seq, position))
        return changed
