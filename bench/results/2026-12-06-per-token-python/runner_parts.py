"""runner_parts.py: the 135M's q4-blocks runner step on one row at position 150, its parts timed where they run (the
cache's rows for the kernel, the embedding, the kernel's layers and logits: median microseconds of 1,500 steps),
then the kernel's Rows and the cache's np.maximum.at alone, each straight after a step. Run from the repository root
with PYTHONPATH=backend. (explorations.txt's "segments" came from a scratch copy of runner.py timing its lines.)"""
import collections
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, "bench")
from blocks_step import open_runner
from timing import timed  # this folder's: a script's own folder is on its path

from typewriter.runners.lite.kernel import Rows

runner = open_runner(None, 1, "q4-blocks")
runner.extend(0, 0, [(i % 1000) + 10 for i in range(150)])
took: dict[str, list[int]] = collections.defaultdict(list)


for owner, name in [(runner, "step"), (runner.cache, "rows"), (runner.blocks, "embed"), (runner.blocks, "forward"),
                    (runner.blocks, "logits")]:
    setattr(owner, name, timed(getattr(owner, name), name, took))
for _ in range(30):
    runner.step([0], [5], [150])
took.clear()
for _ in range(1500):
    runner.step([0], [5], [150])
print({k: round(statistics.median(v) / 1000, 1) for k, v in took.items()})
cache, alone, at = runner.cache, [], []
for _ in range(1500):
    runner.step([0], [5], [150])
    began = time.perf_counter_ns()
    rows = Rows(np.array([0]), np.array([150]), cache._heads, cache.k[0], cache.v[0])
    alone.append(time.perf_counter_ns() - began)
    runner.step([0], [5], [150])
    began = time.perf_counter_ns()
    np.maximum.at(cache.filled, rows.slots, rows.positions + 1)
    at.append(time.perf_counter_ns() - began)
print(f"Rows {statistics.median(alone) / 1000:.1f} us, maximum.at {statistics.median(at) / 1000:.1f} us")
