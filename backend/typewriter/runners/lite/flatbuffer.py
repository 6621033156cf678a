"""A TensorFlow Lite program written directly as a flatbuffer with the schema classes LiteRT ships: the converter is
far slower per program than writing the few ops a decoder layer needs (docs/measurements/2026-12-01-weight-formats.md).
Everything is float32 but the int8 weights, which FULLY_CONNECTED multiplies by rows XNNPACK rounds to 8 bits;
`two_pass` sends a row and its rounding error, about 16 bits in all
(docs/measurements/2026-12-04-int8-lite-gptq-16-bit-rows.md).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from ai_edge_litert.schema_py_generated import QuantizationParametersT


def _schema() -> ModuleType:
    return importlib.import_module("ai_edge_litert.schema_py_generated")


class ProgramBuilder:
    """Each method adds an op and returns its output tensor's index. Every activation's first dimension is `rows`,
    which the interpreter may resize."""

    def __init__(self, rows: int):
        s = self.s = _schema()
        self.rows = rows
        self.model = s.ModelT()
        self.model.version = 3
        self.model.operatorCodes, self.model.buffers = [], [s.BufferT()]  # buffer 0: "no data"
        self._codes: dict[int, int] = {}
        self.graph = s.SubGraphT()
        self.graph.tensors, self.graph.operators = [], []
        self.inputs: list[int] = []
        self._two_passes: dict[int, int] = {}  # x -> _two_pass(x)

    def _tensor(self, shape: Sequence[int], kind: int, data: np.ndarray | None = None,
                quantization: QuantizationParametersT | None = None) -> int:
        t = self.s.TensorT()
        t.shape, t.type, t.name = list(shape), kind, f"t{len(self.graph.tensors)}"
        t.buffer, t.quantization = 0, quantization
        if data is not None:
            buffer = self.s.BufferT()
            buffer.data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
            self.model.buffers.append(buffer)
            t.buffer = len(self.model.buffers) - 1
        self.graph.tensors.append(t)
        return len(self.graph.tensors) - 1

    def input(self, width: int) -> int:
        """A float input [rows, width]."""
        index = self._tensor([self.rows, width], self.s.TensorType.FLOAT32)
        self.inputs.append(index)
        return index

    def const(self, value: npt.ArrayLike) -> int:
        value = np.asarray(value)
        kinds = {np.dtype(np.float32): self.s.TensorType.FLOAT32, np.dtype(np.int32): self.s.TensorType.INT32}
        return self._tensor(value.shape, kinds[value.dtype], value)

    def shape(self, tensor: int) -> list[int]:
        return list(self.graph.tensors[tensor].shape)

    def _op(self, code: int, inputs: Sequence[int], shape: Sequence[int], options_type: int | None = None,
            options: object = None) -> int:
        if code not in self._codes:
            c = self.s.OperatorCodeT()
            c.builtinCode, c.deprecatedBuiltinCode, c.version = code, min(code, 127), 1
            self._codes[code] = len(self.model.operatorCodes)
            self.model.operatorCodes.append(c)
        out = self._tensor(shape, self.s.TensorType.FLOAT32)
        op = self.s.OperatorT()
        op.opcodeIndex, op.inputs, op.outputs = self._codes[code], list(inputs), [out]
        if options_type is not None:
            op.builtinOptionsType, op.builtinOptions = options_type, options
        self.graph.operators.append(op)
        return out

    def int8_matmul(self, x: int, q: np.ndarray, scale: np.ndarray, two_pass: bool = False) -> int:
        """x [rows, in] @ (q * scale): q int8 [in, out], scale float32 [out]; rows at 8 bits, or with `two_pass`
        at about 16."""
        if not two_pass:
            return self._int8_rows(x, q, scale)
        rows, out = self.shape(x)[0], q.shape[1]
        padded = np.concatenate([q, np.zeros((2, out), np.int8)])  # the two symmetric channels weigh nothing
        both = self._int8_rows(self._two_pass(x), padded, (scale * 2).astype(np.float32))  # [2 * rows, out]
        return self._reduce(self.s.BuiltinOperator.MEAN, self.reshape(both, [2, -1, out]), 0, [rows, out])

    def _two_pass(self, x: int) -> int:
        """x [rows, in] -> [2 * rows, in + 2]: x with channels +-m (m = 1.001 max|x|), which makes XNNPACK's rounding
        symmetric and so known here, then what that rounding leaves out."""
        if x in self._two_passes:
            return self._two_passes[x]
        s, b = self.s, self.s.BuiltinOperator
        rows, n = self.shape(x)
        m = self._reduce(b.REDUCE_MAX, self._op(b.ABS, [x], [rows, n]), 1, [rows, 1], keep=True)
        m = self.mul(self._op(b.MAXIMUM, [m, self.const(np.array([1e-30], np.float32))], [rows, 1]),
                     self.const(np.array([1.001], np.float32)))  # an all-zero row stays zero, never 0/0
        symmetric = self._concat([x, m, self._op(b.NEG, [m], [rows, 1])], axis=1, shape=[rows, n + 2])
        steps = self._div(self.const(np.array([255.0], np.float32)), self.add(m, m), [rows, 1])  # as XNNPACK
        rounded = self._div(self._op(b.ROUND, [self.mul(symmetric, steps)], [rows, n + 2]), steps, [rows, n + 2])
        error = self._op(b.SUB, [symmetric, rounded], [rows, n + 2], s.BuiltinOptions.SubOptions, s.SubOptionsT())
        self._two_passes[x] = self._concat([symmetric, error], axis=0, shape=[2 * rows, n + 2])
        return self._two_passes[x]

    def _div(self, a: int, b: int, shape: list[int]) -> int:
        return self._op(self.s.BuiltinOperator.DIV, [a, b], shape, self.s.BuiltinOptions.DivOptions,
                        self.s.DivOptionsT())

    def _concat(self, parts: list[int], axis: int, shape: list[int]) -> int:
        options = self.s.ConcatenationOptionsT()
        options.axis = axis
        return self._op(self.s.BuiltinOperator.CONCATENATION, parts, shape,
                        self.s.BuiltinOptions.ConcatenationOptions, options)

    def _reduce(self, code: int, x: int, axis: int, shape: list[int], keep: bool = False) -> int:
        options = self.s.ReducerOptionsT()
        options.keepDims = keep
        return self._op(code, [x, self.const(np.array([axis], np.int32))], shape,
                        self.s.BuiltinOptions.ReducerOptions, options)

    def _int8_rows(self, x: int, q: np.ndarray, scale: np.ndarray) -> int:
        """x [rows, in] @ (q * scale), rows at 8 bits as XNNPACK rounds them (asymmetric, one scale a row)."""
        s = self.s
        quant = s.QuantizationParametersT()
        # Arrays, not lists: the generated Pack writes a list element by element in Python, an array in one copy.
        quant.scale, quant.zeroPoint = np.asarray(scale, np.float32), np.zeros(len(scale), np.int64)
        quant.quantizedDimension = 0
        w = self._tensor(q.shape[::-1], s.TensorType.INT8, np.ascontiguousarray(q.T), quant)  # [out, in]
        options = s.FullyConnectedOptionsT()
        options.asymmetricQuantizeInputs = True
        return self._op(s.BuiltinOperator.FULLY_CONNECTED, [x, w, -1], [self.shape(x)[0], q.shape[1]],
                        s.BuiltinOptions.FullyConnectedOptions, options)

    def matmul(self, x: int, w: np.ndarray) -> int:
        """x [n, in] @ w [in, out], float32 weights."""
        s = self.s
        return self._op(s.BuiltinOperator.FULLY_CONNECTED, [x, self.const(np.ascontiguousarray(w.T)), -1],
                        [self.shape(x)[0], w.shape[1]], s.BuiltinOptions.FullyConnectedOptions,
                        s.FullyConnectedOptionsT())

    def add(self, a: int, b: int) -> int:
        return self._op(self.s.BuiltinOperator.ADD, [a, b], self.shape(a), self.s.BuiltinOptions.AddOptions,
                        self.s.AddOptionsT())

    def mul(self, a: int, b: int) -> int:
        return self._op(self.s.BuiltinOperator.MUL, [a, b], self.shape(a), self.s.BuiltinOptions.MulOptions,
                        self.s.MulOptionsT())

    def sigmoid(self, x: int) -> int:
        return self._op(self.s.BuiltinOperator.LOGISTIC, [x], self.shape(x))

    def reshape(self, x: int, shape: list[int]) -> int:
        """shape may hold one -1 (the rows, which the interpreter may resize)."""
        s = self.s
        options = s.ReshapeOptionsT()
        options.newShape = list(shape)
        known = [n for n in shape if n != -1]
        size = int(np.prod(self.shape(x)))
        static = [size // int(np.prod(known)) if n == -1 else n for n in shape]
        return self._op(s.BuiltinOperator.RESHAPE, [x, self.const(np.array(shape, np.int32))], static,
                        s.BuiltinOptions.ReshapeOptions, options)

    def rms(self, x: int, eps: float) -> int:
        """x * rsqrt(mean(x^2) + eps) over the last axis (no weight: callers fold it into the next matrix)."""
        s = self.s
        mean = self._reduce(s.BuiltinOperator.MEAN, self.mul(x, x), 1, [self.shape(x)[0], 1], keep=True)
        scale = self._op(s.BuiltinOperator.RSQRT, [self.add(mean, self.const(np.array([eps], np.float32)))],
                         [self.shape(x)[0], 1])
        return self.mul(x, scale)

    def finish(self, outputs: list[int]) -> bytes:
        import flatbuffers

        self.graph.inputs, self.graph.outputs = self.inputs, list(outputs)
        self.model.subgraphs = [self.graph]
        # Sized for every buffer at once: the builder doubles its bytearray (a copy each time) when it runs out.
        data = sum(b.data.nbytes for b in self.model.buffers if b.data is not None)
        builder = flatbuffers.Builder(data + (1 << 20))
        builder.Finish(self.model.Pack(builder), file_identifier=b"TFL3")
        return bytes(builder.Output())
