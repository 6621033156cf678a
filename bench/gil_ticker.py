"""How long the GIL was held off a 1 ms ticker thread while the code in a `with GilTicker() as ticker:` block ran:
`ticker.longest_s`, the longest gap between two ticks (a call that keeps the GIL shows as a gap its length)."""

from __future__ import annotations

import threading
import time


class GilTicker:
    def __init__(self, settle_s: float = 0.02):
        self.settle_s = settle_s  # the ticker runs alone this long before and after the block
        self.gaps: list[float] = []
        self._stop = False
        self._thread = threading.Thread(target=self._tick, daemon=True)

    @property
    def longest_s(self) -> float:
        return max(self.gaps, default=0.0)

    def _tick(self) -> None:
        last = time.perf_counter()
        while not self._stop:
            time.sleep(0.001)
            now = time.perf_counter()
            self.gaps.append(now - last)
            last = now

    def __enter__(self) -> GilTicker:
        self._thread.start()
        time.sleep(self.settle_s)
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(self.settle_s)
        self._stop = True
        self._thread.join()
