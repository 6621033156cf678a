"""Progress lines on stderr for every long wait (loading, compiling)."""

from __future__ import annotations

import sys
import time


class StderrProgress:
    def __init__(self, prefix: str = "typewriter"):
        self.prefix = prefix
        self.t0 = time.perf_counter()

    def __call__(self, message: str) -> None:
        print(f"[{self.prefix} {time.perf_counter() - self.t0:6.1f}s] {message}", file=sys.stderr, flush=True)
