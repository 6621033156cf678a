"""step.py [MODEL]: q4-blocks' step on one row (300 steps) and on 16 (60 steps) at position 150, from the program
cache, as bench/blocks_step.py opens it; prints the median milliseconds of each. ab.sh runs it on two blocks.c."""
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, "bench")
from blocks_step import open_runner

model = Path(sys.argv[1]) if len(sys.argv) > 1 else None
runner = open_runner(model, 16, "q4-blocks")
for slot in range(16):
    runner.extend(slot, 0, [(7 * slot + i) % 1000 + 10 for i in range(150)])
out = {}
for n, steps in ((1, 300), (16, 60)):
    slots, tokens, positions = list(range(n)), [5] * n, [150] * n
    runner.step(slots, tokens, positions)
    t = []
    for _ in range(steps):
        a = time.perf_counter()
        runner.step(slots, tokens, positions)
        t.append((time.perf_counter() - a) * 1000)
    out[n] = round(statistics.median(t), 2)
print(json.dumps(out))
