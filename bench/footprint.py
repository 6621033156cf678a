"""What the server's memory is made of, at its defaults (8 slots, 2,048 tokens of context each).

    .venv/bin/python bench/footprint.py [--programs 4] [--weights fp32|int8|int8-lite]

Loads the embedded model as `typewriter serve` does, in steps, printing the process's resident memory after
each (after handing freed heap back with malloc_trim, so it is what stays): Python and TensorFlow imported, the
weights read from the GGUF file (float32 numpy arrays), the TensorFlow variables (the weights, then the K/V
cache), the numpy arrays dropped, then each compiled XLA program (compiled here, with an empty XLA cache folder,
as on a first start). The sizes of the variables are computed from their shapes, beside the measured growth.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import sys
import tempfile
from pathlib import Path


def rss_mb() -> int:
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024
    raise RuntimeError("no VmRSS")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--programs", type=int, default=4, help="programs to compile (default %(default)s)")
    parser.add_argument("--weights", help="weight format (default: the server's)")
    args = parser.parse_args()
    from typewriter.runners.xla.tf_env import import_tensorflow, prepare_environment

    prepare_environment(tempfile.mkdtemp(prefix="typewriter-xla-"))
    rows = [("start (Python)", rss_mb(), "")]
    tf = import_tensorflow()
    from typewriter.config import Settings
    from typewriter.text.tokenizer import Tokenizer
    from typewriter.weights import load_weights, resolve_model_path
    from typewriter.weights.source import open_source

    rows.append(("TensorFlow, transformers, tokenizers imported", rss_mb(), ""))
    path = resolve_model_path(None)
    source, _ = open_source(path)
    cfg, weights = load_weights(source, lambda done, total: None)
    tokenizer = Tokenizer.from_gguf(path, source.fields)
    rows.append(("weights read (float32 numpy) and the tokenizer", rss_mb(),
                 f"{sum(w.nbytes for w in weights.values()) / 2**20:.0f} MiB of arrays"))
    from typewriter.assemble import weights_for  # here: the rows above are each stage's own memory

    fmt = weights_for(cfg, args.weights or Settings().model.weights)
    if fmt.lite:  # built here from the weights already held, so each stage's memory is its own
        from typewriter.runners.lite.runner import LiteRunner

        runner = LiteRunner(cfg, weights, slots=8, max_len=2048, max_chunk=64, weight_format=fmt)
    else:
        from typewriter.runners.xla.start import build

        runner = build(cfg, weights, 8, 2048, fmt)
    if fmt.lite:
        return lite_rows(runner, rows, weights, source, tokenizer)
    cache = {id(v): v for layer in runner.model.cache.k + runner.model.cache.v for v in layer}
    everything = runner.model.variables

    def mib(variables) -> float:
        return sum(int(tf.size(v)) * v.dtype.size for v in variables) / 2**20

    cache_mb, weight_mb = mib(cache.values()), mib(v for v in everything if id(v) not in cache)
    rows.append(("TensorFlow variables made", rss_mb(),
                 f"weights ({runner.weight_format}) {weight_mb:.0f} MiB + K/V cache {cache_mb:.0f} MiB"))
    del weights, source
    rows.append(("numpy weights dropped", rss_mb(), ""))
    for key in runner.compiler.programs()[: args.programs]:
        runner.compiler.compile(key)
        rows.append((f"compiled {key[0]} {key[1]} x {key[2]}", rss_mb(), ""))
    show(rows)
    del tokenizer
    return 0


def lite_rows(runner, rows, weights, source, tokenizer) -> int:
    """int8-lite: no variables and no programs to compile; its calls grow the programs' buffers and the cache."""
    matrices = sum(w.nbytes for k, w in weights.items() if w.ndim == 2) / 4 / 2**20  # int8: a quarter of fp32
    rows.append(("int8-lite programs made", rss_mb(), f"int8 matrices {matrices:.0f} MiB (packed by XNNPACK; the "
                 f"programs' files mapped and released), embeddings float16 {runner.embeddings.nbytes / 2**20:.0f} MiB "
                 f"(mapped: only the rows read are resident), K/V cache "
                 f"{runner.cache.nbytes / 2**20:.0f} MiB not yet touched"))
    weights.clear()  # the caller's dict: its arrays go now
    del source
    rows.append(("numpy weights dropped", rss_mb(), ""))
    ids = list(range(100, 164))
    calls = [("prefill 64 tokens at 0", lambda: runner.extend(0, 0, ids)),
             ("decode 1 row at 64", lambda: runner.decode([0], [5], [64])),
             ("decode 8 rows at 64", lambda: runner.decode(list(range(8)), [5] * 8, [64] * 8)),
             ("cache copy (only the positions written)", lambda: runner.copy_slot(0, 1))]
    for name, call in calls:
        call()
        rows.append((name, rss_mb(), ""))
    show(rows)
    del tokenizer
    return 0


def show(rows) -> None:
    width = max(len(r[0]) for r in rows)
    before = rows[0][1]
    for name, rss, note in rows:
        print(f"{name:<{width}}  {rss:6d} MB  {rss - before:+6d}  {note}")
        before = rss


if __name__ == "__main__":
    sys.exit(main())
