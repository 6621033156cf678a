"""Build one of bench/c/'s C files into a shared library with the machine's `cc`, as runners/lite/kernel.py builds
the attention kernel: named by a hash of the source and the flags, kept in a cache folder outside the repo, built
once. For measurements only; the runtime never loads these.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
from pathlib import Path

SOURCES = Path(__file__).resolve().parent / "c"


def cpu_flags() -> set[str]:
    line = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    return set(line.split(":", 1)[1].split())


def load(name: str, flags: tuple[str, ...]) -> ctypes.CDLL:
    """bench/c/`name` built with `flags` (beside -O3 -fPIC -shared -pthread), loaded."""
    source = SOURCES / name
    flags = ("-O3", "-fPIC", "-shared", "-pthread", *flags)
    digest = hashlib.sha256(source.read_bytes() + " ".join(flags).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("TYPEWRITER_BENCH_CACHE", Path.home() / ".cache" / "typewriter")) / "bench-c"
    path = cache / f"{source.stem}-{digest}.so"
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        staging = path.with_name(f".{path.name}.{os.getpid()}")
        subprocess.run(["cc", *flags, "-o", str(staging), str(source), "-lm"], check=True)
        os.replace(staging, path)
    return ctypes.CDLL(str(path))
