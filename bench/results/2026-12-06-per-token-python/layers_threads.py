"""layers_threads.py: the 135M's q4-blocks layers and logits (the kernel's two calls) on one row at position 150, on
1 thread and on 2, median ms of 800, three times. Used with blocks.c's PREFETCH at 2, 4, 8 and 16 KB. Run from the
repository root with PYTHONPATH=backend."""
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, "bench")
from blocks_step import open_runner

runner = open_runner(None, 1, "q4-blocks")
runner.extend(0, 0, [(i % 1000) + 10 for i in range(150)])
model = runner.blocks


def medians(threads: int, steps: int = 800) -> tuple[float, float]:
    runner.cache.threads = threads
    layers, logits, start = [], [], model.embed([5])
    for _ in range(steps):
        x = start.copy()
        rows = runner.cache.rows(np.array([0]), np.array([150]))
        began = time.perf_counter()
        model.forward(x, rows.slots_at, rows.positions_at, 1, threads)
        between = time.perf_counter()
        model.logits(x, threads)
        layers.append(between - began)
        logits.append(time.perf_counter() - between)
    return round(statistics.median(layers) * 1000, 3), round(statistics.median(logits) * 1000, 3)


for _ in range(3):
    print("threads 1 layers/logits ms", medians(1), "threads 2", medians(2))
