"""int8_rows_change.py: int8-lite's one-row step on the embedded model straight after another one-row step, against
straight after a 3-row chunk (its programs allocate their tensors again at each change of rows): median ms of 40,
three rounds. Run from the repository root with PYTHONPATH=backend."""
import statistics
import sys
import time

sys.path.insert(0, "bench")
from blocks_step import open_runner

runner = open_runner(None, 1, "int8-lite")
runner.extend(0, 0, [(i % 1000) + 10 for i in range(150)])
for _ in range(3):
    same, changed = [], []
    for _ in range(40):
        began = time.perf_counter()
        runner.step([0], [5], [150])
        same.append(time.perf_counter() - began)
    for _ in range(40):
        runner.extend(0, 150, [5, 6, 7], all_logits=True)
        began = time.perf_counter()
        runner.step([0], [5], [150])
        changed.append(time.perf_counter() - began)
    print(f"one row after one row {statistics.median(same) * 1e3:.2f} ms; "
          f"after a 3-row chunk {statistics.median(changed) * 1e3:.2f} ms")
