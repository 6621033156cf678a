"""Structured outputs and tool calls on a model of another family than the embedded one: Qwen2.5-Coder-0.5B-Instruct
(a Qwen2 model with a 151,936-token vocabulary and a chat template that takes tools), served by a real server
process and driven by the official `openai` client. The `qwen` group: it runs where scripts/fetch-qwen-0.5b.sh
has put the file (conftest.py leaves it out elsewhere; `make test-qwen` fetches it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jsonschema
import openai
import pytest
from real_server import ROOT, real_server
from structured_cases import CALCULATOR, QUIZ, SETTINGS, sampled_quizzes

pytestmark = [pytest.mark.qwen, pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def qwen(tmp_path_factory, qwen_model):
    settings = SETTINGS | {"TYPEWRITER_MODEL_PATH": str(qwen_model), "TYPEWRITER_MAX_ACTIVE": "4"}
    with real_server(settings, tmp_path_factory.mktemp("qwen") / "server.log") as url:
        yield url


def client_of(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=900)


def test_a_json_schema_answer_parses_and_validates_in_every_one_of_a_hundred_sampled_runs(qwen):
    with client_of(qwen) as client:
        answers = sampled_quizzes(client, workers=4)
    for text, finish in answers:
        assert finish == "stop", text
        jsonschema.validate(json.loads(text), QUIZ)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "calculator"}}])
def test_a_forced_tool_call_returns_arguments_that_validate(qwen, choice):
    with client_of(qwen) as client:
        answer = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "What is 12 times 34?"}], tools=[CALCULATOR],
            tool_choice=choice, temperature=0, max_tokens=200).choices[0]
    (call,) = answer.message.tool_calls
    assert (answer.finish_reason, call.function.name) == ("tool_calls", "calculator")
    jsonschema.validate(json.loads(call.function.arguments), CALCULATOR["function"]["parameters"])


def test_the_calculator_example_answers_an_arithmetic_question_with_its_tool(qwen):
    out = subprocess.run([sys.executable, "examples/calculator_tool.py", "What is 37 times 91, plus 15?"], cwd=ROOT,
                         env={**os.environ, "TYPEWRITER_URL": qwen}, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    computed, answer = out.stdout.split("\n", 1)
    assert computed.endswith("= 3382"), out.stdout  # the model wrote 37 * 91 + 15 (or its equal)
    assert "3382" in answer.replace(",", ""), out.stdout
