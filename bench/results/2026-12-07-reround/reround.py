"""reround.py: what q4-blocks would gain and lose holding a file's Q6_K matrices at fewer bits than the file does.

    PYTHONPATH=backend:bench .venv/bin/python bench/results/2026-12-07-reround/reround.py kl MODEL MODE [DAMP]
    PYTHONPATH=backend:bench .venv/bin/python bench/results/2026-12-07-reround/reround.py rows MODEL [layers]
    PYTHONPATH=backend:bench .venv/bin/python bench/results/2026-12-07-reround/reround.py speed MODEL [STEPS]
    PYTHONPATH=backend:bench .venv/bin/python bench/results/2026-12-07-reround/reround.py seed MODEL DAMP FOLDER
    PYTHONPATH=backend:bench .venv/bin/python bench/results/2026-12-07-reround/reround.py texts MODEL FOLDER gsm8k|code

`kl`: bench/quality.py's KL from fp32 on bench/data/heldout.txt, q4-blocks on its blocks kernel, with the Q6_K
matrices named by MODE rounded again: `layers-rtn` (attn_v, ffn_down) to Q4K as llama.cpp's quantize_row_q4_K_ref
rounds; `out-rtn` the logits matrix likewise, `out-q5` to Q5 as quantize_row_q5_0_ref, `out-gptq` to Q4K by GPTQ
(H from the calibration text's final hidden states, damped by DAMP x mean diag); MODEs joined by `+`; `all-gptq`:
every Q6_K matrix by GPTQ, each with H of its own inputs (the file's model run a layer at a time on the calibration
text: attn_v's the normed stream, ffn_down's the feed-forward's activations); with BLOCK_DIAGONAL=1 in the
environment, H's 256 x 256 blocks alone.
`rows`: the logits matrix's rows from token id K on rounded to Q4K (or Q5), the rest as the file's, in numpy from
the blocks kernel's final hidden states (`layers`: with the layers' Q6_K at Q4K too).
`speed`: one-row steps (layers then logits) of the file's blocks and of every Q6_K at Q4K, alternating in one
process at position 150; medians, quartiles and the paired ratio.
`seed`: every Q6_K matrix by GPTQ (as `kl ... all-gptq DAMP`), packed and saved as the server's q4-blocks cache entry
for MODEL in FOLDER (a TYPEWRITER_LITE_CACHE of its own), so that `typewriter bench` and bench/bandwidth.py run on
those blocks as the server would. `texts`: KL from fp32 of the blocks `seed` saved in FOLDER, of the file's blocks
and of llama.cpp on the file, on texts nothing was tuned on: GSM8K's first 8 test problems with their worked answers
(../shared/datasets/gsm8k) or a Python file of this repository (backend/typewriter/runners/lite/gptq.py), a
process each (one holds several GB of logits and models).
The fp32 reference logits and H are kept in artifacts/ between runs.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from typewriter.runners.lite import blocks as B

ARTIFACTS = Path("artifacts")
# GPTQ with H cut to its 256 x 256 blocks (a super-block's inputs): cheaper to invert, what a start could afford
BLOCK_DIAGONAL = os.environ.get("BLOCK_DIAGONAL") == "1"


def qkx2(x: np.ndarray, w: np.ndarray, nmax: int = 15, rmin: float = -1.0, rdelta: float = 0.1,
         nstep: int = 20) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """llama.cpp's make_qkx2_quants over many sub-blocks at once: x, w [S, 32] -> (levels [S, 32], scale [S],
    minimum [S] (subtracted, >= 0))."""
    lo, hi = np.minimum(x.min(-1), 0), x.max(-1)
    flat = hi == lo
    span = np.where(flat, 1, hi - lo)
    sum_w, sum_x = w.sum(-1), (w * x).sum(-1)
    scale = span / nmax
    levels = np.clip(np.rint((x - lo[:, None]) / scale[:, None]), 0, nmax)
    best = (w * (scale[:, None] * levels + lo[:, None] - x) ** 2).sum(-1)
    for i in range(nstep + 1):
        trial = np.clip(np.rint((rmin + rdelta * i + nmax) / span[:, None] * (x - lo[:, None])), 0, nmax)
        sl, sl2, sxl = (w * trial).sum(-1), (w * trial * trial).sum(-1), (w * trial * x).sum(-1)
        det = sum_w * sl2 - sl * sl
        ok = det > 0
        det = np.where(ok, det, 1)
        this_scale, this_min = (sum_w * sxl - sum_x * sl) / det, (sl2 * sum_x - sl * sxl) / det
        positive = this_min > 0
        this_scale = np.where(positive, sxl / np.where(sl2 > 0, sl2, 1), this_scale)
        this_min = np.where(positive, 0, this_min)
        err = (w * (this_scale[:, None] * trial + this_min[:, None] - x) ** 2).sum(-1)
        better = ok & (err < best)
        levels, best = np.where(better[:, None], trial, levels), np.where(better, err, best)
        scale, lo = np.where(better, this_scale, scale), np.where(better, this_min, lo)
    return np.where(flat[:, None], 0, levels), np.where(flat, 0, scale), -lo


def _super_params(x: np.ndarray) -> tuple[np.ndarray, ...]:
    """x [rows, 256] -> each value's step and minimum [rows, 256] (value = q x step - minimum), the 6-bit scales and
    minimums [rows, 8] and the float16 d and dmin [rows], as quantize_row_q4_K_ref sets them."""
    sub = x.reshape(-1, 32)
    _, scale, mins = qkx2(sub, np.sqrt((sub * sub).mean(-1, keepdims=True)) + np.abs(sub))
    scale, mins = scale.reshape(len(x), 8), mins.reshape(len(x), 8)
    top_s, top_m = scale.max(-1), mins.max(-1)
    ls = np.minimum(63, np.rint(scale * np.where(top_s > 0, 63 / np.where(top_s > 0, top_s, 1), 0)[:, None]))
    lm = np.minimum(63, np.rint(mins * np.where(top_m > 0, 63 / np.where(top_m > 0, top_m, 1), 0)[:, None]))
    d, dmin = (top_s / 63).astype(np.float16), (top_m / 63).astype(np.float16)
    step, low = d.astype(np.float32)[:, None] * ls, dmin.astype(np.float32)[:, None] * lm
    return np.repeat(step, 32, 1), np.repeat(low, 32, 1), ls, lm, d, dmin


def q4k(w: np.ndarray, h: np.ndarray | None = None, damp: float = 0.1, chunk: int = 8192) -> B.Blocks:
    """w [out, n] float32 -> Q4K blocks: to nearest (h None), or by GPTQ with H = h, the inputs in order, each
    super-block's scales set from its weights as the earlier inputs' errors left them."""
    out, n = w.shape
    u = None
    if h is not None:
        h = np.array(h, np.float64)
        diag = np.diag(h).copy()
        h[diag == 0, diag == 0] = 1
        h += damp * diag.mean() * np.eye(n)
        if BLOCK_DIAGONAL:  # H's blocks of a super-block alone: each inverted on its own, errors kept inside it
            u = np.zeros((n, n), np.float32)
            for j in range(0, n, 256):
                u[j:j + 256, j:j + 256] = np.linalg.cholesky(np.linalg.inv(h[j:j + 256, j:j + 256])).T
        else:
            u = np.linalg.cholesky(np.linalg.inv(h)).T.astype(np.float32)  # GPTQ's upper factor of H^-1
    parts: list[tuple[np.ndarray, ...]] = []
    for r0 in range(0, out, chunk):
        rest = np.array(w[r0:r0 + chunk], np.float32)
        rows = len(rest)
        q, ls, lm = np.empty((rows, n), np.int8), np.empty((rows, n // 32), np.uint8), np.empty((rows, n // 32), np.uint8)
        supers = np.empty((rows, n // 256, 2), np.float16)
        for j0 in range(0, n, 256):
            step, low, ls[:, j0 // 32:j0 // 32 + 8], lm[:, j0 // 32:j0 // 32 + 8], d, dmin = _super_params(
                rest[:, j0:j0 + 256])
            supers[:, j0 // 256, 0], supers[:, j0 // 256, 1] = d, dmin
            safe = np.where(step > 0, step, 1)
            if u is None:
                q[:, j0:j0 + 256] = np.where(step > 0, np.clip(np.rint((rest[:, j0:j0 + 256] + low) / safe), 0, 15), 0)
                continue
            for b0 in range(j0, j0 + 256, 32):  # GPTQ's lazy batches of 32 inputs
                errors = np.empty((rows, 32), np.float32)
                for j in range(b0, b0 + 32):
                    c = j - j0
                    level = np.where(step[:, c] > 0, np.clip(np.rint((rest[:, j] + low[:, c]) / safe[:, c]), 0, 15), 0)
                    q[:, j] = level
                    errors[:, j - b0] = e = (rest[:, j] - (level * step[:, c] - low[:, c])) / u[j, j]
                    rest[:, j + 1:b0 + 32] -= e[:, None] * u[j, j + 1:b0 + 32][None, :]
                rest[:, b0 + 32:] -= errors @ u[b0:b0 + 32, b0 + 32:]
        parts.append((q, ls, lm, supers))
    q, ls, lm, supers = (np.concatenate([p[i] for p in parts]) for i in range(4))
    return B.Blocks(q, ls, lm, B.FORMATS["q4k"], supers)


def q5(w: np.ndarray) -> B.Blocks:
    """quantize_row_q5_0_ref: d = a block's signed largest / -16, q = min(31, floor(x / d + 16.5)) - 16."""
    out, n = w.shape
    b = np.asarray(w, np.float32).reshape(out, n // 32, 32)
    top = np.take_along_axis(b, np.abs(b).argmax(-1)[..., None], -1)[..., 0]
    inv = np.where(top != 0, -16 / np.where(top != 0, top, 1), 0)
    q = np.minimum(31, np.floor(b * inv[..., None] + 16.5)).astype(np.int8) - np.int8(16)
    return B.Blocks(q.reshape(out, n), (top / -16).astype(np.float16), None, B.FORMATS["q5"])


def _rerounding(round_layer, round_output) -> None:
    """blocks_of, with a Q6_K layer matrix by `round_layer` and the Q6_K logits matrix by `round_output` (None:
    as the file holds it)."""
    file_blocks = B.blocks_of

    def blocks_of(data, kind, out, n):
        blocks = file_blocks(data, kind, out, n)
        how = round_output if out > 100_000 else round_layer  # the logits matrix: a row a token of the vocabulary
        return how(blocks.dequantized()) if kind == B.Q.Q6_K and how is not None else blocks

    B.blocks_of = blocks_of


def _model(path: Path):
    from typewriter.runners.xla.tf_env import prepare_environment

    prepare_environment(None)
    import quality

    from typewriter.assemble import read_model

    cfg, weights, tokenizer = read_model(path)
    ids = tokenizer.encode(Path("bench/data/heldout.txt").read_text())
    ARTIFACTS.mkdir(exist_ok=True)
    kept = ARTIFACTS / f"reround-reference-{path.stem}.npy"
    if not kept.exists():
        np.save(kept, quality.our_logits(cfg, weights, ids, "fp32"))
    return quality, cfg, weights, tokenizer, ids, np.load(kept)


def _runner(cfg, path: Path, max_len: int):
    from typewriter.config import WeightFormat
    from typewriter.runners.lite.runner import LiteRunner
    from typewriter.weights.source import open_source, weight_reader

    _, reader = weight_reader(open_source(path)[0])
    return LiteRunner(cfg, reader, slots=1, max_len=max_len, max_chunk=256, calibration=None,
                      weight_format=WeightFormat.Q4_BLOCKS)


def _normed_stream(runner, cfg, ids: list[int]) -> np.ndarray:
    """What the logits matrix reads: the final residual stream after RMSNorm and its weight [n, d]."""
    x = np.concatenate([runner._blocks_forward(ids[s:s + 256], np.zeros(len(ids[s:s + 256]), np.int64),
                                               np.arange(s, s + len(ids[s:s + 256]))) for s in range(0, len(ids), 256)])
    return (x / np.sqrt((x * x).mean(-1, keepdims=True) + cfg.norm_eps) * runner.blocks.norm).astype(np.float32)


def _tensor_key(data: np.ndarray) -> bytes:
    """A GGUF tensor's data, known again from another opening of the file."""
    return hashlib.sha256(np.ascontiguousarray(data).view(np.uint8).reshape(-1)[:1 << 16].tobytes()).digest()


def _layer_moments(cfg, path: Path, ids: list[int]) -> dict[bytes, np.ndarray]:
    """E[x^T x] of the inputs of every Q6_K matrix, by its tensor's key: the file's model, a layer at a time (the
    kernel runs one layer's struct; with a zero ffn_norm the layer adds no feed-forward, which gives the stream
    between attention and feed-forward)."""
    runner = _runner(cfg, path, 1024)
    blocks, cache = runner.blocks, runner.cache
    structs = blocks._bound[0]
    n = len(ids)
    at = cache.rows(np.zeros(n, np.int64), np.arange(n))
    x = blocks.embed(ids)
    zeros = np.zeros(cfg.dim, np.float32)
    gguf = blocks._gguf
    moments: dict[bytes, np.ndarray] = {}

    def norm(v: np.ndarray, weight: np.ndarray) -> np.ndarray:
        return (v / np.sqrt((v * v).mean(-1, keepdims=True) + cfg.norm_eps) * weight).astype(np.float32)

    def one(layer: B.Layer) -> B.Model:
        """The model's struct with `layer` its only layer."""
        model = B.Model.from_buffer_copy(blocks._model)
        model.n_layers, model.layers = 1, ctypes.addressof(layer)
        return model

    for i, packed in enumerate(blocks.layers):
        for name in ("attn_v", "ffn_down"):
            t = gguf.tensors[f"blk.{i}.{name}.weight"]
            if t.tensor_type != B.Q.Q6_K:
                continue
            if name == "attn_v":
                inputs = norm(x, packed.attention_norm)
            else:
                no_ffn = B.Layer.from_buffer_copy(structs[i])
                no_ffn.ffn_norm = zeros.ctypes.data
                mid = x.copy()
                blocks.kernel.layers(one(no_ffn), mid, at.slots_at, at.positions_at, n, cache.threads)
                normed = norm(mid, packed.ffn_norm)
                gate = blocks.kernel.matmul(packed.matrices["w_gate"], normed, cache.threads)
                up = blocks.kernel.matmul(packed.matrices["w_up"], normed, cache.threads)
                inputs = gate / (1 + np.exp(-gate)) * up
            # float32 kept: the 1.5B's are 14 of 8,960 x 8,960
            moments[_tensor_key(t.data)] = (inputs.T.astype(np.float64) @ inputs / n).astype(np.float32)
        blocks.kernel.layers(one(structs[i]), x, at.slots_at, at.positions_at, n, cache.threads)
    t = gguf.tensors["output.weight"]
    final = norm(x, blocks.norm)
    moments[_tensor_key(t.data)] = final.T.astype(np.float64) @ final / n
    return moments


def _by_gptq(moments: dict[bytes, np.ndarray], damp: float) -> None:
    """blocks_of, with every Q6_K matrix rounded to Q4K by GPTQ on its own inputs' moments."""
    file_blocks = B.blocks_of

    def blocks_of(data, kind, out, n):
        blocks = file_blocks(data, kind, out, n)
        return q4k(blocks.dequantized(), moments[_tensor_key(data)], damp) if kind == B.Q.Q6_K else blocks

    B.blocks_of = blocks_of


def seed(path: Path, damp: float, folder: Path) -> None:
    from typewriter.assemble import read_model
    from typewriter.config import WeightFormat
    from typewriter.runners.lite import blocks_cache
    from typewriter.runners.lite.program_cache import ProgramCache, cache_key
    from typewriter.runners.lite.start import calibration_ids

    cfg, _, tokenizer = read_model(path)
    _by_gptq(_layer_moments(cfg, path, calibration_ids(tokenizer.encode)[:512]), damp)
    began = time.time()
    runner = _runner(cfg, path, 1024)  # packs every matrix, the Q6_K ones by GPTQ
    print(f"packed in {time.time() - began:.0f} s, {runner.blocks.nbytes / 1e6:.1f} MB", flush=True)
    key = cache_key(path, cfg, WeightFormat.Q4_BLOCKS.value, blocks_cache.LAYOUT)
    print("saved", blocks_cache.save(ProgramCache(folder), key, runner.blocks, path), flush=True)


def texts(path: Path, folder: Path, which: str) -> None:
    from typewriter.runners.xla.tf_env import prepare_environment

    prepare_environment(None)
    import quality

    from typewriter.assemble import read_model
    from typewriter.config import WeightFormat
    from typewriter.runners.lite import blocks_cache
    from typewriter.runners.lite.kernel import load as load_kernel
    from typewriter.runners.lite.program_cache import ProgramCache, cache_key
    from typewriter.runners.lite.runner import LiteRunner
    from typewriter.weights.source import open_source, weight_reader

    cfg, weights, tokenizer = read_model(path)
    problems = [json.loads(line) for line in Path("../shared/datasets/gsm8k/test.jsonl").read_text().splitlines()[:8]]
    named = {"gsm8k": "\n\n".join(f"{p['question']}\n{p['answer']}" for p in problems),
             "code": Path("backend/typewriter/runners/lite/gptq.py").read_text()}
    ids = tokenizer.encode(named[which])
    reference = quality.our_logits(cfg, weights, ids, "fp32")
    rows = {"llama.cpp": quality.compare(reference, quality.llama_logits(str(path), ids), ids),
            "file's blocks": quality.compare(reference, quality.our_logits(cfg, weights, ids, WeightFormat.Q4_BLOCKS,
                                                                           None, path), ids)}
    mapped = blocks_cache.load(ProgramCache(folder), cache_key(path, cfg, WeightFormat.Q4_BLOCKS.value,
                                                               blocks_cache.LAYOUT))
    assert mapped is not None, f"no q4-blocks entry for {path.name} in {folder}"
    _, reader = weight_reader(open_source(path)[0])
    kernel = load_kernel(None)
    blocks = B.BlockModel(cfg, reader, kernel, packed=mapped.matrices, check=mapped.check)
    runner = LiteRunner(cfg, reader, slots=1, max_len=-(-len(ids) // 256) * 256, max_chunk=256, kernel=kernel,
                        weight_format=WeightFormat.Q4_BLOCKS, blocks=blocks)
    logits = np.concatenate([runner.extend(0, s, ids[s:s + 256], all_logits=True) for s in range(0, len(ids), 256)])
    rows["every Q6_K at Q4K by GPTQ"] = quality.compare(reference, logits, ids)
    for who, row in rows.items():
        print(json.dumps({"text": which, "tokens": len(ids), "model": who, **row}), flush=True)


def kl(path: Path, mode: str, damp: float) -> None:
    quality, cfg, weights, tokenizer, ids, reference = _model(path)
    from typewriter.config import WeightFormat
    from typewriter.runners.lite.start import calibration_ids

    calibration = calibration_ids(tokenizer.encode)
    h = None
    if "out-gptq" in mode:
        kept = ARTIFACTS / f"reround-h-{path.stem}.npy"
        if not kept.exists():
            x = _normed_stream(_runner(cfg, path, 1024), cfg, calibration[:512])
            np.save(kept, x.T.astype(np.float64) @ x / len(x))
        h = np.load(kept)
    if mode == "all-gptq":
        _by_gptq(_layer_moments(cfg, path, calibration[:512]), damp)
        logits = quality.our_logits(cfg, weights, ids, WeightFormat.Q4_BLOCKS, calibration, path)
        print(json.dumps({"mode": mode, "damp": damp, **quality.compare(reference, logits, ids)}), flush=True)
        return
    parts = mode.split("+")
    output = (lambda w: q4k(w, h, damp)) if "out-gptq" in parts else q4k if "out-rtn" in parts else \
        q5 if "out-q5" in parts else None
    _rerounding(q4k if "layers-rtn" in parts else None, output)
    logits = quality.our_logits(cfg, weights, ids, WeightFormat.Q4_BLOCKS, calibration, path)
    print(json.dumps({"mode": mode, "damp": damp if h is not None else None,
                      **quality.compare(reference, logits, ids)}), flush=True)


def rows(path: Path, layers: bool) -> None:
    quality, cfg, _, _, ids, reference = _model(path)
    file_blocks = B.blocks_of
    if layers:
        _rerounding(q4k, None)
    runner = _runner(cfg, path, 1024)
    x = _normed_stream(runner, cfg, ids)
    t_output = runner.blocks._gguf.tensors["output.weight"]
    out, n = (int(d) for d in reversed(t_output.shape))
    w6 = file_blocks(t_output.data, t_output.tensor_type, out, n).dequantized()
    exact = x @ w6.T
    print(json.dumps({"rows": "as the file", **quality.compare(reference, exact, ids)}), flush=True)
    mass = np.exp(quality.log_softmax(reference)).mean(0)
    print(json.dumps({"fp32 probability mass in ids below": {k: round(float(mass[:k].sum()), 4)
                                                             for k in (16384, 32768, 65536)}}), flush=True)
    for name, rounding, starts in (("q4k", q4k, (0, 16384, 32768, 65536, 100_000)), ("q5", q5, (0, 32768))):
        moved = x @ (rounding(w6).dequantized() - w6).T
        for k in starts:
            logits = exact.copy()
            logits[:, k:] += moved[:, k:]
            print(json.dumps({"rows": f"{name} from id {k}", **quality.compare(reference, logits, ids)}), flush=True)


def speed(path: Path, steps: int) -> None:
    from blocks_step import open_runner

    runner = open_runner(path, 1, "q4-blocks")
    runner.extend(0, 0, [i % 1000 + 10 for i in range(150)])
    file_model, cache = runner.blocks, runner.cache
    if file_model._check is not None:
        file_model._checked()
    _rerounding(q4k, q4k)
    began = time.time()
    fewer = B.BlockModel(file_model.cfg, file_model._weights, cache.kernel)
    print(f"packed again in {time.time() - began:.1f} s; bytes {file_model.nbytes / 1e6:.1f} -> "
          f"{fewer.nbytes / 1e6:.1f} MB", flush=True)
    fewer.bind(cache)
    at = cache.rows(np.arange(1), np.full(1, 150))
    x0 = file_model.embed([5])
    took: dict[str, list[float]] = {"file": [], "q6_k at q4k": []}
    for step in range(steps + 20):
        for name, m in (("file", file_model), ("q6_k at q4k", fewer)):
            x = x0.copy()
            began = time.perf_counter()
            m.kernel.layers(m._model, x, at.slots_at, at.positions_at, 1, cache.threads)
            m.kernel.logits(m._model, x, m.cfg.vocab_size, cache.threads)
            if step >= 20:
                took[name].append(time.perf_counter() - began)
    for name, t in took.items():
        q = statistics.quantiles(t, n=4)
        print(f"{name:12s} median {statistics.median(t) * 1e3:7.3f} ms, quartiles {q[0] * 1e3:7.3f}-"
              f"{q[2] * 1e3:7.3f}", flush=True)
    paired = statistics.median(a / b for a, b in zip(took["file"], took["q6_k at q4k"]))
    print(f"paired file / fewer median {paired:.4f}", flush=True)


if __name__ == "__main__":
    verb, model, *more = sys.argv[1:]
    if verb == "kl":
        kl(Path(model), more[0], float(more[1]) if len(more) > 1 else 0.1)
    elif verb == "seed":
        seed(Path(model), float(more[0]), Path(more[1]))
    elif verb == "texts":
        texts(Path(model), Path(more[0]), more[1])
    elif verb == "rows":
        rows(Path(model), more[:1] == ["layers"])
    else:
        speed(Path(model), int(more[0]) if more else 300)
