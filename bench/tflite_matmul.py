"""One decode step's matmuls (30 layers of SmolLM2-135M's shapes and the [576, 49152] output projection) under
XLA fp32, against the same matmuls as one TensorFlow Lite program with int8 weights run by XNNPACK: the lead for
issue 9's single stream and issue 8's batched decode.

    .venv/bin/python bench/tflite_matmul.py [--rows 1,2,8,64]

The TensorFlow Lite program is written directly as a flatbuffer (FULLY_CONNECTED ops, int8 weights with one
scale per output channel, float inputs that XNNPACK quantizes per row): far faster than tf.lite.TFLiteConverter
(docs/measurements/2026-12-01-weight-formats.md). Weights are random at the model's shapes (speed does not
depend on their values); quality is not measured here. Prints milliseconds per call, medians, in one run.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from steps import median_ms

LAYERS = 30
# (inputs, outputs) of each layer's matrices in the order a layer uses them: qkv, o, gate, up, down
LAYER_SHAPES = ((576, 960), (576, 576), (576, 1536), (576, 1536), (1536, 576))
OUTPUT = (576, 49152)


def random_weights(rng) -> list[np.ndarray]:
    shapes = [s for _ in range(LAYERS) for s in LAYER_SHAPES] + [OUTPUT]
    return [rng.standard_normal(s, dtype=np.float32) * 0.02 for s in shapes]


def xla_program(tf, weights):
    ws = [tf.Variable(w) for w in weights]

    @tf.function(jit_compile=True, autograph=False)
    def step(x):
        for layer in range(LAYERS):
            qkv, o, gate, up, down = ws[layer * 5:layer * 5 + 5]
            a = x @ o + tf.reduce_sum(x @ qkv, -1, keepdims=True) * 1e-6
            x = (a @ gate) * (a @ up) @ down
        return x @ ws[-1]

    return step


def tflite_program(weights, rows: int) -> bytes:
    """The same chain as xla_program (without its elementwise ops) as a TensorFlow Lite flatbuffer."""
    import flatbuffers
    from tensorflow.lite.python import schema_py_generated as schema

    model = schema.ModelT()
    model.version = 3
    code = schema.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = schema.BuiltinOperator.FULLY_CONNECTED
    code.version = 1
    model.operatorCodes, model.buffers = [code], [schema.BufferT()]
    graph = schema.SubGraphT()
    graph.tensors, graph.operators = [], []

    def tensor(shape, kind, data=None, quantization=None) -> int:
        t = schema.TensorT()
        t.shape, t.type, t.name, t.buffer, t.quantization = list(shape), kind, f"t{len(graph.tensors)}", 0, quantization
        if data is not None:
            buffer = schema.BufferT()
            buffer.data = data.reshape(-1).view(np.uint8)
            model.buffers.append(buffer)
            t.buffer = len(model.buffers) - 1
        graph.tensors.append(t)
        return len(graph.tensors) - 1

    def fully_connected(x: int, w: np.ndarray) -> int:
        scale = np.maximum(np.abs(w).max(axis=0), 1e-12) / 127.0
        q = schema.QuantizationParametersT()
        q.scale, q.zeroPoint, q.quantizedDimension = scale.tolist(), [0] * len(scale), 0
        w8 = np.ascontiguousarray(np.clip(np.round(w / scale), -127, 127).astype(np.int8).T)  # [out, in]
        y = tensor([rows, w.shape[1]], schema.TensorType.FLOAT32)
        op = schema.OperatorT()
        op.opcodeIndex, op.outputs = 0, [y]
        op.inputs = [x, tensor(w8.shape, schema.TensorType.INT8, w8, q), -1]
        op.builtinOptionsType = schema.BuiltinOptions.FullyConnectedOptions
        op.builtinOptions = schema.FullyConnectedOptionsT()
        op.builtinOptions.asymmetricQuantizeInputs = True
        graph.operators.append(op)
        return y

    x = graph_input = tensor([rows, OUTPUT[0]], schema.TensorType.FLOAT32)
    side = []  # outputs nothing else reads: kept as graph outputs so nothing is pruned
    for layer in range(LAYERS):
        qkv, o, gate, up, down = weights[layer * 5:layer * 5 + 5]
        side.append(fully_connected(x, qkv))
        a = fully_connected(x, o)
        side.append(fully_connected(a, up))
        x = fully_connected(fully_connected(a, gate), down)
    graph.inputs, graph.outputs = [graph_input], [fully_connected(x, weights[-1]), *side]
    model.subgraphs = [graph]
    builder = flatbuffers.Builder(1 << 20)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="1,2,8,64", help="comma-separated rows per call")
    args = parser.parse_args()
    from typewriter.runners.xla.tf_env import import_tensorflow, prepare_environment

    prepare_environment(None)
    tf = import_tensorflow()
    rng = np.random.default_rng(0)
    weights = random_weights(rng)
    xla = xla_program(tf, weights)
    for rows in (int(r) for r in args.rows.split(",")):
        x = rng.standard_normal((rows, OUTPUT[0]), dtype=np.float32)
        t0 = time.perf_counter()
        flatbuffer = tflite_program(weights, rows)
        t1 = time.perf_counter()
        interpreter = tf.lite.Interpreter(model_content=flatbuffer, num_threads=2)
        interpreter.allocate_tensors()
        t2 = time.perf_counter()
        index = interpreter.get_input_details()[0]["index"]

        def lite():
            interpreter.set_tensor(index, x)
            interpreter.invoke()

        xla_ms, lite_ms = median_ms(lambda: xla(tf.constant(x)).numpy(), 15), median_ms(lite, 15)
        print(json.dumps({"rows": rows, "xla_fp32_ms": xla_ms, "tflite_int8_ms": lite_ms,
                          "ratio": round(xla_ms / lite_ms, 2), "tflite_build_s": round(t1 - t0, 2),
                          "tflite_load_s": round(t2 - t1, 2), "tflite_mb": round(len(flatbuffer) / 1e6)}),
              flush=True)


if __name__ == "__main__":
    main()
