"""kernel_alone.py: the 1.5B's first 8 layers' Q4_K and Q6_K matrices packed both ways in one process, with the
float16 sub-block scales of before (Q4M, Q6) and with the file's own (Q4K, Q6K); each matmul on one row, 15 passes
alternating: milliseconds and GB/s of each. Run from the repository root with PYTHONPATH=backend, at 021e5c7 (the
next commit took Q6, the float16 layout, out of blocks.c)."""
import os
import time

import gguf
import numpy as np

from typewriter.runners.lite.blocks import FORMATS, Blocks, BlocksKernel, _k_scales, blocks_of
from typewriter.runners.lite.kernel import load as load_kernel
from typewriter.weights.ggml_types import GGMLQuantizationType as Q

reader = gguf.GGUFReader(os.path.expanduser("~/.cache/typewriter/models/qwen2.5-coder-1.5b-instruct.gguf"))
kernel = BlocksKernel(load_kernel(None))
matrices = {}  # name -> (type, packed before, packed now)
for t in reader.tensors:
    if len(t.shape) != 2 or not t.name.startswith("blk.") or int(t.name.split(".")[1]) >= 8:
        continue
    out, n = int(t.shape[1]), int(t.shape[0])
    now = blocks_of(t.data, t.tensor_type, out, n)
    if t.tensor_type == Q.Q4_K:
        scales, mins = _k_scales(t.data.view(np.uint8).reshape(-1, 144), out)
        before = Blocks(now.q, scales, mins, FORMATS["q4m"])
    elif t.tensor_type == Q.Q6_K:
        scales = now.supers[..., 0].astype(np.float32).repeat(16, axis=1) * now.scales.astype(np.float32)
        before = Blocks(now.q, scales.astype(np.float16), None, FORMATS["q6"])
    else:
        continue
    matrices[t.name] = (t.tensor_type.name, kernel.pack(before), kernel.pack(now))
print("MB before", sum(m[1].packed.nbytes for m in matrices.values()) / 1e6,
      "now", sum(m[2].packed.nbytes for m in matrices.values()) / 1e6)
rng = np.random.default_rng(0)
rows = {name: rng.standard_normal((1, m[1].inputs)).astype(np.float32) for name, m in matrices.items()}
for name, (kind, a, b) in list(matrices.items())[:6]:  # the two differ by float16's rounding of d x sc
    ya, yb = kernel.matmul(a, rows[name], 2), kernel.matmul(b, rows[name], 2)
    print(name, kind, float(np.abs(ya - yb).max() / np.abs(ya).max()))


def timed(which: int, kinds: tuple[str, ...]) -> float:
    began = time.perf_counter()
    for name, m in matrices.items():
        if m[0] in kinds:
            kernel.matmul(m[which], rows[name], 2)
    return time.perf_counter() - began


for kinds in (("Q4_K",), ("Q6_K",)):
    took: dict[int, list[float]] = {1: [], 2: []}
    for _ in range(15):
        for which in (1, 2):
            took[which].append(timed(which, kinds))
    for which in (1, 2):
        size = sum(m[which].packed.nbytes for m in matrices.values() if m[0] in kinds)
        t = float(np.median(took[which]))
        print(kinds, "before" if which == 1 else "now", f"{t * 1e3:.2f} ms median, least {min(took[which]) * 1e3:.2f},"
              f" {size / t / 1e9:.1f} GB/s")
