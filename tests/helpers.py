"""What several test files need: protocol v1 frames, reading them until a chat ends, waiting for a condition,
recording an engine request's events, a hand-moved clock for an engine driven step by step, and the weight format
a model runs as here by default."""

from __future__ import annotations

import asyncio
import functools
import json
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from typewriter.engine.request import Finished, GenerationRequest, SamplingParams, Token
from typewriter.engine.step_cost import SEEN

WAIT_S = 10.0  # generous: only reached when something is broken


@functools.cache
def default_weights(model: Path) -> str:
    """What `auto` runs `model` as on this machine (assemble.weights_for): q4-blocks or int8-lite for a Llama."""
    from typewriter.assemble import weights_for
    from typewriter.weights.source import open_source, read_config

    return weights_for(read_config(open_source(model)[0])).value


class Clock:
    """Time that moves only when a test moves it."""

    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def instant_steps(costs) -> None:
    """On the hand-moved clock every step takes no time: tell the step costs so, as the engine would after a few
    steps, so that the token budget alone bounds a chunk here (the time bound has tests of its own)."""
    costs.observe(1, [], 0.0)
    for _ in range(SEEN):
        costs.observe(1, [(0, 1)], 0.0)


def wait_until(condition: Callable[[], object], what: str = "the condition", timeout: float = WAIT_S,
               interval: float = 0.01) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} was not met within {timeout:.0f} s")
        time.sleep(interval)


# ---- protocol v1 frames ----


def chat(request_id: str = "c1", text: str = "hi there", **params) -> dict:
    frame = {"type": "chat", "id": request_id, "messages": [{"role": "user", "content": text}]}
    if params:
        frame["params"] = params
    return frame


def chat_json(request_id: str = "c1", text: str = "hi there", **params) -> str:
    return json.dumps(chat(request_id, text, **params))


def stop_json(request_id: str) -> str:
    return json.dumps({"type": "stop", "id": request_id})


def is_terminal(frame: dict) -> bool:
    return frame["type"] in ("end", "error")


def until_terminal(next_frame: Callable[[], dict]) -> list[dict]:
    """Frames from `next_frame()` up to and including the next `end` or `error`."""
    frames = [next_frame()]
    while not is_terminal(frames[-1]):
        frames.append(next_frame())
    return frames


async def recv_json(ws, timeout: float = WAIT_S) -> dict:
    """The next frame from a `websockets` client connection, failing instead of hanging."""
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))


async def until_terminal_async(ws, timeout: float = WAIT_S) -> list[dict]:
    frames = [await recv_json(ws, timeout)]
    while not is_terminal(frames[-1]):
        frames.append(await recv_json(ws, timeout))
    return frames


def token_frames(frames: list[dict]) -> list[dict]:
    return [f for f in frames if f["type"] == "token"]


def text_of(frames: list[dict]) -> str:
    return "".join(f["text"] for f in token_frames(frames))


# ---- fitting a conversation ----


def quadratic_reference(messages, encode, context, default, asked=None):
    """The fitting as it was: the whole history encoded again for every exchange dropped."""
    from typewriter.text.conversation import FittedPrompt, fit_max_new_tokens

    head = [m for m in messages[:1] if m["role"] == "system"]
    rest = list(messages[len(head):])
    want = asked if asked is not None else min(default, context // 2)
    prompt = encode(head + rest)
    dropped = 0
    if len(prompt) + want > context and len(rest) > 1:
        target = context - context // 4
        while len(rest) > 1 and len(prompt) + want > target:
            cut = 2 if len(rest) > 2 else 1
            rest, dropped = rest[cut:], dropped + cut
            prompt = encode(head + rest)
    return FittedPrompt(prompt, fit_max_new_tokens(len(prompt), context, default, asked), dropped)


# ---- engine events ----


class Recorder:
    """An on_event callback that keeps every event and signals the end."""

    def __init__(self):
        self.events = []
        self.finished = threading.Event()

    def __call__(self, event) -> None:
        self.events.append(event)
        if isinstance(event, Finished):
            self.finished.set()

    def wait(self) -> Finished:
        assert self.finished.wait(WAIT_S), f"no Finished after {WAIT_S}s: {self.events}"
        return self.events[-1]

    @property
    def done(self) -> bool:
        return self.finished.is_set()

    @property
    def text(self) -> str:
        return "".join(e.text for e in self.tokens)

    @property
    def tokens(self) -> list[Token]:
        return [e for e in self.events if isinstance(e, Token)]

    def of(self, kind) -> list:
        return [e for e in self.events if isinstance(e, kind)]


def greedy_ids(engine, ids, n=8) -> list[int]:
    """The engine's greedy answer to `ids`, `n` tokens whatever it says."""
    rec = Recorder()
    engine.submit(GenerationRequest("g", ids, SamplingParams(max_new_tokens=n, temperature=0.0,
                                                             repetition_penalty=1.0, ignore_eos=True)), rec)
    rec.wait()
    return [t.token_id for t in rec.tokens]


# ---- the app over Starlette's TestClient ----


def small_settings(**overrides):
    """Small limits, so tests reach them quickly."""
    from typewriter.config import Settings

    values = dict(system_prompt="Be brief.", max_new_tokens=16, max_new_tokens_cap=64, max_messages=8,
                  max_message_bytes=4096, shutdown_grace_s=2.0, allowed_hosts="testserver")  # TestClient's Host
    return Settings.of(**(values | overrides))


@contextmanager
def serving(engine=None, **overrides):
    """A TestClient on the app, once ready, over `engine` (default: a real Engine on the scripted runner)."""
    from scripted import factory, script_engine
    from starlette.testclient import TestClient

    from typewriter.server.app import create_app

    engine = engine or script_engine()
    app = create_app(small_settings(**overrides), factory(engine))
    with TestClient(app) as client:
        wait_until(lambda: client.get("/readyz").status_code == 200, "the app is ready")
        yield client, engine


def receive(ws, timeout: float = WAIT_S) -> dict:
    """The next frame on a TestClient socket as a dict ({"type":"websocket.close",...} for a close), failing
    instead of hanging."""
    import anyio

    async def get():
        with anyio.fail_after(timeout):
            return await ws._send_rx.receive()

    message = ws.portal.call(get)
    if message["type"] == "websocket.send":
        return json.loads(message["text"])
    return message
