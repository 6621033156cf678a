"""Constrained rows in the engine's step (engine/engine.py, engine/constraints.py): a costly next mask is computed on
a worker thread while the forward pass runs, a cheap one on the engine thread as the step begins; a row whose mask is late sits out and takes its token from the logits it
kept once the mask is ready, so it never holds the other rows and its answer is the one it would have been; a
constraint that reaches a dead end or a limit mid-answer ends with `constraint` (not a server fault) and a message naming its field.
A scripted runner over the tiny byte-level tokenizer; a gate holds chosen masks back."""

from __future__ import annotations

import dataclasses
import threading

import pytest
from helpers import Clock, Recorder, instant_steps
from scripted import ChainRunner, letters
from tiny_model import VOCAB_SIZE

from typewriter.engine import constraints
from typewriter.engine.engine import Engine
from typewriter.engine.request import Constraint, ConstraintKind, FinishReason, GenerationRequest, SamplingParams
from typewriter.text.tokenizer import Tokenizer

TEN_LETTERS = Constraint(ConstraintKind.REGEX, "[a-z]{10}", "response_format")
DEAD_AFTER_FOUR = Constraint(ConstraintKind.GRAMMAR, 'start: /[a-z]{4}/ NOTHING\nNOTHING: /[^\\x00-\\x{10FFFF}]/',
                             "response_format")


class Gate:
    """Holds back the masks of the matchers in `held` until opened; tells `began` whenever a mask starts, and records
    the thread each ran on. Each mask reports at least `cpu_s` of CPU: a costly mask, unless told otherwise."""

    def __init__(self, monkeypatch, cpu_s: float = 2 * constraints.INLINE_MASK_S):
        self.held: set[int] = set()
        self.open = threading.Event()
        self.began = threading.Event()
        self.threads: list[threading.Thread] = []
        real = constraints._compute_mask

        def gated(matcher, vocab_size, eos):
            self.began.set()
            self.threads.append(threading.current_thread())
            if id(matcher) in self.held:
                assert self.open.wait(10), "the gate was never opened"
            mask = real(matcher, vocab_size, eos)
            return dataclasses.replace(mask, cpu_s=max(mask.cpu_s, cpu_s))

        monkeypatch.setattr(constraints, "_compute_mask", gated)

    def hold(self, engine, request_id: str) -> None:
        self.held.add(id(engine.scheduler.find(request_id).constraint.matcher))


@pytest.fixture(scope="module")
def tokenizer(tiny_gguf):
    return Tokenizer.load(tiny_gguf)


def engine_of(tokenizer, runner=None) -> Engine:
    engine = Engine(runner or ChainRunner(letters(), VOCAB_SIZE, slots=2, max_len=64), tokenizer, max_queue=8,
                    prefill_budget=64, clock=Clock())
    instant_steps(engine.scheduler.costs)
    return engine


def submit(engine, tokenizer, rid, constraint=None, max_new_tokens=20) -> Recorder:
    recorder = Recorder()
    engine.submit(GenerationRequest(rid, tokenizer.encode("hi"), SamplingParams(
        max_new_tokens=max_new_tokens, temperature=0.0, constraint=constraint)), recorder)
    return recorder


def run(engine, *recorders, steps: int = 200) -> None:
    for _ in range(steps):
        if all(r.done for r in recorders):
            return
        engine.step()
    raise AssertionError("the answers did not end")


def test_a_row_whose_mask_is_late_sits_out_while_the_others_decode_and_answers_as_it_would_have(tokenizer,
                                                                                              monkeypatch):
    alone = engine_of(tokenizer)
    reference = submit(alone, tokenizer, "ref", TEN_LETTERS)
    run(alone, reference)
    gate = Gate(monkeypatch)
    engine = engine_of(tokenizer)
    late = submit(engine, tokenizer, "late", TEN_LETTERS)
    gate.hold(engine, "late")
    free = submit(engine, tokenizer, "free", max_new_tokens=12)
    run(engine, free)
    assert len(free.tokens) == 12 and late.tokens == [] and not late.done
    late_slot = engine.scheduler.find("late").slot
    assert not any(late_slot in call[1] for call in engine.runner.calls if call[0] == "decode")
    gate.open.set()
    run(engine, late)
    assert (late.text, late.events[-1].reason) == (reference.text, FinishReason.EOS) == ("jklmnopqrs", FinishReason.EOS)
    decoded = sum(late_slot in call[1] for call in engine.runner.calls if call[0] == "decode")
    assert decoded == len(late.tokens) - 1  # its logits were kept, never computed again


def test_with_only_late_rows_a_step_waits_for_a_mask_and_runs_nothing(tokenizer, monkeypatch):
    gate = Gate(monkeypatch)
    engine = engine_of(tokenizer)
    late = submit(engine, tokenizer, "late", TEN_LETTERS)
    gate.hold(engine, "late")
    engine.step()  # the prompt; its first token's mask is held
    calls = len(engine.runner.calls)
    for _ in range(3):
        engine.step()
    assert (len(engine.runner.calls), late.tokens) == (calls, [])
    threading.Timer(0.05, gate.open.set).start()
    run(engine, late)
    assert late.text == "jklmnopqrs"


class WaitsForAMask(ChainRunner):
    """Each decode waits (a while at most) for some mask to have begun: it can only while masks run during it."""

    def __init__(self, gate: Gate, **options):
        super().__init__(letters(), VOCAB_SIZE, **options)
        self.gate, self.saw_mask = gate, []

    def decode(self, slots, tokens, positions):
        self.saw_mask.append(self.gate.began.wait(2))
        self.gate.began.clear()
        return super().decode(slots, tokens, positions)


def test_each_mask_is_computed_while_the_forward_pass_runs(tokenizer, monkeypatch):
    gate = Gate(monkeypatch)
    engine = engine_of(tokenizer, WaitsForAMask(gate, slots=2, max_len=64))
    recorder = submit(engine, tokenizer, "c", TEN_LETTERS)
    engine.step()  # the prompt, and its first token
    gate.began.clear()
    run(engine, recorder)
    assert recorder.text == "jklmnopqrs" and engine.runner.saw_mask == [True] * 10


def test_a_cheap_mask_is_computed_on_the_engine_thread_once_one_has_shown_it_cheap(tokenizer, monkeypatch):
    gate = Gate(monkeypatch, cpu_s=0.0)
    engine = engine_of(tokenizer)
    recorder = submit(engine, tokenizer, "c", TEN_LETTERS)
    gate.threads.clear()  # the compile's probe
    run(engine, recorder)
    assert recorder.text == "jklmnopqrs"
    assert gate.threads[0] is not threading.current_thread()  # the first: its cost not known yet
    assert all(thread is threading.current_thread() for thread in gate.threads[1:]) and len(gate.threads) > 5


def test_a_dead_end_mid_answer_ends_with_constraint_naming_the_field_and_the_others_go_on(tokenizer):
    engine = engine_of(tokenizer)
    dead = submit(engine, tokenizer, "dead", DEAD_AFTER_FOUR)
    other = submit(engine, tokenizer, "other", max_new_tokens=12)
    run(engine, dead, other)
    end = dead.events[-1]
    assert (dead.text, end.reason) == ("jklm", FinishReason.CONSTRAINT)
    assert end.error.startswith("response_format: no token can follow the answer's 4 tokens (a dead end")
    assert len(other.tokens) == 12 and other.events[-1].reason is FinishReason.LENGTH
    assert engine.stats().active == 0


def test_a_limit_reached_mid_answer_ends_with_constraint_naming_the_field_not_a_server_fault(tokenizer):
    engine = engine_of(tokenizer)
    costly = submit(engine, tokenizer, "costly", Constraint(ConstraintKind.REGEX, "[a-z]{3}0{100000}",
                                                            "response_format"))
    run(engine, costly)
    end = costly.events[-1]
    assert end.reason is FinishReason.CONSTRAINT
    assert end.error.startswith("response_format: the constraint became too costly to enforce (")
