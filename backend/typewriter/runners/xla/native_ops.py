"""The model's non-linear functions, spelled with TensorFlow ops that XLA lowers directly.

TensorFlow 2.21 lowers Exp, Rsqrt, Sigmoid, Tanh, Softmax and Abs (the ops behind tf.nn.silu, tf.nn.gelu,
tf.math.rsqrt, tf.nn.softmax and tf.abs) to XLA through MlirXlaOpKernel: every occurrence builds a one-op graph and
runs an MLIR pass pipeline over it. The model has four per layer, 121 in a program, and they were a large part of
each program's start, warm XLA cache or not (docs/measurements/2026-12-02-start-up-and-memory.md). The ops below
lower through TensorFlow's own XLA kernels to the same XLA operations:

- SoftplusGrad(g, x) is g * logistic(x) in XLA (tf2xla/kernels/binary_ops.cc);
- SoftmaxCrossEntropyWithLogits returns, beside the loss (unused, so XLA drops it), softmax(logits) - labels;
  with zero labels that is the softmax (exp of the max-shifted logits over their sum), and XLA folds the "- 0";
- Pow is XLA's pow, for the reciprocal square root; Maximum and Neg make the absolute value.

Run eagerly (reference runs, tests) they compute the same functions. The one cost: XLA gives this softmax's max
one more pass than tf.nn.softmax's, so the softmax alone takes somewhat longer (the same study).
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
    """Softmax over the last axis."""
    shape = tf.shape(x)
    rows = tf.reshape(x, [-1, shape[-1]])  # the op takes [rows, classes]
    # The labels broadcast: zeros of the scores' own shape were a constant that TensorFlow's graph optimizer
    # materialized and kept with every program, large for a long chunk's scores
    # (docs/measurements/2026-12-02-start-up-and-memory.md)
    _, probs = tf.raw_ops.SoftmaxCrossEntropyWithLogits(features=rows, labels=tf.zeros([1, 1], x.dtype))
    probs = tf.reshape(probs, shape)
    probs.set_shape(x.shape)
    return probs
