"""q4-blocks: a model's matrices as the GGUF file's own blocks, repacked once for blocks.c (blocks_cache.py keeps
them for the next start), which runs a step through every layer in one call. The file's types map to the kernel's
formats exactly where they can (docs/measurements/2026-12-05-4-bit-weights-research.md, "Recommendation"):

- Q4_0 as Q4; Q4_1 as Q4M; Q4_K as Q4K: its super-blocks' d and dmin and its sub-blocks' 6-bit scales and minimums
  as the file has them (a byte each), 18.5 bytes a block of 32 against the file's 18 (Q4M with float16 d x sc and
  -dmin x m read 20: docs/measurements/2026-12-06-k-quant-scales.md).
- Q5_0 as Q5; Q5_1 as Q5M; Q5_K as Q5M, its sub-blocks' scales and minimums made float16 (d x sc, -dmin x m). The
  0.5B's layers are mostly Q5_0: held at 8 bits they read 1.5x its bytes (docs/measurements/2026-12-06-zen4.md).
- Q6_K as Q6K: its super-blocks' d and its sub-blocks of 16's int8 scales as the file has them, 26.5 bytes a block
  against the file's 26.25 (each block on a cache line; two float16 scales a block read 28). The 1.5B's attn_v and
  ffn_down are Q6_K.
- Q8_0 as Q8.
- every other type (the float types of a directory or a test model) rounded to Q8 blocks again, the one rounding
  this path adds.

Shapes: [out, in] as GGUF stores a matrix's rows; q [out, in] int8, scales and minimums [out, in / 32] float16; a
K-quant's sub-blocks' scales (Q4K's minimums too, Q6K's [out, in / 16]) as the file's integers, with their
super-blocks' float16 d (and dmin) [out, in / 256, 2 or 1].
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ...architecture.model_config import ModelConfig
from ...errors import ModelFormatError
from ...weights.dequantize import dequantize
from ...weights.ggml_types import GGMLQuantizationType as Q
from ...weights.gguf_file import PERMUTED_QK, GGUFFile, unpermute_rotary
from ...weights.source import WeightReader
from ..rotation import Rotation
from .attention import HostCache
from .kernel import Kernel

BLOCK = 32
FORMATS = {"q4": 4, "q4m": 41, "q4k": 42, "q5": 5, "q5m": 51, "q6k": 62, "q8": 8}  # blocks.c's `format`
SUPER = 256  # a K-quant's super-block
_P = ctypes.c_void_p
MATRICES = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


@dataclass(frozen=True)
class Blocks:
    """A matrix as the kernel's format holds it, before packing."""

    q: np.ndarray  # [out, in] int8
    scales: np.ndarray  # [out, in / 32] float16; Q4K's uint8, Q6K's int8 [out, in / 16]
    mins: np.ndarray | None  # [out, in / 32] float16, Q4M and Q5M; Q4K's uint8
    format: int
    supers: np.ndarray | None = None  # a K-quant's [out, in / 256, 2] float16 d and dmin (Q4K), [.., 1] d (Q6K)

    def dequantized(self) -> np.ndarray:
        """[out, in] float32: what the kernel multiplies by (a K-quant's d x sc and -dmin x m in float32)."""
        out, n = self.q.shape
        group = n // self.scales.shape[1]
        scales = self.scales.astype(np.float32)
        mins = None if self.mins is None else self.mins.astype(np.float32)
        if self.supers is not None:
            each = SUPER // group  # sub-blocks a super-block
            scales = self.supers[..., 0].astype(np.float32).repeat(each, axis=1) * scales
            if mins is not None:
                mins = -self.supers[..., 1].astype(np.float32).repeat(each, axis=1) * mins
        w = self.q.astype(np.float32).reshape(out, n // group, group) * scales[..., None]
        if mins is not None:
            w += mins[..., None]
        return w.reshape(out, n)


def _half(blocks: np.ndarray, at: int) -> np.ndarray:
    """The float16 at byte `at` of each block [n, 1]."""
    return blocks[:, at:at + 2].copy().view(np.float16)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[n, 16] bytes -> [n, 32] uint8: the low nibbles as values 0-15, the high ones as 16-31 (GGUF's order)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """[n, 4] bytes, a bit a value (little-endian) -> [n, 32] uint8 0 or 16: Q5_0's and Q5_1's high bits."""
    return np.unpackbits(np.ascontiguousarray(qh), axis=1, bitorder="little") << 4


def _scales_and_mins(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's and Q5_K's super-blocks [n, bytes] -> their sub-blocks' 6-bit scales and minimums [n, 8] uint8 each."""
    from gguf.quants import Q4_K  # packing only: gguf-py is no part of a start from cached blocks

    sc, m = Q4_K.get_scale_min(b[:, 4:16])
    return sc.astype(np.uint8), m.astype(np.uint8)


def _k_scales(b: np.ndarray, out: int) -> tuple[np.ndarray, np.ndarray]:
    """Q5_K's sub-block scales and minimums as float16 [out, in / 32]: d x sc and -dmin x m."""
    d, dmin = _half(b, 0).astype(np.float32), _half(b, 2).astype(np.float32)
    sc, m = _scales_and_mins(b)
    return ((d * sc.astype(np.float32)).astype(np.float16).reshape(out, -1),
            (-dmin * m.astype(np.float32)).astype(np.float16).reshape(out, -1))


def _k_nibbles(qs: np.ndarray) -> np.ndarray:
    """[n, 128] bytes -> [n, 8 sub-blocks, 32] uint8 0-15: sub-block 2c is chunk c's low nibbles, 2c + 1 its high."""
    return ((qs.reshape(-1, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & 0x0F).reshape(-1, 8, 32)


def blocks_of(data: np.ndarray, kind: Q, out: int, n: int) -> Blocks:
    """A GGUF matrix's data (its rows' bytes [out, row bytes], or its numbers [out, in]) in the kernel's format."""
    raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    if kind == Q.Q4_0:  # {f16 d; u8 qs[16]}: (q - 8) * d
        b = raw.reshape(-1, 18)
        q = _nibbles(b[:, 2:]).astype(np.int8) - np.int8(8)
        return Blocks(q.reshape(out, n), _half(b, 0).reshape(out, -1), None, FORMATS["q4"])
    if kind == Q.Q4_1:  # {f16 d; f16 m; u8 qs[16]}: q * d + m
        b = raw.reshape(-1, 20)
        q = _nibbles(b[:, 4:]).astype(np.int8)
        return Blocks(q.reshape(out, n), _half(b, 0).reshape(out, -1), _half(b, 2).reshape(out, -1), FORMATS["q4m"])
    if kind == Q.Q8_0:  # {f16 d; i8 qs[32]}: q * d
        b = raw.reshape(-1, 34)
        return Blocks(b[:, 2:].view(np.int8).reshape(out, n), _half(b, 0).reshape(out, -1), None, FORMATS["q8"])
    if kind == Q.Q5_0:  # {f16 d; u8 qh[4]; u8 qs[16]}: ((q | bit << 4) - 16) * d
        b = raw.reshape(-1, 22)
        q = (_nibbles(b[:, 6:]) | _fifth_bits(b[:, 2:6])).astype(np.int8) - np.int8(16)
        return Blocks(q.reshape(out, n), _half(b, 0).reshape(out, -1), None, FORMATS["q5"])
    if kind == Q.Q5_1:  # {f16 d; f16 m; u8 qh[4]; u8 qs[16]}: (q | bit << 4) * d + m
        b = raw.reshape(-1, 24)
        q = (_nibbles(b[:, 8:]) | _fifth_bits(b[:, 4:8])).astype(np.int8)
        return Blocks(q.reshape(out, n), _half(b, 0).reshape(out, -1), _half(b, 2).reshape(out, -1), FORMATS["q5m"])
    if kind == Q.Q4_K:  # 256 values: {f16 d; f16 dmin; u8 scales[12]; u8 qs[128]}, 8 sub-blocks of 32
        b = raw.reshape(-1, 144)
        sc, m = _scales_and_mins(b)
        return Blocks(_k_nibbles(b[:, 16:]).astype(np.int8).reshape(out, n), sc.reshape(out, -1), m.reshape(out, -1),
                      FORMATS["q4k"], b[:, :4].copy().view(np.float16).reshape(out, -1, 2))
    if kind == Q.Q5_K:  # 256 values: {f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}: sub-block s's fifth
        b = raw.reshape(-1, 176)  # bits are bit s of qh's 32 bytes
        high = ((b[:, 16:48].reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1) << 4
        scales, mins = _k_scales(b, out)
        q = (_k_nibbles(b[:, 48:]) | high).astype(np.int8).reshape(out, n)
        return Blocks(q, scales, mins, FORMATS["q5m"])
    if kind == Q.Q6_K:  # 256 values: {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}: 16 sub-blocks of 16
        b = raw.reshape(-1, 210)
        low = ((b[:, :128].reshape(-1, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & 0x0F)
        high = (b[:, 128:192].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3
        q = (low.reshape(-1, 8, 32) | high.reshape(-1, 8, 32) << 4).astype(np.int8) - np.int8(32)
        return Blocks(q.reshape(out, n), b[:, 192:208].view(np.int8).reshape(out, -1), None, FORMATS["q6k"],
                      _half(b, 208).reshape(out, -1, 1))
    return rounded_to_q8(dequantize(data, kind).reshape(out, n) if kind not in (Q.F32, Q.F16) else
                         np.asarray(data, np.float32).reshape(out, n))


def rounded_to_q8(w: np.ndarray) -> Blocks:
    """w [out, in] float to Q8 blocks: a float16 scale per block of 32 (its largest |w| over 127), to nearest."""
    out, n = w.shape
    b = np.asarray(w, np.float32).reshape(out, n // BLOCK, BLOCK)
    scales = (np.abs(b).max(axis=-1) / 127.0).astype(np.float16)
    step = scales.astype(np.float32)
    step[step == 0] = 1.0  # an all-zero block stays zero
    q = np.clip(np.rint(b / step[..., None]), -127, 127).astype(np.int8)
    return Blocks(q.reshape(out, n), scales, None, FORMATS["q8"])


class Matrix(ctypes.Structure):
    _fields_ = [("packed", _P), ("inputs", ctypes.c_int64), ("out", ctypes.c_int64), ("format", ctypes.c_int64)]


# A GGUF's embedding rows kept as float32 once read: a step's token is mostly one said before, and reading a row from
# the file's blocks is several array operations (docs/measurements/2026-12-06-per-token-python.md). The oldest goes
# first; a row of the 1.5B is 6 KB.
EMBEDDING_ROWS_KEPT = 1024
FIELDS = ("q", "k", "v", "o", "gate", "up", "down")  # a layer's matrices in the C struct, in MATRICES' order


class Layer(ctypes.Structure):
    _fields_ = [("attention_norm", _P), ("ffn_norm", _P), ("bias", _P),
                *((name, Matrix) for name in FIELDS),
                ("keys", _P), ("values", _P)]


class Model(ctypes.Structure):
    _fields_ = [*((name, ctypes.c_int64) for name in ("n_layers", "dim", "heads", "kv_heads", "head_dim", "hidden",
                                                      "v_block")),
                ("eps", ctypes.c_float), ("layers", _P), ("cos", _P), ("sin", _P),
                ("angles", ctypes.c_int64), ("slot_count", ctypes.c_int64), ("stride", ctypes.c_int64),
                ("norm", _P), ("output", Matrix)]


class BlocksKernel:
    """blocks.c's functions in the library kernel.py built (with attention.c, whose layer call it makes)."""

    def __init__(self, kernel: Kernel):
        lib = kernel.library
        self.bytes = lib.typewriter_blocks_bytes
        self.bytes.restype, self.bytes.argtypes = ctypes.c_int64, [ctypes.c_int64, ctypes.c_int64, ctypes.c_int]
        self._pack = lib.typewriter_blocks_pack
        self._pack.restype = None
        self._pack.argtypes = [_P, _P, _P, _P, ctypes.c_int64, ctypes.c_int64, ctypes.c_int, _P]
        self._matmul = lib.typewriter_blocks_matmul
        self._matmul.restype = ctypes.c_int
        self._matmul.argtypes = [_P, _P, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int, _P, ctypes.c_int]
        self._layers = lib.typewriter_blocks_layers
        self._layers.restype = ctypes.c_int
        self._layers.argtypes = [ctypes.POINTER(Model), _P, ctypes.c_int, _P, _P, ctypes.c_int]
        self._logits = lib.typewriter_blocks_logits
        self._logits.restype = ctypes.c_int
        self._logits.argtypes = [ctypes.POINTER(Model), _P, ctypes.c_int, _P, ctypes.c_int]
        self._lib = lib
        lib.typewriter_blocks_set_wide.argtypes = [ctypes.c_int]

    @property
    def wide(self) -> bool:
        return bool(self._lib.typewriter_blocks_wide())

    def set_wide(self, on: bool) -> None:
        """AVX-512 VNNI where the CPU has it (the default), or keep to AVX2 (tests): the same bits either way."""
        self._lib.typewriter_blocks_set_wide(int(on))

    def pack(self, blocks: Blocks) -> PackedMatrix:
        out, n = blocks.q.shape
        size = self.bytes(n, out, blocks.format)
        if size == 0:
            raise ModelFormatError(f"q4-blocks takes matrices of a multiple of {BLOCK} inputs, not {n}")
        packed = np.empty(size, np.uint8)
        q, scales, mins, supers = blocks.q, blocks.scales, blocks.mins, blocks.supers
        if blocks.format == FORMATS["q6k"]:  # each block's halves' scales, where Q4K has minimums
            scales, mins = scales[:, 0::2], scales[:, 1::2]
        kind = {FORMATS["q4k"]: np.uint8, FORMATS["q6k"]: np.int8}.get(blocks.format, np.float16)
        if (supers is None) != (kind is np.float16):
            raise ValueError(f"format {blocks.format} {'takes' if supers is None else 'has no'} super-blocks")
        q, scales = np.ascontiguousarray(q, np.int8), np.ascontiguousarray(scales, kind)
        mins = None if mins is None else np.ascontiguousarray(mins, kind)
        supers = None if supers is None else np.ascontiguousarray(supers, np.float16)
        self._pack(q.ctypes.data, scales.ctypes.data, None if mins is None else mins.ctypes.data,
                   None if supers is None else supers.ctypes.data, n, out, blocks.format, packed.ctypes.data)
        return PackedMatrix(packed, n, out, blocks.format)

    def matmul(self, m: PackedMatrix, x: np.ndarray, threads: int = 1) -> np.ndarray:
        """x [rows, in] float32 -> [rows, out]."""
        x = np.ascontiguousarray(x, np.float32)
        if x.ndim != 2 or x.shape[1] != m.inputs:
            raise ValueError(f"rows {x.shape} do not fit a matrix of {m.inputs} inputs")
        y = np.empty((x.shape[0], m.out), np.float32)
        if self._matmul(m.packed.ctypes.data, x.ctypes.data, x.shape[0], m.inputs, m.out, m.format, y.ctypes.data,
                        threads):
            raise MemoryError("the blocks kernel is out of memory")
        return y

    def layers(self, model: Model, x: np.ndarray, slots_at: int, positions_at: int, rows: int, threads: int) -> None:
        _status(self._layers(ctypes.byref(model), x.ctypes.data, rows, slots_at, positions_at, threads))

    def logits(self, model: Model, x: np.ndarray, vocab: int, threads: int) -> np.ndarray:
        x = np.ascontiguousarray(x, np.float32)
        out = np.empty((x.shape[0], vocab), np.float32)
        _status(self._logits(ctypes.byref(model), x.ctypes.data, x.shape[0], out.ctypes.data, threads))
        return out


@dataclass(frozen=True)
class PackedMatrix:
    packed: np.ndarray  # uint8, blocks.c's layout
    inputs: int
    out: int
    format: int

    def struct(self) -> Matrix:
        return Matrix(self.packed.ctypes.data, self.inputs, self.out, self.format)


@dataclass(frozen=True)
class PackedLayer:
    matrices: dict[str, PackedMatrix]  # by MATRICES' names
    attention_norm: np.ndarray  # [d] float32
    ffn_norm: np.ndarray
    bias: np.ndarray | None  # q, k and v's biases [(h + 2k) e], where the model has them


def _status(status: int) -> None:
    if status == -1:
        raise ValueError("the attention kernel takes heads of a multiple of 16 channels")
    if status == -2:
        raise MemoryError("the blocks kernel is out of memory")
    if status == -3:
        raise IndexError("a slot or position is outside the cache (or past its RoPE angles)")


def _shape(cfg: ModelConfig, name: str) -> tuple[int, int]:
    """(inputs, outputs) of a matrix by `BlockModel.matrices()`' name."""
    q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    shapes = {"wq": (cfg.dim, q), "wk": (cfg.dim, kv), "wv": (cfg.dim, kv), "wo": (q, cfg.dim),
              "w_gate": (cfg.dim, cfg.hidden_dim), "w_up": (cfg.dim, cfg.hidden_dim),
              "w_down": (cfg.hidden_dim, cfg.dim), "output": (cfg.dim, cfg.vocab_size)}
    return shapes[name.rsplit(".", 1)[-1]]


class BlockModel:
    """Every matrix of a Llama-family model packed for blocks.c, its norms and biases as float32, and the token
    embeddings read a row at a time. `bind` points it at a HostCache's K/V arrays."""

    def __init__(self, cfg: ModelConfig, weights: Mapping[str, np.ndarray], kernel: Kernel,
                 packed: Mapping[str, PackedMatrix] | None = None,
                 progress: Callable[[int, int], None] = lambda done, total: None,
                 check: Callable[[], bool] | None = None,
                 repacked: Callable[[BlockModel], object] = lambda blocks: None):
        """`packed`: the matrices packed before (blocks_cache.py), by `matrices()`' names, each checked against the
        model's shapes (ValueError); else packed here, a layer at a time, `progress(layers done, layers)` after each.
        `check`: whether `packed`'s bytes are undamaged, asked (and waited for) before the kernel first reads them;
        where not, every matrix is packed again from `weights` then and handed to `repacked` (to keep)."""
        self.cfg, self.kernel = cfg, BlocksKernel(kernel)
        self._weights = weights
        gguf = weights.src if isinstance(weights, WeightReader) and isinstance(weights.src, GGUFFile) else None
        self._gguf = gguf
        self._check, self._repacked, self._checking = check if packed is not None else None, repacked, threading.Lock()
        self._pack(packed, progress)
        self._embeddings = None if gguf is not None else np.ascontiguousarray(weights["tok_embeddings"], np.float32)
        self._rows_kept: dict[int, np.ndarray] = {}  # a GGUF's: id -> [d] float32, EMBEDDING_ROWS_KEPT at most
        # V is cached as int8-lite's programs cache it: rotated inside blocks of the head's Hadamard (layers.py)
        self.v_block = Rotation.of(cfg.head_dim).b
        self._model: Model | None = None
        self._bound: tuple[object, HostCache] | None = None

    def _pack(self, packed: Mapping[str, PackedMatrix] | None, progress: Callable[[int, int], None]) -> None:
        cfg, weights = self.cfg, self._weights

        def matrix(name: str, stored: str | None = None) -> PackedMatrix:
            """`stored`: the weights' name for it, where that is not `name`."""
            if packed is None:
                return self.kernel.pack(self._blocks(stored or name))
            if name not in packed:
                raise ValueError(f"no packed {name}")
            m, (inputs, out) = packed[name], _shape(cfg, name)
            if (m.inputs, m.out) != (inputs, out) or m.packed.nbytes != self.kernel.bytes(inputs, out, m.format):
                raise ValueError(f"the packed {name} is {m.inputs} x {m.out} in {m.packed.nbytes} bytes, not the "
                                 f"model's {inputs} x {out} in format {m.format}")
            return m

        def floats(name: str) -> np.ndarray:
            return np.ascontiguousarray(weights[name], np.float32)

        self.layers: list[PackedLayer] = []
        for i in range(cfg.n_layers):
            self.layers.append(PackedLayer({m: matrix(f"layers.{i}.{m}") for m in MATRICES},
                                           floats(f"layers.{i}.attention_norm"), floats(f"layers.{i}.ffn_norm"),
                                           np.concatenate([floats(f"layers.{i}.{b}") for b in ("bq", "bk", "bv")])
                                           if cfg.qkv_bias else None))
            if packed is None:
                progress(i + 1, cfg.n_layers)
        self.norm = floats("norm")
        self.output = matrix("output", "tok_embeddings" if cfg.tie_embeddings else "output")

    def _checked(self) -> None:
        """Before the kernel's first read of packed blocks: their check, and where it fails, blocks packed again
        (and bound again, where bound)."""
        with self._checking:
            if self._check is None:  # checked on another thread meanwhile
                return
            if not self._check():
                self._pack(None, lambda done, total: None)
                if self._bound is not None:
                    self.bind(self._bound[1])
                self._repacked(self)
            self._check = None  # only now: another thread's read must wait for the blocks packed again

    @property
    def nbytes(self) -> int:
        return sum(m.packed.nbytes for _, m in self.matrices())

    def matrices(self) -> list[tuple[str, PackedMatrix]]:
        """Every packed matrix by its name, in the order they are packed (and read a step)."""
        return [*((f"layers.{i}.{m}", layer.matrices[m]) for i, layer in enumerate(self.layers) for m in MATRICES),
                ("output", self.output)]

    def _blocks(self, name: str) -> Blocks:
        w = self._weights
        if self._gguf is None or not isinstance(w, WeightReader):
            return rounded_to_q8(np.asarray(w[name], np.float32))
        stored = w.stored[name]
        t = self._gguf.tensors[stored]
        out, n = (int(d) for d in reversed(t.shape))
        data = t.data
        if self._gguf.arch in PERMUTED_QK and (".attn_q." in stored or ".attn_k." in stored):
            heads = self.cfg.n_heads if ".attn_q." in stored else self.cfg.n_kv_heads
            data = data[unpermute_rotary(np.arange(out), heads)]  # whole rows: the blocks move as they are
        blocks = blocks_of(data, t.tensor_type, out, n)
        w.canonical(name, np.empty(blocks.q.shape, np.int8))  # the name table's shape check, loud
        return blocks

    def embed(self, ids: Sequence[int]) -> np.ndarray:
        """[n, d] float32: the file's embedding rows as stored (not rotated: the kernel reads the plain stream)."""
        if self._embeddings is not None:
            return np.ascontiguousarray(self._embeddings[np.asarray(ids, np.int64)])
        out = np.empty((len(ids), self.cfg.dim), np.float32)
        for k, token_id in enumerate(ids):
            out[k] = self._row(int(token_id))
        return out

    def _row(self, token_id: int) -> np.ndarray:
        kept = self._rows_kept
        if (row := kept.get(token_id)) is None:
            assert isinstance(self._weights, WeightReader)
            row = self._weights.rows("tok_embeddings", token_id, token_id + 1).reshape(-1).astype(np.float32)
            if len(kept) >= EMBEDDING_ROWS_KEPT:
                del kept[next(iter(kept))]
            kept[token_id] = row
        return row

    def bind(self, cache: HostCache) -> None:
        """The kernel's view of the model, writing into `cache` (made again when the runner's cache is)."""
        cfg = self.cfg
        structs = (Layer * cfg.n_layers)()
        for i, layer in enumerate(self.layers):
            s = structs[i]
            s.attention_norm, s.ffn_norm = layer.attention_norm.ctypes.data, layer.ffn_norm.ctypes.data
            s.bias = None if layer.bias is None else layer.bias.ctypes.data
            for field, name in zip(FIELDS, MATRICES):
                setattr(s, field, layer.matrices[name].struct())
            s.keys, s.values = cache.k[i].ctypes.data, cache.v[i].ctypes.data
        values = cache.v[0]
        self._model = Model(cfg.n_layers, cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.hidden_dim,
                            self.v_block, cfg.norm_eps, ctypes.addressof(structs), cache.cos.ctypes.data,
                            cache.sin.ctypes.data, len(cache.cos), values.shape[0], values.shape[2],
                            self.norm.ctypes.data, self.output.struct())
        self._bound = (structs, cache)  # alive while C reads them

    def forward(self, x: np.ndarray, slots_at: int, positions_at: int, rows: int, threads: int) -> None:
        """Every layer on x [rows, d] (contiguous float32, updated in place)."""
        if self._check is not None:
            self._checked()
        assert self._model is not None, "bind the model to a cache first"
        self.kernel.layers(self._model, x, slots_at, positions_at, rows, threads)

    def logits(self, x: np.ndarray, threads: int) -> np.ndarray:
        if self._check is not None:
            self._checked()
        assert self._model is not None, "bind the model to a cache first"
        return self.kernel.logits(self._model, x, self.cfg.vocab_size, threads)
