"""Teacher-forced: along a fixed answer, how often each reader's next-token choice is the answer's own token, and
how much the repetition penalty changes that by what it weighs. Tells the weights (our format against llama.cpp
on the same file) from the sampler as the cause of a less right answer, with no generation and so little noise.

    .venv/bin/python bench/penalty_flips.py --follow gold --limit 100 --llama
    .venv/bin/python bench/penalty_flips.py --model "$(scripts/fetch-qwen-0.5b.sh)" --follow gold --limit 100 --llama
    .venv/bin/python bench/penalty_flips.py --follow artifacts/correctness-smollm2.json --per-language 20

`--follow gold`: GSM8K's reference solutions (English; the calculator notes <<...>> dropped, "#### 18" written as
"The answer is 18."), the answers a right tutor gives. `--follow FILE`: llama-server's greedy answers in a
bench/correctness.py --json file, whose every token is llama.cpp's argmax. Each sequence is the prompt our
tokenizer builds (the tutor's system prompt and the question; bench/prompt_tokens.py shows llama-server builds the
same ids) and the answer's tokens, read in one prefill by our model in `--format` (the server's own by default:
int8-lite for the Llama family, fp32 for the others), by `--also` formats, and with `--llama` by llama.cpp
(llama-cpp-python on the same build as llama-server).

At each answer position a reader's choice is the argmax of its logits as they are ("none"), then after the CTRL
penalty (`--penalty`, our default 1.1) over: the prompt and the answer so far ("prompt+answer", what our sampler
weighed), the answer so far only ("answer"), the last 64 tokens ("last64", llama.cpp's repeat_last_n, the
prompt's end included), and the answer's words only ("answer-words": not its tokens of digits, spaces,
punctuation and symbols). Printed per reader and language: the share of positions whose choice is the answer's
token, the mean log-probability of the answer's tokens (nats a token, after the same penalty), and how many answers
a reader would follow to the end.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np
from answer_logits import MAX_LEN, Reader, sequences
from correctness import GSM8K
from quality import log_softmax

HISTORIES = ("none", "prompt+answer", "answer", "last64", "answer-words")
_CALCULATOR = re.compile(r"<<[^>]*>>")


def reference_solution(answer: str) -> str:
    """GSM8K's worked answer as a tutor would write it."""
    steps, final = answer.rsplit("####", 1)
    return f"{_CALCULATOR.sub('', steps).strip()}\nThe answer is {final.strip()}."


def gold_sequences(limit: int, offset: int, tokenizer, system: str) -> list[dict]:
    end = tokenizer.encode("<|im_end|>")
    end = end if len(end) == 1 and end[0] in tokenizer.eos_token_ids else [min(tokenizer.eos_token_ids)]
    picked = []
    for i, line in enumerate(GSM8K.read_text(encoding="utf-8").splitlines()[offset:offset + limit], start=offset):
        row = json.loads(line)
        prompt = tokenizer.encode_chat([{"role": "system", "content": system},
                                        {"role": "user", "content": row["question"]}])
        ids = (prompt + tokenizer.encode(reference_solution(row["answer"])) + end)[:MAX_LEN]
        picked.append({"id": f"en-{i}", "language": "en", "ids": ids, "answer_from": len(prompt)})
    return picked


def penalise(row: np.ndarray, history: list[int], penalty: float) -> np.ndarray:
    """engine/sampling.py's CTRL penalty, on a float64 copy of one row."""
    row = row.astype(np.float64)
    if history and penalty != 1.0:
        seen = np.unique(np.asarray(history, dtype=np.int64))
        values = row[seen]
        row[seen] = np.where(values > 0, values / penalty, values * penalty)
    return row


def words(tokenizer) -> np.ndarray:
    """[vocab] bool: False for the tokens that are whole characters, none of them a letter (digits, spaces,
    punctuation and symbols: a number and its arithmetic); True for the rest, a piece of a character included."""
    def wordy(spelling: bytes) -> bool:
        try:
            return any(c.isalpha() for c in spelling.decode("utf-8"))
        except UnicodeDecodeError:
            return True
    return np.array([wordy(b) for b in tokenizer.token_text.table])


def follow(logits: np.ndarray, ids: list[int], answer_from: int, penalty: float, wordy: np.ndarray
           ) -> dict[str, dict[str, np.ndarray]]:
    """Per answer position and penalty history: whether the argmax is the answer's token, and its log-probability.
    `logits` [n, v]: after each of `ids`."""
    out: dict[str, dict[str, list]] = {h: {"same": [], "logp": []} for h in HISTORIES}
    for t in range(answer_from, len(ids)):
        row, want = logits[t - 1], ids[t]
        for name, history in (("none", []), ("prompt+answer", ids[:t]), ("answer", ids[answer_from:t]),
                              ("last64", ids[:t][-64:]),
                              ("answer-words", [i for i in ids[answer_from:t] if i < wordy.size and wordy[i]])):
            scored = penalise(row, history, penalty)
            out[name]["same"].append(int(np.argmax(scored)) == want)
            out[name]["logp"].append(float(log_softmax(scored[None])[0, want]))
    return {h: {k: np.array(v) for k, v in d.items()} for h, d in out.items()}


def summarise(rows: list[dict]) -> dict:
    tokens = sum(r["tokens"] for r in rows)
    out: dict = {"answers": len(rows), "tokens": tokens}
    for h in HISTORIES:
        out[h] = {"agree": round(sum(r[h]["same"] for r in rows) / tokens, 4),
                  "mean_logp": round(sum(r[h]["logp"] for r in rows) / tokens, 4),
                  "followed_to_the_end": sum(r[h]["first_miss"] is None for r in rows)}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model", help="a GGUF file (default: the embedded model; with a FILE to follow, its)")
    parser.add_argument("--follow", default="gold", help="gold, or a bench/correctness.py --json file")
    parser.add_argument("--limit", type=int, default=100, help="gold: the English problems (default 100)")
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument("--per-language", type=int, default=20, help="a FILE: its answers per language")
    parser.add_argument("--format", help="our weight format (default: the server's own for the model)")
    parser.add_argument("--also", default="", help="more of our formats to read with, comma-separated")
    parser.add_argument("--penalty", type=float, default=1.1, help="the repetition penalty (default 1.1, ours)")
    parser.add_argument("--llama", action="store_true", help="also read with llama.cpp")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from typewriter.runners.xla.tf_env import prepare_environment

    prepare_environment(None)
    from classroom_servers import embedded_model

    from typewriter.assemble import read_model, weights_for
    from typewriter.runners.lite.start import calibration_ids
    from typewriter.text.tokenizer import DEFAULT_SYSTEM_PROMPT

    answers = None if args.follow == "gold" else json.loads(Path(args.follow).read_text())
    path = args.model or (answers["model"] if answers else embedded_model())
    cfg, weights, tokenizer = read_model(Path(path))
    fmt = args.format or weights_for(cfg).value
    if answers is None:
        seqs = gold_sequences(args.limit, args.offset, tokenizer, DEFAULT_SYSTEM_PROMPT)
    else:
        seqs = sequences(answers, "llama", args.per_language, tokenizer, DEFAULT_SYSTEM_PROMPT)
    calibration = calibration_ids(tokenizer.encode)
    wordy = words(tokenizer)
    names = [fmt] + [f for f in args.also.split(",") if f and f != fmt] + (["llama.cpp"] if args.llama else [])
    rows = []
    for name in names:  # one reader at a time: a 150k-token vocabulary's readers are large
        reader = Reader(name, cfg, weights, calibration, path)
        for s in seqs:
            ids, start = s["ids"], s["answer_from"]
            row: dict = {"id": s["id"], "language": s["language"], "reader": name, "tokens": len(ids) - start}
            for h, got in follow(reader(ids), ids, start, args.penalty, wordy).items():
                misses = np.flatnonzero(~got["same"])
                row[h] = {"same": int(got["same"].sum()), "logp": round(float(got["logp"].sum()), 4),
                          "first_miss": int(misses[0]) if misses.size else None}
            rows.append(row)
        del reader
    result: dict = {"model": Path(path).name, "follow": args.follow, "penalty": args.penalty, "readers": names,
                    "sequences": len(seqs), "summary": {}, "rows": rows}
    for name in names:
        for language in ("en", "es", "zh", "all"):
            part = [r for r in rows if r["reader"] == name and language in ("all", r["language"])]
            if part and not (language == "all" and len({r["language"] for r in part}) == 1):
                result["summary"][f"{name} {language}"] = summarise(part)
                print(json.dumps({"reader": name, "language": language, **result["summary"][f"{name} {language}"]}),
                      flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
