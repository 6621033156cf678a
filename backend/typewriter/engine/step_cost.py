"""How long an engine step takes, learned from the steps so far, so the scheduler sizes prompt chunks by time. A
chunk's cost is fit per token plus per attended position, as attention grows along a long prompt
(docs/measurements/2026-12-03-int8-lite-time-sized-chunks-avx512-kernel.md). Pure Python, no tensors.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable, Sequence

# A step that prefills beside answers, in decode-only steps (docs/measurements/2026-12-04-int8-lite-gptq-16-bit-rows.md).
STALL = 1.75
INTER_TOKEN_S = 0.100  # the capacity bar: a student's inter-token gap, 95th percentile
HEADROOM = 0.9  # of the bar: the machine's noise
COLD_CHUNK = 4  # tokens a chunk gets beside answers until the costs are known
FORGET = 0.97  # each chunk step's weight against the next one's (the last ~30 steps count most)
DECODE_STEPS = 16  # decode-only steps whose median is the decode step's time
SEEN = 3  # chunk steps to see before the fit is used
POSITIONS = 1000.0  # cached positions are counted in thousands, so both figures are of a size


def attended(start: int, length: int) -> int:
    """Cached positions a chunk's tokens attend to in all: token i at start + i sees start + i + 1."""
    return length * start + length * (length + 1) // 2


class StepCost:
    def __init__(self, prior: Callable[[int], float] | None = None) -> None:
        """`prior(rows)`: a decode-only step's seconds as probed at start, so a fresh server skips cold chunks."""
        self._prior = prior
        # Per row count, since one figure for every count charged a full batch's rows to the chunk beside them
        # (docs/measurements/2026-12-04-int8-lite-two-thread-attention.md).
        self._decode: dict[int, deque[float]] = {}  # decode rows -> the last decode-only steps' times
        self._medians: dict[int, float] = {}
        self.seen = 0
        self._xx = [0.0, 0.0, 0.0]  # sums of x1 x1, x1 x2, x2 x2 (x1 tokens, x2 thousands of positions)
        self._xy = [0.0, 0.0]

    def observe(self, decode_rows: int, chunks: Sequence[tuple[int, int]], seconds: float) -> None:
        """`chunks`: (start, length). A step with nothing decoding stalls no one, and teaches nothing."""
        if not decode_rows:
            return
        if not chunks:
            times = self._decode.setdefault(decode_rows, deque(maxlen=DECODE_STEPS))
            times.append(seconds)
            self._medians[decode_rows] = statistics.median(times)
            return
        decode_s = self.decode_s(decode_rows)
        if decode_s is not None:
            self._fit(chunks, seconds - decode_s)

    def _fit(self, chunks: Sequence[tuple[int, int]], y: float) -> None:
        """`y`: the seconds the chunks added to the step; older steps weigh less."""
        x1 = float(sum(n for _, n in chunks))
        x2 = sum(attended(s, n) for s, n in chunks) / POSITIONS
        xx, xy = self._xx, self._xy
        for i, v in enumerate((x1 * x1, x1 * x2, x2 * x2)):
            xx[i] = FORGET * xx[i] + v
        xy[0], xy[1] = FORGET * xy[0] + x1 * y, FORGET * xy[1] + x2 * y
        self.seen += 1

    def decode_s(self, rows: int) -> float | None:
        """The median of the last such steps (steadier than a mean through the machine's hiccups); for a count not
        seen yet, the line through those seen, never below the nearest count under it; else the prior's, or None."""
        medians = self._medians
        if not medians:
            return self._prior(rows) if self._prior is not None else None
        if rows in medians:
            return medians[rows]
        if len(medians) == 1:
            (only,) = medians.values()
            return only
        n = len(medians)
        mean_r, mean_t = sum(medians) / n, sum(medians.values()) / n
        spread = sum((r - mean_r) ** 2 for r in medians)
        slope = max(0.0, sum((r - mean_r) * (t - mean_t) for r, t in medians.items()) / spread)
        nearest_below = max((r for r in medians if r < rows), default=None)
        return max(mean_t + slope * (rows - mean_r), 0.0 if nearest_below is None else medians[nearest_below])

    @property
    def ready(self) -> bool:
        return (bool(self._medians) or self._prior is not None) and self.seen >= SEEN

    def figures(self) -> tuple[float, float]:
        """(per_token, per_position) seconds; one that noise made negative is dropped and the other fit alone."""
        (a, b, d), (u, v) = self._xx, self._xy
        det = a * d - b * b
        if det > 1e-9 * a * d:
            per_token, per_thousand = (u * d - b * v) / det, (a * v - b * u) / det
            if per_token >= 0 and per_thousand >= 0:
                return per_token, per_thousand / POSITIONS
        # One figure alone: the one that explains more of the times (the larger drop in squared error).
        by_tokens, by_positions = (u * u / a if a else 0.0), (v * v / d if d else 0.0)
        if by_positions > by_tokens:
            return 0.0, max(0.0, v / d) / POSITIONS
        return (max(0.0, u / a) if a else 0.0), 0.0

    def chunk_s(self, start: int, length: int) -> float:
        per_token, per_position = self.figures()
        return per_token * length + per_position * attended(start, length)

    def allowance_s(self, rows: int, burst: bool = False) -> float:
        """`burst`: several students wait for their first token, so a step may take up to the capacity bar's."""
        decode_s = self.decode_s(rows) or 0.0
        stall = (STALL - 1.0) * decode_s
        return max(stall, INTER_TOKEN_S * HEADROOM - decode_s) if burst else stall

    def longest(self, start: int, cap: int, allowance_s: float) -> int:
        """At least one token, so a prompt moves on however slow the step."""
        per_token, per_position = self.figures()
        length = 1
        while length < cap and per_token * (length + 1) + per_position * attended(start, length + 1) <= allowance_s:
            length += 1
        return length
