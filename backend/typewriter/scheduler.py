"""Which requests run: a bounded FIFO wait queue and a fixed set of slots. Pure Python, no tensors."""

from __future__ import annotations

from collections import deque

from .errors import Overloaded
from .sequence import Sequence, Status


class Scheduler:
    def __init__(self, slots: int, max_queue: int):
        self.max_queue = max_queue
        self.waiting: deque[Sequence] = deque()
        self.running: dict[int, Sequence] = {}  # slot -> sequence
        self.free_slots = list(range(slots))  # kept sorted: the lowest free slot keeps the decode batch small

    def add(self, seq: Sequence) -> None:
        if len(self.waiting) >= self.max_queue + len(self.free_slots):  # those next in line take the free slots
            raise Overloaded(self.max_queue)
        self.waiting.append(seq)

    def admit(self) -> Sequence | None:
        """The next waiting sequence, now placed in the lowest free slot; None if none waits or none is free."""
        if not self.waiting or not self.free_slots:
            return None
        seq = self.waiting.popleft()
        seq.slot = self.free_slots.pop(0)
        seq.move_to(Status.RUNNING)
        self.running[seq.slot] = seq
        return seq

    def remove(self, seq: Sequence) -> None:
        if seq.status is Status.RUNNING:
            del self.running[seq.slot]
            self.free_slots.append(seq.slot)
            self.free_slots.sort()
        elif seq in self.waiting:
            self.waiting.remove(seq)

    def find(self, request_id: str) -> Sequence | None:
        for seq in (*self.running.values(), *self.waiting):
            if seq.id == request_id:
                return seq
        return None

    def batch_size(self) -> int:
        """Rows a decode step covers: every slot up to the highest one in use."""
        return max(self.running) + 1 if self.running else 0
