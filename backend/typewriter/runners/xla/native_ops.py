"""The model's non-linear functions, spelled with ops that lower to XLA through TensorFlow's own kernels rather than
a per-op MLIR pipeline, which was a large part of each program's start
(docs/measurements/2026-12-02-start-up-and-memory.md). Run eagerly they compute the same functions:

- SoftplusGrad(g, x) is g * logistic(x) in XLA (tf2xla/kernels/binary_ops.cc);
- SoftmaxCrossEntropyWithLogits with zero labels returns the softmax beside a loss XLA drops;
- Pow makes the reciprocal square root; Maximum and Neg the absolute value.
"""

from __future__ import annotations

import math

import tensorflow as tf


def silu(x: tf.Tensor) -> tf.Tensor:
    """x * sigmoid(x)."""
    return tf.raw_ops.SoftplusGrad(gradients=x, features=x)


def gelu_tanh(x: tf.Tensor) -> tf.Tensor:
    """GELU with the tanh approximation, 0.5 x (1 + tanh(z)) = x sigmoid(2z), z = sqrt(2/pi) (x + 0.044715 x^3)."""
    z = math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)
    return tf.raw_ops.SoftplusGrad(gradients=x, features=2.0 * z)


def abs(x: tf.Tensor) -> tf.Tensor:
    return tf.maximum(x, -x)


def rsqrt(x: tf.Tensor) -> tf.Tensor:
    return tf.pow(x, tf.constant(-0.5, x.dtype))


def softmax(x: tf.Tensor) -> tf.Tensor:
    shape = tf.shape(x)
    rows = tf.reshape(x, [-1, shape[-1]])  # the op takes [rows, classes]
    # Labels that broadcast: zeros of the scores' shape would be a constant kept with every program.
    _, probs = tf.raw_ops.SoftmaxCrossEntropyWithLogits(features=rows, labels=tf.zeros([1, 1], x.dtype))
    probs = tf.reshape(probs, shape)
    probs.set_shape(x.shape)
    return probs
