"""The slot count while serving: the runner's decode-only steps are timed against the step model probed at start,
and between steps the count of slots open to newcomers moves within the slots whose caches were allocated. It
rises while its step stays within the budget that keeps a full class under the capacity bar, and falls only once
its step passes the bar itself: between the two it holds, as queueing a class costs its students far more than
slower streams do (docs/measurements/2026-12-05-adaptive-slots.md). For the same reason, while chats wait for a
slot it rises further, a slot for each, up to a wider budget: a student left over waits a whole answer and takes
another's cached conversation, where a slightly slower step costs each a few milliseconds. A probe on a busy
machine measured slow steps, and a machine that got busy since makes them slow now: either way the steps served say
so. Lowering the count only stops admitting; no chat is cut short. Pure Python.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .capacity import LEAST_SLOTS, STEP_BUDGET_S, StepModel, slots_by_time, typical_position
from .step_cost import HEADROOM, INTER_TOKEN_S

WINDOW = 128  # decode-only steps weighed: several seconds of a class, so a moment of another's work moves nothing
EVERY = 64  # decode-only steps between two changes, so each count is judged mostly on steps taken since the last
# How far within the budget the step at the open count must stay to raise it, so the machine's noise does not raise
# it a slot at a time.
ROOM = 1.15
# While chats wait for a slot: a full class's p95 gap in decode-only steps at the low end of those measured, not the
# budget's cautious P95_STEPS, which left a class of 32 a few slots short on one machine kind (the study's section
# on it); and fewer steps between two looks, as each look may seat a student who would wait a whole answer.
WAITING_P95_STEPS = 1.25
WAITING_BUDGET_S = INTER_TOKEN_S * HEADROOM / WAITING_P95_STEPS
WAITING_EVERY = 16


@dataclass(frozen=True)
class Change:
    before: int
    after: int
    why: str


class SlotCap:
    def __init__(self, model: StepModel, slots: int, most: int, max_context: int, least: int = LEAST_SLOTS):
        self.model, self.slots, self.least, self.most = model, slots, least, most
        self.max_context = max_context
        self._ratios: deque[tuple[float, int]] = deque(maxlen=WINDOW)  # (measured / modelled seconds, rows)
        self._since = 0  # decode-only steps since the last change
        self.last: Change | None = None

    def observe(self, rows: int, positions: int, seconds: float, waiting: int = 0) -> Change | None:
        """A decode-only step of `rows` rows whose positions sum to `positions`, with `waiting` chats left without a
        slot (none open), and the new count if it moves."""
        model = self.model
        modelled = model.fixed_s + rows * model.per_row_s + model.per_row_position_s * positions
        if rows < 1 or modelled <= 0.0:
            return None
        self._ratios.append((seconds / modelled, rows))
        self._since += 1
        if self._since < (WAITING_EVERY if waiting else EVERY):
            return None
        scale, position = self.scale(), typical_position(self.max_context)
        now_s = scale * model.step_s(self.slots, position)
        up = max(self.least, slots_by_time(model, self.max_context, self.most, scale))
        down = max(self.least, slots_by_time(model, self.max_context, self.most, scale, INTER_TOKEN_S * HEADROOM))
        seats = min(self.slots + waiting, slots_by_time(model, self.max_context, self.most, scale, WAITING_BUDGET_S))
        if up > self.slots and now_s * ROOM < STEP_BUDGET_S:
            target, why = up, (f"raised: {up} slots step in about {scale * model.step_s(up, position) * 1000:.0f} "
                               f"ms, within the budget of {STEP_BUDGET_S * 1000:.0f} ms")
        elif waiting and seats > self.slots:
            target, why = seats, (f"raised: {waiting} chat{'s' if waiting > 1 else ''} waited for a slot; {seats} "
                                  f"slots step in about {scale * model.step_s(seats, position) * 1000:.0f} ms, within "
                                  f"the budget while chats wait of {WAITING_BUDGET_S * 1000:.0f} ms")
        elif down < self.slots and now_s > INTER_TOKEN_S:
            target, why = down, (f"lowered: {self.slots} slots step in about {now_s * 1000:.0f} ms, past the "
                                 f"capacity bar of {INTER_TOKEN_S * 1000:.0f} ms")
        else:
            return None
        why += f" (decode steps take {scale:.2f}x the start's measurement)"
        self.last = change = Change(self.slots, target, why)
        self.slots, self._since = target, 0
        return change

    def scale(self) -> float:
        """The measured steps against the model's: the median by rows, as a step of many rows says more of the cost
        of one more than a step of few."""
        ratios = sorted(self._ratios)
        half, seen = sum(rows for _, rows in ratios) / 2, 0
        for ratio, rows in ratios:
            seen += rows
            if seen >= half:
                return ratio
        return 1.0
