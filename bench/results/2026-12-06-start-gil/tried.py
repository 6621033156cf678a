"""tried.py GGUF: two ways tried, best of three (ms): the merges split all at once against one split a merge (not
taken), and a GGUF string array decoded one string at a time (the reader before dc09353) against the reader's
`_Cursor.strings` (one decode of the joined bytes since dc09353)."""
import mmap
import struct
import sys
import time

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


def one_at_a_time(buf, at, n):
    out = []
    for _ in range(n):
        (size,) = LENGTH(buf, at)
        out.append(str(buf[at + 8:at + 8 + size], "utf-8", "replace"))
        at += 8 + size
    return out


path = sys.argv[1]
merges = GGUFReader(path).fields["tokenizer.ggml.merges"]
split, split_ms = best(lambda: [tuple(m.split(" ", 1)) for m in merges])
pairs, pairs_ms = best(lambda: joined_split(merges))
print(f"merges ({len(merges)}): one split a merge {split_ms:.0f} ms, all at once {pairs_ms:.0f} ms, same: {pairs == split}")
with open(path, "rb") as f:
    buf = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
for key, at, n in string_arrays(buf):
    loop, loop_ms = best(lambda: one_at_a_time(buf, at, n))
    joined, joined_ms = best(lambda: _Cursor(buf, at).strings(n))
    print(f"{key} ({n}): one at a time {loop_ms:.0f} ms, the reader's one decode {joined_ms:.0f} ms, "
          f"same: {joined == loop}")
