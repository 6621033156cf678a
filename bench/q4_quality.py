"""What 4-bit weights would cost in quality (issue 40's research): KL from fp32 on bench/quality.py's held-out
text for the candidate roundings, beside int8-lite and llama.cpp on the same file, in one run.

    .venv/bin/python bench/q4_quality.py [--model F.gguf] [--variants ...] [--json artifacts/q4-quality.json]

Variants (the logits stay int8-lite's: rotated int8, GPTQ, rows to 16 bits):
- int8-lite: today's format, as bench/quality.py measures it.
- int4-channel: int8-lite's programs with every layer matrix GPTQ-rounded to 4-bit levels (-7..7 times one scale
  per output column), held in the int8 programs: the same numbers LiteRT's INT4 per-channel filter would run
  (q4_kernels.py's lite-int4-channel), rows as int8-lite rounds them.
- q4-block32-gptq: the layer matrices rotated as int8-lite's and GPTQ-rounded to blocks of 32 input channels with
  a scale each (-7..7; the C kernel's Q4), run in float: the weights' part of the error only, rows unrounded.
- q4-block32-rtn: the file's weights (not rotated) rounded to nearest in the same blocks, in fp32 (XLA): the
  weights' part only, and no calibration text.
- q4m-block32-rtn: the same with a minimum per block too (GGUF's Q4_1: 16 levels from the block's least to its
  largest weight; the C kernel's Q4M), which gives a Q4_1 file back exactly.
- The file's own Q4_1 blocks (the embedded model) are fp32's weights exactly: a kernel that runs them as they are
  (q4_kernels.py's c-q4m) loses only what its rows' rounding loses, as llama.cpp does.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
BLOCK = 32
LEVELS = 7.0


def gptq_blocks(w: np.ndarray, h: np.ndarray, damp: float, group: int, levels: float = LEVELS) -> np.ndarray:
    """GPTQ (gptq.py's grouped form: each group of `group` inputs rounded against its own diagonal block of H)
    with one scale per BLOCK inputs and output column, each taken when its block is reached: w [in, out] ->
    the rounded matrix, float32 (dequantized)."""
    from typewriter.runners.lite.gptq import group_width

    n, out = w.shape
    g = group_width(n, group)
    w = np.array(w, np.float32).reshape(n // g, g, out)
    blocks = np.array(h, np.float64)
    diag = np.einsum("bii->bi", blocks)
    dead = diag == 0
    w[dead] = 0.0
    diag[dead] = 1.0
    diag += damp * np.mean(diag)
    u = np.linalg.cholesky(np.linalg.inv(blocks)).transpose(0, 2, 1).astype(np.float32)  # [groups, g, g]
    result = np.empty_like(w)
    scale = None
    for j in range(g):
        if j % BLOCK == 0 or scale is None:  # a new block of inputs: its scale from the weights as they are now
            top = np.abs(w[:, j:j + min(BLOCK, g)]).max(axis=1) / levels  # [groups, out]
            scale = np.where(top == 0, 1.0, top).astype(np.float32)
        row = np.clip(np.rint(w[:, j] / scale), -levels, levels) * scale
        result[:, j] = row
        err = (w[:, j] - row) / u[:, j, j, None]
        w[:, j + 1:] -= u[:, j, j + 1:, None] * err[:, None, :]
    return result.reshape(n, out)


def rtn_blocks(w: np.ndarray, levels: float = LEVELS, minimum: bool = False) -> np.ndarray:
    """w [out, in] rounded to nearest in blocks of BLOCK inputs, one scale (largest |w| / levels) each; with
    `minimum`, Q4_1's way: 16 levels from the block's least weight to its largest."""
    out, n = w.shape
    b = w.reshape(out, n // BLOCK, BLOCK)
    if minimum:
        low, high = b.min(-1, keepdims=True), b.max(-1, keepdims=True)
        step = np.where(high > low, (high - low) / 15, 1.0)
        return (np.clip(np.rint((b - low) / step), 0, 15) * step + low).reshape(out, n).astype(np.float32)
    scale = np.abs(b).max(-1, keepdims=True) / levels
    scale = np.where(scale == 0, 1.0, scale)
    return (np.clip(np.rint(b / scale), -levels, levels) * scale).reshape(out, n).astype(np.float32)


class Patched:
    """Makes LiteRunner's programs with another rounding for the layers' matrices (the logits keep int8-lite's):
    `int4-channel` through gptq.py's own loop with 4-bit levels, `q4-block32-gptq` as float matrices."""

    def __init__(self, variant: str):
        self.variant = variant

    def __enter__(self):
        from typewriter.runners.lite import flatbuffer, gptq, programs

        self.saved = (gptq.quantize, programs._by_columns, flatbuffer.ProgramBuilder.int8_matmul, gptq.INT8_MAX)
        quantize, by_columns, int8_matmul, int8_max = self.saved
        state = {"logits": False}
        variant = self.variant

        def layers_quantize(w, h, damp=gptq.DAMP, group=gptq.GROUP, kernel=None):
            if state["logits"]:
                return quantize(w, h, damp, group, kernel)
            if variant == "int4-channel":
                gptq.INT8_MAX = LEVELS  # gptq.py's numpy loop reads it: scales and clips at 4-bit levels
                try:
                    return quantize(w, h, damp, group, None)
                finally:
                    gptq.INT8_MAX = int8_max
            return gptq_blocks(w, h, damp, group), np.ones(w.shape[1], np.float32)

        def logits_by_columns(*args, **kwargs):
            state["logits"] = True
            try:
                return by_columns(*args, **kwargs)
            finally:
                state["logits"] = False

        def float_or_int8(p, x, q, scale, two_pass=False):
            if q.dtype == np.float32:  # a float matrix (q4-block32-gptq's layers): rows unrounded
                return p.matmul(x, q * scale)
            return int8_matmul(p, x, q, scale, two_pass)

        gptq.quantize, programs._by_columns = layers_quantize, logits_by_columns
        flatbuffer.ProgramBuilder.int8_matmul = float_or_int8
        return self

    def __exit__(self, *exc):
        from typewriter.runners.lite import flatbuffer, gptq, programs

        gptq.quantize, programs._by_columns, flatbuffer.ProgramBuilder.int8_matmul, gptq.INT8_MAX = self.saved


def lite_logits(cfg, weights, ids: list[int], calibration: list[int], variant: str) -> np.ndarray:
    from quality import CHUNK

    from typewriter.runners.lite.runner import LiteRunner

    max_len = -(-len(ids) // CHUNK) * CHUNK
    with Patched(variant):
        # kernel None: GPTQ's numpy loop (the C one clips at int8's levels) and numpy's attention
        runner = LiteRunner(cfg, weights, slots=1, max_len=max_len, max_chunk=CHUNK, calibration=calibration,
                            kernel=None)
    return np.concatenate([runner.extend(0, start, ids[start:start + CHUNK], all_logits=True)
                           for start in range(0, len(ids), CHUNK)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a GGUF file (default: the embedded model)")
    parser.add_argument("--variants", default="int8-lite,int4-channel,q4-block32-gptq,q4-block32-rtn")
    parser.add_argument("--no-peer", action="store_true", help="leave llama.cpp out")
    parser.add_argument("--json", help="also write the report here")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    from quality import compare, llama_logits, our_logits

    from typewriter.runners.xla.tf_env import prepare_environment

    prepare_environment(None)
    from typewriter.assemble import read_model
    from typewriter.runners.lite.start import calibration_ids
    from typewriter.weights.source import embedded_model_path

    path = Path(args.model) if args.model else embedded_model_path()
    cfg, weights, tokenizer = read_model(path)
    ids = tokenizer.encode((HERE / "data" / "heldout.txt").read_text())
    calibration = calibration_ids(tokenizer.encode)
    reference = our_logits(cfg, weights, ids, "fp32")
    rows = {}
    for variant in args.variants.split(","):
        if variant == "int8-lite":
            logits = our_logits(cfg, weights, ids, "int8-lite", calibration)
        elif variant in ("q4-block32-rtn", "q4m-block32-rtn"):
            layer_matrices = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
            minimum = variant.startswith("q4m")
            rounded = {k: rtn_blocks(np.asarray(v, np.float32), minimum=minimum)
                       if k.rsplit(".", 1)[-1] in layer_matrices else v for k, v in weights.items()}
            logits = our_logits(cfg, rounded, ids, "fp32")
        else:
            logits = lite_logits(cfg, weights, ids, calibration, variant)
        rows[variant] = compare(reference, logits, ids)
        print(json.dumps({"variant": variant, **rows[variant]}), flush=True)
    if not args.no_peer:
        rows["llama.cpp"] = compare(reference, llama_logits(str(path), ids), ids)
        print(json.dumps({"variant": "llama.cpp", **rows["llama.cpp"]}), flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"model": path.name, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
