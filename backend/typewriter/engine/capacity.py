"""How many students one machine can stream to at once: the slot count, sized at start from measured step times,
not a constant, so a full class stays under the capacity bar on whatever machine serves it.

The bar: every student's inter-token gap under INTER_TOKEN_S at the 95th percentile. A decode step's time grows
with its rows (the matmuls' rows, and each row's attention over its cached positions); a step that also prefills
a newcomer's prompt takes longer (step_cost.py bounds it), and a class's 95th-percentile gap measured P95_STEPS
decode-only steps or less. So the slots are the most rows whose decode-only step, at a typical position, times
P95_STEPS stays under the bar with room for the machine's noise. The step's time is fit from probe steps as fixed
+ per row + per row and cached position, and each slot's K/V cache must also fit in the memory the machine has.
Pure Python: the caller probes the runner.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .step_cost import HEADROOM, INTER_TOKEN_S

MOST_SLOTS = 64
LEAST_SLOTS = 1
# A student's 95th-percentile gap in a full class, in decode-only steps (chunk steps and the machine's noise
# included): what a class of 32 measured, with a little room (docs/measurements/2026-12-04-a-school-sized-model.md).
P95_STEPS = 1.5
PROBE_ROWS = 32  # the rows of the wide probe step: far enough from one row that noise moves the per-row cost little
PROBE_POSITIONS = (64, 512)  # cached positions the probe steps attend over (within a shorter context: less)
MEMORY_SHARE = 0.5  # of the memory available at start, the most the slots' K/V caches may take


@dataclass(frozen=True)
class StepModel:
    """A decode-only step's seconds: fixed + per_row * rows + per_row_position * rows * position."""

    fixed_s: float
    per_row_s: float
    per_row_position_s: float

    def step_s(self, rows: int, position: int) -> float:
        return self.fixed_s + rows * (self.per_row_s + self.per_row_position_s * position)

    @classmethod
    def fit(cls, measure: Callable[[Sequence[tuple[int, int]]], Sequence[float]], max_len: int = 1 << 30,
            rows: int = PROBE_ROWS) -> StepModel:
        """From `measure(probes)` (for each (rows, position), a decode-only step's seconds, steady: measured in
        turns, so that a moment of noise does not fall on one probe alone) at one row and at `rows` rows (at least
        2), each at both PROBE_POSITIONS (as far as a context of `max_len` positions reaches)."""
        near, far = probe_positions(max_len)
        one_near, one_far, wide_near, wide_far = measure([(1, near), (1, far), (rows, near), (rows, far)])
        # per row and position: how a row's cost grows with its position, read at both widths
        per_row_position = max(0.0, ((wide_far - wide_near) + (one_far - one_near)) / ((far - near) * (rows + 1)))
        per_row = max(0.0, (wide_near - one_near) / (rows - 1) - per_row_position * near)
        fixed = max(0.0, one_near - per_row - per_row_position * near)
        return cls(fixed, per_row, per_row_position)


def probe_positions(max_len: int) -> tuple[int, int]:
    """PROBE_POSITIONS within a context of `max_len` positions (at least 2)."""
    far = min(PROBE_POSITIONS[1], max_len - 1)
    return min(PROBE_POSITIONS[0], far // 4), far


@dataclass(frozen=True)
class Sizing:
    """The slot count chosen and why, for /readyz and the log."""

    slots: int
    sized_by: str  # "measured step time", "memory", or "set" (--max-active / TYPEWRITER_MAX_ACTIVE)
    step_ms: float | None = None  # the model's decode-only step at `slots` rows and the typical position

    def describe(self) -> dict[str, object]:
        out: dict[str, object] = {"count": self.slots, "sized_by": self.sized_by}
        if self.step_ms is not None:
            out["decode_step_ms"] = round(self.step_ms, 1)
        return out


def typical_position(max_context: int) -> int:
    """The cached positions a class's answers attend over, for sizing: a quarter of the context, at most 512 (a
    tutoring conversation's few turns: bench/classroom.py's reach 300 to 900). A class whose conversations run
    much longer has slower steps than the slots were sized for."""
    return min(512, max(1, max_context // 4))


def size_slots(model: StepModel, max_context: int, kv_bytes_per_token: int, available_bytes: int | None,
               most: int = MOST_SLOTS) -> Sizing:
    """The most slots whose decode-only step times P95_STEPS is within the bar, and whose K/V caches fit in
    MEMORY_SHARE of `available_bytes` (None: not known)."""
    position = typical_position(max_context)
    budget = INTER_TOKEN_S * HEADROOM / P95_STEPS
    by_time = LEAST_SLOTS
    while by_time < most and model.step_s(by_time + 1, position) <= budget:
        by_time += 1
    slots, why = by_time, "measured step time"
    if available_bytes is not None:
        by_memory = max(LEAST_SLOTS, int(available_bytes * MEMORY_SHARE // (kv_bytes_per_token * max_context)))
        if by_memory < slots:
            slots, why = by_memory, "memory"
    return Sizing(slots, why, model.step_s(slots, position) * 1000)
