"""Fuzzing a real server (the tiny model, over a real socket): whatever a client sends, each frame gets an
answer or a clean close, another connection keeps getting answers throughout, and no stream is left behind.

Hypothesis makes the frames: any text, any JSON value, frame-shaped objects with random fields and values, those
cut short, very deep nesting, huge strings and binary frames; every string, field names included, may hold lone
UTF-16 surrogates, which JSON escapes ("\udfff") and no UTF-8 frame can carry back. Found so far: a few thousand
"[" made the JSON parser raise RecursionError, which dropped the connection with no error frame; a lone
surrogate in a chat's id made every frame of that chat unsendable, and the chat ran on with nobody attached.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from real_server import http_get, real_server
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EXAMPLES = 400
MAX_BYTES = 4096
CLEAN_CLOSES = {1003, 1008, 1009}  # binary frame, frame flood, frame too big
SETTINGS = {"TYPEWRITER_SYSTEM_PROMPT": "Be brief.", "TYPEWRITER_MAX_CONTEXT": "64", "TYPEWRITER_MAX_ACTIVE": "2", "TYPEWRITER_MAX_QUEUE": "4",
            "TYPEWRITER_MAX_MESSAGE_BYTES": str(MAX_BYTES), "TYPEWRITER_MAX_NEW_TOKENS_CAP": "8",
            "TYPEWRITER_CHATS_PER_MINUTE": "100000", "TYPEWRITER_FRAMES_PER_SECOND": "1000"}

# Text, or text around lone surrogates (json.dumps escapes them): not text at all, which must be invalid_request.
surrogates = st.text(st.characters(codec=None, categories=["Cs"]), min_size=1, max_size=3)
texts = st.one_of(st.text(max_size=30), st.tuples(st.text(max_size=10), surrogates, st.text(max_size=10)).map("".join))
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False), texts)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(texts, inner, max_size=4)),
                      max_leaves=20)
fields = st.sampled_from(["type", "id", "messages", "params", "role", "content", "max_new_tokens", "temperature",
                          "stop", "seed", "top_p"])
frame_like = st.fixed_dictionaries(
    {"type": st.one_of(st.sampled_from(["chat", "stop", "ping"]), values)},
    optional={"id": st.one_of(st.text(max_size=70), texts, values),
              "messages": st.one_of(st.lists(st.fixed_dictionaries(
                  {"role": st.one_of(st.sampled_from(["user", "assistant", "system"]), values),
                   "content": st.one_of(st.text(max_size=50), texts, values)}), max_size=3), values),
              "params": st.one_of(st.dictionaries(fields, values, max_size=4),
                                  st.fixed_dictionaries({"stop": st.lists(texts, max_size=3)}), values)},
).flatmap(lambda base: st.dictionaries(st.one_of(fields, texts), values, max_size=2).map(
    lambda extra: {**extra, **base}))
as_json = st.one_of(frame_like, values).map(json.dumps)
frames = st.one_of(
    as_json,
    as_json.flatmap(lambda text: st.integers(0, max(0, len(text) - 1)).map(lambda n: text[:n])),  # cut short
    st.text(max_size=200),
    st.integers(500, 2000).map(lambda depth: "[" * depth + "]" * depth),
    st.integers(1, 3).map(lambda k: json.dumps({"type": "ping", "pad": "x" * (MAX_BYTES * k)})),  # too big
    st.binary(max_size=32),
)


SURROGATE = re.compile(r"\\ud[89a-f]", re.I)  # an escaped surrogate in a frame's text


class Client:
    """One fuzzing connection, opened again whenever the server closed the last one."""

    def __init__(self, url: str):
        self.url, self.ws, self.frames, self.closes = url, None, 0, []
        self.errors: dict[str, int] = {}  # error frames by code
        self.unencodable = 0  # frames holding a lone surrogate, each refused as invalid_request
        self.stack = contextlib.ExitStack()

    def send(self, frame: str | bytes) -> None:
        if self.ws is None:
            self.ws = self.stack.enter_context(connect(self.url, max_size=None, open_timeout=10))
        self.frames += 1
        try:
            self.ws.send(frame)
            while True:  # until the frame's answer: an error, a pong, a chat's end, or a clean close
                reply = json.loads(self.ws.recv(timeout=15))
                if reply["type"] == "error":
                    self.errors[reply["code"]] = self.errors.get(reply["code"], 0) + 1
                    if "holds a lone surrogate" in reply["message"]:
                        assert reply["code"] == "invalid_request" and SURROGATE.search(frame), frame
                        self.unencodable += 1
                if reply["type"] in ("error", "pong", "end"):
                    return
        except ConnectionClosed as e:
            code = e.rcvd.code if e.rcvd else None
            assert code in CLEAN_CLOSES, f"{frame!r:.200} closed the connection with {code}"
            self.closed(code)
        except ConnectionResetError:  # the server closed (1009) while a frame over the limit was still arriving
            assert len(frame) > MAX_BYTES, f"{frame!r:.200} reset the connection"
            self.closed(1009)
        except TimeoutError:
            pytest.fail(f"no answer to {frame!r:.200} within 15 s")

    def closed(self, code: int) -> None:
        self.closes.append(code)
        self.ws = None
        self.stack.close()
        self.stack = contextlib.ExitStack()


def witness(url: str, stop: threading.Event, results: list) -> None:
    """Chats one after another on its own connection while the fuzzing goes on."""
    with connect(url, open_timeout=10) as ws:
        n = 0
        while not stop.is_set():
            n += 1
            ws.send(json.dumps({"type": "chat", "id": f"w{n}", "messages": [{"role": "user", "content": "hi"}],
                                "params": {"max_new_tokens": 4}}))
            while (frame := json.loads(ws.recv(timeout=30)))["type"] not in ("end", "error"):
                pass
            results.append(frame)


def test_every_fuzzed_frame_gets_an_answer_or_a_clean_close_while_another_client_streams(tmp_path, tiny_gguf):
    with real_server(SETTINGS | {"TYPEWRITER_MODEL_PATH": str(tiny_gguf)}, tmp_path / "server.log") as base:
        url = base.replace("http://", "ws://", 1) + "/ws"
        stop, answers = threading.Event(), []
        watcher = threading.Thread(target=witness, args=(url, stop, answers), daemon=True)
        watcher.start()
        client = Client(url)

        @settings(max_examples=EXAMPLES, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(frame=frames)
        def check(frame):
            client.send(frame)

        try:
            check()
        finally:
            stop.set()
            client.stack.close()
        watcher.join(60)
        deadline = time.monotonic() + 10
        while (active := _gauge(http_get(f"{base}/metrics")[1], "typewriter_active_streams")) and \
                time.monotonic() < deadline:
            time.sleep(0.2)
    print(f"fuzzed {client.frames} frames; clean closes by code: "
          f"{ {c: client.closes.count(c) for c in set(client.closes)} }; errors by code: {client.errors}, "
          f"{client.unencodable} for a lone surrogate; the witness got {len(answers)} answers")
    assert client.frames >= EXAMPLES
    assert client.unencodable > 0 and "internal" not in client.errors
    assert answers and all(a["type"] == "end" for a in answers), answers[-3:]
    assert active == 0


def _gauge(metrics: str, name: str) -> float:
    return next(float(line.split()[-1]) for line in metrics.splitlines() if line.startswith(name + " "))
