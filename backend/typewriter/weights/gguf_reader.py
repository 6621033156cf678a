"""The GGUF container: its metadata and where each tensor lies, read in one pass over the header with `struct` and
the tensors memory-mapped, where gguf-py's reader makes a numpy view per field part, a large part of a start
(docs/measurements/2026-12-02-start-up-and-memory.md). Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
(versions 2 and 3).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .ggml_types import GGML_QUANT_SIZES, GGMLQuantizationType

MAGIC = b"GGUF"
# value type -> struct format of one scalar (8: string, 9: array)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_NUMPY = {"B": np.uint8, "b": np.int8, "H": np.uint16, "h": np.int16, "I": np.uint32, "i": np.int32,
          "f": np.float32, "?": np.bool_, "Q": np.uint64, "q": np.int64, "d": np.float64}
# tensors stored as plain numbers come back typed; quantized ones as the raw bytes of each row
_PLAIN = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16,
          GGMLQuantizationType.F64: np.float64, GGMLQuantizationType.I8: np.int8,
          GGMLQuantizationType.I16: np.int16, GGMLQuantizationType.I32: np.int32,
          GGMLQuantizationType.I64: np.int64}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # GGUF order: innermost dimension first
    tensor_type: GGMLQuantizationType
    data: np.ndarray  # a view of the mapped file: numbers [outer..inner], or bytes [outer.., row bytes]


class GGUFFormatError(ValueError):
    pass


_LENGTH = struct.Struct("<Q")


class _Cursor:
    def __init__(self, buf: memoryview, offset: int = 0):
        self.buf, self.at = buf, offset

    def scalar(self, fmt: str) -> Any:
        value = struct.unpack_from("<" + fmt, self.buf, self.at)[0]
        self.at += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.scalar("Q")
        if self.at + n > len(self.buf):
            raise GGUFFormatError(f"a string of {n} bytes at {self.at} runs past the end of the file")
        text = bytes(self.buf[self.at:self.at + n]).decode("utf-8", errors="replace")
        self.at += n
        return text

    def strings(self, n: int) -> list[str]:
        """`string` n times: the walk from length to length in one loop, then the strings' bytes decoded at once with
        a NUL between them (a vocabulary's strings one call at a time were most of the parse; decoding them together
        takes 40% off what is left); one at a time where a string holds a NUL itself."""
        buf, first, length = self.buf, self.at, _LENGTH.unpack_from
        if n > (len(buf) - first) // 8:  # each string holds at least its length: a count no file holds is named here
            raise GGUFFormatError(f"an array of {n} strings at {first} cannot fit in the file")
        starts = [0] * n
        at = first
        for k in range(n):  # a length past the end fails the next unpack (struct.error: the header ends early)
            starts[k] = at
            at += 8 + length(buf, at)[0]
        if at > len(buf):
            raise GGUFFormatError(f"the last of {n} strings from {first} runs past the end of the file")
        self.at = at
        offsets = np.array(starts, np.int64) - first
        data = np.frombuffer(buf, np.uint8, at - first, first).copy()
        keep = np.ones(data.size, bool)
        keep[(offsets[:, None] + np.arange(1, 8)).reshape(-1)] = False  # each length but its first byte, made a NUL
        data[offsets] = 0
        parts = data[keep].tobytes().decode("utf-8", "replace").split("\x00")
        if len(parts) == n + 1:  # a NUL never continues a character, so each string decodes as it would alone
            return parts[1:]
        return [str(buf[start + 8:end], "utf-8", "replace") for start, end in zip(starts, starts[1:] + [at])]

    def value(self, kind: int) -> Any:
        if kind == 8:
            return self.string()
        if kind == 9:
            item, n = self.scalar("I"), self.scalar("Q")
            if item == 8:
                return self.strings(n)
            if item == 9:
                return [self.value(9) for _ in range(n)]
            fmt = _scalar_format(item)
            values = np.frombuffer(self.buf, _NUMPY[fmt], n, self.at).tolist()
            self.at += n * struct.calcsize(fmt)
            return values
        return self.scalar(_scalar_format(kind))


def _tensor_type(name: str, kind: int) -> GGMLQuantizationType:
    try:
        return GGMLQuantizationType(kind)
    except ValueError:
        raise GGUFFormatError(f"tensor {name} has unknown type {kind}") from None


def _scalar_format(kind: int) -> str:
    if kind not in _SCALARS:
        raise GGUFFormatError(f"unknown metadata value type {kind}")
    return _SCALARS[kind]


class GGUFReader:
    """`fields`: metadata key -> value (str, int, float, bool or a list of them); `tensors`: name -> TensorInfo."""

    def __init__(self, path: str | Path):
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        buf = memoryview(self._map)
        if bytes(buf[:4]) != MAGIC:
            raise GGUFFormatError("no GGUF magic at the start")
        cursor = _Cursor(buf, 4)
        try:
            version = cursor.scalar("I")
            if version not in (2, 3):
                raise GGUFFormatError(f"GGUF version {version} (this reads 2 and 3)")
            n_tensors, n_fields = cursor.scalar("Q"), cursor.scalar("Q")
            self.fields: dict[str, Any] = {}
            for _ in range(n_fields):
                key = cursor.string()
                self.fields[key] = cursor.value(cursor.scalar("I"))
            infos = []
            for _ in range(n_tensors):
                name = cursor.string()
                dims = tuple(cursor.scalar("Q") for _ in range(cursor.scalar("I")))
                kind = cursor.scalar("I")
                infos.append((name, dims, _tensor_type(name, kind), cursor.scalar("Q")))
        except struct.error as e:
            raise GGUFFormatError(f"the header ends early ({e})") from e
        alignment = int(self.fields.get("general.alignment", 32))
        start = -(-cursor.at // alignment) * alignment
        self.tensors = {name: self._tensor(name, dims, kind, start + offset) for name, dims, kind, offset in infos}

    def _tensor(self, name: str, dims: tuple[int, ...], kind: GGMLQuantizationType, offset: int) -> TensorInfo:
        if kind not in GGML_QUANT_SIZES:  # a type gguf-py cannot size: refused by name when it is asked for
            return TensorInfo(name, dims, kind, np.empty(0, np.uint8))
        block, block_bytes = GGML_QUANT_SIZES[kind]
        count = int(np.prod(dims, dtype=np.int64))
        if dims and dims[0] % block:
            raise GGUFFormatError(f"tensor {name}: {dims[0]} values per row is not whole {kind.name} blocks")
        nbytes = count // block * block_bytes
        if offset + nbytes > len(self._map):
            raise GGUFFormatError(f"tensor {name} runs past the end of the file")
        outer = tuple(reversed(dims[1:]))
        if kind in _PLAIN:
            data = np.frombuffer(self._map, _PLAIN[kind], count, offset).reshape(*outer, dims[0] if dims else 1)
        else:
            data = np.frombuffer(self._map, np.uint8, nbytes, offset).reshape(*outer, dims[0] // block * block_bytes)
        return TensorInfo(name, dims, kind, data)
