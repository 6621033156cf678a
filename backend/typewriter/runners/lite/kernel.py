"""int8-lite's kernels, attention (attention.c) and GPTQ's rounding loop (gptq.c), in one library called through
ctypes, which lets go of the GIL. `load` takes the one built beside the sources ahead of time (the container
image's), else builds one with `cc`; where neither can be (no compiler, no AVX2, FMA and F16C) it logs why and
returns None, and numpy does the work, slower.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import numpy.typing as npt

log = logging.getLogger("typewriter.lite")
SOURCE_DIR = Path(__file__).parent
SOURCES = ("attention.c", "gptq.c", "blocks.c")
FLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-fPIC", "-shared", "-pthread")
TILE = 16  # attention.c's TILE: keys are stored in tiles of this many positions
NEEDED_FLAGS = ("avx2", "fma", "f16c")  # FLAGS' extensions, as /proc/cpuinfo spells them
WIDE_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_vnni")  # blocks.c's typewriter_blocks_wide, as cpuinfo spells them
_P = ctypes.c_void_p


class Kernel:
    def __init__(self, path: Path):
        self.library = ctypes.CDLL(str(path))
        self._attend = self.library.typewriter_attend
        self._attend.restype = ctypes.c_int
        self._attend.argtypes = [_P, _P, _P, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, _P, _P,
                                 ctypes.c_int64, ctypes.c_int64, _P, ctypes.c_int]
        self._write = self.library.typewriter_write
        self._write.restype = ctypes.c_int
        self._write.argtypes = [_P, _P, _P, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, _P, _P,
                                ctypes.c_int64, ctypes.c_float, _P, _P, ctypes.c_int64, ctypes.c_int64, _P]
        self._layer = self.library.typewriter_layer
        self._layer.restype = ctypes.c_int
        self._layer.argtypes = [*self._write.argtypes, _P, ctypes.c_int]
        self.library.typewriter_set_split_work.argtypes = [ctypes.c_int64]
        self.library.typewriter_set_wide.argtypes = [ctypes.c_int]
        self.library.typewriter_attention_shared_groups.restype = ctypes.c_int64
        self.wide = bool(self.library.typewriter_wide())  # AVX-512: 16 lanes, the same bits (attention.c)
        self._gptq = self.library.typewriter_gptq
        self._gptq.restype = None
        self._gptq.argtypes = [_P, _P, ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                               _P, _P, _P, _P]

    def set_wide(self, on: bool) -> None:
        """Use the AVX-512 routine where the CPU has it (the default), or keep to the AVX2 one (tests)."""
        self.library.typewriter_set_wide(int(on))
        self.wide = bool(self.library.typewriter_wide())

    def split_from(self, rows_positions: int | None) -> None:
        """For tests and measurements: the work (rows times positions) from which a call is shared with the helper
        thread; None: attention.c's SPLIT_WORK."""
        rows_positions = -1 if rows_positions is None else rows_positions
        self.library.typewriter_set_split_work(rows_positions)

    def shared_groups(self) -> int:
        """For tests: the attention groups another thread computed through blocks.c's sharing, since loading."""
        return int(self.library.typewriter_attention_shared_groups())

    def write(self, qkv: np.ndarray, slots: np.ndarray, positions: np.ndarray, heads: tuple[int, int, int],
              rope: tuple[np.ndarray, np.ndarray], keys: np.ndarray, values: np.ndarray) -> np.ndarray:
        """A layer's qkv rows [t, (h + 2k) * e] (float32, contiguous) for slot slots[i] at positions[i] (int64): k
        RoPE'd and v into the caches (as `attend` reads them), and q RoPE'd and scaled by e^-0.5 ->
        [t, k, h / k, e]. heads: (h, k, e); rope: cos, sin [max_len, e / 2] (float32, contiguous)."""
        (h, k, e), t = heads, qkv.shape[0]
        qkv, slots, positions = _checked(qkv, slots, positions, keys, values, (h + 2 * k) * e, k, e)
        q = np.empty((t, k, h // k, e), np.float32)
        cos, sin = rope
        assert cos.shape == sin.shape == (len(cos), e // 2) and cos.dtype == sin.dtype == np.float32
        _status(self._write(qkv.ctypes.data, slots.ctypes.data, positions.ctypes.data, t, h, k, e, cos.ctypes.data,
                            sin.ctypes.data, len(cos), e**-0.5, keys.ctypes.data, values.ctypes.data,
                            values.shape[0], values.shape[2], q.ctypes.data), e)
        return q

    def layer(self, qkv: np.ndarray, rows: Rows, heads: tuple[int, int, int], rope: tuple[np.ndarray, np.ndarray],
              keys: np.ndarray, values: np.ndarray, threads: int = 1) -> np.ndarray:
        """`write`, then `attend` over the rows just written, in one call: qkv [t, (h + 2k) * e] (float32,
        contiguous) for the rows of `rows` (checked against these caches when made) -> [t, h * e]."""
        (h, k, e), t = heads, rows.count
        if qkv.shape != (t, (h + 2 * k) * e) or qkv.dtype != np.float32 or not qkv.flags.c_contiguous:
            raise ValueError(f"qkv {qkv.shape} {qkv.dtype} is not {t} contiguous float32 rows of {(h + 2 * k) * e}")
        out = np.empty((t, h * e), np.float32)
        cos, sin = rope
        _status(self._layer(qkv.ctypes.data, rows.slots_at, rows.positions_at, t, h, k, e, cos.ctypes.data,
                            sin.ctypes.data, len(cos), e**-0.5, keys.ctypes.data, values.ctypes.data, values.shape[0],
                            values.shape[2], rows.q_at, out.ctypes.data, threads), e)
        return out

    def attend(self, q: np.ndarray, slots: np.ndarray, positions: np.ndarray, keys: np.ndarray,
               values: np.ndarray, threads: int = 1) -> np.ndarray:
        """q [t, k, g, e] (RoPE'd, scaled; float32): token i of slot slots[i] at positions[i] (int64); keys
        [slots, k, padded / TILE, e, TILE] and values [slots, k, padded, e] (float16) -> [t, k, g, e]. `threads` 2:
        enough work is shared with the kernel's helper thread, to the same bits."""
        t, k, g, e = q.shape
        q, slots, positions = _checked(q.reshape(t, -1), slots, positions, keys, values, k * g * e, k, e)
        q = q.reshape(t, k, g, e)
        out = np.empty_like(q)
        _status(self._attend(q.ctypes.data, slots.ctypes.data, positions.ctypes.data, t, k, g, e, keys.ctypes.data,
                             values.ctypes.data, values.shape[0], values.shape[2], out.ctypes.data, threads), e)
        return out


    def gptq(self, w: np.ndarray, u: np.ndarray, scale: np.ndarray, inv_scale: np.ndarray, q: np.ndarray,
             threads: int = 2) -> None:
        """w [groups, g, out] float32 (updated in place), u [groups, g, g] float32, scale and inv_scale [out] float32
        -> q [groups, g, out] int8; the columns split between `threads` threads."""
        groups, g, out = w.shape
        for a in (w, u, scale, inv_scale, q):
            if not a.flags.c_contiguous:
                raise ValueError("gptq's arrays must be contiguous")
        if u.shape != (groups, g, g) or scale.shape != (out,) or inv_scale.shape != (out,) or q.shape != w.shape:
            raise ValueError(f"gptq: w {w.shape}, u {u.shape}, scale {scale.shape}, q {q.shape} do not match")
        if w.dtype != np.float32 or u.dtype != np.float32 or q.dtype != np.int8:
            raise ValueError("gptq takes float32 w and u and an int8 q")
        bounds = np.linspace(0, out, max(1, min(threads, out)) + 1).astype(np.int64)

        def run(c0: int, c1: int) -> None:
            scratch = np.empty(512, np.float32)  # gptq.c's TILE_COLUMNS
            self._gptq(w.ctypes.data, u.ctypes.data, groups, g, out, int(c0), int(c1), scale.ctypes.data,
                       inv_scale.ctypes.data, q.ctypes.data, scratch.ctypes.data)

        if len(bounds) == 2:
            run(0, out)
            return
        with ThreadPoolExecutor(len(bounds) - 1, thread_name_prefix="typewriter-gptq") as pool:
            list(pool.map(run, bounds[:-1], bounds[1:]))


class Rows:
    """A step's rows for `Kernel.layer`, made once for every layer; it keeps the arrays alive while C reads them."""

    def __init__(self, slots: npt.ArrayLike, positions: npt.ArrayLike, heads: tuple[int, int, int], keys: np.ndarray,
                 values: np.ndarray):
        h, k, e = heads
        self.slots, self.positions = np.ascontiguousarray(slots, np.int64), np.ascontiguousarray(positions, np.int64)
        _check_caches(keys, values, k, e)
        if self.slots.shape != self.positions.shape or self.slots.ndim != 1:
            raise ValueError(f"{self.slots.shape} slots and {self.positions.shape} positions do not match")
        self.count = len(self.slots)
        self.q = np.empty((self.count, h, e), np.float32)
        self.slots_at, self.positions_at = self.slots.ctypes.data, self.positions.ctypes.data
        self.q_at = self.q.ctypes.data


def _status(status: int, e: int) -> None:
    if status == -1:
        raise ValueError(f"the attention kernel takes heads of a multiple of {TILE} channels, not {e}")
    if status == -2:
        raise MemoryError("the attention kernel is out of memory")
    if status == -3:
        raise IndexError("a slot or position is outside the cache (or past its RoPE angles)")


def _checked(rows: np.ndarray, slots: npt.ArrayLike, positions: npt.ArrayLike, keys: np.ndarray, values: np.ndarray,
             width: int, k: int, e: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The arrays as C reads them; the C side refuses a slot or position outside the cache (-3)."""
    rows = np.ascontiguousarray(rows, np.float32)
    slots, positions = np.ascontiguousarray(slots, np.int64), np.ascontiguousarray(positions, np.int64)
    if rows.ndim != 2 or rows.shape[1] != width or not len(rows) == len(slots) == len(positions):
        raise ValueError(f"rows {rows.shape}, {len(slots)} slots and {len(positions)} positions do not match")
    _check_caches(keys, values, k, e)
    return rows, slots, positions


def _check_caches(keys: np.ndarray, values: np.ndarray, k: int, e: int) -> None:
    if not (keys.flags.c_contiguous and values.flags.c_contiguous and keys.dtype == values.dtype == np.float16):
        raise ValueError("the kernel's caches are contiguous float16 arrays")
    cached, padded = values.shape[0], values.shape[2]
    if values.shape != (cached, k, padded, e) or keys.shape != (cached, k, padded // TILE, e, TILE) or padded % TILE:
        raise ValueError(f"caches {keys.shape} and {values.shape} are not laid out for {k} heads of {e} channels")


@functools.cache
def load(folder: str | None) -> Kernel | None:
    """`folder` None: build in a temporary folder. None where there is no kernel."""
    reason = _cpu_lacks()
    if reason is None and (beside := _library(SOURCE_DIR)).exists():
        return Kernel(beside)
    if reason is None and shutil.which("cc") is None:
        reason = "no C compiler (cc) on PATH, and none built beside attention.c"
    if reason is None:
        home = folder or tempfile.mkdtemp(prefix="typewriter-kernel-")
        temporary = None if folder else home
        try:
            path = _library(Path(home) / "kernels")
            if not path.exists():
                _compile(path)
            return Kernel(path)
        except (OSError, subprocess.SubprocessError) as e:
            reason = f"it did not build ({e})"
        finally:
            if temporary:  # a loaded library stays mapped once its file is gone
                shutil.rmtree(temporary, ignore_errors=True)
    log.warning("int8-lite's attention kernel is not used: %s; attention runs in numpy, slower at long contexts",
                reason)
    return None


def blocks_run_wide(head_dim: int) -> bool:
    """Whether q4-blocks would run here on blocks.c's AVX-512 VNNI path (its AVX2 one is 2-3.5x slower at a batch,
    docs/measurements/2026-12-05-gguf-blocks-kernel.md), told without building the kernel: the CPU's flags, heads
    the attention kernel takes, and a kernel built beside the sources or a compiler to build one."""
    flags = _cpu_flags()
    return (flags is not None and {*NEEDED_FLAGS, *WIDE_FLAGS} <= flags and head_dim % TILE == 0 and
            (_library(SOURCE_DIR).exists() or shutil.which("cc") is not None))


def _cpu_flags() -> set[str] | None:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    return set(next((line for line in text.splitlines() if line.startswith("flags")), "").split())


def _cpu_lacks() -> str | None:
    flags = _cpu_flags()
    if flags is None:
        return "/proc/cpuinfo is unreadable, so AVX2, FMA and F16C cannot be checked"
    missing = [f for f in NEEDED_FLAGS if f not in flags]
    return f"the CPU lacks {', '.join(missing)}" if missing else None


def _library(folder: Path) -> Path:
    sources = b"".join((SOURCE_DIR / name).read_bytes() for name in SOURCES)
    return folder / f"kernels-{hashlib.sha256(sources + ' '.join(FLAGS).encode()).hexdigest()[:16]}.so"


def _compile(path: Path) -> None:
    """Each source on its own `cc` at once, then linked: a first start waits for the slowest source, not the sum
    (docs/measurements/2026-12-05-cached-start.md)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.{os.getpid()}")
    objects = [staging.with_name(f"{staging.name}.{Path(name).stem}.o") for name in SOURCES]
    try:
        compile_only = [flag for flag in FLAGS if flag != "-shared"]
        with ThreadPoolExecutor(len(SOURCES)) as pool:  # threads that wait for processes
            for done in pool.map(_cc, [[*compile_only, "-c", "-o", str(o), str(SOURCE_DIR / name)]
                                       for o, name in zip(objects, SOURCES)]):
                done.check_returncode()
        _cc([*FLAGS, "-o", str(staging), *map(str, objects), "-lm"]).check_returncode()
        os.replace(staging, path)  # whole or not there: two processes building at once both succeed
        # Older builds go: a running server keeps its mapping, and that version rebuilds its own.
        for older in [*path.parent.glob("kernels-*.so"), *path.parent.glob("attention-*.so")]:
            if older != path:
                older.unlink(missing_ok=True)
    except subprocess.CalledProcessError as e:
        raise OSError(e.stderr.strip().splitlines()[-1] if e.stderr.strip() else f"cc exited {e.returncode}") from e
    finally:
        for leftover in [staging, *objects]:
            leftover.unlink(missing_ok=True)
    log.info("built int8-lite's attention kernel %s", path)


def _cc(arguments: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["cc", *arguments], capture_output=True, text=True, timeout=120)


def main() -> None:
    """Build the library beside attention.c, so the container image needs no compiler."""
    path = _library(SOURCE_DIR)
    _compile(path)
    Kernel(path)
    print(path)


if __name__ == "__main__":
    main()
