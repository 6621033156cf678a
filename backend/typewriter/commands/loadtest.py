"""`typewriter loadtest --url URL`: drive a running server's chat endpoint and measure it.

The URL says which front door: `ws://HOST:PORT/ws` is protocol v1 over the socket, `http://HOST:PORT/v1` the
OpenAI-compatible API streamed as server-sent events, so the two can be compared on one server. N connections
each send chats one after another until M chats have been sent. Time to first token is from sending the chat to
its first text (a `token` frame, or a chunk with content); inter-token latency is between consecutive ones (text
the server holds back, such as a partial stop string, arrives with a later one and so counts in that gap).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import time
from collections import Counter
from dataclasses import dataclass, field

from .args import positive_int

DEFAULT_PROMPT = "Explain in a few sentences why the sky is blue."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", required=True, type=chat_url,
                        help="the server's chat endpoint: ws://HOST:PORT/ws (protocol v1) or http://HOST:PORT/v1 "
                             "(OpenAI-compatible, streamed)")
    parser.add_argument("--concurrency", type=positive_int, default=4, metavar="N",
                        help="connections chatting at once (default %(default)s)")
    parser.add_argument("--requests", type=positive_int, default=16, metavar="M",
                        help="chats in all (default %(default)s)")
    parser.add_argument("--prompt", default=DEFAULT_PROMPT, help="the user message every chat sends")
    parser.add_argument("--max-new-tokens", type=positive_int, default=128, metavar="N",
                        help="answer length each chat asks for (default %(default)s)")
    parser.add_argument("--json", action="store_true", help="the report as one JSON object instead of a table")


def chat_url(text: str) -> str:
    """An argparse type: a ws:// or wss:// URL of the socket, or an http(s):// URL of the OpenAI API."""
    if not text.startswith(("ws://", "wss://", "http://", "https://")):
        raise argparse.ArgumentTypeError(f"must be a ws:// URL such as ws://127.0.0.1:8000/ws or an http:// URL "
                                         f"such as http://127.0.0.1:8000/v1, got {text!r}")
    return text


@dataclass
class Results:
    ttft_s: list[float] = field(default_factory=list)
    inter_token_s: list[float] = field(default_factory=list)
    completion_tokens: int = 0
    ok: int = 0
    reasons: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)
    first_error: dict[str, str] = field(default_factory=dict)  # code -> the server's message, to act on


def run(args: argparse.Namespace) -> int:
    report = asyncio.run(measure(args.url, args.concurrency, args.requests, args.prompt, args.max_new_tokens))
    print(json.dumps(report, indent=2) if args.json else format_table(report))
    return 0 if not report["errors"] else 1


async def measure(url: str, concurrency: int, requests: int, prompt: str, max_new_tokens: int) -> dict:
    results = Results()
    numbers = itertools.count()
    started = time.perf_counter()
    client = _client if url.startswith(("ws://", "wss://")) else _openai_client
    await asyncio.gather(*(client(url, numbers, requests, prompt, max_new_tokens, results)
                           for _ in range(min(concurrency, requests))))
    wall_s = time.perf_counter() - started
    return {
        "url": url,
        "concurrency": concurrency,
        "requests": requests,
        "ok": results.ok,
        "reasons": dict(results.reasons),
        "errors": dict(results.errors),
        "error_messages": results.first_error,
        "ttft_ms": _summary(results.ttft_s),
        "inter_token_ms": _summary(results.inter_token_s),
        "completion_tokens": results.completion_tokens,
        "wall_s": round(wall_s, 3),
        "tokens_per_s": round(results.completion_tokens / wall_s, 2) if wall_s > 0 else 0.0,
    }


async def _client(url, numbers, requests, prompt, max_new_tokens, results: Results) -> None:
    from websockets.asyncio.client import connect
    from websockets.exceptions import WebSocketException

    try:
        async with connect(url, max_size=None) as ws:
            while (n := next(numbers)) < requests:
                await _one_chat(ws, f"loadtest-{n}", prompt, max_new_tokens, results)
    except (OSError, WebSocketException) as e:
        code = f"connection: {type(e).__name__}"
        results.errors[code] += 1
        results.first_error.setdefault(code, str(e))


async def _one_chat(ws, chat_id: str, prompt: str, max_new_tokens: int, results: Results) -> None:
    frame = {"type": "chat", "id": chat_id, "messages": [{"role": "user", "content": prompt}],
             "params": {"max_new_tokens": max_new_tokens}}
    sent = time.perf_counter()
    await ws.send(json.dumps(frame))
    last = None
    async for raw in ws:
        message = json.loads(raw)
        kind = message["type"]
        now = time.perf_counter()
        if kind == "token":
            if last is None:
                results.ttft_s.append(now - sent)
            else:
                results.inter_token_s.append(now - last)
            last = now
        elif kind == "end":
            results.ok += 1
            results.reasons[message["reason"]] += 1
            results.completion_tokens += message["usage"]["completion_tokens"]
            return
        elif kind == "error":
            results.errors[message["code"]] += 1
            results.first_error.setdefault(message["code"], message["message"])
            return


async def _openai_client(url, numbers, requests, prompt, max_new_tokens, results: Results) -> None:
    import httpx

    endpoint = url.rstrip("/") + "/chat/completions"
    try:
        async with httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=600.0)) as http:
            while (n := next(numbers)) < requests:
                await _one_completion(http, endpoint, prompt, max_new_tokens, results)
    except httpx.HTTPError as e:
        code = f"connection: {type(e).__name__}"
        results.errors[code] += 1
        results.first_error.setdefault(code, str(e))


async def _one_completion(http, endpoint: str, prompt: str, max_new_tokens: int, results: Results) -> None:
    body = {"model": "typewriter", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_new_tokens,
            "stream": True, "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    last = None
    async with http.stream("POST", endpoint, json=body) as response:
        if response.status_code != 200:
            error = json.loads(await response.aread()).get("error", {})
            _failed(results, error.get("code") or f"http {response.status_code}", error.get("message", ""))
            return
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            now = time.perf_counter()
            if "error" in chunk:
                _failed(results, chunk["error"]["code"], chunk["error"]["message"])
                return
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                if last is None:
                    results.ttft_s.append(now - sent)
                else:
                    results.inter_token_s.append(now - last)
                last = now
            if chunk["choices"] and chunk["choices"][0]["finish_reason"]:
                results.ok += 1
                results.reasons[chunk["choices"][0]["finish_reason"]] += 1
            if chunk.get("usage"):
                results.completion_tokens += chunk["usage"]["completion_tokens"]


def _failed(results: Results, code: str, message: str) -> None:
    results.errors[code] += 1
    results.first_error.setdefault(code, message)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1) of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _summary(seconds: list[float]) -> dict[str, float | None]:
    if not seconds:
        return {"p50": None, "p95": None}
    return {"p50": round(percentile(seconds, 0.5) * 1e3, 2), "p95": round(percentile(seconds, 0.95) * 1e3, 2)}


def format_table(report: dict) -> str:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f} ms"

    errors = "; ".join(f"{code} {n} ({report['error_messages'][code]})"
                       for code, n in sorted(report["errors"].items())) or "none"
    reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(report["reasons"].items())) or "-"
    rows = [
        ("server", report["url"]),
        ("chats", f"{report['ok']} of {report['requests']} ended ({reasons}) over {report['concurrency']} connections"),
        ("errors", errors),
        ("time to first token", f"p50 {ms(report['ttft_ms']['p50'])}   p95 {ms(report['ttft_ms']['p95'])}"),
        ("inter-token latency",
         f"p50 {ms(report['inter_token_ms']['p50'])}   p95 {ms(report['inter_token_ms']['p95'])}"),
        ("throughput", f"{report['tokens_per_s']:.1f} tokens/s "
                       f"({report['completion_tokens']} tokens in {report['wall_s']:.1f} s)"),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)
