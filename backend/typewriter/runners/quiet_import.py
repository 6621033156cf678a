"""TensorFlow's process environment, and TensorFlow without its harmless C++ notices on the terminal.

`prepare_environment` sets TensorFlow's own variables before it loads (its C++ log level, the XLA disk cache).
TensorFlow 2.21 also logs a oneDNN notice from C++ before its log level applies: `import_tensorflow` filters
stderr at the file descriptor while importing, dropping the lines known to be notices and passing the rest on.
`quiet_compiles` does the same around compiling, for the line each read of the XLA disk cache logs.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator, MutableMapping

_NOTICES = (
    "All log messages before absl::InitializeLog() is called are written to STDERR",
    "oneDNN custom operations are on",
    "This TensorFlow binary is optimized to use available CPU instructions",
    "To enable the following instructions:",
)


# TensorFlow's XLA disk cache reads each entry first as a text-format proto, then, when that fails, as the binary
# proto it wrote (ReadTextOrBinaryProto): protobuf logs the failed text parse as an error every time, and the
# entry then loads. absl adds its notice before its first log line.
# And on AMD Zen 4/5, XLA 2.21's loader (cpu_aot_loader.cc) logs an error per cached program, for every feature the
# program was compiled with that the host's feature list lacks: LLVM's tuning flags "+prefer-no-gather" and
# "+prefer-no-scatter" are among the compile features but never among a host's. Later XLA skips features named
# "prefer-*" and "fast-*" in that check, as this filter does; a missing instruction set (a cache folder copied from
# another kind of machine) is still reported.
_CACHE_READ_NOTICES = (
    "Error parsing text-format tensorflow.XlaSerializedCacheEntry",
    "All log messages before absl::InitializeLog() is called are written to STDERR",
    "Loading XLA:CPU AOT result. Target machine feature +prefer-",
    "Loading XLA:CPU AOT result. Target machine feature +fast-",
)


def prepare_environment(xla_cache: str | None, environ: MutableMapping[str, str] = os.environ) -> None:
    """Before TensorFlow is imported: keep its C++ chatter off the terminal and, with `xla_cache` (a folder), keep
    compiled XLA programs there so a later start skips most compiling."""
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


def import_tensorflow():
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    notices = _StderrFilter(_NOTICES)
    notices.enter()
    try:
        import tensorflow as tf
    finally:
        notices.exit()
    return tf


class _StderrFilter:
    """Between enter() and exit() (nested or from several threads), file descriptor 2 is a pipe whose lines a
    thread passes on to the real stderr at once, less those containing a known notice; outside them stderr is
    untouched, so a crash in between loses nothing."""

    def __init__(self, drop: tuple[str, ...]):
        self.drop = tuple(d.encode() for d in drop)
        self.lock = threading.Lock()
        self.depth = 0
        self.saved = self.thread = None

    def enter(self) -> None:
        with self.lock:
            self.depth += 1
            if self.depth > 1:
                return
            sys.stderr.flush()
            read_end, write_end = os.pipe()
            self.saved = os.dup(2)
            self.thread = threading.Thread(target=self._forward, args=(read_end, self.saved), daemon=True,
                                           name="typewriter-stderr")
            self.thread.start()
            os.dup2(write_end, 2)
            os.close(write_end)

    def exit(self) -> None:
        with self.lock:
            self.depth -= 1
            if self.depth:
                return
            sys.stderr.flush()
            os.dup2(self.saved, 2)  # closes the pipe's last write end: the thread drains it and stops
            self.thread.join(5)
            os.close(self.saved)

    def release(self) -> None:
        """Give fd 2 back now, however many blocks are open (the process is about to end)."""
        with self.lock:
            if not self.depth:
                return
            self.depth = 1
        self.exit()

    def _forward(self, read_end: int, out: int) -> None:
        pending = b""
        with os.fdopen(read_end, "rb", buffering=0) as pipe:
            while chunk := pipe.read(65536):
                lines = (pending + chunk).splitlines(keepends=True)
                pending = lines.pop() if not lines[-1].endswith((b"\n", b"\r")) else b""
                kept = b"".join(line for line in lines if not any(d in line for d in self.drop))
                if kept:
                    os.write(out, kept)
        if pending:
            os.write(out, pending)


_compile_filter = _StderrFilter(_CACHE_READ_NOTICES)


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


# LiteRT (TensorFlow Lite) prints a line to stderr (C++) for every interpreter it hands to XNNPACK.
_LITE_NOTICES = ("Created TensorFlow Lite XNNPACK delegate for CPU",)
_lite_filter = _StderrFilter(_LITE_NOTICES)


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
