"""What a weight format costs in quality: the next-token distributions of each format against fp32, on a text
that nothing was tuned on (bench/data/heldout.txt), with llama.cpp on the same GGUF file as the reference point.

The embedded file is Q4_1, so our fp32 holds exactly its dequantized weights: what llama.cpp loses against it is
its 8-bit activations and its own arithmetic, what our int8 loses is requantizing the weights to 8 bits a column
and quantizing activations to 8 bits a row. Reported per format, over every position of the text:
KL(fp32 || format) mean and p99 (nats), top-1 agreement with fp32, and perplexity on the text.

    .venv/bin/python bench/quality.py [--formats fp32,int8,int8-lite] [--no-peer] [--json artifacts/quality.json]
    .venv/bin/python bench/quality.py --model "$(scripts/fetch-qwen-0.5b.sh)" --formats fp32,int8-lite

int8-lite is measured as the server makes it (GPTQ on runners/lite/calibration.txt); `int8-lite-nearest` rounds each
weight to its nearest step instead (as before GPTQ). q4-blocks is measured on its blocks kernel, the path of a
student's decode steps, for every position (the kernel computes each row alone, so a prefilled row is what the same
token decoded would give).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
CHUNK = 256


def log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z -= z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


NEAREST = "int8-lite-nearest"  # int8-lite rounded to nearest, as before GPTQ: this bench's label, not a format


def our_logits(cfg, weights, ids: list[int], fmt: str, calibration: list[int] | None = None,
               path: Path | None = None) -> np.ndarray:
    """Logits at every position of `ids` [n, v] from our model in weight format `fmt`, prefilled in chunks
    (int8-lite rounded by GPTQ on the token ids `calibration`, as the server rounds it; q4-blocks from the blocks
    of the file at `path`)."""
    import tensorflow as tf

    from typewriter.config import WeightFormat
    from typewriter.runners.xla.start import build_model

    max_len = -(-len(ids) // CHUNK) * CHUNK
    if fmt == WeightFormat.Q4_BLOCKS:
        from typewriter.runners.lite.runner import LiteRunner
        from typewriter.weights.source import open_source, weight_reader

        _, reader = weight_reader(open_source(path)[0])  # the file's own blocks, not the float32 copy
        runner = LiteRunner(cfg, reader, slots=1, max_len=max_len, max_chunk=CHUNK, calibration=None,
                            weight_format=WeightFormat.Q4_BLOCKS)
        return np.concatenate([runner.extend(0, start, ids[start:start + CHUNK], all_logits=True)
                               for start in range(0, len(ids), CHUNK)])
    if fmt in (WeightFormat.INT8_LITE, WeightFormat.INT8_LITE_FAST, NEAREST):
        from typewriter.runners.lite.runner import LiteRunner

        runner = LiteRunner(cfg, weights, slots=1, max_len=max_len, max_chunk=CHUNK,
                            calibration=None if fmt == NEAREST else calibration,
                            weight_format=WeightFormat.INT8_LITE_FAST if fmt == WeightFormat.INT8_LITE_FAST
                            else WeightFormat.INT8_LITE)
        return np.concatenate([runner.extend(0, start, ids[start:start + CHUNK], all_logits=True)
                               for start in range(0, len(ids), CHUNK)])
    model = build_model(cfg, weights, slots=1, max_len=max_len, max_chunk=CHUNK, weight_format=fmt)
    extend = tf.function(lambda tokens, start, length: model.extend(tokens, start, length, tf.constant(0), max_len,
                                                                    all_logits=True), jit_compile=True)
    out = []
    for start in range(0, len(ids), CHUNK):
        chunk = ids[start:start + CHUNK]
        padded = tf.constant([chunk + [0] * (CHUNK - len(chunk))], tf.int32)
        out.append(extend(padded, tf.constant(start), tf.constant(len(chunk))).numpy()[0, :len(chunk)])
    return np.concatenate(out)


def llama_logits(path: str, ids: list[int]) -> np.ndarray:
    from llama_cpp_peer import open_model

    llm = open_model(path, n_ctx=len(ids) + 8, logits_all=True)
    llm.eval(ids)
    return np.array(llm.scores[:len(ids)], dtype=np.float32)


def compare(reference: np.ndarray, logits: np.ndarray, ids: list[int]) -> dict:
    """reference, logits [n, v] at positions 0..n-1; position i predicts ids[i + 1]."""
    p, q = log_softmax(reference[:-1]), log_softmax(logits[:-1])
    kl = (np.exp(p) * (p - q)).sum(axis=-1)
    nll = -q[np.arange(len(ids) - 1), ids[1:]]
    return {"kl_mean": round(float(kl.mean()), 5), "kl_p99": round(float(np.percentile(kl, 99)), 5),
            "top1_agree": round(float((p.argmax(-1) == q.argmax(-1)).mean()), 4),
            "perplexity": round(float(np.exp(nll.mean())), 3), "positions": len(ids) - 1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--formats", default="fp32,int8")
    parser.add_argument("--no-peer", action="store_true", help="leave llama.cpp out")
    parser.add_argument("--text", default=str(HERE / "data" / "heldout.txt"))
    parser.add_argument("--json", help="also write the report here")
    parser.add_argument("--model", help="a GGUF file (default: the embedded model)")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    from typewriter.runners.xla.tf_env import prepare_environment

    prepare_environment(None)
    from typewriter.assemble import read_model
    from typewriter.runners.lite.start import calibration_ids
    from typewriter.weights.source import embedded_model_path

    path = Path(args.model) if args.model else embedded_model_path()
    cfg, weights, tokenizer = read_model(path)
    ids = tokenizer.encode(Path(args.text).read_text())
    reference = our_logits(cfg, weights, ids, "fp32")
    rows = {}
    for fmt in args.formats.split(","):
        logits = reference if fmt == "fp32" else our_logits(cfg, weights, ids, fmt, calibration_ids(tokenizer.encode),
                                                             path)
        rows[f"typewriter {fmt}"] = compare(reference, logits, ids)
        print(json.dumps({"model": f"typewriter {fmt}", **rows[f"typewriter {fmt}"]}), flush=True)
    if not args.no_peer:
        rows["llama.cpp"] = compare(reference, llama_logits(str(path), ids), ids)  # the file's own types
        print(json.dumps({"model": "llama.cpp", **rows["llama.cpp"]}), flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"model": path.name, "text": args.text, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
