"""variants.py MODEL NAME=SED [NAME=SED ...]: q4-blocks' one-row step (the layers, then the logits, as the runner
calls them) by several builds of the kernel library in one process, on the same packed model and cache, a step of
each in turn: median and quartiles of each build's step, in milliseconds. Each NAME is built from this tree's
sources with `sed -e SED` applied to blocks.c (`base=` for none), or NAME=@COMMIT from that commit's sources. ROWS (default 1) rows at position 150; STEPS
(default 400) steps each. Run from the repository root with PYTHONPATH=backend."""
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, "bench")
from blocks_step import open_runner

from typewriter.runners.lite import kernel as kernel_module
from typewriter.runners.lite.blocks import BlocksKernel
from typewriter.runners.lite.kernel import Kernel

model, variants = Path(sys.argv[1]), [a.split("=", 1) for a in sys.argv[2:]]
rows, steps = int(os.environ.get("ROWS", "1")), int(os.environ.get("STEPS", "400"))
folder = Path(tempfile.mkdtemp(prefix="variants-"))
kernels = {}
for name, script in variants:
    src = folder / name
    src.mkdir()
    for f in kernel_module.SOURCES:
        if script.startswith("@"):
            at = f"{script[1:]}:backend/typewriter/runners/lite/{f}"
            (src / f).write_bytes(subprocess.run(["git", "show", at], capture_output=True, check=True).stdout)
        else:
            (src / f).write_bytes((kernel_module.SOURCE_DIR / f).read_bytes())
    if script and not script.startswith("@"):
        subprocess.run(["sed", "-i", "-e", script, str(src / "blocks.c")], check=True)
    lib = src / "kernels.so"
    subprocess.run(["cc", *kernel_module.FLAGS, "-o", str(lib), *[str(src / f) for f in kernel_module.SOURCES],
                    "-lm"], check=True)
    kernels[name] = BlocksKernel(Kernel(lib))
runner = open_runner(model, rows, "q4-blocks")
for slot in range(rows):
    runner.extend(slot, 0, [(7 * slot + i) % 1000 + 10 for i in range(150)])
blocks, cache = runner.blocks, runner.cache
r = cache.rows(np.arange(rows), np.full(rows, 150))
x0 = blocks.embed([5] * rows)
took = {name: [] for name in kernels}
for step in range(steps + 20):
    for name, k in kernels.items():
        x = x0.copy()
        began = time.perf_counter()
        k.layers(blocks._model, x, r.slots_at, r.positions_at, rows, cache.threads)
        k.logits(blocks._model, x, blocks.cfg.vocab_size, cache.threads)
        if step >= 20:
            took[name].append(time.perf_counter() - began)
for name, t in took.items():
    q = statistics.quantiles(t, n=4)
    print(f"{name:12s} median {statistics.median(t) * 1e3:6.3f} ms, quartiles {q[0] * 1e3:6.3f}-{q[2] * 1e3:6.3f}",
          flush=True)
