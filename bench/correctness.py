"""How often the tutor's answer to a grade-school maths problem is right, through our server and through llama.cpp's
llama-server on the same GGUF file: GSM8K's test split in English and a fixed 40 of its problems translated into
Spanish and Chinese (bench/data/gsm8k-es.jsonl, gsm8k-zh.jsonl), the tutor's system prompt, greedy decoding.

    .venv/bin/python bench/correctness.py --limit 400 --json artifacts/correctness-smollm2.json
    .venv/bin/python bench/correctness.py --model "$(scripts/fetch-qwen-0.5b.sh)" --limit 400 --json artifacts/correctness-qwen.json
    .venv/bin/python bench/correctness.py --servers ours --weights fp32 --limit 400        # the file's weights exactly
    .venv/bin/python bench/correctness.py --servers ours --repetition-penalty 1.0 --no-loop-guard \
        --against artifacts/correctness-qwen.json       # paired with llama-server's answers of an earlier run
    .venv/bin/python bench/correctness.py --regrade artifacts/correctness-qwen.json --json artifacts/regraded.json

Both servers get the same messages (the tutor's system prompt, DEFAULT_SYSTEM_PROMPT, then the problem) over
their OpenAI-compatible /v1/chat/completions with temperature 0 and `--max-tokens` (512): `typewriter serve` at
its defaults otherwise (the model's repetition penalty, the loop guard on) unless --repetition-penalty or
--no-loop-guard says otherwise, and llama-server (scripts/build-llama-server.sh) with `--jinja`, so it renders the GGUF's own chat
template, at its defaults (no repetition penalty). Each server has `--concurrency` slots (8) and is sent that
many problems at a time; the servers run one after the other, never together.

An answer is right when its final number (bench/grading.py: the last \\boxed{} or else the last number) equals
GSM8K's after `####`; its language is checked against the question's. Printed: accuracy per server and language
with its standard error, how the two servers agree problem by problem (the paired difference and its standard
error), and the figure the model's authors publish, where they do.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from classroom_servers import HOST, Server, build_llama_server, embedded_model, free_port
from grading import answer_language, final_number, same_number

HERE = Path(__file__).resolve().parent
GSM8K = Path("/work/shared/datasets/gsm8k/test.jsonl")
TRANSLATED = {"es": HERE / "data" / "gsm8k-es.jsonl", "zh": HERE / "data" / "gsm8k-zh.jsonl"}
# What each model's authors publish for GSM8K, by a piece of the file's name; their prompting differs from ours
# (few-shot, no tutor's prompt), so it is a bearing, not a target.
PUBLISHED = {
    "smollm2-135m": "1.4% (GSM8K 5-shot, lighteval: the SmolLM2-135M-Instruct model card's evaluation table)",
    "qwen2.5-coder-0.5b": "none found for the 0.5B-Instruct (searched: the Qwen2.5-Coder technical report, "
                          "arXiv 2409.12186, and the model card)",
    "qwen2.5-coder-1.5b": "none found for the 1.5B-Instruct (searched: the Qwen2.5-Coder technical report, "
                          "arXiv 2409.12186, and the model card)",
}


def load_problems(languages: list[str], limit: int, offset: int, gsm8k: Path) -> list[dict]:
    problems = []
    if "en" in languages:
        lines = gsm8k.read_text(encoding="utf-8").splitlines()[offset:offset + limit]
        for i, line in enumerate(lines, start=offset):
            row = json.loads(line)
            gold = row["answer"].rsplit("####", 1)[1].strip()
            problems.append({"id": f"en-{i}", "language": "en", "question": row["question"], "gold": gold})
    for language in languages:
        if language != "en":
            for line in TRANSLATED[language].read_text(encoding="utf-8").splitlines():
                row = json.loads(line)
                problems.append({"id": f"{language}-{row['index']}", "language": language,
                                 "question": row["question"], "gold": row["answer"]})
    return problems


def our_server(model: str, weights: str | None, slots: int, context: int) -> Server:
    port = free_port()
    argv = [sys.executable, "-m", "typewriter", "serve", "--host", HOST, "--port", str(port), "--model", model,
            "--max-active", str(slots), "--max-queue", "256", "--max-context", str(context)]
    if weights:
        argv += ["--weights", weights]
    # the benchmark sends the tutor's system prompt itself, as it must to llama-server, and every request comes
    # from loopback, where the per-client limits would count them all as one student
    env = {"TYPEWRITER_CLIENT_SYSTEM_PROMPT": "replace", "TYPEWRITER_API_SYSTEM_PROMPT": "replace",
           "TYPEWRITER_REQUEST_TIMEOUT_S": "none",
           "TYPEWRITER_QUEUE_TIMEOUT_S": "none", "TYPEWRITER_MAX_CONNECTIONS_PER_CLIENT": "100000",
           "TYPEWRITER_CHATS_PER_MINUTE": "100000"}
    return Server(f"typewriter-{weights or 'auto'}", argv, port, "/readyz", env)


def llama_server(binary: str, model: str, slots: int, context: int, threads: int) -> Server:
    port = free_port()
    argv = [binary, "-m", model, "--host", HOST, "--port", str(port), "--jinja", "-np", str(slots),
            "-c", str(slots * context), "-t", str(threads)]
    return Server("llama-server", argv, port, "/health")


def ask(url: str, messages: list[dict], body: dict) -> dict:
    reply = httpx.post(f"{url}/v1/chat/completions", json={"model": "tutor", "messages": messages, **body},
                       timeout=None)
    reply.raise_for_status()
    answer = reply.json()
    choice = answer["choices"][0]
    return {"text": choice["message"]["content"] or "", "finish_reason": choice["finish_reason"],
            "prompt_tokens": answer["usage"]["prompt_tokens"],
            "completion_tokens": answer["usage"]["completion_tokens"]}


def answer_all(server: Server, problems: list[dict], system: str, body: dict, concurrency: int) -> list[dict]:
    def one(problem: dict) -> dict:
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": problem["question"]})
        return {**problem, **ask(server.http_url, messages, body)}

    done = []
    with ThreadPoolExecutor(concurrency) as pool:
        for n, row in enumerate(pool.map(one, problems), start=1):
            done.append(row)
            if n % 50 == 0:
                print(f"  {server.name}: {n}/{len(problems)}", file=sys.stderr, flush=True)
    return done


def grade(rows: list[dict], tokenizer) -> None:
    """Each answer's final number, whether it is right, its language, and whether our loop guard trips on it
    (re-encoded from the text: the API does not return the ids a server generated)."""
    for row in rows:
        row["number"] = final_number(row["text"], row["language"])
        row["correct"] = same_number(row["number"], row["gold"])
        row["answered_in"] = answer_language(row["text"])
        row["looped"] = would_loop(tokenizer.encode(row["text"]))


def would_loop(token_ids: list[int]) -> bool:
    """Whether our loop guard (engine/repetition.py) trips on these tokens: an answer it ended on our server
    reads "stop" over the API, as one that ended by itself."""
    from typewriter.engine.repetition import LoopGuard

    guard = LoopGuard()
    return any(guard.push(t) for t in token_ids)


def summary(rows: list[dict]) -> dict:
    by_language: dict[str, dict] = {}
    for language in sorted({r["language"] for r in rows}):
        part = [r for r in rows if r["language"] == language]
        n, right = len(part), sum(r["correct"] for r in part)
        p = right / n
        by_language[language] = {
            "n": n, "correct": right, "accuracy": round(p, 4), "stderr": round(math.sqrt(p * (1 - p) / n), 4),
            "in_language": sum(r["answered_in"] == language for r in part),
            "cut_at_length": sum(r["finish_reason"] == "length" for r in part),
            "loop_guard_trips": sum(r["looped"] for r in part),
            "no_number": sum(r["number"] is None for r in part),
            "mean_completion_tokens": round(sum(r["completion_tokens"] for r in part) / n, 1),
        }
    return by_language


def agreement(ours: list[dict], theirs: list[dict]) -> dict:
    """Problem by problem, over the problems both answered; the difference in accuracy and its standard error come from the problems where the two
    disagree (a paired comparison: both servers answered the same problems)."""
    by_id = {r["id"]: r for r in theirs}
    pairs = [(a, by_id[a["id"]]) for a in ours if a["id"] in by_id]  # the problems both answered
    n = len(pairs)
    only_ours = sum(a["correct"] and not b["correct"] for a, b in pairs)
    only_theirs = sum(b["correct"] and not a["correct"] for a, b in pairs)
    return {"n": n, "both_right": sum(a["correct"] and b["correct"] for a, b in pairs),
            "both_wrong": sum(not a["correct"] and not b["correct"] for a, b in pairs),
            "only_ours": only_ours, "only_theirs": only_theirs,
            "difference": round((only_ours - only_theirs) / n, 4),
            "difference_stderr": round(math.sqrt(only_ours + only_theirs) / n, 4),
            "same_text": sum(a["text"] == b["text"] for a, b in pairs)}


def published(model: str) -> str:
    name = Path(model).name.lower()
    return next((text for key, text in PUBLISHED.items() if key in name), "none known to this script")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model", help="a GGUF file (default: the embedded model)")
    parser.add_argument("--servers", default="ours,llama", help="ours, llama or both (default: ours,llama)")
    parser.add_argument("--weights", help="our server's --weights (default: its own, auto)")
    parser.add_argument("--limit", type=int, default=200, help="English problems (default 200)")
    parser.add_argument("--offset", type=int, default=0, help="the first English problem (default 0)")
    parser.add_argument("--languages", default="en,es,zh", help="of en, es, zh (default: all three)")
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--concurrency", type=int, default=8, help="slots on each server and requests in flight")
    parser.add_argument("--context", type=int, default=2048, help="tokens of context per slot")
    parser.add_argument("--threads", type=int, default=2, help="llama-server's threads (1 on a machine busy with "
                                                                 "other work: its threads wait for each other)")
    parser.add_argument("--repetition-penalty", type=float,
                        help="sent to both servers (ours: repetition_penalty, llama: repeat_penalty)")
    parser.add_argument("--no-loop-guard", action="store_true", help="turn our loop guard off")
    parser.add_argument("--system", choices=("tutor", "none"), default="tutor",
                        help="the tutor's system prompt, or no system message (the template's own default)")
    parser.add_argument("--gsm8k", type=Path, default=GSM8K, help="GSM8K's test.jsonl")
    parser.add_argument("--json", type=Path, help="also write every answer and the summaries here")
    parser.add_argument("--against", type=Path, help="pair our answers with llama-server's from an earlier --json "
                                                     "file of the same problems, instead of asking llama-server again")
    parser.add_argument("--regrade", type=Path, help="grade the answers of an earlier --json file again, asking "
                                                     "no server")
    args = parser.parse_args()

    from typewriter.text.tokenizer import DEFAULT_SYSTEM_PROMPT, Tokenizer

    if args.regrade:
        result = json.loads(args.regrade.read_text())
        result["against"] = str(args.against) if args.against else result.get("against")
        report(result, Tokenizer.from_gguf(result["model"]))
        write(result, args.json)
        return 0
    model = args.model or embedded_model()
    tokenizer = Tokenizer.from_gguf(model)
    servers = args.servers.split(",")
    system = DEFAULT_SYSTEM_PROMPT if args.system == "tutor" else ""
    problems = load_problems(args.languages.split(","), args.limit, args.offset, args.gsm8k)
    result: dict = {"model": model, "problems": len(problems), "max_tokens": args.max_tokens,
                    "weights": args.weights or "auto", "repetition_penalty": args.repetition_penalty,
                    "loop_guard": not args.no_loop_guard, "system": args.system, "offset": args.offset,
                    "published": published(model), "against": str(args.against) if args.against else None,
                    "servers": {}}
    for name in servers:
        body: dict = {"temperature": 0, "max_tokens": args.max_tokens}
        if name == "ours":
            server = our_server(model, args.weights, args.concurrency, args.context)
            if args.repetition_penalty is not None:
                body["repetition_penalty"] = args.repetition_penalty
            if args.no_loop_guard:
                body["loop_guard"] = False
        else:
            server = llama_server(build_llama_server(), model, args.concurrency, args.context, args.threads)
            if args.repetition_penalty is not None:
                body["repeat_penalty"] = args.repetition_penalty
        t0 = time.perf_counter()
        with server.start(timeout_s=600):
            rows = answer_all(server, problems, system, body, args.concurrency)
        result["servers"][name] = {"seconds": round(time.perf_counter() - t0, 1), "rows": rows}
        write(result, args.json)  # each server's answers kept as soon as they are in
    report(result, tokenizer)
    write(result, args.json)
    return 0


def report(result: dict, tokenizer) -> None:
    """Grade every server's answers, summarise them and, for two servers, how they agree; print it all."""
    for name, run in result["servers"].items():
        grade(run["rows"], tokenizer)
        run["summary"] = summary(run["rows"])
        print(json.dumps({"server": name, **run["summary"]}, ensure_ascii=False), flush=True)
    ours = result["servers"].get("ours", {}).get("rows")
    theirs = result["servers"].get("llama", {}).get("rows")
    if result.get("against"):  # llama-server's answers from an earlier run, to pair with ours
        theirs = json.loads(Path(result["against"]).read_text())["servers"]["llama"]["rows"]
        grade(theirs, tokenizer)
    if ours and theirs:
        result["agreement"] = {language: agreement([r for r in ours if r["language"] == language],
                                                   [r for r in theirs if r["language"] == language])
                               for language in sorted({r["language"] for r in ours})}
        result["agreement"]["all"] = agreement(ours, theirs)
        print(json.dumps({"agreement": result["agreement"]}), flush=True)
    print(f"published GSM8K for this model: {result['published']}")


def write(result: dict, path: Path | None) -> None:
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    sys.exit(main())
