"""Constrained decoding in the engine (engine/constraints.py): a model of random logits, which left alone writes
noise, answers within a JSON Schema, a regular expression or a grammar every time; constrained and free answers
share a step; the text streams as any answer's does (whole characters, stop sequences never shown in part).
Driven through `Engine.step()` on a scripted runner over the tiny byte-level tokenizer."""

from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import pytest
from helpers import Clock, Recorder, instant_steps
from scripted import ChainRunner
from tiny_model import VOCAB_SIZE

from typewriter.engine.constraints import json_object_schema
from typewriter.engine.engine import Engine
from typewriter.engine.request import (
    Constraint,
    ConstraintKind,
    Finished,
    FinishReason,
    GenerationRequest,
    SamplingParams,
    Started,
)
from typewriter.errors import InvalidRequest
from typewriter.text.tokenizer import Tokenizer

QUIZ = {"type": "object", "additionalProperties": False, "required": ["question", "choices", "answer"],
        "properties": {"question": {"type": "string", "maxLength": 12},
                       "choices": {"type": "array", "minItems": 2, "maxItems": 3,
                                   "items": {"type": "string", "maxLength": 6}},
                       "answer": {"type": "integer", "minimum": 0, "maximum": 2}}}


class NoiseRunner(ChainRunner):
    """Every row of logits is fresh noise: left alone, the answer is random bytes."""

    def __init__(self, seed: int = 0, **options):
        super().__init__(lambda token: 0, VOCAB_SIZE, **options)
        self.rng = np.random.default_rng(seed)

    def logits_after(self, token: int) -> np.ndarray:
        return self.rng.standard_normal(self.vocab_size).astype(np.float32) * 3


@pytest.fixture(scope="module")
def tokenizer(tiny_gguf):
    return Tokenizer.load(tiny_gguf)


@pytest.fixture
def engine(tokenizer):
    engine = Engine(NoiseRunner(slots=4, max_len=256, max_chunk=16), tokenizer, max_queue=64, prefill_budget=64,
                    clock=Clock())
    instant_steps(engine.scheduler.costs)
    return engine


def schema(value: dict) -> Constraint:
    return Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(value), "response_format")


def submit(engine, tokenizer, rid, constraint=None, text="hi", **params) -> Recorder:
    recorder = Recorder()
    sampling = {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 200, "constraint": constraint} | params
    engine.submit(GenerationRequest(rid, tokenizer.encode(text), SamplingParams(**sampling)), recorder)
    return recorder


def run(engine, *recorders, steps: int = 2000) -> None:
    for _ in range(steps):
        if all(r.done for r in recorders):
            return
        engine.step()
    raise AssertionError("the answers did not end")


def test_random_logits_answer_a_json_schema_that_parses_and_validates_every_time(engine, tokenizer):
    recorders = [submit(engine, tokenizer, f"q{i}", schema(QUIZ)) for i in range(12)]
    run(engine, *recorders)
    for r in recorders:
        assert r.events[-1].reason is FinishReason.EOS
        jsonschema.validate(json.loads(r.text), QUIZ)


def test_a_regular_expression_and_a_grammar_hold_the_answer(engine, tokenizer):
    regex = submit(engine, tokenizer, "r", Constraint(ConstraintKind.REGEX, r"[0-9]{3}-[a-z]{2,4}"))
    lark = submit(engine, tokenizer, "g", Constraint(ConstraintKind.GRAMMAR,
                                                      'start: "yes" | "no" | "maybe " NUM\nNUM: /[1-9]/'))
    anything = submit(engine, tokenizer, "o", Constraint(ConstraintKind.JSON_OBJECT, json_object_schema()),
                      max_new_tokens=60)
    run(engine, regex, lark, anything)
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2,4}", regex.text)
    assert re.fullmatch(r"yes|no|maybe [1-9]", lark.text)
    assert anything.events[-1].reason in (FinishReason.EOS, FinishReason.LENGTH)
    if anything.events[-1].reason is FinishReason.EOS:
        assert isinstance(json.loads(anything.text), dict)


def test_constrained_and_free_answers_share_each_decode_step(engine, tokenizer):
    constrained = submit(engine, tokenizer, "c", schema(QUIZ), text="one")
    free = submit(engine, tokenizer, "f", max_new_tokens=30, text="two")
    run(engine, constrained, free)
    assert 2 in engine.runner.decode_rows  # both rows in one call
    assert free.events[-1].reason in (FinishReason.EOS, FinishReason.LENGTH)
    jsonschema.validate(json.loads(constrained.text), QUIZ)


def test_a_constrained_answer_that_runs_out_of_length_ends_with_length(engine, tokenizer):
    long = {"type": "object", "required": ["a"], "properties": {"a": {"type": "string", "minLength": 50}}}
    r = submit(engine, tokenizer, "l", schema(long), max_new_tokens=10)
    run(engine, r)
    assert r.events[-1].reason is FinishReason.LENGTH
    assert r.text.startswith('{"a": "') and len(r.tokens) == 10


def test_whole_characters_stream_and_a_stop_sequence_is_never_shown_in_part(engine, tokenizer):
    """Each "é" and "日" is several byte tokens here: no delta carries part of one. The stop "!" cuts the answer,
    as it would any answer, whatever the schema."""
    words = {"type": "object", "required": ["w"], "additionalProperties": False,
             "properties": {"w": {"enum": ["café", "日本語", "ok"]}}}
    recorders = [submit(engine, tokenizer, f"u{i}", schema(words)) for i in range(6)]
    stopped = submit(engine, tokenizer, "s", Constraint(ConstraintKind.REGEX, "ab!cd"), stop=["!"])
    run(engine, stopped, *recorders)
    for r in recorders:
        assert json.loads(r.text)["w"] in ("café", "日本語", "ok")
        assert all("\ufffd" not in t.text for t in r.tokens)
        assert "".join(t.text for t in r.tokens) == tokenizer.decode([t.token_id for t in r.tokens])
    assert (stopped.text, stopped.events[-1].reason) == ("ab", FinishReason.STOP_SEQUENCE)


def test_a_compiled_constraint_is_kept_and_a_bad_one_is_refused_naming_its_field(engine, tokenizer):
    first = engine.grammars.compile(schema(QUIZ))
    assert engine.grammars.compile(schema(QUIZ)) is first
    with pytest.raises(InvalidRequest, match=r"^response_format: "):
        submit(engine, tokenizer, "bad", Constraint(ConstraintKind.REGEX, "[a-", "response_format"))
    with pytest.raises(InvalidRequest, match=r"^response_format: "):
        submit(engine, tokenizer, "bad", schema({"type": "object", "properties": {"a": {"type": "nonsense"}}}))
    with pytest.raises(InvalidRequest, match="ignore_eos"):
        SamplingParams(constraint=schema(QUIZ), ignore_eos=True)


def test_logprobs_are_the_distribution_the_token_was_drawn_from(engine, tokenizer):
    r = submit(engine, tokenizer, "p", top_k=5, logprobs=5, max_new_tokens=20)
    c = submit(engine, tokenizer, "pc", schema(QUIZ), top_k=5, logprobs=3, text="other")
    run(engine, r, c)
    for token in r.tokens:
        assert np.isclose(sum(np.exp(p) for _, p in token.logprobs.top), 1.0, atol=1e-6)
        assert (token.token_id, token.logprobs.logprob) in token.logprobs.top
    for token in c.tokens:  # within the mask: never a token the schema forbids
        assert token.logprobs.logprob > float("-inf") and len(token.logprobs.top) <= 3


def test_a_follower_copies_its_leaders_prompt_instead_of_computing_it_again(engine, tokenizer):
    """n choices of one prompt: one prefill, then each other choice copies the cache and computes one token."""
    prompt = tokenizer.encode("a prompt long enough to be worth copying: " * 2)
    recorders = [Recorder() for _ in range(3)]
    for i, recorder in enumerate(recorders):
        engine.submit(GenerationRequest(f"n{i}", prompt, SamplingParams(max_new_tokens=5, seed=i),
                                        follows="n0" if i else None), recorder)
    run(engine, *recorders)
    prefilled = sum(n for _, _, n in engine.runner.prefills())
    copies = [call for call in engine.runner.calls if call[0] == "copy"]
    assert (prefilled, len(copies)) == (len(prompt) + 2, 2)
    started = [next(e for e in r.events if isinstance(e, Started)) for r in recorders]
    assert [s.cached_tokens for s in started] == [0, len(prompt) - 1, len(prompt) - 1]
    assert all(isinstance(r.events[-1], Finished) for r in recorders)
