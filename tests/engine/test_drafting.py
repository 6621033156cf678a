"""Drafts from the conversation (engine/drafting.py): a guess is checked in the step and the answer is the one
decoding alone gives, token for token, whatever the sampling; a step drafts only where it stays small.

The scripted runner's next token follows from the whole context (scripted.ContextRunner): a song whose lines start
alike and end differently, so some guesses are right and some wrong. Driven through `Engine.step()`.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from helpers import Clock, Recorder, instant_steps
from scripted import ChainRunner, ContextRunner, OnePassChainRunner, letters
from tiny_model import IM_END, VOCAB_SIZE, byte_token

from typewriter.config import MOST_DRAFT_TOKENS
from typewriter.engine.drafting import LONGEST_REST, Drafts
from typewriter.engine.engine import Engine, StepStats
from typewriter.engine.request import (
    Constraint,
    ConstraintKind,
    FinishReason,
    GenerationRequest,
    SamplingParams,
)
from typewriter.engine.runner import PrefillChunk
from typewriter.engine.step_cost import StepCost
from typewriter.text.tokenizer import Tokenizer

SONG = "the cat sat on the mat. the cat ran to the hat. the dog sat on the log. "
ENDS_AT = 150  # positions: the song's answer then says eos


def song_row(context: list[int], soft: bool = False) -> np.ndarray:
    """The next token after `context`: the song's character at this position (eos past ENDS_AT); `soft`: the
    character three on a little less likely, so sampling and penalties move it."""
    p = len(context)
    row = np.full(VOCAB_SIZE, -100.0, np.float32)
    if p >= ENDS_AT:
        row[IM_END] = 10.0
        return row
    row[byte_token(ord(SONG[p % len(SONG)]))] = 2.0
    if soft:
        row[byte_token(ord(SONG[(p + 3) % len(SONG)]))] = 1.6
    return row


@pytest.fixture(scope="module")
def tokenizer(tiny_gguf):
    return Tokenizer.load(tiny_gguf)


def engine_of(tokenizer, drafts: int, soft: bool = False, slots: int = 2, runner=None) -> Engine:
    runner = runner or ContextRunner(lambda context: song_row(context, soft), VOCAB_SIZE, slots=slots, max_len=256,
                                     max_chunk=16)
    engine = Engine(runner, tokenizer, max_queue=8, prefill_budget=64, clock=Clock(), draft_tokens=drafts)
    instant_steps(engine.scheduler.costs)
    return engine


def answer(engine, tokenizer, rid="a", prompt="the cat", **params) -> tuple[Recorder, list[StepStats], int]:
    """The recorder, every step's figures and the steps taken, for one request run to its end."""
    stats: list[StepStats] = []
    engine.on_step = stats.append
    rec = Recorder()
    greedy = {"temperature": 0.0, "repetition_penalty": 1.0, "max_new_tokens": 200}
    engine.submit(GenerationRequest(rid, tokenizer.encode(prompt), SamplingParams(**(greedy | params))), rec)
    for steps in range(1, 500):
        engine.step()
        if rec.done:
            return rec, stats, steps
    raise AssertionError("no end")


def same_answer(tokenizer, soft: bool = False, **params) -> tuple[list[int], list[StepStats], int, int]:
    """The answer with drafts and without, which must be the same tokens, texts and end: (ids, the drafting
    run's step figures, its steps, the plain run's steps)."""
    runs = {}
    for drafts in (0, MOST_DRAFT_TOKENS):
        rec, stats, steps = answer(engine_of(tokenizer, drafts, soft), tokenizer, **params)
        finished = rec.events[-1]
        runs[drafts] = ([(t.token_id, t.text, t.index, t.logprobs) for t in rec.tokens], finished.reason,
                        finished.completion_tokens, stats, steps)
    (plain, reason, n, _, plain_steps), (drafted, reason_d, n_d, stats, steps) = runs[0], runs[MOST_DRAFT_TOKENS]
    assert drafted == plain and reason_d == reason and n_d == n
    assert not any(s.drafted for s in runs[0][3])  # 0: no drafts at all
    return [t for t, _, _, _ in plain], stats, steps, plain_steps


def test_greedy_answers_are_the_same_with_drafts_in_fewer_steps_some_guesses_wrong(tokenizer):
    ids, stats, steps, plain_steps = same_answer(tokenizer)
    start = len(tokenizer.encode("the cat"))  # the song goes on at the answer's first position
    assert tokenizer.decode(ids).startswith(SONG[start:start + 40])
    drafted, taken = sum(s.drafted for s in stats), sum(s.taken for s in stats)
    assert 0 < taken < drafted  # both the taking and the refusing paths ran
    assert steps < plain_steps * 0.6


def test_sampled_answers_are_the_same_with_drafts_for_the_same_seed(tokenizer):
    ids, stats, _, _ = same_answer(tokenizer, soft=True, temperature=1.0, seed=7)
    assert sum(s.taken for s in stats) > 0
    greedy, _, _, _ = same_answer(tokenizer, soft=True)
    assert ids != greedy  # the seed's draws chose, not the argmax alone


def test_a_repetition_penalty_sees_each_taken_draft_token_as_decoding_does(tokenizer):
    ids, stats, _, _ = same_answer(tokenizer, soft=True, repetition_penalty=1.5)
    assert sum(s.taken for s in stats) > 0
    unpenalised, _, _, _ = same_answer(tokenizer, soft=True)
    assert ids != unpenalised


def test_each_taken_draft_token_carries_the_logprobs_decoding_gives_it(tokenizer):
    ids, stats, _, _ = same_answer(tokenizer, soft=True, logprobs=3)  # same_answer compares them token by token
    assert sum(s.taken for s in stats) > 0
    rec, _, _ = answer(engine_of(tokenizer, MOST_DRAFT_TOKENS, soft=True), tokenizer, logprobs=3)
    assert all(t.logprobs is not None for t in rec.tokens)


@pytest.mark.parametrize("limit", [1, 2, 9, 40, 41])
def test_an_answer_ends_at_max_new_tokens_exactly_and_no_check_runs_past_it(tokenizer, limit):
    ids, _, _, _ = same_answer(tokenizer, max_new_tokens=limit)
    assert len(ids) == limit
    engine = engine_of(tokenizer, MOST_DRAFT_TOKENS)
    rec, _, _ = answer(engine, tokenizer, max_new_tokens=limit)
    prompt = len(tokenizer.encode("the cat"))
    assert all(start + rows <= prompt + limit - 1 for _, start, rows in engine.runner.checks)
    assert rec.events[-1].reason is FinishReason.LENGTH


def test_a_stop_sequence_inside_a_draft_ends_the_answer_where_decoding_would(tokenizer):
    ids, _, _, _ = same_answer(tokenizer, stop=["dog"])  # its text never sent, as same_answer compared
    assert tokenizer.decode(ids).endswith("hat. the dog")


def test_eos_inside_a_draft_ends_the_answer(tokenizer):
    ids, _, _, _ = same_answer(tokenizer)
    assert ids[-1] == IM_END and len(ids) == ENDS_AT - len(tokenizer.encode("the cat")) + 1


def test_a_check_is_one_chunk_of_the_last_token_and_the_guess_at_its_positions(tokenizer):
    engine = engine_of(tokenizer, MOST_DRAFT_TOKENS)
    answer(engine, tokenizer)
    checks = engine.runner.checks
    assert checks and all(2 <= rows <= MOST_DRAFT_TOKENS + 1 for _, _, rows in checks)
    # each check starts where the answer's last token goes: right after what the steps before kept
    assert all(b[1] > a[1] for a, b in itertools.pairwise(checks))


def test_a_step_that_checks_guesses_teaches_the_step_costs_nothing(tokenizer):
    """Its rows are neither decode rows nor a prompt's: taught as chunks beside answers, they would make prompts'
    chunks small (the scheduler sizes them by these costs)."""
    engine = engine_of(tokenizer, MOST_DRAFT_TOKENS, slots=2)
    engine.scheduler.costs = StepCost()
    clock = engine.clock
    seen: list[tuple[int, tuple]] = []
    real_observe = engine.scheduler.costs.observe

    def observe(decode_rows, chunks, seconds):
        seen.append((decode_rows, tuple(chunks)))
        real_observe(decode_rows, chunks, seconds)

    engine.scheduler.costs.observe = observe
    recs = [Recorder(), Recorder()]
    for i, rec in enumerate(recs):  # the first goes on alone, drafting, after the second ends
        engine.submit(GenerationRequest(f"r{i}", tokenizer.encode("the cat"), SamplingParams(
            temperature=0.0, repetition_penalty=1.0, max_new_tokens=60 - 40 * i)), rec)
    while not all(r.done for r in recs):
        clock.now += 0.01
        engine.step()
    model_steps = [call for call in engine.runner.calls if call[0] == "step"]
    checking = [call for call in model_steps if any(chunk[3] for chunk in call[2])]
    assert checking
    assert len(seen) == len(model_steps) - len(checking)  # every other step that ran the model taught its figures


def test_a_runner_whose_rows_depend_on_their_step_gets_no_drafts(tokenizer):
    runner = OnePassChainRunner(letters(), VOCAB_SIZE, slots=2, max_len=256)  # checks_drafts is False
    engine = engine_of(tokenizer, MOST_DRAFT_TOKENS, runner=runner)
    assert engine.draft_tokens == 0
    rec, stats, _ = answer(engine, tokenizer, prompt="abcdefghijklmnopqrstuvwxyzabc", max_new_tokens=60)
    assert not any(s.drafted for s in stats) and len(rec.tokens) == 60


def test_a_runner_called_chunk_by_chunk_refuses_a_check():
    runner = ChainRunner(letters(), VOCAB_SIZE)
    with pytest.raises(ValueError, match="checks no drafts"):
        runner.step([], [], [], [PrefillChunk(0, 0, [1, 2], every_logits=True)])


def test_a_constrained_answer_is_never_drafted(tokenizer):
    engine = engine_of(tokenizer, MOST_DRAFT_TOKENS)
    rec, stats, _ = answer(engine, tokenizer, max_new_tokens=30,
                           constraint=Constraint(ConstraintKind.REGEX, "[a-z .]{30}", "response_format"))
    assert len(rec.tokens) == 30 and not engine.runner.checks and not any(s.drafted for s in stats)


def test_only_an_answer_decoding_alone_in_a_step_that_prefills_nothing_drafts(tokenizer):
    engine = engine_of(tokenizer, MOST_DRAFT_TOKENS, slots=3)
    recs = []
    for i, limit in enumerate((90, 40, 20)):  # the first answer goes on alone after the others end
        rec = Recorder()
        engine.submit(GenerationRequest(f"r{i}", tokenizer.encode("the cat"),
                                        SamplingParams(temperature=0.0, repetition_penalty=1.0, max_new_tokens=limit)),
                      rec)
        recs.append(rec)
        for _ in range(12):  # each newcomer prefills while the others decode
            engine.step()
    while not all(r.done for r in recs):
        engine.step()
    steps = [call for call in engine.runner.calls if call[0] == "step"]
    for _, decoding, chunks in steps:
        checks = [c for c in chunks if c[3]]
        if checks:
            assert not decoding and len(checks) == 1 and len(chunks) == 1  # alone, no prompt beside it
            assert 2 <= checks[0][2] <= MOST_DRAFT_TOKENS + 1
    assert any(len(decoding) + len(chunks) > 1 for _, decoding, chunks in steps)  # answers did share steps
    assert any(chunk[3] for _, _, chunks in steps for chunk in chunks)
    assert [len(r.tokens) for r in recs] == [90, 40, 20]


def test_the_guess_length_grows_while_taken_whole_and_halves_when_none_is():
    drafts = Drafts(5)
    drafts.length = 2
    drafts.checked(2, 2)
    assert drafts.length == 3
    drafts.checked(3, 1)
    assert drafts.length == 3
    drafts.checked(3, 0)
    assert drafts.length == 1
    for _ in range(10):
        drafts.checked(drafts.length, drafts.length)
    assert drafts.length == 5


def test_a_refused_guess_of_one_token_rests_the_guessing_for_longer_each_time_until_one_is_taken():
    prompt = [1, 2, 3, 4, 1, 2]  # the answer's end 1, 2 is always found: a guess every step unless resting

    def guessing_steps(drafts: Drafts, steps: int) -> list[bool]:
        return [bool(drafts.propose(prompt, [], 5)) for _ in range(steps)]

    drafts = Drafts(5)
    drafts.length = 1
    rests = []
    for _ in range(7):
        drafts.checked(1, 0)
        steps = guessing_steps(drafts, 40)
        rests.append(steps.index(True))
    assert rests == [1, 2, 4, 8, 16, LONGEST_REST, LONGEST_REST]
    drafts.checked(1, 1)  # taken: the next refusal rests one step again
    drafts.length = 1
    drafts.checked(1, 0)
    assert guessing_steps(drafts, 3) == [False, True, True]


def test_a_guess_follows_the_latest_earlier_run_of_the_longest_match():
    drafts = Drafts(5)
    prompt = [1, 2, 3, 9, 9, 7, 2, 3, 4, 5, 6, 1]
    # the answer ends 2, 3: its latest earlier occurrence is followed by 4, 5, 6, 1, 2
    assert drafts.propose(prompt, [8, 2, 3], room=5) == [4, 5, 6, 1, 8]
    # the longest match wins over a later shorter one: 1, 2, 3 was followed by 9 at the start
    assert Drafts(5).propose(prompt, [1, 2, 3], room=5) == [9, 9, 7, 2, 3]
    assert Drafts(5).propose(prompt, [8, 2, 3], room=2) == [4, 5]
    assert Drafts(5).propose(prompt, [8, 2, 3], room=0) == []


def test_no_guess_from_a_single_token_or_from_the_answers_own_end():
    assert Drafts(5).propose([1, 2, 3], [4, 3], room=5) == []  # only the token 3 matches
    assert Drafts(5).propose([], [5, 6], room=5) == []  # no earlier run of 5, 6
    assert Drafts(5).propose([5, 6, 7], [5, 6], room=5) == [7, 5, 6]  # reaches into the run being matched


def test_growing_the_conversation_token_by_token_guesses_as_reading_it_whole():
    rng = np.random.default_rng(0)
    for _ in range(30):
        prompt = [int(t) for t in rng.integers(0, 6, 40)]
        answer_ids = [int(t) for t in rng.integers(0, 6, 60)]
        grown = Drafts(5)
        for n in range(len(answer_ids) + 1):
            assert grown.propose(prompt, answer_ids[:n], 4) == Drafts(5).propose(prompt, answer_ids[:n], 4)
