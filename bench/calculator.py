"""Whether the tutor's calculator (TYPEWRITER_CALCULATOR, server/calculator.py) makes its maths answers right more
often: GSM8K's English test problems through our server with the calculator off, then on, each problem asked as
bench/correctness.py asks it (the tutor's system prompt, greedy, over /v1/chat/completions) and graded by its rules.

    .venv/bin/python bench/calculator.py --model ~/.cache/typewriter/models/qwen2.5-coder-0.5b-instruct.gguf \
        --limit 50 --json bench/results/2026-12-05-calculator-0.5b.json
    .venv/bin/python bench/calculator.py --regrade bench/results/2026-12-05-calculator-0.5b.json

Each setting has a server of its own, both started first; the problems go in rounds of `--round` problems, each
round to one server and then the other (the order swapped every round), never to both at once, so a machine whose
load drifts (other work) weighs on both settings alike. Each answer is timed from its request to its response. On
/v1 a calculator step is a paragraph of the content (`> calculator: ... = ...`), which is how steps are counted.

Printed per setting: accuracy and its standard error, answers with a step and steps in all, the loop guard's trips
and answers cut at the length, seconds per answer (mean and median) and completion tokens; then the paired
difference, on minus off, over the same problems (bench/correctness.py's `agreement`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from correctness import GSM8K, agreement, grade, load_problems, our_server, summary

STEP = "\n> calculator: "  # how server/calculator.py's ToolStep.as_text begins


def ask(url: str, problem: dict, system: str, max_tokens: int) -> dict:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": problem["question"]}]
    began = time.perf_counter()
    reply = httpx.post(f"{url}/v1/chat/completions", timeout=None, json={
        "model": "tutor", "messages": messages, "temperature": 0, "max_tokens": max_tokens})
    seconds = time.perf_counter() - began
    reply.raise_for_status()
    answer = reply.json()
    choice = answer["choices"][0]
    text = choice["message"]["content"] or ""
    return {**problem, "text": text, "finish_reason": choice["finish_reason"], "seconds": round(seconds, 2),
            "prompt_tokens": answer["usage"]["prompt_tokens"],
            "completion_tokens": answer["usage"]["completion_tokens"], "steps": text.count(STEP)}


def run(model: str, names: list[str], problems: list[dict], system: str, args: argparse.Namespace) -> dict:
    """{setting: {"seconds": time spent answering, "rows": answers in the problems' order}}."""
    servers = {name: our_server(model, None, args.concurrency, args.context) for name in names}
    for name, server in servers.items():
        assert server.env is not None
        server.env["TYPEWRITER_CALCULATOR"] = "true" if name == "on" else "false"
        server.env["TYPEWRITER_API_SYSTEM_PROMPT"] = "replace"  # /v1's own mode: the tutor's prompt once, as sent
    done: dict[str, dict] = {name: {"seconds": 0.0, "rows": []} for name in names}
    with contextlib.ExitStack() as stack, ThreadPoolExecutor(args.concurrency) as pool:
        for server in servers.values():
            stack.enter_context(server.start(timeout_s=900))
        for n, at in enumerate(range(0, len(problems), args.round)):
            for name in names if n % 2 == 0 else names[::-1]:
                url, began = servers[name].http_url, time.perf_counter()
                done[name]["rows"] += pool.map(lambda p: ask(url, p, system, args.max_tokens),
                                               problems[at:at + args.round])
                done[name]["seconds"] = round(done[name]["seconds"] + time.perf_counter() - began, 1)
            print(f"  {min(at + args.round, len(problems))}/{len(problems)}", file=sys.stderr, flush=True)
    return done


def report(result: dict, tokenizer) -> None:
    for name, run_ in result["settings"].items():
        rows = run_["rows"]
        grade(rows, tokenizer)
        seconds = [r["seconds"] for r in rows]
        run_["summary"] = {**summary(rows)["en"], "answers_with_a_step": sum(r["steps"] > 0 for r in rows),
                           "steps": sum(r["steps"] for r in rows),
                           "mean_seconds": round(statistics.mean(seconds), 1),
                           "median_seconds": round(statistics.median(seconds), 1)}
        print(json.dumps({"calculator": name, **run_["summary"]}), flush=True)
    if {"off", "on"} <= set(result["settings"]):
        result["agreement"] = agreement(result["settings"]["on"]["rows"], result["settings"]["off"]["rows"])
        print(json.dumps({"on_minus_off": result["agreement"]}), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model", help="a GGUF file whose chat template takes tools (Qwen2.5's)")
    parser.add_argument("--limit", type=int, default=50, help="English problems (default 50)")
    parser.add_argument("--offset", type=int, default=0, help="the first problem (default 0)")
    parser.add_argument("--settings", default="off,on", help="calculator off, on, or both (the first goes first)")
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--concurrency", type=int, default=4, help="slots, and requests in flight (default 4)")
    parser.add_argument("--round", type=int, default=8, help="problems a server answers before the other's turn")
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--gsm8k", type=Path, default=GSM8K)
    parser.add_argument("--json", type=Path, help="write every answer and the summaries here")
    parser.add_argument("--regrade", type=Path, help="grade an earlier --json file again, asking no server")
    args = parser.parse_args()

    from typewriter.text.tokenizer import DEFAULT_SYSTEM_PROMPT, Tokenizer

    if args.regrade:
        result = json.loads(args.regrade.read_text())
    else:
        if not args.model:
            parser.error("--model is needed unless --regrade")
        problems = load_problems(["en"], args.limit, args.offset, args.gsm8k)
        result = {"model": args.model, "problems": len(problems), "offset": args.offset, "round": args.round,
                  "max_tokens": args.max_tokens, "concurrency": args.concurrency, "settings": {}}
        result["settings"] = run(args.model, args.settings.split(","), problems, DEFAULT_SYSTEM_PROMPT, args)
    report(result, Tokenizer.from_gguf(result["model"]))
    write(result, args.json or args.regrade)
    return 0


def write(result: dict, path: Path | None) -> None:
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    sys.exit(main())
