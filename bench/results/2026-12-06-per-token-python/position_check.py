"""position_check.py: right after a one-row q4-blocks step of the 135M (the caches as the kernel leaves them), the
runner's position check as an array's max and as Python's max: median microseconds of 1,500 each, alternating."""
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, "bench")
from blocks_step import open_runner

runner = open_runner(None, 1, "q4-blocks")
runner.extend(0, 0, [(i % 1000) + 10 for i in range(150)])
positions, by_array, by_python = [150], [], []
for _ in range(1500):
    runner.step([0], [5], positions)
    began = time.perf_counter_ns()
    _ = np.asarray(positions, np.int64).max() >= runner.max_len
    by_array.append(time.perf_counter_ns() - began)
    runner.step([0], [5], positions)
    began = time.perf_counter_ns()
    _ = max(positions) >= runner.max_len
    by_python.append(time.perf_counter_ns() - began)
print(f"array max {statistics.median(by_array) / 1000:.1f} us, Python max {statistics.median(by_python) / 1000:.1f} us")
