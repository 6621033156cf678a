"""Memory the process hands back to the system: glibc's freed heap, and the pages of files it mapped and read
(nothing here needs TensorFlow)."""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable
from pathlib import Path

MADV_DONTNEED = 4  # Linux: drop the pages from this process; a file's are read again from it if touched


def return_freed_memory() -> None:
    """A compile, and far more the int8-lite programs' making, leaves freed memory on glibc's heap
    (docs/measurements/2026-12-03-int8-lite.md); so do evicted constraints."""
    if trim := _malloc_trim():
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


def release_mapped(path: Path) -> int:
    """Bytes released of the (read-only) mappings of the file `path`, or of the files in the folder `path`: what a
    load read once (XNNPACK packs a program's weights into its own copy; the model file is read to make the
    programs, the blocks or the tensors) would stay resident for nothing. A page read again later comes back from
    the file."""
    madvise = _madvise()
    if madvise is None:
        return 0
    prefix, released = str(Path(path).resolve()), 0
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            name = fields[5].rstrip("\n") if len(fields) == 6 else ""
            if name == prefix or name.startswith(prefix + os.sep):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                if madvise(start, end - start, MADV_DONTNEED) == 0:
                    released += end - start
    return released


@functools.cache
def _madvise() -> Callable[[int, int, int], int] | None:
    try:
        madvise = ctypes.CDLL("libc.so.6", use_errno=True).madvise
    except (OSError, AttributeError):  # not glibc: the pages stay, nothing breaks
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise
