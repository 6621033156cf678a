"""A LiteRT (TensorFlow Lite) interpreter of one flatbuffer file, without the notice LiteRT prints for each."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from ..stderr_filter import StderrFilter

if TYPE_CHECKING:
    from ai_edge_litert.interpreter import Interpreter

log = logging.getLogger("typewriter.lite")

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
