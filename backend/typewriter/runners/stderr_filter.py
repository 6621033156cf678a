"""Native libraries' harmless notices kept off the terminal: a filter on file descriptor 2 (TensorFlow and LiteRT
print theirs from C++, below Python's logging)."""

from __future__ import annotations

import os
import sys
import threading


class StderrFilter:
    """Between enter() and exit() (nested or from several threads), file descriptor 2 is a pipe whose lines a
    thread passes on to the real stderr at once, less those containing a known notice; outside them stderr is
    untouched, so a crash in between loses nothing."""

    def __init__(self, drop: tuple[str, ...]):
        self.drop = tuple(d.encode() for d in drop)
        self.lock = threading.Lock()
        self.depth = 0
        self.saved: int | None = None  # the real stderr, while the pipe stands in for it
        self.thread: threading.Thread | None = None

    def enter(self) -> None:
        with self.lock:
            self.depth += 1
            if self.depth > 1:
                return
            sys.stderr.flush()
            read_end, write_end = os.pipe()
            self.saved = saved = os.dup(2)
            self.thread = thread = threading.Thread(target=self._forward, args=(read_end, saved), daemon=True,
                                                    name="typewriter-stderr")
            thread.start()
            os.dup2(write_end, 2)
            os.close(write_end)

    def exit(self) -> None:
        with self.lock:
            self.depth -= 1
            if self.depth:
                return
            saved, thread = self.saved, self.thread
            assert saved is not None and thread is not None
            sys.stderr.flush()
            os.dup2(saved, 2)  # closes the pipe's last write end: the thread drains it and stops
            thread.join(5)
            os.close(saved)

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
