"""runner_parts.py: the 135M's q4-blocks runner step on one row, its parts timed (the cache's rows, the embedding,
the kernel's layers and logits), and the kernel's Rows and the cache's np.maximum.at alone right after a step."""
import sys, time, statistics, collections
sys.path.insert(0, "/work/main/bench")
from blocks_step import open_runner
import typewriter.runners.lite.runner as R
runner = open_runner(None, 1, "q4-blocks")
runner.extend(0, 0, [(i % 1000) + 10 for i in range(150)])
acc = collections.defaultdict(list)
def wrap(obj, name, label):
    f = getattr(obj, name)
    def w(*a, **k):
        t = time.perf_counter_ns(); r = f(*a, **k); acc[label].append(time.perf_counter_ns() - t); return r
    setattr(obj, name, w)
wrap(runner.cache, "rows", "cache.rows"); wrap(runner.blocks, "embed", "embed"); wrap(runner.blocks, "forward", "forward"); wrap(runner.blocks, "logits", "logits")
wrap(runner, "_logits", "_logits")
for _ in range(30): runner.step([0], [5], [150])
import numpy as np
from typewriter.runners.lite.kernel import Rows
c = runner.cache
t1, t2 = [], []
for _ in range(1500):
    runner.step([0], [5], [150])
    a = time.perf_counter_ns(); rows = Rows(np.array([0]), np.array([150]), c._heads, c.k[0], c.v[0]); b = time.perf_counter_ns()
    runner.step([0], [5], [150])
    d = time.perf_counter_ns(); np.maximum.at(c.filled, rows.slots, rows.positions + 1); e = time.perf_counter_ns()
    t1.append(b - a); t2.append(e - d)
print("Rows", statistics.median(t1) / 1000, "maximum.at", statistics.median(t2) / 1000)
