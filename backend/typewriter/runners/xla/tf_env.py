"""TensorFlow's process environment, and TensorFlow without its harmless C++ notices on the terminal: stderr is
filtered at the file descriptor while it imports and compiles. Nothing here imports TensorFlow until
`import_tensorflow` is called.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Iterator, MutableMapping
from types import ModuleType

from ..stderr_filter import StderrFilter

_NOTICES = (
    "All log messages before absl::InitializeLog() is called are written to STDERR",
    "oneDNN custom operations are on",
    "This TensorFlow binary is optimized to use available CPU instructions",
    "To enable the following instructions:",
)


# Each read of the XLA disk cache logs a failed text parse before the binary one loads, and on some CPUs an LLVM
# tuning flag the host's feature list never has; a missing instruction set is still reported
# (docs/measurements/2026-12-01-xla-disk-cache.md).
_CACHE_READ_NOTICES = (
    "Error parsing text-format tensorflow.XlaSerializedCacheEntry",
    "All log messages before absl::InitializeLog() is called are written to STDERR",
    "Loading XLA:CPU AOT result. Target machine feature +prefer-",
    "Loading XLA:CPU AOT result. Target machine feature +fast-",
)


def prepare_environment(xla_cache: str | None, environ: MutableMapping[str, str] = os.environ) -> None:
    """Before TensorFlow is imported. `xla_cache`: a folder that keeps compiled programs for a later start."""
    environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # not "PyTorch was not found": we never use it
    flags = environ.get("TF_XLA_FLAGS", "")
    if xla_cache and "tf_xla_persistent_cache_directory" not in flags:
        try:
            os.makedirs(xla_cache, exist_ok=True)
            if not os.access(xla_cache, os.W_OK):
                raise PermissionError("not writable")
        except OSError as e:  # a read-only home, say: compile every start, and say so once
            print(f"typewriter: the XLA cache folder {xla_cache} cannot be used ({e}); compiling without it "
                  "(TYPEWRITER_XLA_CACHE names another, off turns this notice off)", file=sys.stderr)
            return
        environ["TF_XLA_FLAGS"] = f"{flags} --tf_xla_persistent_cache_directory={xla_cache}".strip()


def import_tensorflow() -> ModuleType:
    """TensorFlow, without the notices its import prints (it ships no type information: its attributes are Any)."""
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    notices = StderrFilter(_NOTICES)
    notices.enter()
    try:
        return importlib.import_module("tensorflow")
    finally:
        notices.exit()


_compile_filter = StderrFilter(_CACHE_READ_NOTICES)


@contextlib.contextmanager
def quiet_compiles() -> Iterator[None]:
    """Around XLA compiles (from any thread, nested or at once): leave out the cache-read notice lines."""
    _compile_filter.enter()
    try:
        yield
    finally:
        _compile_filter.exit()


def release_stderr() -> None:
    """Before ending the process directly: pass on whatever the filter still holds and restore stderr."""
    _compile_filter.release()
