"""The server's calculator on the 0.5B model (Qwen2.5-Coder-0.5B-Instruct, whose template takes tools), over a real
socket: an arithmetic question gets a `tool_step` with the exact value, and the answer goes on after it. An opt-in
group (marker `qwen`): it runs when the model file is present (conftest.py)."""

from __future__ import annotations

import json

import pytest
from real_server import real_server
from websockets.sync.client import connect

pytestmark = [pytest.mark.qwen, pytest.mark.e2e, pytest.mark.slow]

WAIT_S = 120
# The 0.5B calls the calculator only when the question names it and the expression: with the tutor's prompt and a
# word problem it works the sums out itself (docs/measurements/2026-12-05-calculator.md).
QUESTION = "Call the calculator with the expression 1234 * 5678."


@pytest.fixture(scope="module")
def server(tmp_path_factory, qwen_model):
    settings = {"TYPEWRITER_MODEL_PATH": str(qwen_model), "TYPEWRITER_MAX_ACTIVE": "1",
                "TYPEWRITER_MAX_CONTEXT": "1024", "TYPEWRITER_CALCULATOR": "true"}
    with real_server(settings, tmp_path_factory.mktemp("qwen-calculator") / "server.log") as base:
        yield base


def test_an_arithmetic_question_gets_a_calculator_step_and_the_answer_goes_on(server):
    with connect(server.replace("http://", "ws://", 1) + "/ws", open_timeout=10) as ws:
        ws.send(json.dumps({"type": "chat", "id": "q1", "messages": [{"role": "user", "content": QUESTION}],
                            "params": {"temperature": 0, "max_new_tokens": 160}}))
        frames = [json.loads(ws.recv(timeout=WAIT_S))]
        while frames[-1]["type"] not in ("end", "error"):
            frames.append(json.loads(ws.recv(timeout=WAIT_S)))
    steps = [f for f in frames if f["type"] == "tool_step"]
    assert steps and steps[0]["name"] == "calculator" and steps[0]["error"] is None, frames
    assert steps[0]["result"] == "7006652" and "1234" in steps[0]["expression"]
    after = "".join(f["text"] for f in frames[frames.index(steps[-1]):] if f["type"] == "token")
    assert frames[-1]["type"] == "end" and frames[-1]["reason"] in ("eos", "length")
    assert after.strip() and "<tool_call>" not in after  # the answer went on, and no call leaked as text
    assert frames[-1]["usage"]["prompt_tokens"] > frames[0]["prompt_tokens"]  # the usage counts every part
