"""The loop guard: an answer repeating one unit of text over and over ends with reason `repetition`; short or few
repeats never trip it; a client can turn it off; a constrained answer is cut only where its constraint could end."""

from __future__ import annotations

import numpy as np
from scripted import ScriptTokenizer

from typewriter.engine.constraints import Grammars
from typewriter.engine.repetition import MIN_TOKENS, REPEATS, LoopGuard
from typewriter.engine.request import Constraint, ConstraintKind, FinishReason, GenerationRequest, SamplingParams
from typewriter.engine.request_state import RequestState


def first_trip(tokens) -> int | None:
    guard = LoopGuard()
    for i, t in enumerate(tokens):
        if guard.push(int(t)):
            return i
    return None


def test_a_line_repeated_over_and_over_trips_the_guard_once_it_spans_enough_copies_and_tokens():
    line = list(range(100, 120))  # a 20-token line
    answer = list(range(500, 530)) + line * 12
    trip = first_trip(answer)
    repeated = max(MIN_TOKENS, REPEATS * len(line))  # tokens after the line's first copy
    assert trip == 30 + len(line) + repeated - 1


def test_a_single_token_or_a_long_unit_needs_the_same_span():
    assert first_trip([7] * 200) == MIN_TOKENS  # "ha ha ha ...": one copy, then MIN_TOKENS more
    unit = list(range(1000, 1100))  # a 100-token paragraph: 4 more copies, not 64 tokens, are the bar
    assert first_trip(unit * 6) == 100 + 4 * 100 - 1


def test_text_that_repeats_a_little_or_never_does_not_trip_it():
    rng = np.random.default_rng(0)
    assert first_trip(rng.integers(0, 50_000, 2000)) is None
    line = list(range(100, 112))
    assert first_trip(line * (REPEATS + 1)) is None  # a line copied five times: 48 tokens repeated, under 64
    counting = [t for i in range(200) for t in (300 + i % 10, 400, 500 + i // 10)]  # "1, 2, 3, ..." like
    assert first_trip(counting) is None


def request_state(loop_guard: bool, constraint: Constraint | None = None, pieces=("ha", " ")) -> RequestState:
    tokenizer = ScriptTokenizer(list(pieces))
    params = SamplingParams(max_new_tokens=500, loop_guard=loop_guard, constraint=constraint)
    started = Grammars(tokenizer, tokenizer.vocab_size).start(constraint) if constraint else None
    return RequestState(GenerationRequest("r", [5], params), lambda e: None, tokenizer, tokenizer.eos_token_ids, 0.0,
                        started)


def test_a_looping_answer_ends_with_repetition_and_keeps_its_text_and_off_it_runs_to_its_length():
    for guard in (True, False):
        seq = request_state(guard)
        texts, reason = [], None
        while reason is None:
            text, reason = seq.take(len(seq.output_ids) % 2, 0.0)
            texts.append(text)
        if guard:
            assert reason is FinishReason.REPETITION and len(seq.output_ids) == MIN_TOKENS + 2
        else:
            assert reason is FinishReason.LENGTH and len(seq.output_ids) == 500
        assert "".join(texts) == "ha " * (len(seq.output_ids) // 2)


def test_a_constrained_answer_is_cut_only_where_its_constraint_could_end():
    """Text that may end anywhere (a regex of repeats, or the generic tool format's text) is cut at the first end
    after the guard trips, and still matches; a JSON string, which cannot end until it closes, runs to its length."""
    seq = request_state(True, Constraint(ConstraintKind.REGEX, "(ha )*", "response_format"))
    texts, reason = [], None
    while reason is None:
        text, reason = seq.take(len(seq.output_ids) % 2, 0.0)
        texts.append(text)
    assert reason is FinishReason.REPETITION and len(seq.output_ids) == MIN_TOKENS + 2
    assert seq.constraint.complete and "".join(texts) == "ha " * (MIN_TOKENS // 2 + 1)

    seq = request_state(True, Constraint(ConstraintKind.JSON_SCHEMA, '{"type": "string"}', "response_format"),
                        pieces=('"', "ha", " "))
    text, reason = seq.take(0, 0.0)
    while reason is None:
        text, reason = seq.take(1 + len(seq.output_ids) % 2, 0.0)
    assert reason is FinishReason.LENGTH and len(seq.output_ids) == 500


def test_loop_guard_is_a_boolean_param():
    import pytest

    from typewriter.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match="loop_guard"):
        SamplingParams(loop_guard="no")


def runs_by_arrays(tokens) -> list[bool]:
    """The guard as first written, every period's run in an array: the reference its bookkeeping must match."""
    from typewriter.engine.repetition import MAX_PERIOD

    recent, runs = np.full(MAX_PERIOD, -1, np.int64), np.zeros(MAX_PERIOD, np.int64)
    needed = np.maximum(MIN_TOKENS, REPEATS * np.arange(1, MAX_PERIOD + 1))
    out = []
    for t in tokens:
        runs = (runs + 1) * (recent == t)
        recent = np.roll(recent, 1)
        recent[0] = t
        out.append(bool((runs >= needed).any()))
    return out


def test_the_guard_trips_exactly_where_every_periods_run_counted_in_arrays_would():
    rng = np.random.default_rng(3)
    for case in range(40):
        unit = [int(t) for t in rng.integers(0, 6 if case % 2 else 400, int(rng.integers(1, 140)))]
        noise = [int(t) for t in rng.integers(0, 8, int(rng.integers(0, 300)))]
        tokens = noise + unit * int(rng.integers(1, 9)) + noise[: len(noise) // 2] + unit * 3
        guard = LoopGuard()
        assert [guard.push(t) for t in tokens] == runs_by_arrays(tokens), case
