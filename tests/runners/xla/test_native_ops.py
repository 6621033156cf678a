"""The model's non-linear functions equal TensorFlow's own, eagerly and compiled, and no compiled program holds an
op that TensorFlow lowers to XLA one op at a time through MLIR (each cost about 15 ms of every program's start)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tiny_model import gpt2_config, random_gpt2_weights, random_weights, tiny_config, write_gpt2_gguf

from typewriter.runners.xla import native_ops
from typewriter.runners.xla.runner import XlaRunner
from typewriter.runners.xla.start import build_model
from typewriter.weights import load_weights

# The ops a model could plausibly use that tf2xla registers with MlirXlaOpKernel (TensorFlow 2.21's
# tf2xla/kernels: unary_ops.cc, softmax_op.cc, relu_op.cc, gather_op.cc).
LOWERED_THROUGH_MLIR = {
    "Exp", "Expm1", "Log1p", "Rsqrt", "Sqrt", "Reciprocal", "Sigmoid", "Tanh", "Cos", "Cosh", "Sinh", "Abs",
    "Floor", "Ceil", "Sign", "Softmax", "LogSoftmax", "Relu", "Relu6", "Gather",
}

X = np.concatenate([np.linspace(-40, 40, 161), [-1e4, -88.0, 0.0, 1e-6, 88.0, 1e4]]).astype(np.float32)


def _both(fn):
    """fn eagerly and under XLA."""
    return fn, tf.function(fn, jit_compile=True, autograph=False)


@pytest.mark.parametrize("compiled", [False, True])
def test_silu_and_gelu_equal_tensorflows(compiled):
    silu, gelu = (_both(f)[compiled] for f in (native_ops.silu, native_ops.gelu_tanh))
    np.testing.assert_allclose(silu(X), tf.nn.silu(X), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(gelu(X), tf.nn.gelu(X, approximate=True), rtol=1e-6, atol=1e-6)


def test_softmax_makes_no_constant_or_fill_the_size_of_its_input():
    """Zeros of the scores' shape, as the op's labels, were folded by TensorFlow's graph optimizer into a constant
    that each program kept: 19 MB a layer for a 256-token chunk over 2,048 positions, 1.1 GB for that program."""
    scores = tf.TensorSpec([3, 3, 256, 2048], tf.float32)
    graph = tf.function(native_ops.softmax, autograph=False).get_concrete_function(scores).graph
    size = scores.shape.num_elements()
    made = [op.type for op in graph.get_operations() if op.type not in ("Placeholder", "Reshape", "Identity")
            and any(out.shape.is_fully_defined() and out.shape.num_elements() >= size for out in op.outputs)]
    assert made == ["SoftmaxCrossEntropyWithLogits"], made


@pytest.mark.parametrize("compiled", [False, True])
def test_rsqrt_is_as_exact_as_tensorflows(compiled):
    """Against the float64 value, not tf.math.rsqrt: TensorFlow's own eager rsqrt is 1.4e-7 off on an Intel
    Sapphire Rapids (AVX-512), ours 0.9e-7 the other way, so the two differ by more than either errs."""
    rsqrt = _both(native_ops.rsqrt)[compiled]
    x = np.abs(X) + 1e-6
    exact = 1 / np.sqrt(x.astype(np.float64))
    np.testing.assert_allclose(np.asarray(rsqrt(x), np.float64), exact, rtol=2e-7)
    np.testing.assert_allclose(np.asarray(tf.math.rsqrt(x), np.float64), exact, rtol=2e-7)  # the bound TF meets


@pytest.mark.parametrize("compiled", [False, True])
def test_softmax_equals_tensorflows_over_the_last_axis_with_masked_scores(compiled):
    softmax = _both(native_ops.softmax)[compiled]
    rng = np.random.default_rng(0)
    scores = rng.normal(0, 8, [2, 3, 4, 5, 37]).astype(np.float32)
    scores[..., 20:] = np.finfo(np.float32).min  # masked positions, as the model's attention writes them
    scores[0, 0, 0, 0, :] = np.finfo(np.float32).min  # a row with nothing to attend to: uniform, not NaN
    out = softmax(scores).numpy()
    assert out.shape == scores.shape
    np.testing.assert_allclose(out, tf.nn.softmax(scores, axis=-1), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(out[0, 0, 0, 0], 1 / 37, rtol=1e-6)
    assert np.all(out[..., 20:].reshape(-1, 17)[1:] == 0)


def _ops(concrete) -> set[str]:
    graph = concrete.graph.as_graph_def()
    return {n.op for n in graph.node} | {n.op for f in graph.library.function for n in f.node_def}


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("weight_format", ["fp32", "int8"])
def test_no_program_holds_an_op_lowered_one_at_a_time_through_mlir(family, weight_format, tmp_path):
    if family == "llama":
        cfg = tiny_config()
        weights = random_weights(cfg)
    else:  # through a file: the canonical names are the loader's
        path = write_gpt2_gguf(tmp_path / "gpt2.gguf", gpt2_config(), random_gpt2_weights(gpt2_config()))
        cfg, weights = load_weights(path)
    model = build_model(cfg, weights, slots=4, max_len=32, max_chunk=8, kv_buckets=(16, 32),
                        weight_format=weight_format)
    runner = XlaRunner(model, chunk_buckets=(8,), batch_buckets=(1, 4))
    for key in runner.compiler.programs():
        ops = _ops(runner.compiler.fn(key).get_concrete_function(*runner.compiler._idle_args(key)))
        assert "SoftplusGrad" in ops or key[0] == "copy"  # the check sees into the layers' functions
        assert not ops & LOWERED_THROUGH_MLIR, key
