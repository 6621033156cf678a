"""The slot count, sized at start from probed step times so a full class stays under the capacity bar on any machine,
and every slot's K/V cache fits in memory (docs/measurements/2026-12-04-a-school-sized-model.md). Pure Python.
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
class Sizing:
    slots: int
    sized_by: str  # "measured step time", "memory", or "set" (--max-active / TYPEWRITER_MAX_ACTIVE)
    step_ms: float | None = None

    def describe(self) -> dict[str, object]:
        out: dict[str, object] = {"count": self.slots, "sized_by": self.sized_by}
        if self.step_ms is not None:
            out["decode_step_ms"] = round(self.step_ms, 1)
        return out


def typical_position(max_context: int) -> int:
    """A tutoring conversation's few turns; longer ones make steps slower than the slots were sized for."""
    return min(512, max(1, max_context // 4))


def size_slots(model: StepModel, max_context: int, kv_bytes_per_token: int, available_bytes: int | None,
               most: int = MOST_SLOTS) -> Sizing:
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
