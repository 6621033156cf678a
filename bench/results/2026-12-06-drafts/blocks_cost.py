"""blocks_cost.py [MODEL] [WEIGHTS]: the runner's step for one slot at position 150, one row (a decode step) against
a chunk of 2..6 rows with every row's logits (a guess checked), alternating 40 rounds: median milliseconds and the
ratio to one row. MODEL "-" or none: the embedded model; WEIGHTS q4-blocks (default) or int8-lite. Run from the
repository root with PYTHONPATH=backend."""
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, "bench")
from blocks_step import open_runner

model = Path(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1] != "-" else None
weights = sys.argv[2] if len(sys.argv) > 2 else "q4-blocks"
runner = open_runner(model, 1, weights)
runner.extend(0, 0, [(i % 1000) + 10 for i in range(150)])
took: dict[int, list[float]] = {}
for _ in range(40):
    for rows in (1, 2, 3, 4, 5, 6):
        began = time.perf_counter()
        if rows == 1:
            runner.step([0], [5], [150])
        else:
            runner.extend(0, 150, [5 + j for j in range(rows)], all_logits=True)
        took.setdefault(rows, []).append(time.perf_counter() - began)
one = statistics.median(took[1])
print(weights, " ".join(f"{rows}: {statistics.median(t) * 1e3:.2f} ms ({statistics.median(t) / one:.2f}x)"
                        for rows, t in took.items()))
