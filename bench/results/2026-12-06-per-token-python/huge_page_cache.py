"""huge_page_cache.py MODE: the 135M's blocks.bin mapped with its page cache as it is (plain), or first evicted
(posix_fadvise DONTNEED) and mapped with MADV_HUGEPAGE (evict-advise); prints how much of it is PMD-mapped and the
one-row step, median ms of 1,500."""
import sys, re, time, statistics, ctypes, os, glob
import numpy as np
sys.path.insert(0, "/work/main/bench")
libc = ctypes.CDLL("libc.so.6", use_errno=True)
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
mode = sys.argv[1]
if "evict" in mode:
    for f in glob.glob(os.path.expanduser("~/.cache/typewriter/lite/*/blocks.bin")):
        fd = os.open(f, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)
if "advise" in mode:
    from typewriter.runners.lite import blocks_cache
    orig = np.memmap
    class M(np.memmap):
        pass
    def memmap(*a, **k):
        m = orig(*a, **k)
        start = m.ctypes.data & ~((1 << 21) - 1)
        print("madvise", libc.madvise(start, m.ctypes.data + len(m) - start, 14), file=sys.stderr)
        return m
    blocks_cache.np = type("npproxy", (), {"__getattr__": staticmethod(lambda n: getattr(np, n))})()
    blocks_cache.np.memmap = memmap
t = time.perf_counter()
from blocks_step import open_runner
runner = open_runner(None, 1, "q4-blocks")
print("open s", round(time.perf_counter() - t, 2))
runner.extend(0, 0, [(i % 1000) + 10 for i in range(150)])
def pmd():
    cur = None; out = {}
    for line in open("/proc/self/smaps"):
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line): cur = line.split()
        elif cur and cur[-1].endswith("blocks.bin") and re.match(r"^(Rss|FilePmdMapped):", line):
            k, v = line.split()[:2]; out[k] = int(v)
    return out
def bench(n=1500):
    t = []
    for _ in range(n):
        a = time.perf_counter(); runner.step([0], [5], [150]); t.append(time.perf_counter() - a)
    return round(statistics.median(t) * 1000, 3)
print(mode, pmd(), bench(), bench())
