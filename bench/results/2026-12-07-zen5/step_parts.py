"""step_parts.py MODEL LIBRARY: q4-blocks' one-row step by a kernel library built with TSC counters
(step-parts.diff.txt applied to blocks.c), the caller's thread: the layers' cycles and their parts (quantizing the
rows, the caller's own groups, waiting for the helper's, attention), then the logits'; medians over STEPS (default
300) steps at position 150, as fractions of the layers' cycles. Run from the repository root with PYTHONPATH=backend."""
import ctypes
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, "bench")
from blocks_step import open_runner

from typewriter.runners.lite.blocks import BlocksKernel
from typewriter.runners.lite.kernel import Kernel

model, library = Path(sys.argv[1]), Path(sys.argv[2])
steps = int(os.environ.get("STEPS", "300"))
k = BlocksKernel(Kernel(library))
read = k._lib.typewriter_blocks_stats
read.argtypes = [ctypes.c_void_p]
runner = open_runner(model, 1, "q4-blocks")
runner.extend(0, 0, [i % 1000 + 10 for i in range(150)])
blocks, cache = runner.blocks, runner.cache
r = cache.rows(np.arange(1), np.full(1, 150))
x0 = blocks.embed([5])
stats = np.zeros(8, np.uint64)
names = ["layers", "quantize", "own groups", "waiting", "attention", "logits"]
rows = []
for step in range(steps + 20):
    x = x0.copy()
    read(stats.ctypes.data)
    t0 = time.perf_counter()
    k.layers(blocks._model, x, r.slots_at, r.positions_at, 1, cache.threads)
    read(stats.ctypes.data)
    layers = stats.copy()
    k.logits(blocks._model, x, blocks.cfg.vocab_size, cache.threads)
    read(stats.ctypes.data)
    if step >= 20:
        rows.append([*layers[:5], stats[5], time.perf_counter() - t0])
a = np.array(rows, np.float64)
med = np.median(a, axis=0)
print(f"step {med[6] * 1e3:.3f} ms; layers {med[0] / 1e6:.3f} Mcycles, logits {med[5] / 1e6:.3f}")
for i, name in enumerate(names[1:5], 1):
    print(f"  {name:11s} {med[i] / 1e6:.3f} Mcycles, {med[i] / med[0]:.1%} of the layers")
