"""Import TensorFlow without its start-up notices on the terminal.

TensorFlow 2.21 logs a oneDNN notice from C++ before its log level applies. We catch stderr at the file
descriptor while importing, drop the lines known to be notices, and pass everything else through.
"""

from __future__ import annotations

import os
import sys
import tempfile

_NOTICES = (
    "All log messages before absl::InitializeLog() is called are written to STDERR",
    "oneDNN custom operations are on",
    "This TensorFlow binary is optimized to use available CPU instructions",
    "To enable the following instructions:",
)


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
