"""An answer whose constraint could go no further (a dead end: no token can follow, the text incomplete) is the
client's constraint, not a fault of the server's: on both OpenAI doors a 400 `invalid_request` whose param and
message name the field, whole or as the stream's last event, never a "stop" and never a 500. Over the app and a
real engine on a scripted runner over the tiny byte-level tokenizer, which writes a, b, c, ... as far as it may."""

from __future__ import annotations

import json

import pytest
from helpers import serving
from scripted import ChainRunner, RecordingEngine, letters
from tiny_model import VOCAB_SIZE

from typewriter.text.tokenizer import Tokenizer

DEAD_END = {"type": "grammar", "grammar": "start: /[a-z]{4}/ NOTHING\nNOTHING: /[^\\x00-\\x{10FFFF}]/"}
MESSAGES = [{"role": "user", "content": "hi"}]
SAYS = "response_format: no token can follow the answer's 4 tokens (a dead end of the constraint)"


@pytest.fixture(scope="module")
def tokenizer(tiny_gguf):
    return Tokenizer.load(tiny_gguf)


@pytest.fixture
def client(tokenizer):
    engine = RecordingEngine(ChainRunner(letters(), VOCAB_SIZE, slots=2, max_len=256), tokenizer, max_queue=8,
                             prefill_budget=64).start()
    with serving(engine) as (client, _):
        yield client


def data_of(response) -> list:
    """The JSON data of each server-sent event (a Responses event has an `event:` line first)."""
    return [json.loads(line[6:]) for block in response.text.split("\n\n") for line in block.splitlines()
            if line.startswith("data: {")]


def test_chat_completions_whole_is_a_400_naming_the_field(client):
    response = client.post("/v1/chat/completions", json={"model": "m", "messages": MESSAGES, "max_tokens": 16,
                                                         "response_format": DEAD_END})
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["code"], error["type"], error["param"]) == ("invalid_request", "invalid_request_error",
                                                              "response_format")
    assert error["message"].startswith(SAYS)


def test_chat_completions_streamed_sends_the_text_so_far_then_the_error_never_a_finish_reason(client):
    response = client.post("/v1/chat/completions", json={"model": "m", "messages": MESSAGES, "max_tokens": 16,
                                                         "response_format": DEAD_END, "stream": True})
    events = data_of(response)
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices"))
    assert text == "abcd" and not any(e["choices"][0]["finish_reason"] for e in events if e.get("choices"))
    error = events[-1]["error"]
    assert (error["code"], error["type"], error["param"]) == ("invalid_request", "invalid_request_error",
                                                              "response_format")
    assert error["message"].startswith(SAYS)


def test_the_responses_api_fails_the_response_naming_its_field_whole_and_streamed(client):
    body = {"model": "m", "input": "hi", "max_output_tokens": 16, "text": {"format": DEAD_END}}
    whole = client.post("/v1/responses", json=body)
    streamed = client.post("/v1/responses", json=body | {"stream": True})
    says = SAYS.replace("response_format", "text.format")
    assert whole.status_code == 400
    assert (whole.json()["error"]["param"], whole.json()["error"]["message"][:len(says)]) == ("text.format", says)
    failed = data_of(streamed)[-1]
    assert failed["type"] == "response.failed"
    assert failed["response"]["error"]["code"] == "invalid_request"
    assert failed["response"]["error"]["message"].startswith(says)
