"""The classroom benchmark's two chat clients: one student's connection to a server, asked one turn at a time.

`TypewriterChat` speaks protocol v1 over one WebSocket kept open across turns; `LlamaChat` streams llama-server's
OpenAI-compatible `POST /v1/chat/completions` (SSE) over one kept-alive HTTP connection. Both time the same
things on the client's clock: from sending the request to the first non-empty text, and between consecutive
non-empty text deltas. A turn that fails carries an error code instead of raising.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

OK_REASONS = {"eos", "length", "stop_sequence", "stop"}


@dataclass
class Turn:
    text: str = ""
    ttft_s: float | None = None
    gaps_s: list[float] = field(default_factory=list)  # between consecutive non-empty text deltas
    completion_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int | None = None  # prompt tokens the server reused from its cache, where it says
    dropped_messages: int = 0  # oldest messages our server left out to fit the context (llama-server refuses)
    error: str | None = None  # a code; None when the answer ended normally
    detail: str = ""  # the server's message for the error, to act on
    constrained: bool = False  # asked with a response_format
    reason: str = ""  # how it ended, in the server's words (length: cut by max_new_tokens)

    def on_text(self, sent: float, last: float | None) -> float:
        """Record a non-empty delta that arrived now; returns now, the new `last`."""
        now = time.perf_counter()
        if last is None:
            self.ttft_s = now - sent
        else:
            self.gaps_s.append(now - last)
        return now


@dataclass(frozen=True)
class Params:
    max_new_tokens: int
    timeout_s: float


class TypewriterChat:
    """One student's WebSocket to our server (protocol v1)."""

    def __init__(self, url: str, params: Params):
        self.url, self.params, self.ws, self.count = url, params, None, 0

    async def __aenter__(self) -> TypewriterChat:
        from websockets.asyncio.client import connect

        self.ws = await connect(self.url, max_size=None, open_timeout=self.params.timeout_s)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.ws.close()

    async def ask(self, messages: list[dict], response_format: dict | None = None) -> Turn:
        from websockets.exceptions import ConnectionClosed

        self.count += 1
        # Greedy and no repetition penalty on both servers: the same arithmetic, so comparable answers.
        frame = {"type": "chat", "id": f"turn-{self.count}", "messages": messages,
                 "params": {"max_new_tokens": self.params.max_new_tokens, "temperature": 0,
                            "repetition_penalty": 1.0, "loop_guard": False}}  # the same work as llama-server's
        if response_format is not None:
            frame["response_format"] = response_format
        turn, sent, last = Turn(constrained=response_format is not None), time.perf_counter(), None
        try:
            async with asyncio.timeout(self.params.timeout_s):
                await self.ws.send(json.dumps(frame))
                async for raw in self.ws:
                    message = json.loads(raw)
                    kind = message.get("type")
                    if kind == "start":  # unknown fields ignored; these two only where the server sends them
                        turn.cached_tokens = message.get("cached_tokens")
                        turn.dropped_messages = message.get("dropped_messages", 0)
                    elif kind == "token" and message.get("text"):
                        turn.text += message["text"]
                        last = turn.on_text(sent, last)
                    elif kind == "end":
                        usage = message.get("usage", {})
                        turn.completion_tokens = usage.get("completion_tokens", 0)
                        turn.prompt_tokens = usage.get("prompt_tokens", 0)
                        turn.reason = message.get("reason", "")
                        if message.get("reason") not in OK_REASONS:
                            turn.error = f"end_{message.get('reason')}"
                        return turn
                    elif kind == "error":
                        turn.error, turn.detail = message.get("code", "error"), message.get("message", "")
                        return turn
                turn.error = "closed"
        except TimeoutError:
            turn.error = "timeout"
        except ConnectionClosed as e:
            turn.error, turn.detail = f"closed_{e.rcvd.code if e.rcvd else 'abnormal'}", str(e)
        return turn


class LlamaChat:
    """One student's HTTP connection to llama-server's OpenAI-compatible chat endpoint."""

    def __init__(self, base_url: str, params: Params):
        self.base_url, self.params, self.client = base_url, params, None

    async def __aenter__(self) -> LlamaChat:
        import httpx

        self.client = httpx.AsyncClient(base_url=self.base_url, timeout=self.params.timeout_s,
                                        limits=httpx.Limits(max_connections=1))
        return self

    async def __aexit__(self, *exc) -> None:
        await self.client.aclose()

    async def ask(self, messages: list[dict], response_format: dict | None = None) -> Turn:
        import httpx

        body = {"messages": messages, "max_tokens": self.params.max_new_tokens, "temperature": 0,
                "repeat_penalty": 1.0, "cache_prompt": True, "stream": True,
                "stream_options": {"include_usage": True}}
        if response_format is not None:  # llama-server reads OpenAI's json_schema and makes a grammar of it
            body["response_format"] = response_format
        turn, sent, last = Turn(constrained=response_format is not None), time.perf_counter(), None
        try:
            async with asyncio.timeout(self.params.timeout_s):
                async with self.client.stream("POST", "/v1/chat/completions", json=body) as response:
                    if response.status_code != 200:
                        turn.error = f"http_{response.status_code}"
                        turn.detail = (await response.aread()).decode(errors="replace")[:300]
                        return turn
                    async for line in response.aiter_lines():
                        if not line.startswith("data:"):
                            continue
                        data = line[5:].strip()
                        if data == "[DONE]":
                            break
                        chunk = json.loads(data)
                        if "error" in chunk:
                            turn.error = f"peer_{chunk['error'].get('type', 'error')}"
                            turn.detail = chunk["error"].get("message", "")
                            return turn
                        for choice in chunk.get("choices") or ():
                            turn.reason = choice.get("finish_reason") or turn.reason
                            if text := (choice.get("delta") or {}).get("content"):
                                turn.text += text
                                last = turn.on_text(sent, last)
                        if usage := chunk.get("usage"):
                            turn.completion_tokens = usage.get("completion_tokens", 0)
                            turn.prompt_tokens = usage.get("prompt_tokens", 0)
                            turn.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        except TimeoutError:
            turn.error = "timeout"
        except httpx.HTTPError as e:
            turn.error, turn.detail = f"http_{type(e).__name__}", str(e)
        return turn
