"""TensorFlow's process environment, and importing TensorFlow without its start-up notices on the terminal.

`prepare_environment` sets TensorFlow's own variables before it loads (its C++ log level, the XLA disk cache).
TensorFlow 2.21 also logs a oneDNN notice from C++ before its log level applies: `import_tensorflow` catches
stderr at the file descriptor while importing, drops the lines known to be notices, and passes the rest through.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import MutableMapping

_NOTICES = (
    "All log messages before absl::InitializeLog() is called are written to STDERR",
    "oneDNN custom operations are on",
    "This TensorFlow binary is optimized to use available CPU instructions",
    "To enable the following instructions:",
)


def prepare_environment(xla_cache: str | None, environ: MutableMapping[str, str] = os.environ) -> None:
    """Before TensorFlow is imported: keep its C++ chatter off the terminal and, with `xla_cache` (a folder), keep
    compiled XLA programs there so a later start skips most compiling. That cache is opt-in: TensorFlow 2.21 logs
    harmless but alarming errors ("Error parsing text-format XlaSerializedCacheEntry", "Target machine feature
    +prefer-no-gather is not supported") each time it reads an entry back."""
    environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # not "PyTorch was not found": we never use it
    flags = environ.get("TF_XLA_FLAGS", "")
    if xla_cache and "tf_xla_persistent_cache_directory" not in flags:
        os.makedirs(xla_cache, exist_ok=True)
        environ["TF_XLA_FLAGS"] = f"{flags} --tf_xla_persistent_cache_directory={xla_cache}".strip()


def import_tensorflow():
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as caught:
        os.dup2(caught.fileno(), 2)
        try:
            import tensorflow as tf
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            for line in caught.read().decode(errors="replace").splitlines(keepends=True):
                if not any(n in line for n in _NOTICES):
                    sys.stderr.write(line)
    return tf
