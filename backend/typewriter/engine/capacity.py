"""The slot count, sized at start from probed step times so a full class stays under the capacity bar on any machine,
and every slot's K/V cache fits in memory (docs/measurements/2026-12-04-a-school-sized-model.md); while serving it
moves with the steps measured then (slot_cap.py). Pure Python.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .step_cost import HEADROOM, INTER_TOKEN_S

MOST_SLOTS = 64
LEAST_SLOTS = 1
P95_STEPS = 1.5  # a full class's 95th-percentile gap, in decode-only steps
PROBE_ROWS = 32  # far enough from one row that noise moves the per-row cost little
PROBE_POSITIONS = (64, 512)
MEMORY_SHARE = 0.5  # of the memory available at start, the most the slots' K/V caches may take
STEP_BUDGET_S = INTER_TOKEN_S * HEADROOM / P95_STEPS  # the longest decode-only step a full class may take
# Of the machine's CPU time, the most other processes may take while the probe measures for its figure to be kept
# for good: more, and the next start measures again (docs/measurements/2026-12-05-adaptive-slots.md).
BUSY = 0.2


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
        """`measure`: a decode-only step's seconds per (rows, position), taken in turns so noise is shared."""
        near, far = probe_positions(max_len)
        one_near, one_far, wide_near, wide_far = measure([(1, near), (1, far), (rows, near), (rows, far)])
        per_row_position = max(0.0, ((wide_far - wide_near) + (one_far - one_near)) / ((far - near) * (rows + 1)))
        per_row = max(0.0, (wide_near - one_near) / (rows - 1) - per_row_position * near)
        fixed = max(0.0, one_near - per_row - per_row_position * near)
        return cls(fixed, per_row, per_row_position)


def probe_positions(max_len: int) -> tuple[int, int]:
    far = min(PROBE_POSITIONS[1], max_len - 1)
    return min(PROBE_POSITIONS[0], far // 4), far


@dataclass(frozen=True)
class Probe:
    """A step model and how busy other processes kept the machine while it was measured."""

    model: StepModel
    others: float | None = None  # their share of the machine's CPU time meanwhile, 0 to 1; None: not known

    @property
    def under_load(self) -> bool:
        return self.others is not None and self.others > BUSY


@dataclass(frozen=True)
class Sizing:
    slots: int  # at start; slot_cap.py moves it while serving when `most` is set
    sized_by: str  # "measured step time", "memory", or "set" (--max-active / TYPEWRITER_MAX_ACTIVE)
    step_ms: float | None = None
    most: int | None = None  # the slots whose K/V caches are allocated; None: the count is fixed
    others: float | None = None  # the probe's `others`, when it measured under load

    @property
    def adapts(self) -> bool:
        return self.most is not None

    def describe(self) -> dict[str, object]:
        out: dict[str, object] = {"count": self.slots, "sized_by": self.sized_by}
        if self.step_ms is not None:
            out["decode_step_ms"] = round(self.step_ms, 1)
        if self.most is not None:
            out["bounds"] = [LEAST_SLOTS, self.most]
        if self.step_ms is not None:
            out["measured_under_load"] = self.others is not None
        return out

    def summary(self) -> str:
        """For the start-up lines: how many, why, and whether the figure behind it may be trusted."""
        why = self.sized_by if self.step_ms is None else f"{self.sized_by}: a decode step of {self.step_ms:.0f} ms"
        if self.most is not None:
            why += f"; moves within {LEAST_SLOTS}-{self.most} with the steps measured while serving"
        if self.others is not None:
            why += (f"; measured under load: other processes took {self.others:.0%} of the CPU time, so the next "
                    "start measures again")
        return f"{self.slots} slot{'' if self.slots == 1 else 's'} ({why})"


def typical_position(max_context: int) -> int:
    """A tutoring conversation's few turns; longer ones make steps slower than the slots were sized for."""
    return min(512, max(1, max_context // 4))


def slots_by_time(model: StepModel, max_context: int, most: int = MOST_SLOTS, scale: float = 1.0,
                  budget_s: float = STEP_BUDGET_S) -> int:
    """The most slots whose decode-only step, `scale` times the model's, stays within `budget_s`; at least one."""
    position = typical_position(max_context)
    slots = LEAST_SLOTS
    while slots < most and scale * model.step_s(slots + 1, position) <= budget_s:
        slots += 1
    return slots


def size_slots(probe: Probe, max_context: int, kv_bytes_per_token: int, available_bytes: int | None,
               most: int = MOST_SLOTS) -> Sizing:
    """The slots at start, and the most whose caches fit (`Sizing.most`), for slot_cap.py to move them within."""
    by_time = slots_by_time(probe.model, max_context, most)
    if available_bytes is not None:
        most = min(most, max(LEAST_SLOTS, int(available_bytes * MEMORY_SHARE // (kv_bytes_per_token * max_context))))
    slots, why = (by_time, "measured step time") if by_time <= most else (most, "memory")
    step_s = probe.model.step_s(slots, typical_position(max_context))
    return Sizing(slots, why, step_s * 1000, most, probe.others if probe.under_load else None)
