"""The engine's contract. Behaviour is driven through `Engine.step()` on a scripted runner (no TensorFlow, no
thread, a hand-moved clock), so every test is exact and nothing waits; a few tests run the real thread, and the
tiny random model runs end to end through assemble.load.

The scripted model answers a lowercase letter with the next one ("a" -> "bcd..."), so every answer's text is
known in advance.
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import replace

import pytest
from helpers import Clock, Recorder, instant_steps, wait_until
from scripted import letter_runner, letters
from tiny_model import (
    IM_END,
    VOCAB_SIZE,
    byte_token,
    greedy_loop,
    random_weights,
    tiny_config,
    write_gguf,
    write_hf_dir,
)

from typewriter import assemble
from typewriter.config import WeightFormat
from typewriter.engine.capacity import Sizing, StepModel
from typewriter.engine.engine import MAX_FAULTY_STEPS, Engine, EngineFault, EngineState
from typewriter.engine.request import (
    Finished,
    FinishReason,
    GenerationRequest,
    Queued,
    SamplingParams,
    Share,
    Started,
    Token,
)
from typewriter.engine.slot_cap import EVERY, WAITING_EVERY
from typewriter.engine.step_cost import COLD_CHUNK, SEEN, STALL
from typewriter.errors import EngineStopped, InvalidRequest, Overloaded, PromptTooLong
from typewriter.runners.options import RunnerOptions
from typewriter.runners.xla.model import Transformer
from typewriter.text.tokenizer import Tokenizer
from typewriter.weights import load_weights


@pytest.fixture(scope="module")
def tokenizer(tiny_gguf):
    return Tokenizer.load(tiny_gguf)


@pytest.fixture
def make_engine(tokenizer):
    """An engine that is not started: the test calls `step()`."""

    def make(max_queue=4, eos_after_z=False, prefill_budget=8, **runner_options) -> Engine:
        engine = Engine(letter_runner(eos_after_z, **runner_options), tokenizer, max_queue=max_queue,
                        prefill_budget=prefill_budget, clock=Clock())
        instant_steps(engine.scheduler.costs)
        return engine

    return make


def request(tokenizer, rid, text, **params) -> GenerationRequest:
    greedy = {"temperature": 0.0, "repetition_penalty": 1.0}
    return GenerationRequest(rid, tokenizer.encode(text), SamplingParams(**(greedy | params)))


def submit(engine, tokenizer, rid, text, **params) -> Recorder:
    rec = Recorder()
    engine.submit(request(tokenizer, rid, text, **params), rec)
    return rec


def steps_until(engine, *recs, limit=1000) -> int:
    """Step the engine until every recorder has its Finished; returns the steps it took."""
    for n in range(1, limit + 1):
        engine.step()
        if all(r.done for r in recs):
            return n
    raise AssertionError(f"not finished after {limit} steps: {[r.events[-3:] for r in recs]}")


# ---- one request ----


def test_events_are_started_then_tokens_then_exactly_one_finished_with_usage(make_engine, tokenizer):
    engine = make_engine()
    rec = submit(engine, tokenizer, "r1", "qa", max_new_tokens=5)
    steps_until(engine, rec)
    engine.step()
    started, *tokens, finished = rec.events
    assert started == Started("r1", 2, 0.0)
    assert [(t.index, t.text) for t in tokens] == [(0, "b"), (1, "c"), (2, "d"), (3, "e"), (4, "f")]
    assert all(t.request_id == "r1" for t in tokens)
    assert isinstance(finished, Finished) and finished.request_id == "r1"
    assert (finished.prompt_tokens, finished.completion_tokens) == (2, 5)
    assert len(rec.events) == 7  # nothing after Finished, however many more steps


def test_the_first_step_prefills_and_the_answer_then_takes_one_token_per_decode_step(make_engine, tokenizer):
    engine = make_engine()
    rec = submit(engine, tokenizer, "r", "a", max_new_tokens=4)
    engine.step()
    assert rec.text == "b" and engine.runner.calls == [("prefill", 0, 0, 1)]  # it decodes from the next step
    engine.step()
    engine.step()
    assert rec.text == "bcd" and engine.decode_steps == 2


def test_max_new_tokens_ends_the_answer_with_length(make_engine, tokenizer):
    engine = make_engine()
    rec = submit(engine, tokenizer, "r", "a", max_new_tokens=3)
    steps_until(engine, rec)
    assert rec.events[-1].reason is FinishReason.LENGTH and rec.text == "bcd"


def test_eos_ends_the_answer_with_eos_and_contributes_no_text(make_engine, tokenizer):
    engine = make_engine(eos_after_z=True)
    rec = submit(engine, tokenizer, "r", "w", max_new_tokens=10)
    steps_until(engine, rec)
    assert rec.events[-1].reason is FinishReason.EOS
    assert [t.token_id for t in rec.tokens][-1] == IM_END
    assert rec.text == "xyz" and rec.events[-1].completion_tokens == 4


def test_a_stop_sequence_ends_the_answer_and_its_text_is_never_emitted(make_engine, tokenizer):
    engine = make_engine()
    rec = submit(engine, tokenizer, "r", "a", max_new_tokens=20, stop=("zz", "def"))
    steps_until(engine, rec)
    assert rec.events[-1].reason is FinishReason.STOP_SEQUENCE
    assert rec.text == "bc"
    assert len(rec.tokens) == 5  # b c d e f: "d" and "e" were held back, then dropped with the stop


def test_greedy_engine_answer_equals_a_direct_greedy_loop_over_the_same_logits(make_engine, tokenizer):
    """The scripted answer is the argmax chain; the engine must neither skip nor repeat a step."""
    follow, ids = letters(), tokenizer.encode("m")
    for _ in range(8):
        ids.append(follow(ids[-1]))
    engine = make_engine()
    rec = submit(engine, tokenizer, "r", "m", max_new_tokens=8)
    steps_until(engine, rec)
    assert [t.token_id for t in rec.tokens] == ids[1:]


# ---- ending early ----


def test_cancel_ends_the_request_at_the_next_step_without_another_token(make_engine, tokenizer):
    engine = make_engine(max_len=4096)
    rec = submit(engine, tokenizer, "r", "a", max_new_tokens=4000)
    for _ in range(3):
        engine.step()
    tokens_at_cancel, steps_at_cancel = len(rec.tokens), engine.decode_steps
    assert engine.cancel("r")
    engine.step()
    assert rec.events[-1].reason is FinishReason.CANCELLED
    assert (len(rec.tokens), engine.decode_steps) == (tokens_at_cancel, steps_at_cancel)  # no model work for it
    assert not engine.cancel("r")  # no longer known


def test_a_request_cancelled_while_it_waits_ends_without_starting(make_engine, tokenizer):
    engine = make_engine(slots=1)
    running = submit(engine, tokenizer, "1", "a", max_new_tokens=10)
    engine.step()
    waiting = submit(engine, tokenizer, "2", "b", max_new_tokens=10)
    engine.step()
    assert engine.cancel("2")
    engine.step()
    assert [type(e) for e in waiting.events] == [Queued, Finished]
    assert waiting.events[-1].reason is FinishReason.CANCELLED and not running.done


def test_a_deadline_ends_the_request_with_timeout_at_the_first_step_past_it(make_engine, tokenizer):
    engine = make_engine(max_len=4096)
    rec = submit(engine, tokenizer, "r", "a", max_new_tokens=4000, timeout_s=0.05)
    for _ in range(5):
        engine.step()
    engine.clock.now += 0.05  # exactly at the deadline: not past it
    engine.step()
    assert not rec.done
    engine.clock.now += 0.001
    engine.step()
    finished = rec.events[-1]
    assert finished.reason is FinishReason.TIMEOUT and finished.completion_tokens == 6


def test_shutdown_ends_running_and_waiting_requests_with_shutdown(make_engine, tokenizer):
    engine = make_engine(slots=1, max_len=4096)
    running = submit(engine, tokenizer, "a", "a", max_new_tokens=4000)
    engine.step()
    waiting = submit(engine, tokenizer, "b", "b", max_new_tokens=10)
    engine.shutdown()
    assert running.events[-1].reason is waiting.events[-1].reason is FinishReason.SHUTDOWN
    assert not waiting.of(Started)
    assert engine.state is EngineState.STOPPED
    with pytest.raises(EngineStopped):
        engine.submit(request(tokenizer, "c", "c"), Recorder())


# ---- many requests ----


def test_concurrent_requests_all_finish_and_share_decode_steps(make_engine, tokenizer):
    engine = make_engine(slots=4)
    recs = {letter: submit(engine, tokenizer, letter, letter, max_new_tokens=10) for letter in "aeim"}
    steps_until(engine, *recs.values())
    for letter, rec in recs.items():
        assert rec.events[-1].reason is FinishReason.LENGTH
        start = ord(letter) - ord("a") + 1
        assert rec.text == "".join(chr(ord("a") + (start + i) % 26) for i in range(10))
    assert engine.decode_steps < 40 // 2
    assert max(engine.runner.decode_rows) == 4


def test_short_newcomers_arriving_together_are_prefilled_in_one_step_while_the_running_answer_moves(
        make_engine, tokenizer):
    engine = make_engine(slots=4, prefill_budget=3)
    running = submit(engine, tokenizer, "running", "a", max_new_tokens=50)
    engine.step()
    burst = [submit(engine, tokenizer, name, "bcd", max_new_tokens=3) for name in "xyz"]  # 3 tokens each
    before = len(running.tokens)
    engine.step()
    assert all(r.of(Started) for r in burst)  # three starting: the budget of 3 a step, three times
    assert [len(r.tokens) for r in burst] == [1, 1, 1]
    assert len(running.tokens) == before + 1  # and the running answer still took its token
    engine.step()
    assert [len(r.tokens) for r in burst] == [2, 2, 2]
    assert not any(r.of(Queued) for r in burst)  # a slot was free for each: none is told it is queued


def test_a_stream_whose_program_is_still_compiling_sits_out_while_the_others_go_on(make_engine, tokenizer):
    engine = make_engine(slots=2)
    engine.runner.compiler.compiled_up_to = {"decode": 8}  # as if longer decode programs were compiling
    short = submit(engine, tokenizer, "short", "a", max_new_tokens=20)
    long = submit(engine, tokenizer, "long", "abcd", max_new_tokens=20)
    for _ in range(8):
        engine.step()
    assert len(short.tokens) == 8 and len(long.tokens) == 5  # "long" holds 9 positions and waits there
    engine.runner.compiler.compiled_up_to = {"decode": 3}  # now nothing compiled can run
    engine.step()  # then all go (the real runner waits for the program), rather than no one
    assert len(short.tokens) == 9 and len(long.tokens) == 6
    engine.runner.compiler.compiled_up_to = {}
    steps_until(engine, short, long)
    assert short.text == "bcdefghijklmnopqrstu" and long.text == "efghijklmnopqrstuvwx"


def test_a_long_prompt_is_prefilled_within_the_budget_over_several_steps_as_the_others_decode(make_engine,
                                                                                              tokenizer):
    engine = make_engine(slots=2, prefill_budget=8, max_len=256, max_chunk=16)
    running = submit(engine, tokenizer, "running", "a", max_new_tokens=100)
    engine.step()
    long = submit(engine, tokenizer, "long", "q" * 40, max_new_tokens=5)
    for step in range(5):
        engine.step()
        assert len(running.tokens) == 2 + step  # every step also decodes the running answer
    assert engine.runner.prefills()[1:] == [(1, 0, 8), (1, 8, 8), (1, 16, 8), (1, 24, 8), (1, 32, 8)]
    assert [e.text for e in long.tokens] == ["r"]  # the last chunk gave the first token
    steps_until(engine, long)
    assert long.text == "rstuv"


def test_alone_a_prompt_is_prefilled_in_the_largest_chunks(make_engine, tokenizer):
    engine = make_engine(prefill_budget=8, max_len=256, max_chunk=16)
    rec = submit(engine, tokenizer, "r", "q" * 40, max_new_tokens=2)
    steps_until(engine, rec)
    assert engine.runner.prefills() == [(0, 0, 16), (0, 16, 16), (0, 32, 8)]


def test_beside_a_running_answer_chunks_are_sized_by_the_measured_step_times(tokenizer):
    """The engine tells the scheduler what each step took: until it has seen a few, a newcomer's chunks are small;
    then each step stays within STALL times a decode-only step (issue 8's bound on a running answer's gaps)."""
    clock = Clock()
    runner = letter_runner(one_pass=True, max_len=512, max_chunk=64)
    step = runner.step

    def timed(slots, tokens, positions, chunks=()):  # 4 ms a step, a chunk token 0.5 ms and 5 us a position
        clock.now += 0.004 + sum(0.0005 * len(c.token_ids) + 5e-6 * sum(range(c.start + 1, c.start + len(c.token_ids) + 1))
                                 for c in chunks)
        return step(slots, tokens, positions, chunks)

    runner.step = timed
    engine = Engine(runner, tokenizer, max_queue=4, prefill_budget=64, clock=clock)
    running = submit(engine, tokenizer, "running", "a", max_new_tokens=400, loop_guard=False)  # a..z, a..z, ...: a loop
    for _ in range(4):
        engine.step()
    long = submit(engine, tokenizer, "long", "q" * 300, max_new_tokens=2)
    times = []
    while not long.tokens:
        began = clock.now
        engine.step()
        times.append(clock.now - began)
    chunks = [n for _, _, n in runner.prefills()[1:]]
    assert chunks[:SEEN] == [COLD_CHUNK] * SEEN and max(chunks[SEEN:]) > COLD_CHUNK
    assert max(times) <= STALL * 0.004 + 1e-9 and sum(chunks) == long.of(Started)[0].prompt_tokens
    assert len(running.tokens) == 4 + len(times)  # the answer went on at every step


def test_prefills_go_first_come_first_served(make_engine, tokenizer):
    engine = make_engine(slots=3, prefill_budget=8, max_len=256, max_chunk=16)
    running = submit(engine, tokenizer, "running", "a", max_new_tokens=100)
    engine.step()
    first = submit(engine, tokenizer, "first", "q" * 20, max_new_tokens=2)
    second = submit(engine, tokenizer, "second", "r" * 20, max_new_tokens=2)
    engine.step()  # two starting: a budget of 8 each, all of it to the first in line (its chunk is at most 16)
    assert engine.runner.prefills()[1:] == [(1, 0, 16)]
    assert not second.of(Started)
    engine.step()  # the first needs 4 more tokens; the other 12 of the budget start the second
    assert engine.runner.prefills()[2:] == [(1, 16, 4), (2, 0, 12)]
    assert first.tokens and second.of(Started) and not second.tokens
    assert len(running.tokens) == 3


def test_a_stop_during_a_long_prefill_frees_the_slot_at_the_next_step(make_engine, tokenizer):
    engine = make_engine(slots=1, prefill_budget=8, max_len=256, max_chunk=8)
    running = submit(engine, tokenizer, "r", "a", max_new_tokens=100)
    engine.step()
    engine.cancel("r")
    long = submit(engine, tokenizer, "long", "q" * 60, max_new_tokens=2)
    engine.step()  # r ends; long starts its prefill
    assert running.events[-1].reason is FinishReason.CANCELLED and long.of(Started)
    waiting = submit(engine, tokenizer, "next", "b", max_new_tokens=2)
    engine.step()
    engine.cancel("long")
    engine.step()
    assert long.events[-1].reason is FinishReason.CANCELLED and not long.tokens
    assert waiting.of(Started)  # the slot went to the next in line in the same step


# ---- the slots open to newcomers move with the decode steps' times ----

PROBED = StepModel(fixed_s=0.006, per_row_s=0.0012, per_row_position_s=1e-6)
ANSWERED = {FinishReason.LENGTH, FinishReason.REPETITION}  # the alphabet, over and over, is a repetition


def timed_engine(tokenizer, scale, open_slots=2, allocated=8, sized_by="measured step time"):
    """Each runner step moves the clock by `scale[0]` times what the probe's model says of it."""
    clock = Clock()
    runner = letter_runner(slots=allocated, max_len=256)
    runner.sizing = Sizing(open_slots, sized_by, 10.0, most=None if sized_by == "set" else allocated)
    runner.step_model = PROBED
    step = runner.step

    def timed(slots, tokens, positions, chunks=()):
        if slots:
            clock.now += scale[0] * PROBED.step_s(len(slots), sum(positions) / len(slots))
        return step(slots, tokens, positions, chunks)

    runner.step = timed
    engine = Engine(runner, tokenizer, max_queue=16, prefill_budget=64, clock=clock)
    instant_steps(engine.scheduler.costs)
    return engine


def test_cheap_decode_steps_open_more_slots_and_the_log_says_why(tokenizer, caplog):
    scale = [0.5]
    engine = timed_engine(tokenizer, scale)
    assert engine.max_active == 2 and engine.describe_runtime()["slots"]["count"] == 2
    recs = [submit(engine, tokenizer, f"r{i}", "a", max_new_tokens=150) for i in range(6)]
    with caplog.at_level(logging.INFO, logger="typewriter.engine"):
        for _ in range(EVERY + 4):
            engine.step()
    assert engine.max_active == 8 and engine.stats().active == 6  # the queued four got their slots
    assert "slots 2 -> 8, raised: 8 slots step in about" in caplog.text
    assert "within the budget of 60 ms (decode steps take 0.50x the start's measurement)" in caplog.text
    described = engine.describe_runtime()["slots"]
    assert described["count"] == 8 and described["last_change"]["from"] == 2
    steps_until(engine, *recs)
    assert {r.events[-1].reason for r in recs} <= ANSWERED


def test_chats_waiting_for_a_slot_open_one_each_and_the_log_says_why(tokenizer, caplog):
    engine = timed_engine(tokenizer, [1.0], open_slots=42, allocated=64)  # 42: the most within the budget
    recs = [submit(engine, tokenizer, f"r{i}", "a", max_new_tokens=150) for i in range(45)]
    with caplog.at_level(logging.INFO, logger="typewriter.engine"):
        for _ in range(WAITING_EVERY + 4):
            engine.step()
    assert engine.max_active == 45 and engine.stats().active == 45  # the three left over got their slots
    assert "slots 42 -> 45, raised: 3 chats waited for a slot; 45 slots step in about" in caplog.text
    steps_until(engine, *recs)
    assert {r.events[-1].reason for r in recs} <= ANSWERED


def test_slow_decode_steps_stop_admitting_but_end_no_chat(tokenizer, caplog):
    scale = [1.0]
    engine = timed_engine(tokenizer, scale, open_slots=6)
    running = [submit(engine, tokenizer, f"r{i}", "a", max_new_tokens=120) for i in range(6)]
    for _ in range(3):
        engine.step()
    scale[0] = 12.0  # the machine got busy
    with caplog.at_level(logging.INFO, logger="typewriter.engine"):
        for _ in range(EVERY + 2):
            engine.step()
    assert engine.max_active == 1 and "slots 6 -> 1, lowered: 6 slots step in about" in caplog.text
    assert "(decode steps take 12.00x the start's measurement)" in caplog.text
    late = submit(engine, tokenizer, "late", "a", max_new_tokens=3)
    engine.step()
    assert engine.stats().active == 6 and late.events == [Queued("late", 1)]  # it waits; those running go on
    steps_until(engine, *running, late)
    assert {r.events[-1].reason for r in [*running, late]} <= ANSWERED


def test_the_count_follows_the_runners_part_of_a_step_not_what_the_engine_adds(tokenizer):
    """The probe timed the runner alone: sampling and the events cost the same on a faster or slower machine."""
    engine = timed_engine(tokenizer, [1.0], open_slots=42, allocated=48)  # 42: the most within the budget
    clock = engine.clock

    def slow_consumer(event):  # each token's sampling and hand-off, on the engine's clock
        clock.now += 0.005

    for i in range(6):
        engine.submit(request(tokenizer, f"r{i}", "a", max_new_tokens=120), slow_consumer)
    for _ in range(3 * EVERY):
        engine.step()
    assert engine.max_active == 42 and engine.slot_cap.scale() == pytest.approx(1.0)


def test_a_set_slot_count_never_moves(tokenizer):
    """--max-active: as many slots allocated as set, and no more open however cheap the steps."""
    engine = timed_engine(tokenizer, [0.1], allocated=2, sized_by="set")
    for i in range(4):
        submit(engine, tokenizer, f"r{i}", "a", max_new_tokens=80)
    for _ in range(3 * EVERY):
        engine.step()
        assert engine.stats().active <= engine.max_active == 2
    assert engine.slot_cap is None and "last_change" not in engine.describe_runtime()["slots"]


def test_a_raised_count_takes_the_lowest_numbered_slots_first(tokenizer):
    """Slots past the open count are never written until it rises, so their caches take no memory."""
    engine = timed_engine(tokenizer, [1.0], open_slots=3)
    for i in range(5):
        submit(engine, tokenizer, f"r{i}", "a", max_new_tokens=40)
    engine.step()
    assert sorted(engine.scheduler.running) == [0, 1, 2] and engine.stats().queued == 2


# ---- reusing the cache ----


def test_the_next_turn_of_a_conversation_starts_after_its_cached_history(make_engine, tokenizer):
    engine = make_engine(slots=2, max_len=256, max_chunk=16)
    first = submit(engine, tokenizer, "t1", "hello", max_new_tokens=4)
    steps_until(engine, first)
    history = tokenizer.encode("hello") + [t.token_id for t in first.tokens]
    turn = history + tokenizer.encode(" and q")
    second = Recorder()
    engine.submit(GenerationRequest("t2", turn, SamplingParams(max_new_tokens=3, temperature=0.0)), second)
    steps_until(engine, second)
    started = second.of(Started)[0]
    assert started.cached_tokens == len(history) - 1  # the last answer token was sampled, never fed
    assert engine.runner.prefills()[-1] == (0, len(history) - 1, len(turn) - len(history) + 1)
    assert second.text == "rst"


def test_a_prefix_cached_in_a_busy_slot_is_copied_rather_than_computed_again(make_engine, tokenizer):
    engine = make_engine(slots=2, max_len=256, max_chunk=64, prefill_budget=64)
    system = "s" * 40
    first = submit(engine, tokenizer, "a", system + "a", max_new_tokens=50)
    engine.step()
    second = submit(engine, tokenizer, "b", system + "k", max_new_tokens=3)
    steps_until(engine, second)
    assert ("copy", 0, 1) in engine.runner.calls
    assert second.of(Started)[0].cached_tokens == 40
    assert engine.runner.prefills()[-1] == (1, 40, 1)
    assert second.text == "lmn" and not first.done


def test_a_newcomer_takes_the_least_recently_used_free_slot_keeping_recent_conversations(make_engine, tokenizer):
    engine = make_engine(slots=3, max_len=256)
    for rid, text in (("old", "x"), ("mid", "y"), ("new", "z")):
        steps_until(engine, submit(engine, tokenizer, rid, text, max_new_tokens=2))  # each in slot 0..2 in turn?
    slots = [call[1] for call in engine.runner.calls if call[0] == "prefill"]
    rec = submit(engine, tokenizer, "other", "w", max_new_tokens=2)
    steps_until(engine, rec)
    assert engine.runner.prefills()[-1][0] == slots[0]  # the oldest conversation's slot went first


def test_waiting_requests_hear_their_queue_position_as_it_changes(make_engine, tokenizer):
    engine = make_engine(slots=1, max_queue=3)
    first = submit(engine, tokenizer, "1", "a", max_new_tokens=3)
    engine.step()
    second = submit(engine, tokenizer, "2", "b", max_new_tokens=3)
    third = submit(engine, tokenizer, "3", "c", max_new_tokens=3)
    steps_until(engine, first, second, third)
    assert [e.position for e in first.of(Queued)] == []
    assert [e.position for e in second.of(Queued)] == [1]
    assert [e.position for e in third.of(Queued)] == [2, 1]
    assert isinstance(third.events[2], Started)  # positions come before the start
    assert all(r.events[-1].reason is FinishReason.LENGTH for r in (first, second, third))


def test_a_full_queue_refuses_with_overloaded_and_the_others_still_finish(make_engine, tokenizer):
    engine = make_engine(slots=1, max_queue=1)
    running = submit(engine, tokenizer, "1", "a", max_new_tokens=2)
    engine.step()
    waiting = submit(engine, tokenizer, "2", "b", max_new_tokens=2)
    with pytest.raises(Overloaded, match=r"wait queue is full \(1 waiting\)"):
        engine.submit(request(tokenizer, "3", "c", max_new_tokens=2), Recorder())
    steps_until(engine, running, waiting)
    assert running.events[-1].reason is waiting.events[-1].reason is FinishReason.LENGTH


def test_a_burst_while_a_slot_is_free_is_bounded_by_that_slot_plus_the_queue(make_engine, tokenizer):
    engine = make_engine(slots=2, max_queue=1)
    recs = [submit(engine, tokenizer, "1", "a", max_new_tokens=2)]
    engine.step()
    recs.append(submit(engine, tokenizer, "2", "b", max_new_tokens=2))  # will take the free slot
    recs.append(submit(engine, tokenizer, "3", "c", max_new_tokens=2))  # will wait
    with pytest.raises(Overloaded):
        engine.submit(request(tokenizer, "4", "d", max_new_tokens=2), Recorder())
    steps_until(engine, *recs)
    assert [r.events[-1].reason for r in recs] == [FinishReason.LENGTH] * 3


def test_a_prompt_that_does_not_fit_is_refused_with_prompt_too_long(make_engine, tokenizer):
    engine = make_engine(max_len=64)
    with pytest.raises(PromptTooLong) as too_many:
        engine.submit(request(tokenizer, "r", "a" * 64, max_new_tokens=1), Recorder())
    assert too_many.value.prompt_tokens == 64
    with pytest.raises(PromptTooLong, match="context holds 64 tokens") as no_room:
        engine.submit(request(tokenizer, "r", "a" * 10, max_new_tokens=55), Recorder())
    assert (no_room.value.max_new_tokens, no_room.value.context) == (55, 64)
    rec = submit(engine, tokenizer, "r", "a" * 10, max_new_tokens=54)
    steps_until(engine, rec)
    assert rec.events[-1].reason is FinishReason.LENGTH


def test_bad_requests_are_refused_before_they_reach_the_model(make_engine, tokenizer):
    engine = make_engine()
    for bad in ([VOCAB_SIZE], [-1]):  # inside XLA an id out of range would kill the engine thread
        with pytest.raises(InvalidRequest, match="prompt_ids"):
            engine.submit(GenerationRequest("r", [5, *bad], SamplingParams(max_new_tokens=1)), Recorder())
    with pytest.raises(InvalidRequest, match="prompt"):
        engine.submit(GenerationRequest("r", [], SamplingParams(max_new_tokens=1)), Recorder())
    rec = submit(engine, tokenizer, "r", "ab", max_new_tokens=2)
    with pytest.raises(InvalidRequest, match="already running"):
        engine.submit(request(tokenizer, "r", "c", max_new_tokens=2), Recorder())
    steps_until(engine, rec)
    assert rec.events[-1].reason is FinishReason.LENGTH and engine.runner.prefills() == [(0, 0, 2)]


def test_a_callback_that_raises_loses_its_own_request_but_not_the_engine(make_engine, tokenizer, caplog):
    engine = make_engine()
    broken = Recorder()

    def explode(event):
        broken(event)
        if isinstance(event, Token):
            raise RuntimeError("consumer went away")

    engine.submit(request(tokenizer, "bad", "a", max_new_tokens=50), explode)
    good = submit(engine, tokenizer, "good", "a", max_new_tokens=5)
    steps_until(engine, good, broken)
    assert good.events[-1].reason is FinishReason.LENGTH and good.text == "bcdef"
    assert broken.events[-1].reason is FinishReason.CANCELLED and broken.events[-1].completion_tokens == 1
    assert "consumer went away" in caplog.text


# ---- the thread ----


# ---- faults: each ends only the requests it concerns ----


def _running(engine, tokenizer, rid, text, **params) -> Recorder:
    rec = submit(engine, tokenizer, rid, text, **params)
    engine.step()
    assert rec.tokens, "prefilled and given its first token in one step"
    return rec


def test_a_failed_decode_step_ends_the_requests_in_it_while_a_prefill_in_the_same_step_goes_on(make_engine,
                                                                                              tokenizer, caplog):
    engine = make_engine(slots=2)
    a = _running(engine, tokenizer, "a", "a", max_new_tokens=6)
    b = submit(engine, tokenizer, "b", "m", max_new_tokens=5)
    engine.runner.fail("decode", RuntimeError("XLA said no"))
    with caplog.at_level(logging.ERROR, logger="typewriter.engine"):
        engine.step()  # b's prompt is prefilled, then the decode of a fails
    assert (a.wait().reason, a.wait().error) == (FinishReason.ERROR, "a decode step failed on the server")
    assert caplog.text.count("Traceback") == 1 and "a decode step failed for a" in caplog.text
    steps_until(engine, b)
    assert b.wait().reason is FinishReason.LENGTH and b.text == "nopqr"
    assert engine.state is EngineState.IDLE  # driven by hand, and never failed
    again = submit(engine, tokenizer, "again", "a", max_new_tokens=3)
    steps_until(engine, again)
    assert again.text == "bcd" and again.of(Started)[0].cached_tokens == 0  # a's half-written slot is not reused


def test_a_one_pass_runner_gets_each_step_in_one_call_and_answers_as_separate_calls_do(make_engine, tokenizer):
    texts = {"a": "a", "b": "klmnopqrstuvwxyzabcd", "c": "x"}  # b's 20 tokens take three steps of budget 8
    answers = {}
    for one_pass in (False, True):
        engine = make_engine(slots=3, one_pass=one_pass)
        recs = {rid: submit(engine, tokenizer, rid, text, max_new_tokens=7) for rid, text in texts.items()}
        steps = steps_until(engine, *recs.values())
        answers[one_pass] = {rid: [t.token_id for t in rec.tokens] for rid, rec in recs.items()}
        calls = [c for c in engine.runner.calls if c[0] == "step"]
        if one_pass:
            assert len(calls) == steps and any(decoding and chunks for _, decoding, chunks in calls)
        else:
            assert not calls
    assert answers[True] == answers[False]
    assert {rid: tokenizer.decode(ids) for rid, ids in answers[True].items()}["b"] == "efghijk"


def test_a_failed_one_pass_step_ends_every_request_in_it_and_the_engine_goes_on(make_engine, tokenizer, caplog):
    engine = make_engine(slots=2, one_pass=True)
    a = _running(engine, tokenizer, "a", "a", max_new_tokens=6)
    b = submit(engine, tokenizer, "b", "m", max_new_tokens=5)
    engine.runner.fail("step", RuntimeError("XLA said no"))
    with caplog.at_level(logging.ERROR, logger="typewriter.engine"):
        engine.step()  # b's chunk and a's decode row in one call, which fails
    for rec in (a, b):
        assert (rec.wait().reason, rec.wait().error) == (FinishReason.ERROR, "a step failed on the server")
    assert caplog.text.count("Traceback") == 1 and "a step failed for b, a" in caplog.text
    again = submit(engine, tokenizer, "again", "a", max_new_tokens=3)
    steps_until(engine, again)
    assert again.text == "bcd" and again.of(Started)[0].cached_tokens == 0  # no half-written slot is reused
    assert engine.state is EngineState.IDLE


def test_a_failed_prefill_chunk_ends_only_its_request(make_engine, tokenizer):
    engine = make_engine(slots=2)
    a = _running(engine, tokenizer, "a", "a", max_new_tokens=6)
    b = submit(engine, tokenizer, "b", "m", max_new_tokens=5)
    engine.runner.fail("extend", RuntimeError("bad chunk"))
    engine.step()
    assert (b.wait().reason, b.wait().error) == (FinishReason.ERROR, "a prefill chunk failed on the server")
    steps_until(engine, a)
    assert a.wait().reason is FinishReason.LENGTH and a.text == "bcdefg"


def test_a_failed_cache_copy_ends_only_the_request_it_was_for(make_engine, tokenizer):
    engine = make_engine(slots=2, prefill_budget=32, max_chunk=32)
    prefix = "abcdefghijklmnopqrst"  # 20 tokens: long enough to copy from a busy slot
    a = _running(engine, tokenizer, "a", prefix, max_new_tokens=6)
    b = submit(engine, tokenizer, "b", prefix + "uv", max_new_tokens=3)
    engine.runner.fail("copy", RuntimeError("bad copy"))
    engine.step()
    assert not engine.runner.failures["copy"], "the step tried to copy a's prefix for b"
    assert (b.wait().reason, b.wait().error) == (FinishReason.ERROR, "a cache copy failed on the server")
    steps_until(engine, a)
    assert a.wait().reason is FinishReason.LENGTH


def test_a_sampling_fault_ends_only_that_request_in_a_shared_decode_step(make_engine, tokenizer, monkeypatch):
    engine = make_engine(slots=2)
    a = _running(engine, tokenizer, "a", "a", max_new_tokens=6)
    b = _running(engine, tokenizer, "b", "m", max_new_tokens=6)
    seq = engine.scheduler.find("b")
    monkeypatch.setattr(seq, "sample", lambda logits: 1 // 0)
    engine.step()
    assert engine.runner.calls[-1] == ("decode", (0, 1)), "both in one decode step"
    assert (b.wait().reason, b.wait().error) == (FinishReason.ERROR, "sampling or detokenizing failed on the server")
    steps_until(engine, a)
    assert a.wait().reason is FinishReason.LENGTH and a.text == "bcdefg"


def test_faulty_steps_in_a_row_raise_engine_fault_but_a_good_step_between_resets_the_count(make_engine, tokenizer):
    engine = make_engine(slots=1)
    for i in range(2 * MAX_FAULTY_STEPS):
        if i == MAX_FAULTY_STEPS - 1:  # one good step before the count is reached
            steps_until(engine, submit(engine, tokenizer, f"ok{i}", "a", max_new_tokens=2))
        engine.runner.fail("extend", RuntimeError("bad chunk"))
        rec = submit(engine, tokenizer, f"r{i}", "a", max_new_tokens=2)
        if i < 2 * MAX_FAULTY_STEPS - 2:
            engine.step()
            assert rec.wait().reason is FinishReason.ERROR
    with pytest.raises(EngineFault, match="3 steps in a row failed"):
        engine.step()


@pytest.fixture
def started(tokenizer):
    engines = []

    def start(max_queue=4, **runner_options) -> Engine:
        engine = Engine(letter_runner(**runner_options), tokenizer, max_queue=max_queue, prefill_budget=8).start()
        engines.append(engine)
        return engine

    yield start
    for engine in engines:
        engine.shutdown()


def test_the_thread_serves_requests_submitted_from_other_threads(started, tokenizer):
    engine = started(slots=2)
    out: queue.SimpleQueue = queue.SimpleQueue()
    threads = [threading.Thread(target=lambda c=c: out.put(list(engine.stream(request(tokenizer, c, c,
                                                                                            max_new_tokens=4)))))
               for c in "ak"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    answers = sorted(["".join(e.text for e in events if isinstance(e, Token)) for events in
                      (out.get_nowait(), out.get_nowait())])
    assert answers == ["bcde", "lmno"]
    assert engine.alive and engine.stats().active == 0


def test_an_abandoned_stream_cancels_its_request(started, tokenizer):
    engine = started(max_len=4096, step_s=0.001)
    events = engine.stream(request(tokenizer, "left", "a", max_new_tokens=4000))
    assert isinstance(next(events), Started)
    next(events)
    events.close()
    wait_until(lambda: engine.stats().active == 0, "the abandoned request's slot is free")


def test_shutdown_of_the_running_thread_ends_every_request_and_refuses_new_ones(started, tokenizer):
    engine = started(slots=1, max_len=4096, step_s=0.001)
    running, waiting = Recorder(), Recorder()
    engine.submit(request(tokenizer, "a", "a", max_new_tokens=4000), running)
    wait_until(lambda: running.tokens, "a first token")
    engine.submit(request(tokenizer, "b", "b", max_new_tokens=10), waiting)
    engine.shutdown()
    assert running.wait().reason is waiting.wait().reason is FinishReason.SHUTDOWN
    assert not engine.alive and engine.state is EngineState.STOPPED
    with pytest.raises(EngineStopped):
        engine.submit(request(tokenizer, "c", "c"), Recorder())


def test_steps_that_keep_failing_end_every_request_and_the_engine_refuses_new_ones(started, tokenizer, caplog):
    """Faults end only their own requests, but MAX_FAULTY_STEPS steps in a row with a failed runner call mean
    the model state is broken: the engine fails as a whole, and every request, waiting ones too, hears of it."""
    engine = started(slots=1)
    engine.runner.fail("extend", RuntimeError("XLA said no"), times=1000)
    with caplog.at_level(logging.ERROR, logger="typewriter.engine"):
        recs = [submit(engine, tokenizer, rid, rid, max_new_tokens=4) for rid in "abcd"]
        finished = [rec.wait() for rec in recs]
    assert [f.reason for f in finished] == [FinishReason.ERROR] * 4
    assert [f.error for f in finished[:MAX_FAULTY_STEPS]] == ["a prefill chunk failed on the server"] * 3
    assert "EngineFault: 3 steps in a row failed" in finished[3].error
    assert engine.state is EngineState.FAILED and not engine.alive
    assert "engine thread failed" in caplog.text
    with pytest.raises(EngineStopped, match="failed"):
        engine.submit(request(tokenizer, "e", "e", max_new_tokens=4), Recorder())


# ---- the tiny random model, end to end ----


@pytest.fixture(scope="module")
def tiny_engine(tiny_gguf):
    engine, tokenizer, _ = assemble.load(tiny_gguf, slots=2, max_context=64, max_queue=2, prefill_budget=8,
                                      compile="lazy", weight_format="fp32")  # XLA's (runners/lite/test_runner.py: int8-lite)
    yield engine, tokenizer
    engine.shutdown()


def test_tiny_model_answers_concurrently_exactly_as_a_cacheless_greedy_loop(tiny_engine, tiny_gguf):
    engine, tokenizer = tiny_engine
    cfg, weights = load_weights(tiny_gguf)
    model = Transformer(cfg, weights, slots=1, max_len=64)
    prompts = {"chat": tokenizer.encode_chat([{"role": "user", "content": "hello"}], system=""),
               "raw": tokenizer.encode("or")}
    recs = {name: Recorder() for name in prompts}
    greedy = SamplingParams(max_new_tokens=12, temperature=0.0, repetition_penalty=1.0)
    for name, ids in prompts.items():
        engine.submit(GenerationRequest(name, ids, greedy), recs[name])
    for name, ids in prompts.items():
        finished = recs[name].wait()
        assert finished.reason in (FinishReason.LENGTH, FinishReason.EOS)
        expected = greedy_loop(model, ids, 12, tokenizer.eos_token_ids)
        assert [t.token_id for t in recs[name].tokens] == expected, name
    assert engine.runner.compiler.tracing_counts().get("decode/2x64") == 1  # the two answers shared decode steps


def test_tiny_model_answers_from_its_cache_exactly_as_from_scratch(tiny_gguf):
    """Reuse within a slot (a conversation's next turn) and a copy from a busy slot (a shared prefix) change no
    token of a greedy answer. Driven by step(), so the busy slot is certainly busy."""
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0, repetition_penalty=1.0, ignore_eos=True)

    def engine():
        opened = assemble.open_runner(tiny_gguf, RunnerOptions(WeightFormat.FP32, 64, slots=2, compile="lazy"))
        return Engine(opened.runner, opened.tokenizer, max_queue=2, prefill_budget=8)

    tokenizer = Tokenizer.load(tiny_gguf)

    def ask(engine, rid, ids) -> Recorder:
        rec = Recorder()
        engine.submit(GenerationRequest(rid, ids, greedy), rec)
        return rec

    warm = engine()
    first_ids = tokenizer.encode("hello world, or hello")
    first = ask(warm, "t1", first_ids)
    steps_until(warm, first)
    turn = first_ids + [t.token_id for t in first.tokens] + tokenizer.encode(" or")
    second = ask(warm, "t2", turn)
    steps_until(warm, second)
    prefix = [byte_token(b) for b in b"a shared prefix, long"]  # 21 tokens
    busy = ask(warm, "busy", prefix + [byte_token(ord("x"))] * 10)
    warm.step()
    warm.step()  # busy's 31 prompt tokens are in, in two chunks of 16 and 15
    shared = ask(warm, "shared", prefix + tokenizer.encode(" or"))
    steps_until(warm, busy, shared)

    cold = engine()
    fresh = [ask(cold, "t2", turn), ask(cold, "shared", prefix + tokenizer.encode(" or"))]
    steps_until(cold, *fresh)
    assert second.of(Started)[0].cached_tokens == len(first_ids) + 7  # all but the last answer token
    assert shared.of(Started)[0].cached_tokens == len(prefix)
    assert ("copy" in warm.runner.compiler.tracing_counts()) and not busy.of(Queued)
    assert [t.token_id for t in second.tokens] == [t.token_id for t in fresh[0].tokens]
    assert [t.token_id for t in shared.tokens] == [t.token_id for t in fresh[1].tokens]
    assert [r.of(Started)[0].cached_tokens for r in fresh] == [0, 0]


@pytest.mark.parametrize("qkv_bias", [False, True], ids=["llama", "qwen2"])
def test_a_hugging_face_directory_answers_exactly_as_the_gguf_of_the_same_weights(tmp_path, qkv_bias):
    cfg = tiny_config(tie_embeddings=False, qkv_bias=qkv_bias)
    weights = random_weights(cfg)
    answers = []
    for path in (write_gguf(tmp_path / "tiny.gguf", cfg, weights), write_hf_dir(tmp_path / "hf", cfg, weights)):
        engine, tokenizer, _ = assemble.load(path, slots=1, max_context=64, max_queue=0, prefill_budget=8,
                                              compile="lazy")
        try:
            ids = tokenizer.encode_chat([{"role": "user", "content": "hello"}], system="")
            params = SamplingParams(max_new_tokens=10, temperature=0.0, repetition_penalty=1.0)
            rec = Recorder()
            engine.submit(GenerationRequest("r", ids, params), rec)
            rec.wait()
            answers.append((ids, [e.token_id for e in rec.tokens]))
        finally:
            engine.shutdown()
    assert answers[0] == answers[1] and len(answers[0][1]) > 0


def test_stats_count_each_groups_requests_in_slots_and_waiting(make_engine, tokenizer):
    engine = make_engine(slots=2)
    for rid, group in (("a1", "algebra"), ("a2", "algebra"), ("b1", "biology"), ("a3", "algebra")):
        engine.submit(replace(request(tokenizer, rid, "abc", max_new_tokens=8), share=Share(rid, group)), Recorder())
    engine.step()
    stats = engine.stats()
    assert (stats.active, stats.queued) == (2, 2)
    assert stats.groups == {"algebra": (1, 2), "biology": (1, 0)}  # the least-served class took the second slot


# ---- an answer parked for a student short of its share of slots ----


def test_a_parked_answer_resumes_with_one_start_no_queue_place_and_every_token_in_order(make_engine, tokenizer):
    engine = make_engine(slots=2, max_len=96)
    parked: list[int] = []
    engine.on_step = lambda stats: parked.append(stats.parked)
    greedy = [Recorder(), Recorder()]
    for n, rec in enumerate(greedy):
        engine.submit(replace(request(tokenizer, f"g{n}", "ab", max_new_tokens=40), share=Share("greedy", "class")),
                      rec)
    while len(greedy[1].tokens) < 6:
        engine.step()
    ana = Recorder()
    engine.submit(replace(request(tokenizer, "ana", "ab", max_new_tokens=4), share=Share("ana", "class")), ana)
    steps_until(engine, ana, *greedy)  # the scripted runner checks every chunk and decode against its cache
    assert sum(parked) == 1
    for rec in greedy:
        assert len(rec.of(Started)) == 1 and not rec.of(Queued)
        assert [t.index for t in rec.tokens] == list(range(40))
        assert rec.text == "".join(chr(ord("a") + (2 + i) % 26) for i in range(40))  # on where it was
    assert ana.text == "cdef"


def test_tiny_model_answer_parked_and_resumed_is_the_same_as_never_parked(tiny_gguf):
    greedy = SamplingParams(max_new_tokens=14, temperature=0.0, repetition_penalty=1.0, ignore_eos=True)
    opened = assemble.open_runner(tiny_gguf, RunnerOptions(WeightFormat.FP32, 64, slots=2, compile="lazy"))
    engine = Engine(opened.runner, opened.tokenizer, max_queue=4, prefill_budget=8)
    parked: list[int] = []
    engine.on_step = lambda stats: parked.append(stats.parked)
    tokenizer = opened.tokenizer
    prompts = {"g0": tokenizer.encode("hello world"), "g1": tokenizer.encode("or hello"), "ana": tokenizer.encode("x")}
    recs = {rid: Recorder() for rid in prompts}
    for rid in ("g0", "g1"):
        engine.submit(GenerationRequest(rid, prompts[rid], greedy, share=Share("greedy", "class")), recs[rid])
    while len(recs["g1"].tokens) < 5:
        engine.step()
    engine.submit(GenerationRequest("ana", prompts["ana"], greedy, share=Share("ana", "class")), recs["ana"])
    steps_until(engine, *recs.values())
    assert sum(parked) == 1
    cfg, weights = load_weights(tiny_gguf)
    model = Transformer(cfg, weights, slots=1, max_len=64)
    for rid, ids in prompts.items():
        assert [t.token_id for t in recs[rid].tokens] == greedy_loop(model, ids, 14, ()), rid
