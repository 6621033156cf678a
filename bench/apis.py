"""The socket against the OpenAI-compatible API: time to first token, inter-token latency and tokens/s of the same
chats through each front door of one server, in one run.

    .venv/bin/python bench/apis.py --json artifacts/apis.json

It starts `typewriter serve` (the embedded model unless --model; 4 slots), waits until every program has
compiled (so no round meets a background compile), then runs `typewriter loadtest`'s measurement in turns:
socket, SSE, socket, SSE, ... at each concurrency, and reports the median of the rounds for each and their ratio
(SSE over socket; 1.0 is parity, below 1 for latencies means SSE was faster).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import httpx
from classroom_servers import embedded_model, typewriter_server

from typewriter.commands.loadtest import measure

PROMPT = "Can you explain why dividing by a fraction is the same as multiplying by its reciprocal?"


def wait_for_programs(base: str, timeout_s: float = 900.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        programs = httpx.get(f"{base}/readyz", timeout=5).json()["runtime"]["programs"]
        if "made_at_load" in programs or programs["compiled"] == programs["total"]:
            return
        print(f"  compiling: {programs['compiled']} of {programs['total']} programs", file=sys.stderr, flush=True)
        time.sleep(10)
    raise RuntimeError("the programs did not all compile in time")


def one(url: str, concurrency: int, requests: int, tokens: int) -> dict:
    report = asyncio.run(measure(url, concurrency, requests, PROMPT, tokens))
    if report["errors"]:
        raise RuntimeError(f"{url}: errors {report['error_messages']}")
    return {"ttft_p50_ms": report["ttft_ms"]["p50"], "ttft_p95_ms": report["ttft_ms"]["p95"],
            "inter_token_p50_ms": report["inter_token_ms"]["p50"],
            "inter_token_p95_ms": report["inter_token_ms"]["p95"], "tokens_per_s": report["tokens_per_s"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a GGUF file or HF directory (default: the embedded model)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--rounds", type=int, default=3, help="turns of each front door per concurrency")
    parser.add_argument("--tokens", type=int, default=128, help="answer length each chat asks for")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    with typewriter_server(4, 32, 2048, args.model or embedded_model()).start(timeout_s=600) as server:
        wait_for_programs(server.http_url)
        urls = {"socket": f"ws://127.0.0.1:{server.port}/ws", "sse": f"{server.http_url}/v1"}
        one(urls["socket"], 1, 1, 16)  # warm both paths once
        one(urls["sse"], 1, 1, 16)
        results = {}
        for concurrency in args.concurrency:
            rounds = {"socket": [], "sse": []}
            for _ in range(args.rounds):
                for door, url in urls.items():
                    rounds[door].append(one(url, concurrency, 2 * concurrency, args.tokens))
            medians = {door: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
                       for door, runs in rounds.items()}
            ratios = {k: round(medians["sse"][k] / medians["socket"][k], 3) for k in medians["socket"]}
            results[str(concurrency)] = {**medians, "sse_over_socket": ratios}
            print(f"{concurrency} at once: " + json.dumps(results[str(concurrency)]), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"tokens": args.tokens, "rounds": args.rounds, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
