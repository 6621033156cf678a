"""checks.py [FILE]: one thread's speed of each candidate check over a file's pages (already in the page cache), in
pieces of 64 MiB as blocks_cache.py reads them; FILE: the largest q4-blocks entry in the cache by default."""
import glob
import hashlib
import os
import sys
import time
import zlib

import numpy as np

path = sys.argv[1] if len(sys.argv) > 1 else max(glob.glob(os.path.expanduser("~/.cache/typewriter/lite/*/blocks.bin")),
                                                key=os.path.getsize)
mapped = np.memmap(path, np.uint8, mode="r")
pieces = [mapped[at:at + (1 << 26)] for at in range(0, len(mapped), 1 << 26)]
for piece in pieces:  # in the page cache and mapped before any is timed
    zlib.crc32(piece.data)
print(f"{len(mapped) >> 20} MiB")
for name, check in [("sha256", lambda b: hashlib.sha256(b).digest()), ("sha1", lambda b: hashlib.sha1(b).digest()),
                    ("blake2b", lambda b: hashlib.blake2b(b).digest()), ("md5", lambda b: hashlib.md5(b).digest()),
                    ("crc32", zlib.crc32)]:
    took = []
    for _ in range(3):
        began = time.perf_counter()
        for piece in pieces:
            check(piece.data)
        took.append(time.perf_counter() - began)
    print(f"{name}: {len(mapped) / min(took) / 1e9:.2f} GB/s (best of 3), {min(took):.3f}-{max(took):.3f} s")
