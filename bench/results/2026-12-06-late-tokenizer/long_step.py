"""long_step.py: the 135M's q4-blocks step on one row and on 8 at position 1800 (100 steps each, after each slot's
1,800-token prompt), median ms; ab.sh's SCRIPT, for attention shared with blocks.c's helper at long contexts."""
import json
import statistics
import sys
import time

sys.path.insert(0, "bench")
from blocks_step import open_runner

runner = open_runner(None, 8, "q4-blocks")
P = 1800
for slot in range(8):
    runner.extend(slot, 0, [(7 * slot + i) % 1000 + 10 for i in range(P)])
out = {}
for n in (1, 8):
    slots, tokens, positions = list(range(n)), [5] * n, [P] * n
    runner.step(slots, tokens, positions)
    t = []
    for _ in range(100):
        a = time.perf_counter()
        runner.step(slots, tokens, positions)
        t.append((time.perf_counter() - a) * 1000)
    out[n] = round(statistics.median(t), 2)
print(json.dumps(out))
