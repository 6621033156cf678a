"""A constrained answer that loops where its constraint cannot end (engine/wrap_up.py): a model stuck repeating
"ab" inside a JSON string would run to its length and be cut; once the loop guard sees the loop, the answer is
steered to its end, and ends by itself (reason `repetition`) with JSON that validates. Driven through `Engine.step()` on a scripted
runner over the tiny byte-level tokenizer."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest
from helpers import Clock, Recorder, instant_steps
from scripted import ChainRunner
from tiny_model import VOCAB_SIZE, byte_token

from typewriter.engine.engine import Engine
from typewriter.engine.repetition import MIN_TOKENS
from typewriter.engine.request import Constraint, ConstraintKind, FinishReason, GenerationRequest, SamplingParams
from typewriter.engine.wrap_up import scan
from typewriter.text.tokenizer import Tokenizer

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "tags"],
          "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}}}
A, B = byte_token(ord("a")), byte_token(ord("b"))


class LoopRunner(ChainRunner):
    """Prefers "ab" over and over, whatever came before; every other token is less likely, each by its own margin,
    so a choice among them is the model's, not a tie's."""

    def __init__(self, **options):
        super().__init__(lambda token: A if token == B else B, VOCAB_SIZE, **options)
        self.rest = np.random.default_rng(0).uniform(0, 10, VOCAB_SIZE).astype(np.float32)

    def logits_after(self, token: int) -> np.ndarray:
        row = self.rest.copy()
        row[self.follow(token)] = 100.0
        return row


@pytest.fixture(scope="module")
def tokenizer(tiny_gguf):
    return Tokenizer.load(tiny_gguf)


def answer(tokenizer, loop_guard: bool) -> Recorder:
    engine = Engine(LoopRunner(slots=1, max_len=512, max_chunk=16), tokenizer, max_queue=4, prefill_budget=64,
                    clock=Clock())
    instant_steps(engine.scheduler.costs)
    recorder = Recorder()
    params = SamplingParams(temperature=0.0, max_new_tokens=300, loop_guard=loop_guard,
                            constraint=Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(SCHEMA), "response_format"))
    engine.submit(GenerationRequest("r", tokenizer.encode("hi"), params), recorder)
    for _ in range(1000):
        if recorder.done:
            return recorder
        engine.step()
    raise AssertionError("the answer did not end")


def test_a_loop_inside_a_json_string_is_steered_to_an_end_that_validates(tokenizer):
    looped = answer(tokenizer, loop_guard=False)
    assert looped.events[-1].reason is FinishReason.LENGTH and "abababab" in looped.text
    steered = answer(tokenizer, loop_guard=True)
    assert steered.events[-1].reason is FinishReason.REPETITION  # it ended by itself, after a loop
    value = json.loads(steered.text)
    jsonschema.validate(value, SCHEMA)
    assert "ab" * (MIN_TOKENS // 2) in value["name"] and len(value["name"]) < 2 * MIN_TOKENS  # the loop, till seen
    assert value["tags"] == []  # then the shortest way to the end


def test_the_scan_follows_quotes_escapes_and_brackets():
    assert scan(b'{"a": "x') == (1, 2)  # inside a string, an object and the string open
    assert scan(b'\\"', 1) == (1, 0)  # an escaped quote does not close the string
    assert scan(b'"}]', 1) == (0, -3)
    assert scan(b'", "', 1) == (1, 0)  # closes one string and opens the next: no nearer the end
