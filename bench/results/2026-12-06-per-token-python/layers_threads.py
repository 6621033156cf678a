"""layers_threads.py: the 135M's q4-blocks layers and logits (the kernel's two calls) on one row at position 150, on
1 thread and on 2, median ms of 800, three times. Used with blocks.c's PREFETCH at 2, 4, 8 and 16 KB."""
import sys, time, statistics
sys.path.insert(0, "/work/main/bench")
from blocks_step import open_runner
runner = open_runner(None, 1, "q4-blocks")
runner.extend(0, 0, [(i % 1000) + 10 for i in range(150)])
bm = runner.blocks
import numpy as np
def bench(threads, n=800):
    runner.cache.threads = threads
    t = []; tl = []; tg = []
    x0 = bm.embed([5])
    for _ in range(n):
        x = x0.copy()
        rows = runner.cache.rows(np.array([0]), np.array([150]))
        a = time.perf_counter(); bm.forward(x, rows.slots_at, rows.positions_at, 1, threads); b = time.perf_counter()
        bm.logits(x, threads); c = time.perf_counter()
        tl.append(b - a); tg.append(c - b)
    return round(statistics.median(tl) * 1000, 3), round(statistics.median(tg) * 1000, 3)
for r in range(3):
    print("threads 1 layers/logits ms", bench(1), "threads 2", bench(2))
