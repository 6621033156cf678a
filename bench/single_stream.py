"""One student alone: idle time to first token for the tutoring prompt and decode tokens/s, for each of our
weight formats (`typewriter bench --streams 1`, a process each) and for llama.cpp through llama-cpp-python on the
same GGUF file, both a token a step (no drafts), in this process's main thread (from another Python thread it
decoded several times slower), with 2 threads. Ratios are taken within the run. Time to first token is measured
twice on each side: with every prompt token computed (`ttft_uncached_ms`: ours with `cache_prompt=False`,
llama.cpp after `reset()`), and asked again with all but the last token cached (`ttft_ms`: our prefix cache,
llama.cpp's own prefix reuse).

    .venv/bin/python bench/single_stream.py [--formats fp32,int8] [--tokens 128] [--model F.gguf]
        [--peer-threads 2] [--json artifacts/single.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def ours(fmt: str, tokens: int, model: str | None = None) -> dict:
    # one token a step, as llama.cpp's: what the weights' bytes bound (drafts, several a step: bench/drafts.py)
    command = [sys.executable, "-m", "typewriter", "bench", "--json", "--streams", "1", "--tokens", str(tokens),
               "--draft-tokens", "0", "--weights", fmt, *(["--model", model] if model else [])]
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {"ttft_uncached_ms": result["ttft_uncached_ms"], "ttft_ms": result["ttft_ms"],
            "tokens_per_s": result["single_tokens_per_s"], "prompt_tokens": result["prompt_tokens"]}


def llama(path: str, prompt: list[int], tokens: int, threads: int = 2) -> dict:
    from llama_cpp_peer import open_model

    llm = open_model(path, n_ctx=len(prompt) + tokens + 8, threads=threads)
    uncached, cached = [], []
    for _ in range(6):  # the first is a warm-up
        llm.reset()
        start = time.perf_counter()
        next(iter(llm.generate(prompt, top_k=1, temp=0.0, reset=True)))
        uncached.append((time.perf_counter() - start) * 1000)
        llm.reset()
        llm.eval(prompt[:-1])  # as ours: all but the last token cached (a whole cached prompt computes nothing)
        start = time.perf_counter()  # llama-cpp-python keeps the matching prefix
        next(iter(llm.generate(prompt, top_k=1, temp=0.0, reset=True)))
        cached.append((time.perf_counter() - start) * 1000)
    llm.reset()
    stream = llm.generate(prompt, top_k=1, temp=0.0, reset=True)
    next(stream)
    start = time.perf_counter()
    for _ in range(tokens - 1):
        next(stream)
    return {"ttft_uncached_ms": round(statistics.median(uncached[1:]), 1),
            "ttft_ms": round(statistics.median(cached[1:]), 1),
            "tokens_per_s": round((tokens - 1) / (time.perf_counter() - start), 2), "prompt_tokens": len(prompt)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--formats", default="fp32,int8")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--model", help="a GGUF file (default: the embedded model)")
    parser.add_argument("--peer-threads", type=int, default=2,
                        help="llama.cpp's threads (default %(default)s; 1 where other work holds a core, as its "
                             "2-thread decode waits at a barrier after every op)")
    parser.add_argument("--json", help="also write the report here")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    from typewriter.commands.bench import TUTOR_QUESTION
    from typewriter.text.tokenizer import Tokenizer
    from typewriter.weights.source import embedded_model_path

    path = Path(args.model) if args.model else embedded_model_path()
    prompt = Tokenizer.from_gguf(path).encode_chat([{"role": "user", "content": TUTOR_QUESTION}])
    rows = {"llama.cpp (llama-cpp-python)": llama(str(path), prompt, args.tokens, args.peer_threads)}
    for fmt in args.formats.split(","):
        rows[f"typewriter {fmt}"] = ours(fmt, args.tokens, args.model)
    peer = rows["llama.cpp (llama-cpp-python)"]
    for name, row in rows.items():
        row |= {"tokens_per_s_ratio": round(row["tokens_per_s"] / peer["tokens_per_s"], 2),
                "ttft_uncached_ratio": round(row["ttft_uncached_ms"] / peer["ttft_uncached_ms"], 2),
                "ttft_ratio": round(row["ttft_ms"] / peer["ttft_ms"], 2)}
        print(json.dumps({"engine": name, **row}), flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
