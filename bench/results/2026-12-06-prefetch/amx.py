"""amx.py [MODEL|-]: q4-blocks' step at 1, 4, 8, 16, 32 rows with AMX on and off, in turns, in one process (the
median of three turns' steps). Run with blocks-amx.c.txt copied over backend/typewriter/runners/lite/blocks.c: it
calls that file's typewriter_blocks_set_amx."""
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, "bench")
from blocks_step import open_runner

model = Path(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1] != "-" else None
runner = open_runner(model, 32, "q4-blocks")
lib = runner.blocks.kernel._lib
lib.typewriter_blocks_set_amx.argtypes = [__import__('ctypes').c_int]
for slot in range(32):
    runner.extend(slot, 0, [(7 * slot + i) % 1000 + 10 for i in range(150)])
rows = [1, 4, 8, 16, 32]
times = {(a, n): [] for a in (True, False) for n in rows}
for _ in range(3):
    for amx in (True, False):
        lib.typewriter_blocks_set_amx(int(amx))
        for n in rows:
            slots, tokens, positions = list(range(n)), [5] * n, [150] * n
            runner.step(slots, tokens, positions)
            for _ in range(max(10, 60 // n)):
                a = time.perf_counter()
                runner.step(slots, tokens, positions)
                times[(amx, n)].append((time.perf_counter() - a) * 1000)
lib.typewriter_blocks_set_amx(1)
for amx in (True, False):
    print(json.dumps({"amx": amx, **{str(n): round(statistics.median(times[(amx, n)]), 2) for n in rows}}))
