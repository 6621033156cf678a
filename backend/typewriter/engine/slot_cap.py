"""The slot count while serving: the runner's decode-only steps are timed against the step model probed at start,
and between steps the count of slots open to newcomers moves to the most whose step stays within the
budget, within the slots whose caches were allocated. A probe on a busy machine measured slow steps, and a machine
that got busy since makes them slow now: either way the steps served say so
(docs/measurements/2026-12-05-adaptive-slots.md). Lowering the count only stops admitting; no chat is cut short.
Pure Python.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .capacity import LEAST_SLOTS, STEP_BUDGET_S, StepModel, slots_by_time, typical_position

WINDOW = 128  # decode-only steps weighed: several seconds of a class, so a moment of another's work moves nothing
EVERY = 64  # decode-only steps between two changes, so each count is judged mostly on steps taken since the last
# How far past the budget the steps at the open count must be to lower it, and how far within to raise it: between,
# it stays, so the machine's noise does not move it back and forth a slot at a time.
MARGIN = 1.15


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

    def observe(self, rows: int, positions: int, seconds: float) -> Change | None:
        """A decode-only step of `rows` rows whose positions sum to `positions`, and the new count if it moves."""
        model = self.model
        modelled = model.fixed_s + rows * model.per_row_s + model.per_row_position_s * positions
        if rows < 1 or modelled <= 0.0:
            return None
        self._ratios.append((seconds / modelled, rows))
        self._since += 1
        if self._since < EVERY:
            return None
        scale, position = self.scale(), typical_position(self.max_context)
        target = max(self.least, slots_by_time(model, self.max_context, self.most, scale))
        now_s = scale * model.step_s(self.slots, position)
        if target > self.slots and now_s * MARGIN < STEP_BUDGET_S:
            why = f"raised: {target} slots step in about {scale * model.step_s(target, position) * 1000:.0f} ms, within"
        elif target < self.slots and now_s > STEP_BUDGET_S * MARGIN:
            why = f"lowered: {self.slots} slots step in about {now_s * 1000:.0f} ms, past"
        else:
            return None
        why += f" the budget of {STEP_BUDGET_S * 1000:.0f} ms (decode steps take {scale:.2f}x the start's measurement)"
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
