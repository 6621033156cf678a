"""Would the file's own 4-bit weights beat int8-lite? A probe of LiteRT's blockwise 4-bit matmul (issue 9's lead).

    .venv/bin/python bench/q4_1_exact.py [--tokens 512] [--outliers 0,16,64] [--reps 3]

The embedded file is Q4_1: every block of 32 weights is d * q + m with q in 0..15. XNNPACK's 4-bit kernel (a
FULLY_CONNECTED whose filter is INT4 with BlockwiseQuantization and float16 scales; float inputs it quantizes to
8 bits a row) has a fixed zero point of 8, so a block is written as d * (q - 8) plus its offset m + 8d, and the
offsets go through a second, small float matmul of each block's input sum. The weights are then exactly the
file's (checked here: requantizing our float32 copy gives back every value), but nothing can be rotated: a rotated
matrix is no longer 4-bit. Without the rotation a row's few large channels cost its other channels their 8 bits,
so the K largest input channels of each matmul (by their largest |value| on the tutor's system prompt and a few
questions, run through our float32 weights in numpy) are zeroed before the 4-bit matmul and multiplied by their
float rows beside it. The logits stay int8-lite's (rotated int8).

Prints, for int8-lite and each variant: KL from fp32 on the first --tokens tokens of bench/data/heldout.txt (as
bench/quality.py computes it), then interleaved speed rounds: a one-row decode step, a four-row step, and a
256-token prefill, in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
BLOCK = 32
CALIBRATION = ["What is a fraction? Explain it simply, with one small example.",
               "Why does the moon change its shape during the month?",
               "How do I find the area of a triangle?",
               "Can you explain what photosynthesis is?"]


def q4_1(w: np.ndarray):
    """w [in, out] -> (q uint8 [in, out] in 0..15, d and m float16 [in / 32, out]): Q4_1's rounding, so a matrix
    that was Q4_1 comes back exactly."""
    i, o = w.shape
    b = w.reshape(i // BLOCK, BLOCK, o)
    lo, hi = b.min(1), b.max(1)
    d, m = ((hi - lo) / 15).astype(np.float16), lo.astype(np.float16)
    step = np.where(d == 0, 1, d).astype(np.float32)
    q = np.clip(np.rint((b - m.astype(np.float32)[:, None]) / step[:, None]), 0, 15).astype(np.uint8)
    return q.reshape(i, o), d, m


def dequantized(q, d, m) -> np.ndarray:
    i, o = q.shape
    blocks = q.astype(np.float32).reshape(i // BLOCK, BLOCK, o)
    return (blocks * d.astype(np.float32)[:, None] + m.astype(np.float32)[:, None]).reshape(i, o)


def q4_matmul(p, x: int, w: np.ndarray, outliers=()) -> int:
    """x [rows, in] @ w, w held as Q4_1 (4-bit, XNNPACK) plus the offsets and the outlier rows in float."""
    s = p.s
    q, d, m = q4_1(w)
    i, o = w.shape
    nibbles = ((q.T.astype(np.int16) - 8) & 0xF).astype(np.uint8).reshape(o, i // 2, 2)  # [out, in], signed
    packed = nibbles[..., 0] | (nibbles[..., 1] << 4)  # TensorFlow Lite's INT4: the even element low
    scales = p._tensor([o, i // BLOCK], s.TensorType.FLOAT16, np.ascontiguousarray(d.T))
    quant = s.QuantizationParametersT()
    quant.details = s.BlockwiseQuantizationT()
    quant.details.scales, quant.details.zeroPoints, quant.details.blockSize = scales, -1, BLOCK
    quant.detailsType = s.QuantizationDetails.BlockwiseQuantization
    filt = p._tensor([o, i], s.TensorType.INT4, packed, quant)
    keep = np.ones(i, np.float32)
    keep[list(outliers)] = 0
    options = s.FullyConnectedOptionsT()
    options.asymmetricQuantizeInputs = True
    inner = p.mul(x, p.const(keep)) if len(outliers) else x
    y = p._op(s.BuiltinOperator.FULLY_CONNECTED, [inner, filt, -1], [p.shape(x)[0], o],
              s.BuiltinOptions.FullyConnectedOptions, options)
    # beside it, in float: [block sums of the kept channels, the outlier channels] @ [offsets; outlier rows]
    pick = np.zeros((i, i // BLOCK + len(outliers)), np.float32)
    pick[np.arange(i), np.arange(i) // BLOCK] = keep
    pick[list(outliers), i // BLOCK + np.arange(len(outliers))] = 1
    rows = [m.astype(np.float32) + 8 * d.astype(np.float32), dequantized(q, d, m)[list(outliers)]]
    return p.add(y, p.matmul(p.matmul(x, pick), np.concatenate(rows)))


class Q4Programs:
    def __init__(self, cfg, weights, outliers: dict[str, tuple[int, ...]]):
        self.cfg, self.weights, self.outliers = cfg, weights, outliers

    def layer(self, i: int) -> dict:
        return {k.split(".", 2)[2]: np.asarray(a, np.float32) for k, a in self.weights.items()
                if k.startswith(f"layers.{i}.")}

    def _norm(self, p, x, g):
        return p.mul(p.rms(x, self.cfg.norm_eps), p.const(g))

    def _mm(self, p, x, w, name):
        return q4_matmul(p, x, w, self.outliers.get(name, ()))

    def _qkv(self, p, x, i):
        w = self.layer(i)
        y = self._mm(p, self._norm(p, x, w["attention_norm"]), np.concatenate([w["wq"].T, w["wk"].T, w["wv"].T], 1),
                     f"{i}.qkv")
        if self.cfg.qkv_bias:
            y = p.add(y, p.const(np.concatenate([w["bq"], w["bk"], w["bv"]]).astype(np.float32)))
        return y

    def make(self):
        import tempfile

        from typewriter.runners.lite.flatbuffer import ProgramBuilder
        from typewriter.runners.lite.layers import RotationFolder
        from typewriter.runners.lite.programs import EMBEDDINGS, ProgramSet
        from typewriter.runners.rotation import quantize_int8

        cfg = self.cfg
        p = ProgramBuilder(1)
        first = p.finish([self._qkv(p, p.input(cfg.dim), 0)])
        layers = []
        for i in range(cfg.n_layers):
            w, p = self.layer(i), ProgramBuilder(1)
            x, attended = p.input(cfg.dim), p.input(cfg.n_heads * cfg.head_dim)
            h = p.add(x, self._mm(p, attended, w["wo"].T, f"{i}.o"))
            n = self._norm(p, h, w["ffn_norm"])
            gate, up = self._mm(p, n, w["w_gate"].T, f"{i}.gate"), self._mm(p, n, w["w_up"].T, f"{i}.up")
            x = p.add(h, self._mm(p, p.mul(p.mul(gate, p.sigmoid(gate)), up), w["w_down"].T, f"{i}.down"))
            layers.append(p.finish([x] if i + 1 == cfg.n_layers else [x, self._qkv(p, x, i + 1)]))
        # The logits as int8-lite has them: the stream is not rotated here, so rotate the normed rows first.
        folder = RotationFolder(cfg, self.weights)
        logits = ProgramBuilder(1)
        normed = logits.rms(logits.input(cfg.dim), cfg.norm_eps)
        rotated = logits.matmul(normed, folder.stream.numpy(np.eye(cfg.dim, dtype=np.float32)))  # rows @ R
        output = np.concatenate([columns for _, _, columns in folder.output()], axis=1)
        logits = logits.finish([logits.int8_matmul(rotated, *quantize_int8(output))])
        programs = ProgramSet(Path(tempfile.mkdtemp(prefix="q4-programs-")), cfg.n_layers)
        programs.first.write_bytes(first)
        for i, layer in enumerate(layers):
            programs.layer(i).write_bytes(layer)
        programs.logits.write_bytes(logits)
        np.save(programs.folder / EMBEDDINGS, np.asarray(self.weights["tok_embeddings"], np.float32).astype(np.float16))
        return programs


def channel_peaks(cfg, weights, ids: list[int]) -> dict[str, np.ndarray]:
    """Each matmul input's largest |value| per channel, over `ids` run through the float32 weights in numpy."""
    from typewriter.runners.lite.attention import HostCache

    src = Q4Programs(cfg, weights, {})
    peaks: dict[str, np.ndarray] = {}

    def seen(name, x):
        peaks[name] = np.maximum(peaks.get(name, 0), np.abs(x).max(0))
        return x

    def rms(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + cfg.norm_eps) * g

    def qkv(x, i):
        w = src.layer(i)
        y = seen(f"{i}.qkv", rms(x, w["attention_norm"])) @ np.concatenate([w["wq"].T, w["wk"].T, w["wv"].T], 1)
        return y + np.concatenate([w["bq"], w["bk"], w["bv"]]) if cfg.qkv_bias else y

    cache = HostCache(cfg, 1, -(-len(ids) // 128) * 128)
    x = np.asarray(weights["tok_embeddings"], np.float32)[ids]
    q = qkv(x, 0)
    for i in range(cfg.n_layers):
        w = src.layer(i)
        h = x + seen(f"{i}.o", cache.extend(i, q, 0, 0)) @ w["wo"].T
        n = seen(f"{i}.gate", rms(h, w["ffn_norm"]))
        peaks[f"{i}.up"] = peaks[f"{i}.gate"]
        gate = n @ w["w_gate"].T
        x = h + seen(f"{i}.down", gate / (1 + np.exp(-gate)) * (n @ w["w_up"].T)) @ w["w_down"].T
        if i + 1 < cfg.n_layers:
            q = qkv(x, i + 1)
    return peaks


def timings(runner, ids: list[int]) -> dict[str, float]:
    t = time.perf_counter()
    for i in range(32):
        runner.decode([0], [5], [100 + i])
    one = (time.perf_counter() - t) / 32
    t = time.perf_counter()
    for i in range(8):
        runner.decode([0, 1, 2, 3], [5] * 4, [132 + i] * 4)
    four = (time.perf_counter() - t) / 8
    t = time.perf_counter()
    runner.extend(1, 0, ids[:256])
    return {"decode_1_row_ms": round(one * 1e3, 1), "decode_4_rows_ms": round(four * 1e3, 1),
            "prefill_256_ms": round((time.perf_counter() - t) * 1e3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--outliers", default="0,16,64", help="float channels per matmul input, one variant each")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    from quality import CHUNK, compare, our_logits

    from typewriter.runners.xla.tf_env import prepare_environment

    prepare_environment(None)
    from typewriter.assemble import read_model
    from typewriter.runners.lite.programs import make_programs
    from typewriter.runners.lite.runner import LiteRunner
    from typewriter.runners.lite.start import calibration_ids
    from typewriter.weights.source import embedded_model_path

    cfg, weights, tokenizer = read_model(embedded_model_path())
    w = np.asarray(weights["layers.0.w_up"], np.float32).T
    print(json.dumps({"requantized_exactly": bool(np.array_equal(dequantized(*q4_1(w)), w))}), flush=True)
    ids = tokenizer.encode((HERE / "data" / "heldout.txt").read_text())[:args.tokens]
    reference = our_logits(cfg, weights, ids, "fp32")
    peaks = channel_peaks(cfg, weights, [t for q in CALIBRATION for t in tokenizer.encode_chat(
        [{"role": "user", "content": q}])])
    variants = {"int8-lite": lambda: make_programs(cfg, weights, Path(tempfile.mkdtemp(prefix="programs-")),
                                                   calibration=calibration_ids(tokenizer.encode))}
    for k in (int(k) for k in args.outliers.split(",")):
        outliers = {name: tuple(int(c) for c in np.argsort(-a)[:k]) for name, a in peaks.items()} if k else {}
        variants[f"q4_1 exact, {k} float channels"] = lambda o=outliers: Q4Programs(cfg, weights, o).make()
    runners = {}
    max_len = -(-max(len(ids), 512) // CHUNK) * CHUNK
    for name, make in variants.items():
        runner = LiteRunner(cfg, None, slots=4, max_len=max_len, max_chunk=CHUNK, programs=make())
        logits = np.concatenate([runner.extend(0, s, ids[s:s + CHUNK], all_logits=True)
                                 for s in range(0, len(ids), CHUNK)])
        print(json.dumps({"format": name, **compare(reference, logits, ids)}), flush=True)
        runners[name] = runner
    for r in range(args.reps):  # interleaved, so a noisy machine slows every variant alike
        for name, runner in runners.items():
            runner.extend(0, 0, ids[:100])
            print(json.dumps({"round": r, "format": name, **timings(runner, ids)}), flush=True)


if __name__ == "__main__":
    main()
