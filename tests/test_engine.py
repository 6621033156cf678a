"""The engine's contract, mostly over a scripted runner (no TensorFlow) and the tiny byte-level tokenizer, plus
the tiny random model end to end through runtime.load.

The scripted model answers a lowercase letter with the next one ("a" -> "bcd..."), so every answer's text is
known in advance.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time

import numpy as np
import pytest
from test_model import prefill_all
from tiny_model import IM_END, VOCAB_SIZE, byte_token, random_weights, tiny_config, write_gguf, write_hf_dir

from typewriter import runtime
from typewriter.engine import Engine
from typewriter.errors import EngineStopped, InvalidRequest, Overloaded, PromptTooLong
from typewriter.model import Transformer
from typewriter.request import Finished, FinishReason, GenerationRequest, Queued, SamplingParams, Started, Token
from typewriter.tokenizer import Tokenizer
from typewriter.weights import load_weights

WAIT_S = 10.0  # generous: only reached when something is broken


class LetterRunner:
    """The ModelRunner interface over a script: after letter c comes c + 1 ("z" wraps to "a", or ends the answer
    with eos if `eos_after_z`). `step_s` slows each decode step; decode waits while `gate` is clear."""

    def __init__(self, slots=2, max_len=64, max_prompt=32, step_s=0.0, eos_after_z=False):
        self.slots, self.max_len, self.max_prompt = slots, max_len, max_prompt
        self.vocab_size = VOCAB_SIZE
        self.step_s, self.eos_after_z = step_s, eos_after_z
        self.gate = threading.Event()
        self.gate.set()
        self.at_gate = threading.Event()  # set once a decode step has started (and may be held at the gate)
        self.batch_rows: list[int] = []  # real rows of each decode step
        self.calls: list[tuple[str, int]] = []  # ("prefill", slot) / ("decode", rows), in order

    def logits_after(self, token: int) -> np.ndarray:
        letter = token - byte_token(ord("a"))
        if letter == 25 and self.eos_after_z:
            nxt = IM_END
        else:
            nxt = byte_token(ord("a") + (letter + 1) % 26 if 0 <= letter < 26 else ord("a"))
        row = np.zeros(VOCAB_SIZE, np.float32)
        row[nxt] = 1.0
        return row

    def prefill(self, slot, prompt_ids):
        self.calls.append(("prefill", slot))
        return self.logits_after(prompt_ids[-1])

    def decode(self, tokens, positions):
        self.at_gate.set()
        assert self.gate.wait(WAIT_S), "the test never opened the gate"
        time.sleep(self.step_s)
        self.calls.append(("decode", len(tokens)))
        self.batch_rows.append(len(tokens))
        return np.stack([self.logits_after(t) for t in tokens])


@pytest.fixture(scope="module")
def tokenizer(tiny_gguf):
    return Tokenizer.load(tiny_gguf)


@pytest.fixture
def make_engine(tokenizer):
    engines = []

    def make(max_queue=4, **runner_options) -> Engine:
        engine = Engine(LetterRunner(**runner_options), tokenizer, max_queue=max_queue).start()
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.runner.gate.set()
        engine.shutdown()


class Recorder:
    """An on_event callback that keeps every event and signals the end."""

    def __init__(self):
        self.events = []
        self.finished = threading.Event()

    def __call__(self, event):
        self.events.append(event)
        if isinstance(event, Finished):
            self.finished.set()

    def wait(self) -> Finished:
        assert self.finished.wait(WAIT_S), f"no Finished after {WAIT_S}s: {self.events}"
        return self.events[-1]

    def wait_for(self, kind, timeout=WAIT_S):
        deadline = time.monotonic() + timeout
        while not any(isinstance(e, kind) for e in self.events):
            assert time.monotonic() < deadline, f"no {kind.__name__}: {self.events}"
            time.sleep(0.001)

    @property
    def text(self) -> str:
        return "".join(e.text for e in self.events if isinstance(e, Token))

    @property
    def tokens(self) -> list[Token]:
        return [e for e in self.events if isinstance(e, Token)]


def request(tokenizer, rid, text, **params) -> GenerationRequest:
    return GenerationRequest(rid, tokenizer.encode(text), SamplingParams(**({"temperature": 0.0, "repetition_penalty": 1.0} | params)))


def run(engine, req) -> Recorder:
    rec = Recorder()
    engine.submit(req, rec)
    rec.wait()
    return rec


# ---- one request ----


def test_events_are_started_then_tokens_then_exactly_one_finished_with_usage(make_engine, tokenizer):
    engine = make_engine()
    rec = run(engine, request(tokenizer, "r1", "qa", max_new_tokens=5))
    started, *tokens, finished = rec.events
    assert started == Started("r1", 2, started.queue_ms)
    assert [(t.index, t.text) for t in tokens] == [(0, "b"), (1, "c"), (2, "d"), (3, "e"), (4, "f")]
    assert all(t.request_id == "r1" for t in tokens)
    assert isinstance(finished, Finished) and finished.request_id == "r1"
    assert (finished.prompt_tokens, finished.completion_tokens) == (2, 5)
    time.sleep(0.02)
    assert len(rec.events) == 7  # nothing after Finished


def test_max_new_tokens_ends_the_answer_with_length(make_engine, tokenizer):
    rec = run(make_engine(), request(tokenizer, "r", "a", max_new_tokens=3))
    assert rec.events[-1].reason is FinishReason.LENGTH and rec.text == "bcd"


def test_eos_ends_the_answer_with_eos_and_contributes_no_text(make_engine, tokenizer):
    rec = run(make_engine(eos_after_z=True), request(tokenizer, "r", "w", max_new_tokens=10))
    assert rec.events[-1].reason is FinishReason.EOS
    assert [t.token_id for t in rec.tokens][-1] == IM_END
    assert rec.text == "xyz" and rec.events[-1].completion_tokens == 4


def test_a_stop_sequence_ends_the_answer_and_its_text_is_never_emitted(make_engine, tokenizer):
    rec = run(make_engine(), request(tokenizer, "r", "a", max_new_tokens=20, stop=("zz", "def")))
    assert rec.events[-1].reason is FinishReason.STOP_SEQUENCE
    assert rec.text == "bc"
    assert len(rec.tokens) == 5  # b c d e f: "d" and "e" were held back, then dropped with the stop


def test_greedy_engine_answer_equals_a_direct_greedy_loop_over_the_same_logits(make_engine, tokenizer):
    """The scripted answer is the argmax chain; the engine must neither skip nor repeat a step."""
    runner = LetterRunner()
    ids = tokenizer.encode("m")
    for _ in range(8):
        ids.append(int(runner.logits_after(ids[-1]).argmax()))
    rec = run(make_engine(), request(tokenizer, "r", "m", max_new_tokens=8))
    assert [t.token_id for t in rec.tokens] == ids[1:]


# ---- ending early ----


def test_cancel_from_another_thread_ends_the_request_within_one_decode_step(make_engine, tokenizer):
    engine = make_engine(max_len=4096, step_s=0.002)
    rec, at_finish = Recorder(), []

    def on_event(event):
        if isinstance(event, Finished):
            at_finish.append(engine.steps)
        rec(event)

    engine.submit(request(tokenizer, "r", "a", max_new_tokens=4000), on_event)
    while len(rec.tokens) < 3:
        time.sleep(0.001)
    assert engine.cancel("r")
    steps_at_cancel, tokens_at_cancel = engine.steps, len(rec.tokens)
    assert rec.wait().reason is FinishReason.CANCELLED
    assert at_finish[0] - steps_at_cancel <= 1
    assert len(rec.tokens) - tokens_at_cancel <= 1
    assert not engine.cancel("r")  # no longer known


def test_a_deadline_ends_the_request_with_timeout(make_engine, tokenizer):
    engine = make_engine(max_len=4096, step_s=0.005)
    t0 = time.perf_counter()
    rec = run(engine, request(tokenizer, "r", "a", max_new_tokens=4000, timeout_s=0.05))
    finished = rec.events[-1]
    assert finished.reason is FinishReason.TIMEOUT
    assert 0.05 <= time.perf_counter() - t0 < 2.0
    assert 1 <= finished.completion_tokens < 100


def test_shutdown_ends_running_and_waiting_requests_with_shutdown(make_engine, tokenizer):
    engine = make_engine(slots=1, max_len=4096, step_s=0.002)
    running, waiting = Recorder(), Recorder()
    engine.submit(request(tokenizer, "a", "a", max_new_tokens=4000), running)
    running.wait_for(Token)
    engine.submit(request(tokenizer, "b", "b", max_new_tokens=10), waiting)
    engine.shutdown()
    assert running.wait().reason is FinishReason.SHUTDOWN
    assert waiting.wait().reason is FinishReason.SHUTDOWN
    assert not any(isinstance(e, Started) for e in waiting.events)
    assert not engine.alive
    with pytest.raises(EngineStopped):
        engine.submit(request(tokenizer, "c", "c"), Recorder())


# ---- many requests ----


def test_concurrent_requests_all_finish_and_share_decode_steps(make_engine, tokenizer):
    engine = make_engine(slots=4, step_s=0.001)
    engine.runner.gate.clear()  # hold the first step so every request is in before decoding starts
    recs = {}
    for letter in "aeim":
        recs[letter] = Recorder()
        engine.submit(request(tokenizer, letter, letter, max_new_tokens=10), recs[letter])
    engine.runner.gate.set()
    for letter, rec in recs.items():
        assert rec.wait().reason is FinishReason.LENGTH
        start = ord(letter) - ord("a") + 1
        assert rec.text == "".join(chr(ord("a") + (start + i) % 26) for i in range(10))
    total = sum(r.events[-1].completion_tokens for r in recs.values())
    assert engine.steps < total // 2
    assert max(engine.runner.batch_rows) == 4


def test_a_burst_of_newcomers_is_prefilled_one_per_decode_step_and_is_not_told_it_is_queued(make_engine, tokenizer):
    engine = make_engine(slots=4, step_s=0.01)
    running = Recorder()
    engine.submit(request(tokenizer, "running", "a", max_new_tokens=50), running)  # slot 0, for about 0.5 s
    running.wait_for(Token)
    burst = {name: Recorder() for name in "xyz"}
    for name, rec in burst.items():
        engine.submit(request(tokenizer, name, "b", max_new_tokens=3), rec)
    for rec in (running, *burst.values()):
        rec.wait()
    calls = engine.runner.calls
    newcomers = [i for i, call in enumerate(calls) if call[0] == "prefill" and call[1] != 0]
    assert len(newcomers) == 3
    assert all(calls[i + 1][0] == "decode" for i in newcomers), calls  # the running answer moves between them
    assert not any(isinstance(e, Queued) for rec in burst.values() for e in rec.events)  # a slot was free for each


def test_waiting_requests_hear_their_queue_position_as_it_changes(make_engine, tokenizer):
    engine = make_engine(slots=1, max_queue=3)
    engine.runner.gate.clear()
    first, second, third = Recorder(), Recorder(), Recorder()
    engine.submit(request(tokenizer, "1", "a", max_new_tokens=3), first)
    first.wait_for(Started)
    engine.submit(request(tokenizer, "2", "b", max_new_tokens=3), second)
    engine.submit(request(tokenizer, "3", "c", max_new_tokens=3), third)
    engine.runner.gate.set()
    for rec in (first, second, third):
        assert rec.wait().reason is FinishReason.LENGTH
    assert [e.position for e in first.events if isinstance(e, Queued)] == []
    assert [e.position for e in second.events if isinstance(e, Queued)] == [1]
    assert [e.position for e in third.events if isinstance(e, Queued)] == [2, 1]
    assert isinstance(third.events[2], Started)  # positions come before the start


def test_a_full_queue_refuses_with_overloaded_and_the_others_still_finish(make_engine, tokenizer):
    engine = make_engine(slots=1, max_queue=1)
    engine.runner.gate.clear()
    running, waiting = Recorder(), Recorder()
    engine.submit(request(tokenizer, "1", "a", max_new_tokens=2), running)
    running.wait_for(Started)
    engine.submit(request(tokenizer, "2", "b", max_new_tokens=2), waiting)
    with pytest.raises(Overloaded, match=r"wait queue is full \(1 waiting\)"):
        engine.submit(request(tokenizer, "3", "c", max_new_tokens=2), Recorder())
    engine.runner.gate.set()
    assert running.wait().reason is waiting.wait().reason is FinishReason.LENGTH


def test_a_burst_while_a_slot_is_free_is_bounded_by_that_slot_plus_the_queue(make_engine, tokenizer):
    engine = make_engine(slots=2, max_queue=1)
    engine.runner.gate.clear()
    recs = [Recorder() for _ in range(3)]
    engine.submit(request(tokenizer, "1", "a", max_new_tokens=2), recs[0])
    assert engine.runner.at_gate.wait(WAIT_S)  # the engine is inside a decode step: nobody is admitted meanwhile
    engine.submit(request(tokenizer, "2", "b", max_new_tokens=2), recs[1])  # will take the free slot
    engine.submit(request(tokenizer, "3", "c", max_new_tokens=2), recs[2])  # will wait
    with pytest.raises(Overloaded):
        engine.submit(request(tokenizer, "4", "d", max_new_tokens=2), Recorder())
    engine.runner.gate.set()
    assert [r.wait().reason for r in recs] == [FinishReason.LENGTH] * 3


def test_a_prompt_that_does_not_fit_is_refused_with_prompt_too_long(make_engine, tokenizer):
    engine = make_engine(max_len=64, max_prompt=32)
    with pytest.raises(PromptTooLong) as too_many:
        engine.submit(request(tokenizer, "r", "a" * 33, max_new_tokens=1), Recorder())
    assert too_many.value.prompt_tokens == 33
    with pytest.raises(PromptTooLong, match="context holds 64 tokens") as no_room:
        engine.submit(request(tokenizer, "r", "a" * 10, max_new_tokens=55), Recorder())
    assert (no_room.value.max_new_tokens, no_room.value.context) == (55, 64)
    assert run(engine, request(tokenizer, "r", "a" * 10, max_new_tokens=54)).events[-1].reason is FinishReason.LENGTH


def test_token_ids_outside_the_vocab_are_refused_before_they_reach_the_model(make_engine, tokenizer):
    engine = make_engine()
    for bad in ([VOCAB_SIZE], [-1]):
        with pytest.raises(InvalidRequest, match="prompt_ids"):
            engine.submit(GenerationRequest("r", [5, *bad], SamplingParams(max_new_tokens=1)), Recorder())
    assert run(engine, request(tokenizer, "r", "ab", max_new_tokens=2)).events[-1].reason is FinishReason.LENGTH


def test_a_callback_that_raises_loses_its_own_request_but_not_the_engine(make_engine, tokenizer, caplog):
    engine = make_engine(step_s=0.001)
    broken = []

    def explode(event):
        broken.append(event)
        if isinstance(event, Token):
            raise RuntimeError("consumer went away")

    engine.submit(request(tokenizer, "bad", "a", max_new_tokens=50), explode)
    rec = run(engine, request(tokenizer, "good", "a", max_new_tokens=5))
    assert rec.events[-1].reason is FinishReason.LENGTH and rec.text == "bcdef"
    deadline = time.monotonic() + WAIT_S
    while not isinstance(broken[-1], Finished):
        assert time.monotonic() < deadline
        time.sleep(0.001)
    assert broken[-1].reason is FinishReason.CANCELLED and broken[-1].completion_tokens < 50
    assert engine.alive and "consumer went away" in caplog.text


# ---- the synchronous and asyncio streams ----


def test_stream_yields_every_event_up_to_finished(make_engine, tokenizer):
    events = list(make_engine().stream(request(tokenizer, "r", "a", max_new_tokens=4)))
    assert isinstance(events[0], Started) and events[-1].reason is FinishReason.LENGTH
    assert "".join(e.text for e in events if isinstance(e, Token)) == "bcde"


def test_astream_delivers_the_events_to_asyncio_and_cancels_when_abandoned(make_engine, tokenizer):
    engine = make_engine(max_len=4096, step_s=0.002)

    async def main():
        whole = [e async for e in engine.astream(request(tokenizer, "full", "a", max_new_tokens=4))]
        seen = []
        async with contextlib.aclosing(engine.astream(request(tokenizer, "left", "a", max_new_tokens=4000))) as s:
            async for event in s:
                seen.append(event)
                if len(seen) == 3:
                    break
        return whole, seen

    whole, seen = asyncio.run(main())
    assert "".join(e.text for e in whole if isinstance(e, Token)) == "bcde"
    assert whole[-1].reason is FinishReason.LENGTH
    assert [type(e) for e in seen] == [Started, Token, Token]
    deadline = time.monotonic() + WAIT_S
    while engine.stats().active:  # the abandoned request was cancelled, freeing its slot
        assert time.monotonic() < deadline
        time.sleep(0.001)


# ---- the tiny random model, end to end ----


@pytest.fixture(scope="module")
def tiny_engine(tiny_gguf):
    engine, tokenizer, _ = runtime.load(tiny_gguf, slots=2, max_context=64, warmup=False)
    yield engine, tokenizer
    engine.shutdown()


def _greedy_loop(model, prompt, n, eos_ids):
    """Argmax of a full prefill of everything so far, one token at a time: no cache involved."""
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(prefill_all(model, ids)[-1].argmax()))
        if ids[-1] in eos_ids:
            break
    return ids[len(prompt) :]


def test_tiny_model_answers_concurrently_exactly_as_a_cacheless_greedy_loop(tiny_engine, tiny_gguf):
    engine, tokenizer = tiny_engine
    cfg, weights = load_weights(tiny_gguf)
    model = Transformer(cfg, weights, slots=1, max_len=64)
    prompts = {"chat": tokenizer.encode_chat([{"role": "user", "content": "hello"}]), "raw": tokenizer.encode("or")}
    recs = {name: Recorder() for name in prompts}
    for name, ids in prompts.items():
        engine.submit(GenerationRequest(name, ids, SamplingParams(max_new_tokens=12, temperature=0.0, repetition_penalty=1.0)), recs[name])
    for name, ids in prompts.items():
        finished = recs[name].wait()
        assert finished.reason in (FinishReason.LENGTH, FinishReason.EOS)
        expected = _greedy_loop(model, ids, 12, tokenizer.eos_token_ids)
        assert [t.token_id for t in recs[name].tokens] == expected, name
    assert engine.runner.tracing_counts().get("decode/2x64") == 1  # the two answers shared decode steps


def test_collecting_a_stream_from_another_thread_sees_one_finished(tiny_engine):
    engine, tokenizer = tiny_engine
    out: queue.SimpleQueue = queue.SimpleQueue()
    thread = threading.Thread(
        target=lambda: out.put(list(engine.stream(request(tokenizer, "t", "hello", max_new_tokens=5))))
    )
    thread.start()
    thread.join(WAIT_S)
    events = out.get_nowait()
    assert sum(isinstance(e, Finished) for e in events) == 1 and isinstance(events[-1], Finished)
    assert events[-1].completion_tokens == len([e for e in events if isinstance(e, Token)])


@pytest.mark.parametrize("qkv_bias", [False, True], ids=["llama", "qwen2"])
def test_a_hugging_face_directory_answers_exactly_as_the_gguf_of_the_same_weights(tmp_path, qkv_bias):
    cfg = tiny_config(tie_embeddings=False, qkv_bias=qkv_bias)
    weights = random_weights(cfg)
    answers = []
    for path in (write_gguf(tmp_path / "tiny.gguf", cfg, weights), write_hf_dir(tmp_path / "hf", cfg, weights)):
        engine, tokenizer, _ = runtime.load(path, slots=1, max_context=64, warmup=False)
        try:
            ids = tokenizer.encode_chat([{"role": "user", "content": "hello"}])
            params = SamplingParams(max_new_tokens=10, temperature=0.0, repetition_penalty=1.0)
            answers.append((ids, [e.token_id for e in run(engine, GenerationRequest("r", ids, params)).tokens]))
        finally:
            engine.shutdown()
    assert answers[0] == answers[1] and len(answers[0][1]) > 0
