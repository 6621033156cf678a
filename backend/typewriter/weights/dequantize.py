"""GGUF tensor data to float32. Float32 and float16 as they are; llama.cpp's 32-value block types that small models
use most (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) in a few passes over the whole tensor, where gguf-py goes row by row, slower
(docs/measurements/2026-12-02-start-up-and-memory.md); gguf-py does the rest. The values are the same bit for bit.
"""

from __future__ import annotations

import numpy as np

from .ggml_types import GGML_QUANT_SIZES
from .ggml_types import GGMLQuantizationType as Q


def _half(blocks: np.ndarray, at: int) -> np.ndarray:
    """The float16 at byte `at` of each block, as float32 [n, 1]."""
    return blocks[:, at:at + 2].copy().view(np.float16).astype(np.float32)


def _nibbles(blocks: np.ndarray, at: int) -> np.ndarray:
    """[n, 32] float32: each block's 16 bytes from `at`, low 4 bits as values 0-15, high 4 bits as 16-31."""
    qs = blocks[:, at:at + 16]
    out = np.empty((blocks.shape[0], 2, 16), np.float32)
    np.bitwise_and(qs, 0x0F, out=out[:, 0], casting="unsafe")  # bit operations straight into float32: no
    np.right_shift(qs, 4, out=out[:, 1], casting="unsafe")  # table, no uint8 temporary
    return out.reshape(-1, 32)


def _q4_0(blocks: np.ndarray) -> np.ndarray:  # {f16 d; u8 qs[16]}: (q - 8) * d
    out = _nibbles(blocks, 2)
    out -= 8.0
    out *= _half(blocks, 0)
    return out


def _q4_1(blocks: np.ndarray) -> np.ndarray:  # {f16 d; f16 m; u8 qs[16]}: q * d + m
    out = _nibbles(blocks, 4)
    out *= _half(blocks, 0)
    out += _half(blocks, 2)
    return out


def _q8_0(blocks: np.ndarray) -> np.ndarray:  # {f16 d; i8 qs[32]}: q * d
    out = blocks[:, 2:].view(np.int8).astype(np.float32)
    out *= _half(blocks, 0)
    return out


def _fifth_bits(blocks: np.ndarray, at: int) -> np.ndarray:
    """[n, 32] float32: each block's 32 fifth bits (a little-endian uint32 at byte `at`), as 0 or 16."""
    bits = np.unpackbits(np.ascontiguousarray(blocks[:, at:at + 4]), axis=1, bitorder="little")  # [n, 32]
    return bits.astype(np.float32) * 16.0


def _q5_0(blocks: np.ndarray) -> np.ndarray:  # {f16 d; u8 qh[4]; u8 qs[16]}: ((q | bit << 4) - 16) * d
    out = _nibbles(blocks, 6)
    out += _fifth_bits(blocks, 2)
    out -= 16.0
    out *= _half(blocks, 0)
    return out


def _q5_1(blocks: np.ndarray) -> np.ndarray:  # {f16 d; f16 m; u8 qh[4]; u8 qs[16]}: (q | bit << 4) * d + m
    out = _nibbles(blocks, 8)
    out += _fifth_bits(blocks, 4)
    out *= _half(blocks, 0)
    out += _half(blocks, 2)
    return out


_DECODERS = {Q.Q4_0: _q4_0, Q.Q4_1: _q4_1, Q.Q5_0: _q5_0, Q.Q5_1: _q5_1, Q.Q8_0: _q8_0}


def dequantize(data: np.ndarray, kind: Q) -> np.ndarray:
    """A tensor's data as the mapped file holds it -> float32, flat."""
    if kind in (Q.F32, Q.F16):  # as gguf-py reads them, without its import (40 ms of a start from cached blocks,
        # whose norms are float32: docs/measurements/2026-12-07-check-off-the-path.md)
        return np.asarray(data.view(np.float32 if kind == Q.F32 else np.float16), np.float32).reshape(-1)
    if kind not in _DECODERS:  # imported here: gguf-py is no part of a start from cached blocks
        import gguf
        from gguf.quants import dequantize as gguf_dequantize

        return np.asarray(gguf_dequantize(data, gguf.GGMLQuantizationType(int(kind))), dtype=np.float32).reshape(-1)
    size = GGML_QUANT_SIZES[kind][1]  # bytes a block
    raw = np.ascontiguousarray(data, dtype=np.uint8).reshape(-1)
    if raw.size % size:
        raise ValueError(f"{kind.name} data of {raw.size} bytes is not whole {size}-byte blocks")
    return _DECODERS[kind](raw.reshape(-1, size)).reshape(-1)
