"""formats.py MODEL [LAYERS]: the kernel alone, per format: each GGUF matrix type of the model's first LAYERS layers
(default 8) and its logits' matrix, packed as q4-blocks packs it, multiplied by one row on 1 and on 2 threads, 15
passes alternating: milliseconds and GB/s read of each. Run from the repository root with PYTHONPATH=backend."""
import sys
import time
from collections import defaultdict

import gguf
import numpy as np

from typewriter.runners.lite.blocks import BlocksKernel, blocks_of
from typewriter.runners.lite.kernel import load as load_kernel

reader = gguf.GGUFReader(sys.argv[1])
layers = int(sys.argv[2]) if len(sys.argv) > 2 else 8
kernel = BlocksKernel(load_kernel(None))
groups = defaultdict(list)  # "type, where" -> packed matrices
names = {t.name for t in reader.tensors}
logits = "output.weight" if "output.weight" in names else "token_embd.weight"
for t in reader.tensors:
    if len(t.shape) != 2:
        continue
    layer = t.name.startswith("blk.") and int(t.name.split(".")[1]) < layers
    if not layer and t.name != logits:
        continue
    out, n = int(t.shape[1]), int(t.shape[0])
    packed = kernel.pack(blocks_of(t.data, t.tensor_type, out, n))
    groups[f"{t.tensor_type.name} {'layers' if layer else 'logits'}"].append(packed)
rng = np.random.default_rng(0)
rows = {id(m): rng.standard_normal((1, m.inputs)).astype(np.float32) for ms in groups.values() for m in ms}


def timed(ms, threads):
    began = time.perf_counter()
    for m in ms:
        kernel.matmul(m, rows[id(m)], threads)
    return time.perf_counter() - began


for kind, ms in groups.items():
    took = {1: [], 2: []}
    for _ in range(15):
        for threads in (1, 2):
            took[threads].append(timed(ms, threads))
    size = sum(m.packed.nbytes for m in ms)
    for threads in (1, 2):
        t = float(np.median(took[threads]))
        print(f"{kind:16s} {len(ms):3d} matrices {size / 1e6:7.1f} MB, {threads} thread(s): {t * 1e3:7.2f} ms median,"
              f" least {min(took[threads]) * 1e3:7.2f}, {size / t / 1e9:5.1f} GB/s", flush=True)
