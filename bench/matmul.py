"""The output projection [b, 576] x [576, 49152] under XLA on this CPU: why the model stores it [d, v] in fp32.

    .venv/bin/python bench/matmul.py

Prints milliseconds per call for the transposed [v, d] layout, the [d, v] layout, and bfloat16 weights (cast to
fp32 inside the step, or multiplied in bfloat16), at batch 1 and 4. Compare within one run.
"""

from __future__ import annotations

import time

from typewriter.runners.xla.tf_env import prepare_environment


def main() -> None:
    prepare_environment(None)
    from typewriter.runners.xla.tf_env import import_tensorflow

    tf = import_tensorflow()
    w_vd = tf.Variable(tf.random.normal([49152, 576]))
    w_dv = tf.Variable(tf.random.normal([576, 49152]))
    w_bf16 = tf.Variable(tf.cast(tf.random.normal([576, 49152]), tf.bfloat16))
    variants = {
        "[v, d] transposed": lambda x: tf.matmul(x, w_vd, transpose_b=True),
        "[d, v]": lambda x: tf.matmul(x, w_dv),
        "bf16 cast to fp32": lambda x: tf.matmul(x, tf.cast(w_bf16, tf.float32)),
        "bf16 matmul": lambda x: tf.cast(tf.matmul(tf.cast(x, tf.bfloat16), w_bf16), tf.float32),
    }
    for batch in (1, 4):
        x = tf.random.normal([batch, 576])
        row = []
        for name, fn in variants.items():
            step = tf.function(fn, jit_compile=True)
            step(x).numpy()
            t0 = time.perf_counter()
            for _ in range(40):
                step(x).numpy()
            row.append(f"{name} {(time.perf_counter() - t0) / 40 * 1000:.2f} ms")
        print(f"batch {batch}: " + ", ".join(row), flush=True)


if __name__ == "__main__":
    main()
