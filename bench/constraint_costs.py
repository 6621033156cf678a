"""What costly constraints do to a served model (issue 38, item 6): a student's pace alone and beside scripts that
keep sending a constraint (or plain chats), and the server's resident memory as clients send new ~62 KB schemas.
A real `typewriter serve` on loopback (the embedded model unless --model), driven over HTTP.

    .venv/bin/python bench/constraint_costs.py pace [--regex '0{50000}' | --plain] [--scripts 2] [--rounds 3]
    .venv/bin/python bench/constraint_costs.py memory [--schemas 100] [--clients 1]

One JSON line per measurement. `pace`: the student's streamed answer (64 tokens, greedy) timed from its first token
to its last, the median of `--rounds`, alone and then beside the scripts. `memory`: VmRSS every ten schemas, each
client a different X-Forwarded-For address (the server trusts loopback as its proxy).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from classroom_servers import HOST, Server, free_port

STORY = [{"role": "user", "content": "Tell me a long story about a cat who learns to sail."}]
SETTINGS = {"TYPEWRITER_MAX_ACTIVE": "8", "TYPEWRITER_MAX_QUEUE": "32", "TYPEWRITER_MAX_CONTEXT": "1024",
            "TYPEWRITER_CHATS_PER_MINUTE": "100000", "TYPEWRITER_MAX_NEW_TOKENS_CAP": "512",
            "TYPEWRITER_TRUSTED_PROXIES": HOST}


def big_schema(seed: int) -> dict:
    """About 62 KB of JSON: 620 properties of bounded strings with patterns, integers, enums, arrays, objects."""
    rng, properties = random.Random(seed), {}
    for i in range(620):
        name, kind = f"field_{i}_{rng.randrange(10**9)}", rng.randrange(5)
        if kind == 0:
            properties[name] = {"type": "string", "maxLength": rng.randrange(5, 60),
                                "pattern": f"^[a-z]{{1,{rng.randrange(5, 40)}}}$"}
        elif kind == 1:
            properties[name] = {"type": "integer", "minimum": rng.randrange(100), "maximum": 100 + rng.randrange(1000)}
        elif kind == 2:
            properties[name] = {"enum": [f"v{i}_{j}_{rng.randrange(10**4)}" for j in range(rng.randrange(2, 8))]}
        elif kind == 3:
            properties[name] = {"type": "array", "maxItems": 4, "items": {"type": "string", "maxLength": 20}}
        else:
            properties[name] = {"type": "object", "additionalProperties": False,
                                "properties": {"a": {"type": "boolean"}, "b": {"type": "number"}}}
    return {"type": "object", "additionalProperties": False, "properties": properties, "required": list(properties)[:5]}


def pace(client: httpx.Client) -> float:
    """The student's tokens a second, from their first token to their last."""
    stamps: list[float] = []
    body = {"model": "m", "messages": STORY, "temperature": 0, "max_tokens": 64, "stream": True, "loop_guard": False}
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        for line in response.iter_lines():
            if line.startswith("data: {") and (choices := json.loads(line[6:])["choices"]) \
                    and choices[0]["delta"].get("content"):
                stamps.append(time.perf_counter())
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def measure_pace(server: Server, response_format: dict | None, scripts: int, rounds: int) -> dict:
    stop, answers = threading.Event(), []

    def script() -> None:
        with httpx.Client(base_url=server.http_url, timeout=600) as client:
            while not stop.is_set():
                body = {"model": "m", "messages": STORY, "max_tokens": 120}
                if response_format is not None:
                    body["response_format"] = response_format
                response = client.post("/v1/chat/completions", json=body)
                answers.append(response.status_code)

    with httpx.Client(base_url=server.http_url, timeout=600) as client:
        pace(client)  # warm
        alone = statistics.median(pace(client) for _ in range(rounds))
        threads = [threading.Thread(target=script, daemon=True) for _ in range(scripts)]
        for thread in threads:
            thread.start()
        time.sleep(3)  # the scripts are decoding
        try:
            beside = statistics.median(pace(client) for _ in range(rounds))
        finally:
            stop.set()
            for thread in threads:
                thread.join(600)
    return {"scripts": scripts, "response_format": response_format, "alone_tok_s": round(alone, 1),
            "beside_tok_s": round(beside, 1), "ratio": round(beside / alone, 2), "script_answers": len(answers),
            "script_statuses": sorted(set(answers))}


def measure_memory(server: Server, schemas: int, clients: int) -> list[dict]:
    rows = []
    with httpx.Client(base_url=server.http_url, timeout=600) as client:
        def ask(seed: int, who: int) -> int:
            format_ = {"type": "json_schema", "json_schema": {"name": "big", "schema": big_schema(seed)}}
            return client.post("/v1/chat/completions", headers={"X-Forwarded-For": f"198.51.100.{who}"},
                               json={"model": "m", "messages": STORY, "max_tokens": 1,
                                     "response_format": format_}).status_code

        ask(-1, 250)  # the tokenizer llguidance needs is built on the first constraint
        before, began = server.status("VmRSS"), time.monotonic()
        for seed in range(schemas):
            status = ask(seed, seed % clients)
            if seed % 10 == 9 or seed == schemas - 1:
                rows.append({"schemas": seed + 1, "clients": clients, "status": status,
                             "rss_growth_mb": round((server.status("VmRSS") - before) / 1024, 1),
                             "seconds": round(time.monotonic() - began, 1)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["pace", "memory"])
    parser.add_argument("--model", help="a model path (default: the embedded model)")
    parser.add_argument("--regex", default="0{50000}", help="pace: the constraint the scripts send")
    parser.add_argument("--plain", action="store_true", help="pace: the scripts send plain chats instead")
    parser.add_argument("--scripts", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--schemas", type=int, default=100)
    parser.add_argument("--clients", type=int, default=1)
    args = parser.parse_args()
    port = free_port()
    argv = [sys.executable, "-m", "typewriter", "serve", "--host", HOST, "--port", str(port)]
    if args.model:
        argv += ["--model", args.model]
    with Server("typewriter", argv, port, "/readyz", SETTINGS).start(timeout_s=600) as server:
        if args.what == "pace":
            response_format = None if args.plain else {"type": "regex", "regex": args.regex}
            print(json.dumps(measure_pace(server, response_format, args.scripts, args.rounds)), flush=True)
        else:
            for row in measure_memory(server, args.schemas, args.clients):
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
