"""What a constraint may cost (engine/constraints.py): llguidance's limits and the compile-time probe refuse one whose
masks would cost too much, naming its field, before it reaches the engine; what passes is enforced as before.
Over the tiny byte-level tokenizer."""

from __future__ import annotations

import json
import re

import pytest
from helpers import Clock, Recorder, instant_steps
from scripted import ChainRunner, letters
from tiny_model import VOCAB_SIZE

from typewriter.engine import constraints
from typewriter.engine.constraints import Grammars
from typewriter.engine.engine import Engine
from typewriter.engine.request import Constraint, ConstraintKind, FinishReason, GenerationRequest, SamplingParams
from typewriter.errors import InvalidRequest
from typewriter.text.tokenizer import Tokenizer

COSTLY = {"a regex of a million": (ConstraintKind.REGEX, "a{1000000}"),
          "a regex of a hundred thousand": (ConstraintKind.REGEX, "0{100000}"),
          "a schema's pattern": (ConstraintKind.JSON_SCHEMA, json.dumps(
              {"type": "object", "required": ["a"], "properties": {"a": {"type": "string", "pattern": "^a{1000000}$"}}}))}


@pytest.fixture(scope="module")
def tokenizer(tiny_gguf):
    return Tokenizer.load(tiny_gguf)


@pytest.fixture
def grammars(tokenizer):
    return Grammars(tokenizer, VOCAB_SIZE)


@pytest.mark.parametrize("kind, source", COSTLY.values(), ids=COSTLY.keys())
def test_a_constraint_whose_masks_cost_too_much_is_refused_at_compile_naming_its_field(grammars, kind, source):
    with pytest.raises(InvalidRequest, match=r"^response_format: too costly to enforce \(.*\); use smaller") as e:
        grammars.compile(Constraint(kind, source, "response_format"))
    assert e.value.field == "response_format"


def test_the_engine_refuses_it_on_submit_too_and_nothing_starts(tokenizer):
    engine = Engine(ChainRunner(letters(), VOCAB_SIZE), tokenizer, max_queue=4, prefill_budget=64, clock=Clock())
    with pytest.raises(InvalidRequest, match="^response_format: too costly"):
        engine.submit(GenerationRequest("r", tokenizer.encode("hi"), SamplingParams(
            max_new_tokens=8, constraint=Constraint(ConstraintKind.REGEX, "a{1000000}", "response_format"))), Recorder())
    assert engine.stats().queued == 0


def test_a_mask_over_its_cpu_time_is_refused_saying_how_long_it_took(grammars, monkeypatch):
    monkeypatch.setattr(constraints, "MASK_CPU_S", 0.0)
    with pytest.raises(InvalidRequest, match=r"^tools: too costly to enforce: a token's mask took \d+ ms, more than "
                                             r"the 0 ms allowed"):
        grammars.compile(Constraint(ConstraintKind.REGEX, "[a-z]{3}", "tools"))


def test_a_constraint_that_allows_no_answer_is_refused_at_compile(grammars):
    with pytest.raises(InvalidRequest, match="^response_format: no answer can match it"):
        grammars.compile(Constraint(ConstraintKind.REGEX, "a[^\\x00-\\x{10FFFF}]", "response_format"))


def test_the_longest_forced_text_the_limits_let_through_is_written_whole(tokenizer):
    """The text a grammar forces is tokenized by llguidance's own greedy match; the answer spells it exactly."""
    engine = Engine(ChainRunner(letters(), VOCAB_SIZE, max_len=1200), tokenizer, max_queue=4, prefill_budget=64,
                    clock=Clock())
    instant_steps(engine.scheduler.costs)
    recorder = Recorder()
    engine.submit(GenerationRequest("f", tokenizer.encode("hi"), SamplingParams(
        max_new_tokens=1100, temperature=0.0, constraint=Constraint(ConstraintKind.REGEX, "x{1000}-[0-9]"))), recorder)
    while not recorder.done:
        engine.step()
    assert re.fullmatch(r"x{1000}-[0-9]", recorder.text) and recorder.events[-1].reason is FinishReason.EOS

