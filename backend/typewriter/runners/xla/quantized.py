"""Weight formats of the model's matrices: fp32, or int8 with one scale per output column (`Int8Matrix`).

An int8 matmul rounds its input rows to int8 too, one scale a row, for XLA's fast CPU dot; a one-row input is
padded to two, as XLA's one-row int8 dot is a slow loop. A few large channels spoil a row's scale for the rest,
so both sides are rotated first, x @ w = (x @ R) @ (R^T @ w), as QuaRot does
(docs/measurements/2026-12-01-weight-formats.md).
"""

from __future__ import annotations

from typing import TypeAlias

import numpy as np
import tensorflow as tf

from ...config import WeightFormat
from ..rotation import INT8_MAX, Rotation, quantize_int8
from . import native_ops
from .host_memory import variable


class Int8Matrix(tf.Module):  # type: ignore[misc]  # tf.Module is Any: TensorFlow ships no type information
    """w [in, out] held rotated, R^T @ w, as int8 values and a float32 scale per output column."""

    def __init__(self, w: np.ndarray, name: str):
        super().__init__(name=name)
        w = np.asarray(w, dtype=np.float32)
        self.rotation = Rotation.of(w.shape[0])
        q, scale = quantize_int8(self.rotation.numpy(w.T).T)  # R^T @ w = (w^T @ R)^T
        self.q = variable(q, f"{name}_q")
        self.scale = variable(scale, f"{name}_scale")

    @property
    def shape(self) -> tf.TensorShape:
        return self.q.shape


FORMATS = (WeightFormat.FP32, WeightFormat.INT8)  # the formats XLA runs
Matrix: TypeAlias = "tf.Variable | Int8Matrix"  # a matrix [in, out] as `matrix` holds it: fp32, or int8


def matrix(w: np.ndarray, name: str, fmt: WeightFormat) -> Matrix:
    """w [in, out] in the weight format `fmt` (one of FORMATS)."""
    fmt = WeightFormat(fmt)
    if fmt is WeightFormat.INT8:
        return Int8Matrix(w, name)
    if fmt is WeightFormat.FP32:
        return variable(w, name, np.float32)
    raise ValueError(f"XLA runs {' and '.join(f.value for f in FORMATS)}, not {fmt.value!r}")


def dense(x: tf.Tensor, w: Matrix) -> tf.Tensor:
    """x [..., in] @ w [in, out] -> [..., out] float32, for either format."""
    if not isinstance(w, Int8Matrix):
        return tf.matmul(x, w)
    lead = tf.shape(x)[:-1]
    rows = tf.reshape(x, [-1, x.shape[-1]])
    one_row = rows.shape[0] == 1
    rows = w.rotation(rows)
    if one_row:
        rows = tf.concat([rows, tf.zeros_like(rows)], axis=0)
    row_scale = tf.reduce_max(native_ops.abs(rows), axis=-1, keepdims=True) / INT8_MAX  # [m, 1]
    row_scale = tf.where(row_scale > 0, row_scale, 1.0)
    rows_q = tf.cast(tf.clip_by_value(tf.round(rows / row_scale), -INT8_MAX, INT8_MAX), tf.int8)
    y = tf.cast(tf.linalg.matmul(rows_q, w.q, output_type=tf.int32), tf.float32) * row_scale * w.scale
    if one_row:
        y = y[:1]
    return tf.reshape(y, tf.concat([lead, [w.shape[1]]], axis=0))


def columns(w: Matrix, index: tf.Tensor) -> tf.Tensor:
    """Columns `index` [...] of w [in, out] as float32 [in, ...] (the tied embedding table's rows)."""
    if not isinstance(w, Int8Matrix):
        return tf.gather(w, index, axis=1)
    rotated = tf.cast(tf.gather(w.q, index, axis=1), tf.float32) * tf.gather(w.scale, index)  # R^T @ w[:, index]
    flat = tf.reshape(tf.transpose(rotated, [*range(1, rotated.shape.rank), 0]), [-1, w.shape[0]])  # [.., in]
    unrotated = w.rotation.inverse(flat)  # w[:, index]^T
    return tf.transpose(tf.reshape(unrotated, tf.concat([tf.shape(index), [w.shape[0]]], 0)),
                        [rotated.shape.rank - 1, *range(rotated.shape.rank - 1)])
