"""huge_page_cache.py MODE: the 135M's blocks.bin mapped with its page cache as it is (`plain`), or its page cache
first evicted (posix_fadvise DONTNEED, `evict`) and the file mapped with MADV_HUGEPAGE (`advise`), so that the pages
are read again into 2 MB folios; prints how much of the mapping is PMD-mapped and the one-row step, median ms of
1,500, twice. Run from the repository root with PYTHONPATH=backend."""
import ctypes
import glob
import os
import re
import statistics
import sys
import time

import numpy as np

from typewriter.runners.lite import blocks_cache

sys.path.insert(0, "bench")
from blocks_step import open_runner

MADV_HUGEPAGE = 14
libc = ctypes.CDLL("libc.so.6", use_errno=True)
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
mode = sys.argv[1]
if "evict" in mode:
    for path in glob.glob(os.path.expanduser("~/.cache/typewriter/lite/*/blocks.bin")):
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
if "advise" in mode:
    plain_memmap = np.memmap

    class AdvisedMap(np.memmap):
        def __new__(cls, *args, **kwargs):
            mapped = plain_memmap(*args, **kwargs)
            start = mapped.ctypes.data & ~((1 << 21) - 1)
            print("madvise", libc.madvise(start, mapped.ctypes.data + len(mapped) - start, MADV_HUGEPAGE),
                  file=sys.stderr)
            return mapped

    class AdvisedNumpy:
        memmap = AdvisedMap

        def __getattr__(self, name):
            return getattr(np, name)

    blocks_cache.np = AdvisedNumpy()
runner = open_runner(None, 1, "q4-blocks")
runner.extend(0, 0, [(i % 1000) + 10 for i in range(150)])


def mapped() -> dict[str, int]:
    found, region = {}, None
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                region = line.split()
            elif region and region[-1].endswith("blocks.bin") and re.match(r"^(Rss|FilePmdMapped):", line):
                key, kib = line.split()[:2]
                found[key.rstrip(":")] = int(kib)
    return found


def step_ms(steps: int = 1500) -> float:
    took = []
    for _ in range(steps):
        began = time.perf_counter()
        runner.step([0], [5], [150])
        took.append(time.perf_counter() - began)
    return round(statistics.median(took) * 1000, 3)


print(mode, mapped(), step_ms(), step_ms())
