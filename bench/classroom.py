"""The classroom benchmark: simulated students chat with our server and with llama.cpp's llama-server in one run.

    .venv/bin/python bench/classroom.py --json artifacts/classroom.json

Each student opens one connection and holds a conversation of a few turns: a tutoring question, the answer
streamed back, a reading pause, the next question with the whole history (the questions and the answers as
received), as a chat client does. Every student of a class size starts together, give or take a small seeded
jitter; the class is over when the last one finishes. The questions, pauses and jitter come from one seed, so
both servers get the same classroom. Both answer greedily (temperature 0, no repetition penalty) from the same
GGUF file with the tutor's system prompt, so they do comparable work.

Measures, per server and class size (all on the client's clock):
  TTFT             from sending a request to its first non-empty text; p50 and p95 over every turn
  inter-token      between consecutive non-empty text deltas of one answer; p50 and p95 over every gap
  longest stall    the longest such gap seen by any answer
  tokens/s         completion tokens of the whole class / its wall time (reading pauses included)
  prefix hit       prompt tokens the server reused from its cache / prompt tokens: ours from /metrics
                   (typewriter_prefix_reused_tokens_total, "-" when the server has no such counter), llama-server
                   from each answer's usage.prompt_tokens_details.cached_tokens
  errors           by code: the server's error codes, end_<reason> for an answer that ended other than by eos,
                   length or stop, timeout for one past --request-timeout, connect for a failed connection; a
                   student whose turn fails stops there
  capacity         the largest class size with inter-token p95 < 100 ms, TTFT p95 < 1 s and no errors
  constrained      with --constrained F: every (1/F)th student asks each answer as JSON under ANSWER_SCHEMA
                   (`response_format` json_schema, on both servers); how many such answers parse and validate,
                   and how many ran out of --max-new-tokens

Our server is started at its defaults (`typewriter serve --max-context 2048`: it sizes its slots by the step times
it measures) unless --max-active is given or --ours names a running one. llama-server (scripts/build-llama-server.sh builds it) is restarted for each
class size with one slot per student and 2048 tokens of context per slot, threads 2, its prompt cache on, once
with separate KV buffers per slot (default) and once with one unified buffer (-kvu); the table shows the better
of the two per size (the one that meets the target, else the more tokens/s) and the JSON both.

Run it on an otherwise idle machine (each run records the load average before it): llama-server's threads wait
for each other by spinning, so with -t 2 on 2 cores any other busy process can slow it many times over.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from classroom_clients import LlamaChat, Params, Turn, TypewriterChat
from classroom_report import best_layout, capacity, summarise, table
from classroom_servers import HOST, build_llama_server, embedded_model, llama_server, typewriter_server

QUESTIONS = [
    "How do I add fractions with different denominators, like 1/3 + 1/4?",
    "What is the Pythagorean theorem and when can I use it?",
    "Can you explain what a derivative means in calculus?",
    "How do I solve the equation 3x + 7 = 22?",
    "Why is the sky blue?",
    "What happens during photosynthesis?",
    "What is the difference between an atom and a molecule?",
    "How do vaccines help the body fight disease?",
    "How should I structure a persuasive essay?",
    "What makes a good thesis statement?",
    "When do I use a semicolon instead of a comma?",
    "How can I make my short story's opening more interesting?",
    "What were the main causes of the First World War?",
    "Why did the Roman Empire fall?",
    "What was the Industrial Revolution and why did it matter?",
    "How does the water cycle work?",
]
METRICS = ("typewriter_prefix_reused_tokens_total", "typewriter_prompt_tokens_total")
# A constrained student's answer: the explanation and a question back, as a tutoring app would show them.
ANSWER_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["explanation", "check_question"],
                 "properties": {"explanation": {"type": "string", "maxLength": 600},
                                "check_question": {"type": "string", "maxLength": 200}}}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "tutor_answer", "schema": ANSWER_SCHEMA,
                                                          "strict": True}}


@dataclass(frozen=True)
class Plan:
    """One student's part of a classroom: when they start, what they ask, how long they read each answer."""
    start_s: float
    questions: list[str]
    pauses_s: list[float]
    response_format: dict | None = None  # RESPONSE_FORMAT for a constrained student


def classroom(students: int, args: argparse.Namespace) -> list[Plan]:
    plans = []
    for i in range(students):
        rng = random.Random(f"{args.seed}/{students}/{i}")
        picks = rng.sample(QUESTIONS, min(args.turns, len(QUESTIONS)))  # no repeats unless turns > questions
        questions = [picks[k % len(picks)] for k in range(args.turns)]
        pauses = [rng.uniform(*args.pause) for _ in range(args.turns - 1)]
        constrained = args.constrained > 0 and i % round(1 / args.constrained) == 0
        plans.append(Plan(rng.uniform(0, args.jitter), questions, pauses, RESPONSE_FORMAT if constrained else None))
    return plans


async def student(chat, plan: Plan, system_prompt: str, turns: list[Turn]) -> None:
    from websockets.exceptions import WebSocketException

    await asyncio.sleep(plan.start_s)
    messages = [{"role": "system", "content": system_prompt}]
    try:
        async with chat:
            for k, question in enumerate(plan.questions):
                if k:
                    await asyncio.sleep(plan.pauses_s[k - 1])
                messages.append({"role": "user", "content": question})
                turn = await chat.ask(list(messages), plan.response_format)
                turns.append(turn)
                if turn.error:
                    return
                messages.append({"role": "assistant", "content": turn.text})
    except (OSError, TimeoutError, WebSocketException) as e:
        turns.append(Turn(error="connect", detail=f"{type(e).__name__}: {e}"))


async def run_class(make_chat, plans: list[Plan], system_prompt: str) -> tuple[list[Turn], float]:
    turns: list[Turn] = []
    started = time.perf_counter()
    await asyncio.gather(*(student(make_chat(), plan, system_prompt, turns) for plan in plans))
    return turns, time.perf_counter() - started


def read_metrics(http_url: str) -> dict[str, float] | None:
    """The sums of METRICS in the server's Prometheus text (a name it lacks is absent); None if unreadable."""
    try:
        text = httpx.get(http_url + "/metrics", timeout=10).text
    except httpx.HTTPError:
        return None
    sums: dict[str, float] = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in METRICS:  # `name{labels} value`, summed over labels
            sums[name] = sums.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return sums


def prefix_hit(before: dict | None, after: dict | None) -> float | None:
    reused, prompt = METRICS
    if not before or not after or reused not in after or prompt not in after:
        return None
    served = after[prompt] - before.get(prompt, 0.0)
    return (after[reused] - before.get(reused, 0.0)) / served if served else None


def measure_ours(ws_url: str, plans: list[Plan], args: argparse.Namespace, system_prompt: str) -> dict:
    http_url = "http" + ws_url[2:].rsplit("/", 1)[0]
    before, load = read_metrics(http_url), os.getloadavg()[0]
    turns, wall_s = asyncio.run(run_class(lambda: TypewriterChat(ws_url, args.params), plans, system_prompt))
    return summarise(turns, wall_s, prefix_hit(before, read_metrics(http_url))) | {"load_before": load} \
        | constrained_answers(turns)


def measure_peer(binary: str, model: str, unified: bool, plans: list[Plan], args: argparse.Namespace,
                 system_prompt: str) -> dict:
    server = llama_server(binary, model, len(plans), args.max_context, args.threads, unified)
    with server.start(args.ready_timeout):
        load = os.getloadavg()[0]
        turns, wall_s = asyncio.run(run_class(lambda: LlamaChat(server.http_url, args.params), plans, system_prompt))
    return summarise(turns, wall_s, None) | {"load_before": load, "log": str(server.log)} | constrained_answers(turns)


def constrained_answers(turns: list[Turn]) -> dict:
    """Of the constrained answers: how many, how many parse and validate, how many ran out of length."""
    import jsonschema

    asked = [t for t in turns if t.constrained and not t.error]
    valid = 0
    for turn in asked:
        try:
            jsonschema.validate(json.loads(turn.text), ANSWER_SCHEMA)
            valid += 1
        except (ValueError, jsonschema.ValidationError):
            pass
    return {"constrained": {"answers": len(asked), "valid": valid, "length": sum(t.reason == "length" for t in asked)}}


def progress(name: str, students: int, s: dict) -> None:
    print(f"  {name:<12} {students:>3} students: {s['tokens_per_s']:7.1f} tokens/s, TTFT p95 {s['ttft_ms']['p95']} ms, "
          f"inter-token p95 {s['inter_token_ms']['p95']} ms, errors {s['errors'] or 0}, {s['wall_s']} s "
          f"(load average before: {s['load_before']:.1f})",
          file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> dict:
    from typewriter.text.tokenizer import DEFAULT_SYSTEM_PROMPT

    layouts = {"both": [False, True], "default": [False], "kvu": [True], "none": []}[args.peer_layouts]
    model = args.model or embedded_model()
    binary = (args.peer_bin or build_llama_server()) if layouts else None
    ours = None
    if not args.ours:
        largest = max(args.students)
        ours = typewriter_server(args.max_active, max(32, largest), args.max_context, args.model)
        print(f"starting our server (log {ours.log}) ...", file=sys.stderr, flush=True)
        ours.start(args.ready_timeout)
    ws_url = args.ours or f"ws://{HOST}:{ours.port}/ws"
    ready = httpx.get("http" + ws_url[2:].rsplit("/", 1)[0] + "/readyz", timeout=10).json()
    slots = ready.get("runtime", {}).get("slots")  # how many, and how our server sized them
    print(f"our server: {slots}", file=sys.stderr, flush=True)
    sizes = []
    try:
        for n in args.students:
            plans = classroom(n, args)
            size: dict = {"students": n, "ours": measure_ours(ws_url, plans, args, DEFAULT_SYSTEM_PROMPT)}
            progress("ours", n, size["ours"])
            runs = {}
            for unified in layouts:
                name = "kvu" if unified else "default"
                runs[name] = measure_peer(binary, model, unified, plans, args, DEFAULT_SYSTEM_PROMPT)
                progress(f"peer {name}", n, runs[name])
            if runs:
                size |= {"peer_runs": runs, "peer_layout": best_layout(runs), "peer": runs[best_layout(runs)]}
            sizes.append(size)
    finally:
        if ours:
            ours.stop()
    caps = {"ours": capacity({s["students"]: s["ours"] for s in sizes}),
            "peer": capacity({s["students"]: s["peer"] for s in sizes}) if layouts else None}
    config = {k: v for k, v in vars(args).items() if k != "params"} | {"model": model, "peer_bin": binary,
                                                                        "ours_url": ws_url, "ours_slots": slots}
    return {"config": config, "sizes": sizes, "capacity": caps}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    def positive(text: str) -> int:
        if int(text) < 1:
            raise argparse.ArgumentTypeError(f"want a positive integer, got {text!r}")
        return int(text)

    def counts(text: str) -> list[int]:
        values = [int(v) for v in text.split(",")]
        if not values or min(values) < 1:
            raise argparse.ArgumentTypeError(f"want positive integers such as 1,4,8, got {text!r}")
        return values

    def seconds_range(text: str) -> tuple[float, float]:
        low, _, high = text.partition(",")
        low_s, high_s = float(low), float(high or low)
        if not 0 <= low_s <= high_s:
            raise argparse.ArgumentTypeError(f"want LOW,HIGH seconds with 0 <= LOW <= HIGH, got {text!r}")
        return low_s, high_s

    p = argparse.ArgumentParser(prog="bench/classroom.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--students", type=counts, default=[1, 4, 8, 16, 32], metavar="N,N,...",
                   help="class sizes, in order (default 1,4,8,16,32)")
    p.add_argument("--turns", type=positive, default=3, metavar="N", help="questions per student (default %(default)s)")
    p.add_argument("--max-new-tokens", type=positive, default=256, metavar="N",
                   help="answer length asked for (default %(default)s)")
    p.add_argument("--pause", type=seconds_range, default=(1.0, 2.0), metavar="LOW,HIGH",
                   help="reading pause between turns, uniform in seconds (default 1,2)")
    p.add_argument("--jitter", type=float, default=0.5, metavar="S",
                   help="students start within this many seconds (default 0.5)")
    p.add_argument("--seed", type=int, default=0, metavar="N", help="seeds questions, pauses and jitter (default 0)")
    p.add_argument("--request-timeout", type=float, default=120.0, metavar="S",
                   help="seconds one answer may take before it counts as error `timeout` (default 120)")
    p.add_argument("--ours", metavar="ws://127.0.0.1:PORT/ws", help="a running server; default: start one")
    p.add_argument("--max-active", type=positive, metavar="N",
                   help="our server's --max-active (default: its own, sized by measured step times)")
    p.add_argument("--max-context", type=positive, default=2048, metavar="N",
                   help="context per stream / per slot (default 2048)")
    p.add_argument("--model", metavar="PATH", help="the GGUF file both servers load (default: the embedded model)")
    p.add_argument("--peer-layouts", choices=["both", "default", "kvu", "none"], default="both",
                   help="llama-server KV layouts to measure (default both; none: ours only)")
    p.add_argument("--peer-bin", metavar="PATH",
                   help="a llama-server binary (default: scripts/build-llama-server.sh's)")
    p.add_argument("--threads", type=positive, default=2, metavar="N", help="llama-server -t (default 2)")
    p.add_argument("--ready-timeout", type=float, default=900.0, metavar="S",
                   help="seconds to wait for a server to be ready")
    p.add_argument("--constrained", type=float, default=0.0, metavar="F",
                   help="the share of students whose answers are JSON under a schema, e.g. 0.25 (default 0)")
    p.add_argument("--json", type=Path, metavar="PATH", help="also write every number as JSON here")
    args = p.parse_args(argv)
    if not 0 <= args.constrained <= 1:
        p.error(f"--constrained: want a share from 0 to 1, got {args.constrained}")
    args.params = Params(args.max_new_tokens, args.request_timeout)
    return args


def main() -> int:
    args = parse_args()
    report = run(args)
    print(table(report["sizes"], report["capacity"]))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
