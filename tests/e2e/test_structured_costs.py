"""What a constraint may cost, end to end on the embedded model: one too costly to enforce is a 400
`invalid_request` naming `response_format`, never a 500; and a student chatting beside a script that keeps sending
the costliest constraint the limits let through keeps a pace within a bounded factor of their pace alone.
A real server process, driven by the official `openai` client."""

from __future__ import annotations

import statistics
import threading
import time

import openai
import pytest
from real_server import real_server
from structured_cases import SETTINGS

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# Forced text the limits let through at a few milliseconds a mask: before the bounds, each mask cost most of a second.
COSTLIEST = {"type": "regex", "regex": "0{50000}"}
MILLION = "^a{1000000}$"
STORY = [{"role": "user", "content": "Tell me a long story about a cat who learns to sail."}]


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    with real_server(SETTINGS, tmp_path_factory.mktemp("costs") / "server.log") as url:
        yield url


def client_of(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=600)


@pytest.mark.parametrize("response_format, param", [
    ({"type": "regex", "regex": "a{1000000}"}, "response_format"),
    ({"type": "json_schema", "json_schema": {"name": "a", "strict": True, "schema": {
        "type": "object", "required": ["a"], "additionalProperties": False,
        "properties": {"a": {"type": "string", "pattern": MILLION}}}}}, "response_format.json_schema.schema"),
], ids=["regex", "schema pattern"])
def test_a_constraint_too_costly_to_enforce_is_a_400_naming_response_format(smol, response_format, param):
    with client_of(smol) as client, pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="m", messages=STORY, response_format=response_format, max_tokens=8)
    body = caught.value.body
    assert (caught.value.status_code, body["code"], body["param"]) == (400, "invalid_request", param)
    assert "too costly to enforce" in body["message"]


def pace(client: openai.OpenAI) -> float:
    """The student's tokens a second, from their first token to their last."""
    stamps, usage = [], None
    for chunk in client.chat.completions.create(model="m", messages=STORY, temperature=0, max_tokens=64, stream=True,
                                                stream_options={"include_usage": True},
                                                extra_body={"loop_guard": False}):
        if chunk.choices and chunk.choices[0].delta.content:
            stamps.append(time.perf_counter())
        usage = chunk.usage or usage
    assert usage is not None and usage.completion_tokens > 16 and len(stamps) > 1
    return (usage.completion_tokens - 1) / (stamps[-1] - stamps[0])


def test_a_student_keeps_their_pace_beside_a_script_sending_the_costliest_constraint_that_passes(smol):
    stop, answers = threading.Event(), []

    def script() -> None:
        with client_of(smol) as client:
            while not stop.is_set():
                answer = client.chat.completions.create(model="m", messages=STORY, response_format=COSTLIEST,
                                                        max_tokens=120)
                answers.append(answer.choices[0].message.content)

    with client_of(smol) as client:
        pace(client)  # warm
        alone = statistics.median(pace(client) for _ in range(3))
        scripts = [threading.Thread(target=script, daemon=True) for _ in range(2)]
        for thread in scripts:
            thread.start()
        time.sleep(3)  # both are decoding
        try:
            beside = statistics.median(pace(client) for _ in range(3))
        finally:
            stop.set()
            for thread in scripts:
                thread.join(600)
    assert answers and all(a == "0" * len(a) for a in answers)  # the script got its answers too
    assert beside > 0.2 * alone, f"{beside:.1f} tokens/s beside the script, {alone:.1f} alone"
