"""RoPE, the K/V cache and attention on the host between a layer's TensorFlow Lite programs: by the C kernel
(kernel.py) where it builds, which gives a token the same bits decoded or in any chunk, else in numpy, where only
chunks are bitwise invariant. The cache never crosses into TensorFlow Lite, and a row reads only its own slot's
positions so far (docs/measurements/2026-12-03-int8-lite.md).

Shapes: n rows, t chunk tokens, h query heads, k kv heads, g = h // k, e head dim, s cached positions.
"""

from __future__ import annotations

import mmap
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import numpy.typing as npt

from ...architecture.model_config import ModelConfig
from .kernel import TILE as KERNEL_TILE
from .kernel import Kernel, Rows

# One query row by one tile at a time: OpenBLAS's last bits depend on a product's shape
# (docs/measurements/2026-12-03-int8-lite-time-sized-chunks-avx512-kernel.md).
TILE = 128
# Cached positions a decode step reads before a second thread pays for its hand-off
# (docs/measurements/2026-12-03-int8-lite.md).
SPLIT_POSITIONS = 2048

class HostCache:
    """The kernel reads float16 keys in channel-major tiles [slots, k, padded / 16, e, 16] and float16 values
    [slots, k, padded, e]; numpy reads float32, both [slots, k, padded, e]."""

    def __init__(self, cfg: ModelConfig, slots: int, max_len: int, kernel: Kernel | None = None, threads: int = 2):
        self.cfg, self.slots, self.max_len, self.kernel, self.threads = cfg, slots, max_len, kernel, threads
        self._helper = ThreadPoolExecutor(1, thread_name_prefix="typewriter-attention")
        padded = -(-max_len // TILE) * TILE  # whole tiles; the pages past max_len are never written
        k, e = cfg.n_kv_heads, cfg.head_dim
        key_shape = (slots, k, padded // KERNEL_TILE, e, KERNEL_TILE) if kernel else (slots, k, padded, e)
        dtype = np.float16 if kernel else np.float32  # the kernel reads float16: half the bytes a step
        self.k = [_untouched_zeros(key_shape, dtype) for _ in range(cfg.n_layers)]
        self.v = [_untouched_zeros((slots, k, padded, e), dtype) for _ in range(cfg.n_layers)]  # [slots, k, padded, e]
        self.filled = np.zeros(slots, np.int64)  # per slot: positions below this may have been written
        angles = cfg.rope_angles(max_len)  # [max_len, e/2]
        self.cos, self.sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
        self._heads, self._rope = (cfg.n_heads, k, e), (self.cos, self.sin)

    def _split(self, qkv: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """qkv [n, (h + 2k) * e] -> q [n, h, e], k [n, k, e] with RoPE at `positions` [n], v [n, k, e]."""
        cfg, n = self.cfg, qkv.shape[0]
        heads = cfg.n_heads + cfg.n_kv_heads
        qk = _rope(qkv[:, :heads * cfg.head_dim].reshape(n, heads, cfg.head_dim),
                   self.cos[positions][:, None], self.sin[positions][:, None])  # cos/sin [n, 1, e/2]
        v = qkv[:, heads * cfg.head_dim:].reshape(n, cfg.n_kv_heads, cfg.head_dim)
        return qk[:, :cfg.n_heads], qk[:, cfg.n_heads:], v

    def decode(self, layer: int, qkv: np.ndarray, slots: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """One token per row at (slot, position), attending to its slot's positions 0..position -> [n, h * e]."""
        cfg = self.cfg
        if self.kernel:
            return self._by_kernel(layer, qkv, slots, positions)
        q, k, v = self._split(qkv, positions)
        keys, values = self.k[layer], self.v[layer]
        keys[slots, :, positions] = k
        values[slots, :, positions] = v
        np.maximum.at(self.filled, slots, positions + 1)
        n = qkv.shape[0]
        out = np.empty((n, cfg.n_kv_heads, cfg.groups, cfg.head_dim), np.float32)
        q = q.reshape(n, cfg.n_kv_heads, cfg.groups, cfg.head_dim) * np.float32(cfg.head_dim**-0.5)

        def rows(part: range) -> None:  # each row alone, so a row's result never depends on the others
            for row in part:
                slot, s = slots[row], positions[row] + 1
                scores = _few_scores(q[row], keys[slot, :, :s])  # [k, g, s]
                weights, total = _exp(scores)
                out[row] = (weights @ values[slot, :, :s]) / total  # [k, g, e]

        if self.threads > 1 and n > 1 and positions.sum() + n >= SPLIT_POSITIONS:
            half = _balanced_half(positions)
            other = self._helper.submit(rows, range(half, n))
            rows(range(half))
            other.result()
        else:
            rows(range(n))
        return out.reshape(n, -1)

    def extend(self, layer: int, qkv: np.ndarray, slot: int, start: int) -> np.ndarray:
        """A prompt chunk of t tokens at positions start.., each attending up to its own -> [t, h * e]."""
        cfg, t = self.cfg, qkv.shape[0]
        if t == 0:
            return np.empty((0, cfg.n_heads * cfg.head_dim), np.float32)
        end = start + t
        positions = np.arange(start, end)
        if self.kernel:
            return self._by_kernel(layer, qkv, np.full(t, slot, np.int64), positions)
        keys, values = self.k[layer], self.v[layer]
        self.filled[slot] = max(self.filled[slot], end)
        q, k, v = self._split(qkv, positions)
        keys[slot, :, start:end] = k.transpose(1, 0, 2)
        values[slot, :, start:end] = v.transpose(1, 0, 2)
        q = q.reshape(t, cfg.n_kv_heads, cfg.groups, cfg.head_dim) * np.float32(cfg.head_dim**-0.5)
        return _attend(q, keys[slot], values[slot], positions).reshape(t, -1)  # heads in q's order

    def rows(self, slots: npt.ArrayLike, positions: npt.ArrayLike) -> Rows:
        """Kernel only: made once a step, so each layer's `attend` is one C call."""
        rows = Rows(slots, positions, self._heads, self.k[0], self.v[0])
        if rows.count:
            np.maximum.at(self.filled, rows.slots, rows.positions + 1)
        return rows

    def attend(self, layer: int, qkv: np.ndarray, rows: Rows) -> np.ndarray:
        """qkv [n, (h + 2k) * e] -> [n, h * e]: RoPE, the cache writes and attention, by the kernel."""
        assert self.kernel is not None, "rows and attend are the kernel's way (numpy's: decode and extend)"
        return self.kernel.layer(qkv, rows, self._heads, self._rope, self.k[layer], self.v[layer], self.threads)

    def _by_kernel(self, layer: int, qkv: np.ndarray, slots: np.ndarray, positions: np.ndarray) -> np.ndarray:
        return self.attend(layer, np.ascontiguousarray(qkv, np.float32), self.rows(slots, positions))

    def copy_slot(self, source: int, target: int) -> None:
        n = self.filled[source]
        key_tiles = -(-n // KERNEL_TILE) if self.kernel else n  # the keys' third axis: tiles or positions
        for keys, values in zip(self.k, self.v):
            keys[target, :, :key_tiles] = keys[source, :, :key_tiles]
            values[target, :, :n] = values[source, :, :n]
        self.filled[target] = max(self.filled[target], n)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.k + self.v)


def _untouched_zeros(shape: tuple[int, ...], dtype: npt.DTypeLike = np.float32) -> np.ndarray:
    """Pages take memory only once written, 4 KiB at a time, where numpy's large zeros ask for huge pages
    (docs/measurements/2026-12-03-int8-lite.md)."""
    count = int(np.prod(shape))
    return np.frombuffer(mmap.mmap(-1, max(count * np.dtype(dtype).itemsize, 1)), dtype, count=count).reshape(shape)


def _balanced_half(positions: np.ndarray) -> int:
    work = np.cumsum(positions + 1)
    return int(np.clip(np.searchsorted(work, work[-1] / 2), 1, len(positions) - 1))


def _attend(q: np.ndarray, keys: np.ndarray, values: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """q [t, k, g, e] (scaled) at `positions` [t] against keys/values [k, padded, e] -> [t, k, g, e]. A token gets
    the same bits in any chunk, else the next program's int8 rows may round it into another greedy answer: one row
    by one tile per product, sums within a tile then tile after tile
    (docs/measurements/2026-12-03-int8-lite-one-pass-litert-program-cache.md)."""
    t, k, g, e = q.shape
    rows, tiles = t * g, int(positions[-1]) // TILE + 1
    block = np.ascontiguousarray(q.transpose(1, 0, 2, 3).reshape(k, rows, 1, 1, e))  # rows in (token, group) order
    at = np.repeat(positions, g)
    key_tiles = keys[:, :tiles * TILE].reshape(k, 1, tiles, TILE, e).transpose(0, 1, 2, 4, 3)  # [k, 1, tiles, e, TILE]
    scores = (block @ key_tiles).reshape(k, rows, tiles * TILE)  # [k, rows, tiles, 1, TILE]: a product a row and tile
    first = int(positions[0])  # every row sees the positions before the chunk's first
    scores[:, :, first:] += np.where(np.arange(first, tiles * TILE) > at[:, None], np.float32(-np.inf), np.float32(0))
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    by_tile = scores.reshape(k, rows, tiles, 1, TILE)
    total = np.cumsum(by_tile.sum(axis=-1)[..., 0], axis=-1)[..., -1]  # each tile's sum, then tile after tile
    weighted = by_tile @ values[:, :tiles * TILE].reshape(k, 1, tiles, TILE, e)  # [k, rows, tiles, 1, e]
    out: np.ndarray = np.cumsum(weighted[:, :, :, 0], axis=2)[:, :, -1] / total[..., None]  # tile after tile, in order
    return out.reshape(k, t, g, e).transpose(1, 0, 2, 3)


def _few_scores(q: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """q [k, g, e], keys [k, s, e] -> [k, g, s], as keys @ q^T: OpenBLAS is slow at a few rows by transposed keys
    (docs/measurements/2026-12-03-int8-lite-one-pass-litert-program-cache.md)."""
    return np.ascontiguousarray((keys @ q.transpose(0, 2, 1)).transpose(0, 2, 1))


def _rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate-half RoPE (Hugging Face layout): x [n, heads, e], cos/sin [n, 1, e/2]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    out = np.empty(x.shape, np.float32)
    np.subtract(x1 * cos, x2 * sin, out=out[..., :half])
    np.add(x2 * cos, x1 * sin, out=out[..., half:])
    return out


def _exp(scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Softmax's numerator in place and its denominator [..., 1]: the caller divides the few values, not the weights."""
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    return scores, scores.sum(axis=-1, keepdims=True)
