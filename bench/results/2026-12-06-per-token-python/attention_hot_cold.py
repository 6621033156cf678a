"""attention_hot_cold.py [POSITION]: with attention-twice.diff.txt and blocks-stats.diff.txt applied to a scratch copy
(never committed), each layer's attention is computed twice, the first with its K/V as the step left them (cold),
the second straight after (hot): microseconds a layer, on 2 threads and 1, one row of the 135M."""
import sys, time, ctypes
sys.path.insert(0, "/work/main/bench")
from blocks_step import open_runner
P = int(sys.argv[1]) if len(sys.argv) > 1 else 150
runner = open_runner(None, 1, "q4-blocks")
runner.extend(0, 0, [(i % 1000) + 10 for i in range(P)])
lib = runner.blocks.kernel._lib
out = (ctypes.c_uint64 * 8)()
for threads in (2, 1):
    runner.cache.threads = threads
    for _ in range(30): runner.step([0], [5], [P])
    lib.typewriter_blocks_stats(out)
    n = 300
    for _ in range(n): runner.step([0], [5], [P])
    lib.typewriter_blocks_stats(out)
    v = list(out)
    print(f"position {P} threads {threads}: attend cold {v[6]/n/30/2.596e3:.2f} us a layer, hot {v[7]/n/30/2.596e3:.2f}")
