"""Hand glibc's freed heap back to the system (nothing here needs TensorFlow)."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable


def return_freed_memory() -> None:
    """Hand what glibc keeps of freed memory back to the system: a compile leaves freed memory on its heap, and
    the int8-lite programs' making far more, the float weights it folded (docs/measurements/2026-12-03-int8-lite.md)."""
    if trim := _malloc_trim():
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
