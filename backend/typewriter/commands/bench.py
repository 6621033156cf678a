"""`typewriter bench`: load, compile, time to first token and decode speed of the engine in this process. Speeds
are reported beside their peer in the same run (batched against single-stream), since absolute numbers travel badly.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import TYPE_CHECKING, Any

from ..config import MOST_DRAFT_TOKENS, ConfigError, Settings, default_model_id
from ..engine.request import Event, Finished, GenerationRequest, SamplingParams, Token
from ..progress import StderrProgress
from .args import add_model_arguments, check_model_arguments, positive_int

if TYPE_CHECKING:  # the parser imports no numpy
    from ..engine.engine import Engine

TUTOR_QUESTION = "Can you explain why dividing by a fraction is the same as multiplying by its reciprocal?"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    parser.add_argument("--tokens", type=positive_int, default=256, metavar="N",
                        help="decode tokens to time (default %(default)s)")
    parser.add_argument("--streams", type=positive_int, default=4, metavar="N",
                        help="concurrent streams for the batched run (default %(default)s)")
    parser.add_argument("--draft-tokens", type=int, default=Settings().engine.draft_tokens, metavar="N",
                        choices=range(MOST_DRAFT_TOKENS + 1),
                        help="tokens guessed from the conversation and checked in a step, 0 to "
                             f"{MOST_DRAFT_TOKENS} (default %(default)s; 0: none)")


def run(args: argparse.Namespace) -> int:
    from ..assemble import load

    check_model_arguments(args)  # bad values fail before the model loads
    if args.tokens >= args.max_context:
        raise ConfigError(None, f"must be smaller than --max-context ({args.max_context}) so that the prompt fits, "
                                f"got {args.tokens}", "--tokens")
    streams = args.streams
    progress = StderrProgress("bench")
    # The batched run submits its N streams to N slots, so every one finds a slot free and none waits.
    engine, tokenizer, times = load(args.model, slots=streams, max_context=args.max_context, max_queue=0,
                                    prefill_budget=Settings().engine.prefill_budget, progress=progress,
                                    draft_tokens=args.draft_tokens,
                                    weight_format=args.weights)
    try:
        prompt = tokenizer.encode_chat([{"role": "user", "content": TUTOR_QUESTION}])  # the tutor's system prompt
        progress("time to first token, the prompt computed whole and then reused (medians of 5)")
        uncached = statistics.median(_run(engine, [prompt], 1, cache_prompt=False)[0]["ttft_ms"] for _ in range(5))
        ttft = statistics.median(_run(engine, [prompt], 1)[0]["ttft_ms"] for _ in range(5))
        progress(f"single stream, {args.tokens} tokens")
        single = _run(engine, [prompt], args.tokens)[0]
        result = {
            "model": default_model_id(args.model),
            "load_s": round(times.load_s, 2),
            "compile_s": round(times.compile_s, 2),
            "prompt_tokens": len(prompt),
            "ttft_uncached_ms": round(uncached, 1),  # every prompt token computed
            "ttft_ms": round(ttft, 1),  # all but the last token found in the prefix cache
            "decode_tokens": args.tokens,
            "draft_tokens": engine.draft_tokens,  # 0 where the runner checks no drafts
            "single_tokens_per_s": round(single["tokens_per_s"], 2),
        }
        if streams > 1:
            progress(f"{streams} concurrent streams, {args.tokens} tokens each")
            runs = _run(engine, [prompt] * streams, args.tokens)
            wall = max(r["end"] for r in runs) - min(r["first"] for r in runs)
            aggregate = sum(r["tokens"] - 1 for r in runs) / wall
            result |= {
                "streams": streams,
                "aggregate_tokens_per_s": round(aggregate, 2),
                "batched_vs_single": round(aggregate / single["tokens_per_s"], 2),
            }
    finally:
        engine.shutdown()
    if args.json:
        print(json.dumps(result))
    else:
        width = max(map(len, result))
        for key, value in result.items():
            print(f"{key:<{width}}  {value}")
    return 0


def _run(engine: Engine, prompts: list[list[int]], tokens: int, cache_prompt: bool = True) -> list[dict[str, Any]]:
    """Run prompts concurrently to exactly `tokens` tokens each; per-stream timings."""
    import queue

    params = SamplingParams(max_new_tokens=tokens, temperature=0.0, ignore_eos=True, cache_prompt=cache_prompt)
    events: queue.SimpleQueue[Event] = queue.SimpleQueue()
    stats = {}
    for i, prompt in enumerate(prompts):
        rid = f"bench-{time.perf_counter_ns()}-{i}"
        stats[rid] = {"tokens": 0, "first": 0.0}
        engine.submit(GenerationRequest(rid, prompt, params), events.put)
    done = 0
    while done < len(prompts):
        event = events.get()
        s = stats[event.request_id]
        if isinstance(event, Token):
            s["tokens"] += 1
            if s["tokens"] == 1:
                s["first"] = time.perf_counter()
        elif isinstance(event, Finished):
            s |= {"end": time.perf_counter(), "ttft_ms": event.timings.ttft_ms,
                  "tokens_per_s": event.timings.tokens_per_s}
            done += 1
    return list(stats.values())
