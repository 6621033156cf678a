"""Names for traced TensorFlow functions that do not depend on what the process did before tracing them: XLA's
persistent compile cache keys a program by its name, which TensorFlow takes from a process-wide counter, so the
same program traced after another history missed the cache (docs/measurements/2026-12-01-xla-disk-cache.md).
Inside `stable_names(prefix)`, functions traced on this thread are named from the prefix and their order.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable, Iterator

from tensorflow.python.eager.polymorphic_function import concrete_function

_scope = threading.local()
_tensorflow_name: Callable[[str], str] = concrete_function._inference_name


def _inference_name(name: str) -> str:
    counter = getattr(_scope, "counter", None)
    if counter is None:
        return _tensorflow_name(name)
    return f"__inference_{_scope.prefix}_{next(counter)}_{name}"


concrete_function._inference_name = _inference_name


@contextlib.contextmanager
def stable_names(prefix: str) -> Iterator[None]:
    """`prefix` must be unique in the process (two programs with one name cannot both be registered)."""
    if not prefix.replace("_", "").isalnum():
        raise ValueError(f"a function name prefix takes letters, digits and _: {prefix!r}")
    saved = getattr(_scope, "prefix", None), getattr(_scope, "counter", None)
    _scope.prefix, _scope.counter = prefix, itertools.count()
    try:
        yield
    finally:
        _scope.prefix, _scope.counter = saved
