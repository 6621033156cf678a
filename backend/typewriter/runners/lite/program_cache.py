"""int8-lite's program cache: a restart maps the programs made before instead of folding the weights again
(docs/measurements/2026-12-03-int8-lite.md). An entry is keyed by the model file, its config and FORMAT_VERSION,
renamed into place whole, and each file's digest checked before LiteRT reads it (beside the other files' loading),
so a damaged, partial or stale entry is a miss (logged) and made again, never an error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import mmap
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import CancelledError, ThreadPoolExecutor
from pathlib import Path

from ...architecture.model_config import ModelConfig
from . import gptq
from .calibration import text as calibration_text
from .programs import ProgramSet

log = logging.getLogger("typewriter.lite")
FORMAT_VERSION = 5  # bump when what layers.py, flatbuffer.py or gptq.py write changes
STALE_STAGING_S = 3600  # a staging folder this old belongs to no save still running
MANIFEST = "manifest.json"
OLD_MANIFEST = "source.json"  # read only to remove entries from before FORMAT_VERSION 4


def cache_key(model_file: Path, cfg: ModelConfig, weight_format: str, layout: str = "") -> str:
    """`layout`: for q4-blocks' entry, the packing code's digest, which its files depend on (GPTQ's rounding, which
    the programs' files do, rounds none of them)."""
    stat = model_file.stat()
    made_by = [layout] if layout else [gptq.DAMP, gptq.GROUP, hashlib.sha256(calibration_text().encode()).hexdigest()]
    identity = [FORMAT_VERSION, weight_format, str(model_file.resolve()), stat.st_size, stat.st_mtime_ns,
                dataclasses.asdict(cfg), made_by]
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:20]


class ProgramCache:
    """`root` None: no cache; programs are made in a temporary folder, gone once the runner has mapped them."""

    def __init__(self, root: str | os.PathLike[str] | None):
        self.root = Path(root) if root else None

    def load(self, key: str, n_layers: int) -> ProgramSet | None:
        """The entry's programs, each file's digest checked when its reader asks (`ProgramSet.checked`), which
        raises ValueError on a mismatch; an entry with a file or a digest missing is a miss here."""
        if self.root is None or not (entry := self.root / key).is_dir():
            return None
        files = ProgramSet(entry, n_layers).files()
        try:
            digests = json.loads((entry / MANIFEST).read_text())["files"]
            expected = {path: digests[path.name] for path in files}
            for path in files:
                if not path.is_file() or not isinstance(expected[path], str):
                    raise ValueError(f"{path.name} is missing")
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("the int8-lite program cache %s is unreadable or damaged (%s); making the programs again",
                        entry, e)
            self.discard(key)
            return None
        return ProgramSet(entry, n_layers, checked=Digests(expected).check)

    def discard(self, key: str) -> None:
        if self.root is not None:
            shutil.rmtree(self.root / key, ignore_errors=True)

    @contextlib.contextmanager
    def making(self, key: str) -> Iterator[Path]:
        """A staging folder, or a temporary one where there is no writable cache; removed on the way out unless
        `save` moved it into place, so map its files before then."""
        folder = None
        if self.root is not None:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
                folder = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=self.root))
            except OSError as e:
                log.warning("could not write the int8-lite program cache %s (%s); the next start makes the "
                            "programs again", self.root, e)
        folder = folder or Path(tempfile.mkdtemp(prefix="typewriter-lite-"))
        try:
            yield folder
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def save(self, key: str, programs: ProgramSet, model_file: Path, weight_format: str) -> ProgramSet:
        """Best effort: a cache that cannot be written is logged and the programs stay where made. Older entries of
        the same model file and format, and those whose model file is gone, are removed (docs/configuration.md)."""
        if self.root is None or programs.folder.parent != self.root:
            return programs
        try:
            files = {path.name: _digest(path) for path in programs.files()}
        except OSError as e:
            log.warning("could not read the int8-lite programs back (%s); the next start makes them again", e)
            return programs
        target = self.save_entry(key, programs.folder, model_file, weight_format, {"files": files})
        return programs if target is None else ProgramSet(target, programs.n_layers)

    def entry(self, key: str) -> Path | None:
        """The saved entry's folder, None where there is none."""
        return self.root / key if self.root is not None and (self.root / key).is_dir() else None

    def save_entry(self, key: str, folder: Path, model_file: Path, weight_format: str,
                   described: Mapping[str, object]) -> Path | None:
        """`folder` (from `making`) renamed into place with a manifest of `described`: the entry's folder, or None
        where it was not saved (logged)."""
        if self.root is None or folder.parent != self.root:
            return None
        target = self.root / key
        try:
            manifest = {"model_file": str(model_file.resolve()), "format": weight_format, **described}
            (folder / MANIFEST).write_text(json.dumps(manifest, indent=1))
            folder.rename(target)
        except OSError as e:
            if not target.is_dir():  # another process saving the same entry first is no failure
                log.warning("could not save the %s cache entry to %s (%s); the next start makes it again",
                            weight_format, self.root, e)
                return None
            return target
        self._remove_older(key, model_file, weight_format)
        return target

    def _remove_older(self, key: str, model_file: Path, weight_format: str) -> None:
        if self.root is None:
            return
        for entry in self.root.iterdir():
            if entry.name.startswith(".") and _age_s(entry) > STALE_STAGING_S:  # a save that was killed midway
                shutil.rmtree(entry, ignore_errors=True)
            if entry.name == key or entry.name.startswith("."):
                continue
            try:
                manifest = entry / MANIFEST if (entry / MANIFEST).is_file() else entry / OLD_MANIFEST
                written = json.loads(manifest.read_text())
                source, made_as = written["model_file"], written.get("format", weight_format)  # older: no format
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue
            if source == str(model_file.resolve()) and made_as == weight_format:
                log.info("removing the %s cache entry %s, made before %s or its code changed", made_as, entry,
                         model_file.name)
                shutil.rmtree(entry, ignore_errors=True)
            elif not Path(source).exists():
                log.info("removing the %s cache entry %s: its model file %s is gone", made_as, entry, source)
                shutil.rmtree(entry, ignore_errors=True)


class Digests:
    """Each file's SHA-256, worked out on two threads from the moment the entry is opened, in the order the runner
    opens the files (hashlib lets go of the GIL): a file reaches LiteRT only once its own digest matched, and the
    others run beside the interpreters being made, off the path to ready
    (docs/measurements/2026-12-05-cached-start.md)."""

    def __init__(self, expected: Mapping[Path, str]):
        self._expected = dict(expected)
        pool = ThreadPoolExecutor(2, thread_name_prefix="typewriter-digest")
        self._digests = {path: pool.submit(_digest, path) for path in self._expected}
        pool.shutdown(wait=False)  # its threads end with the last digest

    def check(self, path: Path) -> Path:
        """`path`, once its digest matched; ValueError when it does not or the file could not be read (the others
        are not worked out then: the entry is made again)."""
        try:
            matched = self._digests[path].result() == self._expected[path]
        except OSError as e:
            matched, why = False, f"{path.name} could not be read ({e})"
        except CancelledError:  # another file did not match
            matched, why = False, f"{path.name} was not checked: the entry is damaged"
        else:
            why = f"{path.name} does not match its digest"
        if not matched:
            for digest in self._digests.values():
                digest.cancel()
            raise ValueError(why)
        return path


DIGEST_PIECE = 1 << 26  # bytes


def _digest(path: Path) -> str:
    """Over the mapped file in pieces of 64 MiB: hashlib holds no GIL while it works and needs it back once a piece
    (other threads hold it most of the time meanwhile: blocks of 4 MiB read into a buffer made the start slower,
    docs/measurements/2026-12-05-cached-start.md), and each piece's pages are let go once hashed, so the file never
    counts whole in the process's resident memory."""
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size:  # an empty file cannot be mapped
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped, memoryview(mapped) as view:
                for start in range(0, size, DIGEST_PIECE):
                    stop = min(size, start + DIGEST_PIECE)
                    sha.update(view[start:stop])
                    mapped.madvise(mmap.MADV_DONTNEED, start, stop - start)
    return sha.hexdigest()


def _age_s(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return 0.0
