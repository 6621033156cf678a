"""One student with drafts from the conversation (engine/drafting.py) against without, and against llama.cpp with and
without its own prompt lookup (llama-cpp-python's LlamaPromptLookupDecoding), on three kinds of question: the
tutoring question `typewriter bench` asks, GSM8K's first maths problems (../shared/datasets/gsm8k), and code to fix
or explain. Greedy, each answer to its end or --tokens.

Ours: one engine (q4-blocks, one slot), each question answered with drafts off and on in turn, --rounds times; the
two answers must be the same tokens (the run stops if not). llama.cpp in this process's main thread, 2 threads.
Reported per kind and engine: tokens/s over the kind's answers (tokens after the first, over the time after the
first), the spread over rounds, ours' share of draft tokens taken, and the ratios within the run.

    .venv/bin/python bench/drafts.py [--model F.gguf] [--gsm8k 8] [--tokens 256] [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
GSM8K = HERE.parent.parent / "shared" / "datasets" / "gsm8k" / "test.jsonl"
CODE = '''def average(numbers):
    total = 0
    for i in range(1, len(numbers)):
        total += numbers[i]
    return total / len(numbers)

print(average([2, 4, 6]))'''
CODE_QUESTIONS = [
    "This prints 3.33 instead of 4. Fix the function and show the whole corrected code:\n\n" + CODE,
    "Explain line by line what this code does:\n\n" + CODE,
    "Add type hints and a docstring to this function, and show the whole function:\n\n" + CODE,
]


def questions(gsm8k: int) -> dict[str, list[str]]:
    from typewriter.commands.bench import TUTOR_QUESTION

    with open(GSM8K) as f:
        maths = [json.loads(line)["question"] for _, line in zip(range(gsm8k), f)]
    return {"tutor": [TUTOR_QUESTION], "gsm8k": maths, "code": CODE_QUESTIONS}


def ours(model: str | None, prompts: dict[str, list[list[int]]], tokens: int, rounds: int) -> dict:
    from typewriter.assemble import load
    from typewriter.config import MOST_DRAFT_TOKENS, Settings, lite_cache_dir
    from typewriter.engine.request import Finished, GenerationRequest, SamplingParams, Token

    engine, _, _ = load(model, slots=1, max_context=2048, max_queue=0, prefill_budget=Settings().engine.prefill_budget,
                        weight_format="q4-blocks", program_cache=lite_cache_dir(), draft_tokens=MOST_DRAFT_TOKENS)
    params = SamplingParams(max_new_tokens=tokens, temperature=0.0)
    runs: dict[str, dict[str, list]] = {}
    steps: list = []
    engine.on_step = steps.append
    try:
        for r in range(rounds):
            for kind, kind_prompts in prompts.items():
                for i, prompt in enumerate(kind_prompts):
                    answers = {}
                    for drafts in ((0, MOST_DRAFT_TOKENS) if (r + i) % 2 == 0 else (MOST_DRAFT_TOKENS, 0)):
                        engine.draft_tokens = drafts
                        steps.clear()
                        ids, first = [], 0.0
                        for event in engine.stream(GenerationRequest(f"drafts-{r}-{kind}-{i}-{drafts}", prompt,
                                                                     params)):
                            if isinstance(event, Token):
                                ids.append(event.token_id)
                                first = first or time.perf_counter()
                            elif isinstance(event, Finished):
                                took = time.perf_counter() - first
                        answers[drafts] = ids
                        run = runs.setdefault(f"{kind} {'on' if drafts else 'off'}", {"tokens": [], "s": [],
                                                                                        "drafted": [], "taken": []})
                        run["tokens"].append(len(ids) - 1)
                        run["s"].append(took)
                        run["drafted"].append(sum(s.drafted for s in steps))
                        run["taken"].append(sum(s.taken for s in steps))
                    if answers[0] != answers[MOST_DRAFT_TOKENS]:
                        sys.exit(f"{kind} {i}: the answers differ with drafts on and off")
    finally:
        engine.shutdown()
    return runs


def llama(path: str, prompts: dict[str, list[list[int]]], tokens: int, rounds: int) -> dict:
    from llama_cpp_peer import import_llama_cpp, open_model

    from typewriter.config import MOST_DRAFT_TOKENS

    lookup = import_llama_cpp().llama_speculative.LlamaPromptLookupDecoding(num_pred_tokens=MOST_DRAFT_TOKENS)
    plain = open_model(path, n_ctx=2048, threads=2)
    drafting = open_model(path, n_ctx=2048, threads=2, draft_model=lookup)
    runs: dict[str, dict[str, list]] = {}
    for _ in range(rounds):
        for kind, kind_prompts in prompts.items():
            for prompt in kind_prompts:
                for name, llm in (("off", plain), ("on", drafting)):
                    llm.reset()
                    n, first = 0, 0.0
                    for token in llm.generate(prompt, top_k=1, temp=0.0, reset=True):
                        if token == llm.token_eos() or n == tokens:
                            break
                        n += 1
                        first = first or time.perf_counter()
                    run = runs.setdefault(f"{kind} {name}", {"tokens": [], "s": []})
                    run["tokens"].append(n - 1)
                    run["s"].append(time.perf_counter() - first)
    return runs


def summary(runs: dict, per_round: dict[str, int]) -> dict:
    """tokens/s over each round's answers of a kind (runs are kept in order, a kind's answers a round together),
    the median and the spread over rounds."""
    out = {}
    for name, run in runs.items():
        k = per_round[name.split()[0]]
        rounds = [slice(r, r + k) for r in range(0, len(run["tokens"]), k)]
        rates = [sum(run["tokens"][r]) / sum(run["s"][r]) for r in rounds]
        row = {"tokens_per_s": round(statistics.median(rates), 1),
               "spread": [round(min(rates), 1), round(max(rates), 1)],
               "answer_tokens": sum(run["tokens"]) // len(rounds)}
        if "drafted" in run:
            row["drafts_taken"] = f"{sum(run['taken'])}/{sum(run['drafted'])}"
        out[name] = row
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a GGUF file (default: the embedded model)")
    parser.add_argument("--gsm8k", type=int, default=8, help="GSM8K problems (default %(default)s)")
    parser.add_argument("--tokens", type=int, default=256, help="the longest answer (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="also write the report here")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    from typewriter.text.tokenizer import Tokenizer
    from typewriter.weights.source import embedded_model_path

    path = Path(args.model) if args.model else embedded_model_path()
    tokenizer = Tokenizer.from_gguf(path)
    prompts = {kind: [tokenizer.encode_chat([{"role": "user", "content": q}]) for q in qs]
               for kind, qs in questions(args.gsm8k).items()}
    per_round = {kind: len(p) for kind, p in prompts.items()}
    report = {"ours": summary(ours(args.model, prompts, args.tokens, args.rounds), per_round),
              "llama.cpp": summary(llama(str(path), prompts, args.tokens, args.rounds), per_round)}
    for kind in prompts:
        ratios = {f"ours {a} / llama.cpp {b}": round(report["ours"][f"{kind} {a}"]["tokens_per_s"] /
                                                     report["llama.cpp"][f"{kind} {b}"]["tokens_per_s"], 2)
                  for a, b in (("off", "off"), ("on", "off"), ("on", "on"))}
        ratios["ours on / off"] = round(report["ours"][f"{kind} on"]["tokens_per_s"] /
                                        report["ours"][f"{kind} off"]["tokens_per_s"], 2)
        ratios["llama.cpp on / off"] = round(report["llama.cpp"][f"{kind} on"]["tokens_per_s"] /
                                             report["llama.cpp"][f"{kind} off"]["tokens_per_s"], 2)
        report[f"{kind} ratios"] = ratios
    print(json.dumps(report, indent=1))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
