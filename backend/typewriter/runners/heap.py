"""Hand glibc's freed heap back to the system (nothing here needs TensorFlow)."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable


def return_freed_memory() -> None:
    """A compile, and far more the int8-lite programs' making, leaves freed memory on glibc's heap
    (docs/measurements/2026-12-03-int8-lite.md)."""
    if trim := _malloc_trim():
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
