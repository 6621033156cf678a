"""q4-blocks' cache: a model file's matrices as blocks.c packs them, in one file of the program cache's entry for
that file, mapped at the next start instead of packed again (packing the real 1.5B takes longer than llama-server
takes to start, docs/measurements/2026-12-06-q4-blocks-alone.md). Every piece's digest is checked before the kernel
reads any: a damaged weight would not fail, it would answer wrongly. A partial or stale entry is a miss (logged) and
packed again at once; the digests are computed on a thread of their own while the start goes on, and the kernel's
first read waits for them (`Mapped.check`): damage found then is packed again before that read
(docs/measurements/2026-12-07-check-off-the-path.md). The check is CRC-32, at over twice
SHA-256's speed: what it guards against is damage, not an adversary (the folder is the operator's, SECURITY.md), and
a start reads every piece (docs/measurements/2026-12-06-start-off-the-gil.md).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .blocks import BlockModel, PackedMatrix
from .program_cache import MANIFEST, ProgramCache

log = logging.getLogger("typewriter.lite")
# The code that lays the blocks out and checks them: an entry is keyed by it (start.py), so a changed layout or
# check is a miss, not a wrong answer.
LAYOUT = hashlib.sha256(b"".join((Path(__file__).parent / name).read_bytes()
                                 for name in ("blocks.c", "blocks.py", "blocks_cache.py"))).hexdigest()[:16]
BLOCKS = "blocks.bin"
ALIGN = 64  # each matrix starts on a cache line
PIECE = 1 << 26  # bytes a digest covers: a save computes them on two threads, zlib holding no GIL meanwhile


@dataclass(frozen=True)
class Mapped:
    """An entry's matrices, mapped read-only, and their check: `check()` waits for the digests (computed on a thread
    since the entry was mapped) and says whether they match; where not, the entry is removed (logged) and the
    matrices must not be read."""

    matrices: dict[str, PackedMatrix]
    check: Callable[[], bool]


def load(cache: ProgramCache, key: str) -> Mapped | None:
    """The matrices saved under `key` and their check, under way; None where there are none, or the entry is
    unreadable or of other sizes than its manifest names (the entry is removed then)."""
    if (entry := cache.entry(key)) is None:
        return None
    try:
        manifest = json.loads((entry / MANIFEST).read_text())
        matrices, pieces = manifest["matrices"], manifest["pieces"]
        mapped = np.memmap(entry / BLOCKS, np.uint8, mode="r")
        size = max((offset + nbytes for _, offset, nbytes, *_ in matrices), default=0)
        if len(mapped) != size or len(pieces) != -(-size // PIECE):
            raise ValueError(f"{BLOCKS} holds {len(mapped)} bytes, not the {size} its manifest names")
        named = {name: PackedMatrix(mapped[offset:offset + nbytes], int(inputs), int(out), int(fmt))
                 for name, offset, nbytes, inputs, out, fmt in matrices}
    except (OSError, ValueError, KeyError, TypeError) as e:
        _damaged(cache, key, entry, e)
        return None
    return Mapped(named, _checking(mapped, [str(p) for p in pieces], lambda e: _damaged(cache, key, entry, e)))


def _damaged(cache: ProgramCache, key: str, entry: Path, why: Exception) -> None:
    log.warning("the q4-blocks cache entry %s is unreadable or damaged (%s); packing the blocks again", entry, why)
    cache.discard(key)


def _checking(mapped: np.ndarray, pieces: list[str], damaged: Callable[[Exception], None]) -> Callable[[], bool]:
    """The digests on one thread (the start goes on on the other core), and the wait for them."""
    digests: Future[list[str]] = Future()

    def compute() -> None:
        try:
            digests.set_result([_digest(piece) for piece in _pieces(mapped)])
        except Exception as e:
            digests.set_exception(e)

    threading.Thread(target=compute, name="typewriter-blocks-check", daemon=True).start()

    def check() -> bool:
        try:
            if digests.result() == pieces:
                return True
            damaged(ValueError(f"{BLOCKS} does not match its digests"))
        except Exception as e:
            damaged(e)
        return False

    return check


def save(cache: ProgramCache, key: str, blocks: BlockModel, model_file: Path) -> Path | None:
    """Best effort, as the programs' save: the entry's folder, or None where it could not be written (logged)."""
    if cache.root is None:
        return None
    with cache.making(key) as folder:
        try:
            index, offset = [], 0
            with open(folder / BLOCKS, "wb") as f:
                for name, m in blocks.matrices():
                    f.write(bytes(-offset % ALIGN))
                    offset += -offset % ALIGN
                    f.write(m.packed.data)
                    index.append([name, offset, m.packed.nbytes, m.inputs, m.out, m.format])
                    offset += m.packed.nbytes
            digests = _pieces_of(folder / BLOCKS)
        except OSError as e:
            log.warning("could not write the q4-blocks cache in %s (%s); the next start packs again", folder, e)
            return None
        return cache.save_entry(key, folder, model_file, "q4-blocks", {"matrices": index, "pieces": digests})


def _pieces_of(path: Path) -> list[str]:
    mapped = np.memmap(path, np.uint8, mode="r")
    try:
        return _digests(mapped)
    finally:
        del mapped


def _digests(mapped: np.ndarray) -> list[str]:
    """Each piece's, on two threads."""
    with ThreadPoolExecutor(2, thread_name_prefix="typewriter-digest") as pool:
        return list(pool.map(_digest, _pieces(mapped)))


def _pieces(mapped: np.ndarray) -> Iterator[np.ndarray]:
    """The spans a digest each covers, in order."""
    return (mapped[at:at + PIECE] for at in range(0, len(mapped), PIECE))


def _digest(piece: np.ndarray) -> str:
    return f"{zlib.crc32(piece.data):08x}"
