"""The model's non-linear functions, spelled with TensorFlow ops that XLA lowers directly.

TensorFlow 2.21 lowers Exp, Rsqrt, Sigmoid, Tanh, Softmax and Abs (the ops behind tf.nn.silu, tf.nn.gelu,
tf.math.rsqrt, tf.nn.softmax and tf.abs) to XLA through MlirXlaOpKernel: every occurrence builds a one-op graph and
runs an MLIR pass pipeline over it. The model has four per layer, 121 in a program, and they took about 2 s of each
program's start here, warm XLA cache or not (a decode program's first call: 4.1 s, 2.3 s with these spellings;
perf put a quarter of it in MlirXlaOpKernel). The ops below lower through TensorFlow's own XLA kernels to the same
XLA operations:

- SoftplusGrad(g, x) is g * logistic(x) in XLA (tf2xla/kernels/binary_ops.cc);
- SoftmaxCrossEntropyWithLogits returns, beside the loss (unused, so XLA drops it), softmax(logits) - labels;
  with zero labels that is the softmax (exp of the max-shifted logits over their sum), and XLA folds the "- 0";
- Pow is XLA's pow, for the reciprocal square root; Maximum and Neg make the absolute value.

Run eagerly (reference runs, tests) they compute the same functions. The one cost: XLA gives this softmax's max
one more pass than tf.nn.softmax's, so the softmax alone takes about 20% longer (a compiled softmax of [1, 3, 3,
256, 2048] scores, a 256-token chunk's over 2,048 positions: 15 ms against 12.3, median of 15).
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


def abs(x: tf.Tensor) -> tf.Tensor:  # noqa: A001 (the name of the function it replaces)
    return tf.maximum(x, -x)


def rsqrt(x: tf.Tensor) -> tf.Tensor:
    return tf.pow(x, tf.constant(-0.5, x.dtype))


def softmax(x: tf.Tensor) -> tf.Tensor:
    """Softmax over the last axis."""
    shape = tf.shape(x)
    rows = tf.reshape(x, [-1, shape[-1]])  # the op takes [rows, classes]
    # The labels broadcast: zeros of the scores' own shape were a constant that TensorFlow's graph optimizer
    # materialized and kept with every program (a 256-token chunk over 2,048 positions: 19 MB a layer, 570 MB)
    _, probs = tf.raw_ops.SoftmaxCrossEntropyWithLogits(features=rows, labels=tf.zeros([1, 1], x.dtype))
    probs = tf.reshape(probs, shape)
    probs.set_shape(x.shape)
    return probs
