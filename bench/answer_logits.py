"""How far each weight format is from the file's exact weights on the tutor's maths answers, llama.cpp's included:
the next-token distributions along answers that bench/correctness.py collected, read back by each format.

    .venv/bin/python bench/answer_logits.py --answers artifacts/correctness-qwen.json --per-language 20 \
        --formats fp32,int8-lite,int8-lite-nearest --json artifacts/answer-logits-qwen.json

Each sequence is the prompt our tokenizer builds for the problem's messages (the tutor's system prompt and the
question; bench/prompt_tokens.py shows llama-server builds the same ids) followed by an answer's text as tokens
(the `--server` answers of the file, llama's by default), with the model's end-of-turn token. Every format reads the
whole sequence (ours prefilled in chunks, as bench/quality.py does; llama.cpp through llama-cpp-python), and at
each answer position is compared with fp32 (XLA over the file's weights dequantized exactly): KL(fp32 || format)
mean and p99 (nats), top-1 agreement, and where the format's top-1 differs from fp32's while fp32 was sure of its
choice (its top-1 probability at least 0.5: a flip there can change a greedy answer). Per language, and overall.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from quality import CHUNK, NEAREST, log_softmax

HERE = Path(__file__).resolve().parent
MAX_LEN = 1024


class Reader:
    """One weight format's logits at every position of a sequence, built once and reused across sequences."""

    def __init__(self, fmt: str, cfg, weights, calibration: list[int], path: str):
        self.fmt = fmt
        if fmt == "llama.cpp":
            from llama_cpp_peer import open_model

            self.llm = open_model(path, n_ctx=MAX_LEN, logits_all=True, threads=1)  # a busy machine: no spinning
        elif fmt.startswith("int8-lite"):
            from typewriter.config import WeightFormat
            from typewriter.runners.lite.runner import LiteRunner

            fast = fmt == WeightFormat.INT8_LITE_FAST.value
            self.runner = LiteRunner(cfg, weights, slots=1, max_len=MAX_LEN, max_chunk=CHUNK,
                                     calibration=None if fmt == NEAREST else calibration,
                                     weight_format=WeightFormat.INT8_LITE_FAST if fast else WeightFormat.INT8_LITE)
        else:
            import tensorflow as tf

            from typewriter.runners.xla.start import build_model

            model = build_model(cfg, weights, slots=1, max_len=MAX_LEN, max_chunk=CHUNK, weight_format=fmt)
            self.extend = tf.function(lambda tokens, start, length: model.extend(
                tokens, start, length, tf.constant(0), MAX_LEN, all_logits=True), jit_compile=True)

    def __call__(self, ids: list[int]) -> np.ndarray:
        """[n, v] logits after each of `ids`."""
        if self.fmt == "llama.cpp":
            self.llm.reset()
            self.llm.eval(ids)
            return np.array(self.llm.scores[:len(ids)], dtype=np.float32)
        if self.fmt.startswith("int8-lite"):
            return np.concatenate([self.runner.extend(0, start, ids[start:start + CHUNK], all_logits=True)
                                   for start in range(0, len(ids), CHUNK)])
        import tensorflow as tf

        out = []
        for start in range(0, len(ids), CHUNK):
            chunk = ids[start:start + CHUNK]
            padded = tf.constant([chunk + [0] * (CHUNK - len(chunk))], tf.int32)
            out.append(self.extend(padded, tf.constant(start), tf.constant(len(chunk))).numpy()[0, :len(chunk)])
        return np.concatenate(out)


def sequences(answers: dict, server: str, per_language: int, tokenizer, system: str) -> list[dict]:
    rows = answers["servers"][server]["rows"]
    im_end = tokenizer.encode("<|im_end|>")
    end = im_end if len(im_end) == 1 and im_end[0] in tokenizer.eos_token_ids else [min(tokenizer.eos_token_ids)]
    picked = []
    for language in ("en", "es", "zh"):
        for row in [r for r in rows if r["language"] == language][:per_language]:
            prompt = tokenizer.encode_chat([{"role": "system", "content": system},
                                            {"role": "user", "content": row["question"]}])
            answer = tokenizer.encode(row["text"]) + (end if row["finish_reason"] == "stop" else [])
            ids = (prompt + answer)[:MAX_LEN]
            picked.append({"id": row["id"], "language": language, "ids": ids, "answer_from": len(prompt)})
    return picked


def compare(reference: np.ndarray, logits: np.ndarray) -> dict:
    """Per position of [n, v] rows: KL(reference || logits), whether the top-1s agree, whether the reference was
    sure (top-1 probability >= 0.5)."""
    p, q = log_softmax(reference), log_softmax(logits)
    kl = (np.exp(p) * (p - q)).sum(axis=-1)
    return {"kl": kl, "agree": p.argmax(-1) == q.argmax(-1), "sure": np.exp(p.max(-1)) >= 0.5}


def summarise(parts: list[dict]) -> dict:
    kl = np.concatenate([p["kl"] for p in parts])
    agree = np.concatenate([p["agree"] for p in parts])
    sure = np.concatenate([p["sure"] for p in parts])
    return {"positions": int(kl.size), "kl_mean": round(float(kl.mean()), 5),
            "kl_p99": round(float(np.percentile(kl, 99)), 5), "top1_agree": round(float(agree.mean()), 4),
            "sure_flips": int((sure & ~agree).sum()), "sure_flips_per_1000": round(1000 * float((sure & ~agree).mean()), 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--answers", type=Path, required=True, help="a bench/correctness.py --json file")
    parser.add_argument("--server", default="llama", help="whose answers to read back (default: llama)")
    parser.add_argument("--per-language", type=int, default=20)
    parser.add_argument("--formats", default="int8-lite,int8-lite-nearest,llama.cpp",
                        help="compared with fp32 (default: int8-lite,int8-lite-nearest,llama.cpp)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from typewriter.runners.xla.tf_env import prepare_environment

    prepare_environment(None)
    from typewriter.assemble import read_model
    from typewriter.runners.lite.start import calibration_ids
    from typewriter.text.tokenizer import DEFAULT_SYSTEM_PROMPT

    answers = json.loads(args.answers.read_text())
    path = answers["model"]
    cfg, weights, tokenizer = read_model(Path(path))
    seqs = sequences(answers, args.server, args.per_language, tokenizer, DEFAULT_SYSTEM_PROMPT)
    calibration = calibration_ids(tokenizer.encode)
    formats = args.formats.split(",")
    reference = Reader("fp32", cfg, weights, calibration, path)
    readers = [Reader(fmt, cfg, weights, calibration, path) for fmt in formats]
    parts: dict[str, list[dict]] = {fmt: [] for fmt in formats}
    for s in seqs:  # one sequence at a time: a 150k-token vocabulary's logits are 0.6 MB a position
        at = slice(s["answer_from"] - 1, -1)  # the rows that predict the answer's tokens
        ref = reference(s["ids"])[at]
        for fmt, reader in zip(formats, readers):
            parts[fmt].append({**compare(ref, reader(s["ids"])[at]), "language": s["language"]})
    result = {"model": Path(path).name, "answers_of": args.server, "sequences": len(seqs),
              "answer_tokens": sum(len(s["ids"]) - s["answer_from"] for s in seqs), "formats": {}}
    for fmt in formats:
        by_language = {lang: summarise([p for p in parts[fmt] if p["language"] == lang])
                       for lang in ("en", "es", "zh") if any(p["language"] == lang for p in parts[fmt])}
        result["formats"][fmt] = {"all": summarise(parts[fmt]), **by_language}
        print(json.dumps({"format": fmt, **result["formats"][fmt]}), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
