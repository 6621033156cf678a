"""`typewriter loadtest --url URL`: drive a running server's chat door and measure it. The URL picks the door, the
socket (ws://) or the OpenAI API streamed (http://), so that the two can be compared on one server. Text the server
holds back (a partial stop string) counts in the gap before the token that brings it.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from ..errors import TypewriterError
from .args import positive_int

if TYPE_CHECKING:
    import httpx

DEFAULT_PROMPT = "Explain in a few sentences why the sky is blue."
CONNECT_TIMEOUT_S = 10.0


class Unreachable(TypewriterError):
    """Nothing listens at the URL, its host does not resolve, or what answers is no Typewriter chat door."""

    code = "unreachable"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", required=True, type=chat_url,
                        help="the server's chat endpoint: ws://HOST:PORT/ws (protocol v1) or http://HOST:PORT/v1 "
                             "(OpenAI-compatible, streamed); ws://HOST:PORT and http://HOST:PORT mean the same")
    parser.add_argument("--concurrency", type=positive_int, default=4, metavar="N",
                        help="connections chatting at once (default %(default)s)")
    parser.add_argument("--requests", type=positive_int, default=16, metavar="M",
                        help="chats in all (default %(default)s)")
    parser.add_argument("--prompt", default=DEFAULT_PROMPT, help="the user message every chat sends")
    parser.add_argument("--max-new-tokens", type=positive_int, default=128, metavar="N",
                        help="answer length each chat asks for (default %(default)s)")
    parser.add_argument("--json", action="store_true", help="the report as one JSON object instead of a table")
    parser.epilog = "exit codes: 0 every chat ended, 1 some chats failed, 2 a bad option or no server at the URL"


def chat_url(text: str) -> str:
    """An argparse type: a base URL gets its door's path (/ws, /v1), a pasted .../v1/chat/completions is cut back to
    /v1, and any other path is refused with the two URLs it could have meant."""
    parts = urlsplit(text.strip())
    scheme = parts.scheme.lower()
    if scheme not in ("ws", "wss", "http", "https") or not parts.netloc:
        raise argparse.ArgumentTypeError(f"must be a ws:// URL such as ws://127.0.0.1:8000/ws or an http:// URL "
                                         f"such as http://127.0.0.1:8000/v1, got {text!r}")
    path = parts.path.rstrip("/")
    if path.endswith("/v1/chat/completions"):
        path = path.removesuffix("/chat/completions")
    door = "/ws" if scheme in ("ws", "wss") else "/v1"
    if not path or path.endswith(door):
        return urlunsplit((scheme, parts.netloc, path or door, "", ""))
    prefix = path.rsplit("/", 1)[0] if path.endswith(("/ws", "/v1")) else path  # a proxy's, kept
    secure = scheme in ("wss", "https")
    socket, openai = (f"{'wss' if secure else 'ws'}://{parts.netloc}{prefix}/ws",
                      f"{'https' if secure else 'http'}://{parts.netloc}{prefix}/v1")
    raise argparse.ArgumentTypeError(f"{text!r} names neither door: give {socket} for the socket or {openai} for "
                                     "the OpenAI API")


@dataclass
class Results:
    ttft_s: list[float] = field(default_factory=list)
    inter_token_s: list[float] = field(default_factory=list)
    completion_tokens: int = 0
    ok: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    first_error: dict[str, str] = field(default_factory=dict)  # code -> the server's message, to act on

    def failed(self, code: str, message: str) -> None:
        self.errors[code] += 1
        self.first_error.setdefault(code, message)

    def text_at(self, now: float, sent: float, last: float | None) -> float:
        """Count text that arrived at `now` for a chat sent at `sent` whose text last arrived at `last`."""
        (self.ttft_s if last is None else self.inter_token_s).append(now - (sent if last is None else last))
        return now


def run(args: argparse.Namespace) -> int:
    report = asyncio.run(measure(args.url, args.concurrency, args.requests, args.prompt, args.max_new_tokens))
    print(json.dumps(report, indent=2) if args.json else format_table(report))
    return 0 if report["ok"] == report["requests"] and not report["errors"] else 1


async def measure(url: str, concurrency: int, requests: int, prompt: str, max_new_tokens: int) -> dict[str, Any]:
    """Raises Unreachable before any chat when no server is there to drive."""
    on_socket = url.startswith(("ws://", "wss://"))
    await (_check_socket(url) if on_socket else _check_openai(url))
    results = Results()
    numbers = itertools.count()
    connections = min(concurrency, requests)
    started = time.perf_counter()
    worker = _socket_worker if on_socket else _openai_worker
    await asyncio.gather(*(worker(url, numbers, requests, prompt, max_new_tokens, results)
                           for _ in range(connections)))
    wall_s = time.perf_counter() - started
    return {
        "url": url,
        "concurrency": connections,
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


async def _check_socket(url: str) -> None:
    from ..client import AsyncClient, ConnectFailed, HandshakeRefused

    try:
        async with AsyncClient(url, open_timeout=CONNECT_TIMEOUT_S):
            pass
    except (ConnectFailed, HandshakeRefused) as e:
        raise Unreachable(str(e)) from None


async def _socket_worker(url: str, numbers: Iterator[int], requests: int, prompt: str, max_new_tokens: int,
                         results: Results) -> None:
    from ..client import AsyncClient, ChatError, ClientError, Ended, ServerClosed, TokenEvent

    async with AsyncClient(url, open_timeout=CONNECT_TIMEOUT_S) as client:  # checked a moment ago
        while (n := next(numbers)) < requests:
            sent, last = time.perf_counter(), None
            try:
                async for event in client.chat(prompt, id=f"loadtest-{n}", max_new_tokens=max_new_tokens).events():
                    if isinstance(event, TokenEvent):
                        last = results.text_at(time.perf_counter(), sent, last)
                    elif isinstance(event, Ended):
                        results.ok += 1
                        results.reasons[event.reason] += 1
                        results.completion_tokens += event.usage.completion_tokens
            except ChatError as e:
                results.failed(e.code, e.message)
            except ServerClosed as e:  # the next chat opens a new socket
                results.failed(f"closed {e.close_code}", e.reason or str(e))
            except ClientError as e:  # the server went away: this connection stops
                results.failed(e.code, str(e))
                return


async def _check_openai(url: str) -> None:
    import httpx

    try:
        async with httpx.AsyncClient(timeout=CONNECT_TIMEOUT_S) as http:
            response = await http.get(f"{url}/models")
    except httpx.HTTPError as e:
        raise Unreachable(_connect_failure(url, e)) from None
    if response.status_code not in (200, 401, 503):  # 401: a key is needed; 503: loading, the chats will say
        raise Unreachable(f"{url}/models answered HTTP {response.status_code}, so {url} is no Typewriter server's "
                          "OpenAI API; give http://HOST:PORT/v1 (or ws://HOST:PORT/ws for the socket)")


def _connect_failure(url: str, e: Exception) -> str:
    """httpx's error, worded as typewriter.client words a socket's (the OSError under it says what happened)."""
    import httpx

    from ..client.protocol import connect_error

    deepest, cause = None, e.__cause__ or e.__context__
    while cause is not None:  # "All connection attempts failed" is an OSError too; the one under it says why
        deepest = cause if isinstance(cause, OSError) else deepest
        cause = cause.__cause__ or cause.__context__
    if isinstance(e, httpx.TimeoutException):
        deepest = TimeoutError()
    return str(connect_error(url, deepest or e, CONNECT_TIMEOUT_S))


async def _openai_worker(url: str, numbers: Iterator[int], requests: int, prompt: str, max_new_tokens: int,
                         results: Results) -> None:
    import httpx

    try:
        async with httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=600.0)) as http:
            while next(numbers) < requests:
                await _one_completion(http, f"{url}/chat/completions", prompt, max_new_tokens, results)
    except httpx.HTTPError as e:  # the server went away: this connection stops
        results.failed("connect_failed", _connect_failure(url, e))


async def _one_completion(http: httpx.AsyncClient, endpoint: str, prompt: str, max_new_tokens: int,
                          results: Results) -> None:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_new_tokens,
            "stream": True, "stream_options": {"include_usage": True}}
    sent, last = time.perf_counter(), None
    async with http.stream("POST", endpoint, json=body) as response:
        if response.status_code != 200:
            text = (await response.aread()).decode(errors="replace")
            try:
                error = json.loads(text)["error"]
                results.failed(str(error["code"]), str(error["message"]))
            except (ValueError, KeyError, TypeError):
                results.failed(f"http_{response.status_code}", text[:200] or "no body")
            return
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            try:
                chunk = json.loads(line[len("data: "):])
            except ValueError:
                results.failed("invalid_event", f"not JSON: {line[:200]!r}")
                return
            if "error" in chunk:
                results.failed(chunk["error"]["code"], chunk["error"]["message"])
                return
            choice = chunk["choices"][0] if chunk["choices"] else {}
            if choice.get("delta", {}).get("content"):
                last = results.text_at(time.perf_counter(), sent, last)
            if choice.get("finish_reason"):
                results.ok += 1
                results.reasons[choice["finish_reason"]] += 1
            if chunk.get("usage"):
                results.completion_tokens += chunk["usage"]["completion_tokens"]


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1) of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _summary(seconds: list[float]) -> dict[str, float | None]:
    if not seconds:
        return {"p50": None, "p95": None}
    return {"p50": round(percentile(seconds, 0.5) * 1e3, 2), "p95": round(percentile(seconds, 0.95) * 1e3, 2)}


def format_table(report: dict[str, Any]) -> str:
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
