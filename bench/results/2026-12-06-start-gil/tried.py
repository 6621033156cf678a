"""tried.py GGUF: two ways not taken, against what the code does, best of three (ms): the merges split all at once
against one split a merge, and a GGUF string array read as one decode of its joined bytes against the reader's
loop (weights/gguf_reader.py)."""
import mmap
import struct
import sys
import time

import numpy as np

from typewriter.weights.gguf_reader import GGUFReader, _Cursor

LENGTH = struct.Struct("<Q").unpack_from


def best(fn):
    took = []
    for _ in range(3):
        began = time.perf_counter()
        out = fn()
        took.append(time.perf_counter() - began)
    return out, 1000 * min(took)


def joined_split(merges):
    parts = " ".join(merges).split(" ")
    pairs = list(zip(parts[::2], parts[1::2]))
    return pairs if len(parts) == 2 * len(merges) and list(map(" ".join, pairs)) == merges else None


def string_arrays(buf):
    """(key, offset of the first string, count) of each string array in the header."""
    cursor = _Cursor(buf, 4)
    cursor.scalar("I")
    _, n_fields = cursor.scalar("Q"), cursor.scalar("Q")
    for _ in range(n_fields):
        key, kind = cursor.string(), cursor.scalar("I")
        if kind == 9 and struct.unpack_from("<I", buf, cursor.at)[0] == 8:
            yield key, cursor.at + 12, struct.unpack_from("<Q", buf, cursor.at + 4)[0]
        cursor.value(kind)


def joined_decode(buf, at, n):
    starts = [0] * n
    first = at
    for k in range(n):
        starts[k] = at
        at += 8 + LENGTH(buf, at)[0]
    s = np.array(starts, np.int64) - first
    data = np.frombuffer(buf[first:at], np.uint8).copy()
    keep = np.ones(data.size, bool)
    keep[(s[:, None] + np.arange(1, 8)).ravel()] = False
    data[s] = 0
    parts = data[keep].tobytes().decode("utf-8", "replace").split("\x00")[1:]
    return parts if len(parts) == n else None


path = sys.argv[1]
merges = GGUFReader(path).fields["tokenizer.ggml.merges"]
split, split_ms = best(lambda: [tuple(m.split(" ", 1)) for m in merges])
pairs, pairs_ms = best(lambda: joined_split(merges))
print(f"merges ({len(merges)}): one split a merge {split_ms:.0f} ms, all at once {pairs_ms:.0f} ms, same: {pairs == split}")
with open(path, "rb") as f:
    buf = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
for key, at, n in string_arrays(buf):
    loop, loop_ms = best(lambda: _Cursor(buf, at).strings(n))
    joined, joined_ms = best(lambda: joined_decode(buf, at, n))
    print(f"{key} ({n}): the reader's loop {loop_ms:.0f} ms, one decode {joined_ms:.0f} ms, same: {joined == loop}")
