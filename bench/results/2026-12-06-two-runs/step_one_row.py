"""step_one_row.py [STEPS]: the 135M's q4-blocks step on one row at position 150, STEPS times (default 2000), as
bench/blocks_step.py opens it; prints the median ms. Used for the read-ahead trials and under perf record."""
import statistics
import sys
import time

sys.path.insert(0, "bench")
from blocks_step import open_runner

runner = open_runner(None, 16, "q4-blocks")
runner.extend(0, 0, [(i % 1000) + 10 for i in range(150)])
took = []
for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 2000):
    began = time.perf_counter()
    runner.step([0], [5], [150])
    took.append((time.perf_counter() - began) * 1000)
print("median ms", statistics.median(took))
