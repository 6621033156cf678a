"""A LiteRT (TensorFlow Lite) interpreter of one flatbuffer, without the notice LiteRT prints for each."""

from __future__ import annotations

from ..stderr_filter import StderrFilter

# LiteRT (TensorFlow Lite) prints a line to stderr (C++) for every interpreter it hands to XNNPACK.
_LITE_NOTICES = ("Created TensorFlow Lite XNNPACK delegate for CPU",)
_lite_filter = StderrFilter(_LITE_NOTICES)


def lite_interpreter(content: bytes, threads: int):
    """A LiteRT (TensorFlow Lite) interpreter of a flatbuffer, XNNPACK on `threads` threads, without its notices.
    LiteRT is tf.lite.Interpreter's successor (deprecated since TensorFlow 2.20), and imports in a small fraction
    of TensorFlow's time (docs/measurements/2026-12-03-int8-lite-one-pass-litert-program-cache.md)."""
    from ai_edge_litert.interpreter import Interpreter

    _lite_filter.enter()
    try:
        interpreter = Interpreter(model_content=content, num_threads=threads)
        interpreter.allocate_tensors()
    finally:
        _lite_filter.exit()
    return interpreter
