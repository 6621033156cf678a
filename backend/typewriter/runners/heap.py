"""Hand glibc's freed heap back to the system (nothing here needs TensorFlow)."""

from __future__ import annotations

import ctypes
import functools


def return_freed_memory() -> None:
    """Hand what glibc keeps of freed memory back to the system: a compile leaves some 60 MB freed on its heap,
    and the int8-lite programs' making about 700 MB (the float weights it folded)."""
    if trim := _malloc_trim():
        trim(0)


@functools.cache
def _malloc_trim():
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
