"""attention_hot_cold.py [POSITION]: with attention-twice.diff.txt and blocks-stats.diff.txt applied to a scratch copy
(never committed), each layer's attention is computed twice, the first with its K/V as the step left them (cold),
the second straight after (hot): microseconds a layer (TSC cycles at 2.596 GHz), on 2 threads and 1, one row of the
135M. Run from the repository root with PYTHONPATH=backend."""
import ctypes
import sys

sys.path.insert(0, "bench")
from blocks_step import open_runner

TSC_MHZ = 2596.0
position = int(sys.argv[1]) if len(sys.argv) > 1 else 150
runner = open_runner(None, 1, "q4-blocks")
runner.extend(0, 0, [(i % 1000) + 10 for i in range(position)])
stats = runner.blocks.kernel._lib.typewriter_blocks_stats
counters = (ctypes.c_uint64 * 8)()
layers = runner.cfg.n_layers
for threads in (2, 1):
    runner.cache.threads = threads
    for _ in range(30):
        runner.step([0], [5], [position])
    stats(counters)  # read and reset
    steps = 300
    for _ in range(steps):
        runner.step([0], [5], [position])
    stats(counters)
    cold, hot = (counters[i] / steps / layers / TSC_MHZ for i in (6, 7))
    print(f"position {position} threads {threads}: attend cold {cold:.2f} us a layer, hot {hot:.2f}")
