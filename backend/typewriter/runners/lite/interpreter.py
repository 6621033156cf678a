"""A LiteRT (TensorFlow Lite) interpreter of one flatbuffer file, without the notice LiteRT prints for each, and
the file's pages handed back once XNNPACK has packed its weights."""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ..stderr_filter import StderrFilter

if TYPE_CHECKING:
    from ai_edge_litert.interpreter import Interpreter

log = logging.getLogger("typewriter.lite")
MADV_DONTNEED = 4  # Linux: drop the pages from this process; a file's are read again from it if touched

# LiteRT (TensorFlow Lite) prints a line to stderr (C++) for every interpreter it hands to XNNPACK.
_LITE_NOTICES = ("Created TensorFlow Lite XNNPACK delegate for CPU",)
_lite_filter = StderrFilter(_LITE_NOTICES)


def lite_interpreter(program: bytes | Path, threads: int) -> Interpreter:
    """LiteRT, not tf.lite, imports in a fraction of TensorFlow's time
    (docs/measurements/2026-12-03-int8-lite-one-pass-litert-program-cache.md)."""
    from ai_edge_litert.interpreter import Interpreter

    source = {"model_path": str(program)} if isinstance(program, Path) else {"model_content": program}
    _lite_filter.enter()
    try:
        interpreter = Interpreter(**source, num_threads=threads)
        interpreter.allocate_tensors()
    finally:
        _lite_filter.exit()
    return interpreter


def release_mapped(path: Path) -> int:
    """Bytes released of the mappings of the file `path`, or of the files in the folder `path`. XNNPACK packs most
    weights into its own copy, so the file's would stay resident for nothing; a page read again later comes back
    from the file."""
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
