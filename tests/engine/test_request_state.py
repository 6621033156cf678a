"""A request's state takes one token at a time and says what text is now certain and whether the answer is over:
the per-token half of an engine step, tested without an engine, a thread or a model."""

from __future__ import annotations

import numpy as np
import pytest
from tiny_model import IM_END, byte_token

from typewriter.engine.request import AnswerStart, FinishReason, GenerationRequest, SamplingParams
from typewriter.engine.request_state import RequestState, Status
from typewriter.text.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tokenizer(tiny_gguf):
    return Tokenizer.load(tiny_gguf)


def sequence(tokenizer, **params) -> RequestState:
    request = GenerationRequest("s", [byte_token(ord("q"))], SamplingParams(**({"max_new_tokens": 100} | params)))
    return RequestState(request, lambda event: None, tokenizer, tokenizer.eos_token_ids, now=0.0)


def take_text(seq: RequestState, text: str) -> list[tuple[str, FinishReason | None]]:
    return [seq.take(byte_token(b), now=1.0) for b in text.encode()]


def test_each_token_gives_its_text_and_the_answer_goes_on(tokenizer):
    assert take_text(sequence(tokenizer), "hi!") == [("h", None), ("i", None), ("!", None)]


def test_a_character_split_over_tokens_arrives_whole_with_its_last_byte(tokenizer):
    assert take_text(sequence(tokenizer), "é") == [("", None), ("é", None)]


def test_eos_ends_the_answer_with_no_text_of_its_own_and_releases_held_text(tokenizer):
    seq = sequence(tokenizer, stop=("xyz",))
    assert take_text(seq, "ax") == [("a", None), ("", None)]  # "x" might begin the stop sequence
    assert seq.take(IM_END, now=2.0) == ("x", FinishReason.EOS)


def test_ignore_eos_treats_eos_as_an_ordinary_token(tokenizer):
    seq = sequence(tokenizer, ignore_eos=True)
    assert seq.take(IM_END, now=1.0) == ("", None)


def test_a_stop_sequence_across_tokens_ends_the_answer_and_is_never_returned(tokenizer):
    seq = sequence(tokenizer, stop=("cd",))
    assert take_text(seq, "abcd") == [("a", None), ("b", None), ("", None), ("", FinishReason.STOP_SEQUENCE)]


def test_the_length_limit_ends_the_answer_with_every_held_character(tokenizer):
    seq = sequence(tokenizer, max_new_tokens=3, stop=("cz",))
    assert take_text(seq, "abc") == [("a", None), ("b", None), ("c", FinishReason.LENGTH)]
    assert seq.output_ids == [byte_token(b) for b in b"abc"]


def penalised_pick(tokenizer, prompt: list[int], said: list[int], a: int, b: int, **request) -> int:
    """The greedy choice between `a` (logit 1.5) and `b` (1.0) at penalty 2 once the answer has said `said`."""
    params = SamplingParams(temperature=0.0, repetition_penalty=2.0)
    seq = RequestState(GenerationRequest("s", prompt, params, **request), lambda event: None, tokenizer,
                       tokenizer.eos_token_ids, now=0.0)
    for token in said:
        seq.take(token, now=1.0)
    logits = np.zeros(tokenizer.vocab_size, np.float32)
    logits[a], logits[b] = 1.5, 1.0
    return seq.sample(logits)


def test_the_repetition_penalty_weighs_the_answers_words_not_the_prompts(tokenizer):
    """The question's numbers, names and language are what an answer should reuse: a word the prompt holds is not
    penalised, the same word once the answer has said it is (1.5 / 2 < 1.0)."""
    a, b = byte_token(ord("a")), byte_token(ord("b"))
    assert penalised_pick(tokenizer, [a, a], [], a, b) == a
    assert penalised_pick(tokenizer, [a, a], [a], a, b) == b


def test_the_repetition_penalty_leaves_digits_and_symbols_alone(tokenizer):
    """A worked sum repeats its digits, operators and spaces by nature: said before, they are not penalised."""
    for said in "7", "=", " ", "$":
        a, b = byte_token(ord(said)), byte_token(ord("b"))
        assert penalised_pick(tokenizer, [a], [a, a], a, b) == a, said


def test_a_continued_answers_start_counts_as_its_own_words_for_the_penalty(tokenizer):
    """Resumed elsewhere, an answer is penalised as the uninterrupted one would be: its start is answer, not
    prompt, though it is prefilled with the prompt."""
    a, b = byte_token(ord("a")), byte_token(ord("b"))
    assert penalised_pick(tokenizer, [b], [], a, b, answer_start=AnswerStart((a,))) == b


def test_timings_count_from_submission_and_the_decode_rate_after_the_first_token(tokenizer):
    seq = sequence(tokenizer)
    seq.started = 0.5
    seq.take(byte_token(ord("a")), now=1.0)
    for i in range(4):
        seq.take(byte_token(ord("a")), now=1.5 + i * 0.5)
    t = seq.timings(now=3.0)
    assert (t.queue_ms, t.ttft_ms, t.total_ms, t.tokens_per_s) == (500.0, 1000.0, 3000.0, 2.0)


def test_the_cached_positions_are_the_prompt_so_far_then_everything_but_the_last_token(tokenizer):
    seq = sequence(tokenizer)
    seq.prompt_ids = [5, 6, 7]
    seq.prefilled = 2
    assert seq.cached_ids() == [5, 6]
    seq.prefilled = 3
    seq.take(byte_token(ord("a")), now=1.0)  # sampled from the prompt's logits, not yet fed to the model
    assert seq.cached_ids() == [5, 6, 7]
    seq.take(byte_token(ord("b")), now=1.0)
    assert seq.cached_ids() == [5, 6, 7, byte_token(ord("a"))]


def test_status_moves_only_forward(tokenizer):
    seq = sequence(tokenizer)
    with pytest.raises(RuntimeError, match="waiting -> running"):
        seq.move_to(Status.RUNNING)  # a prompt is prefilled before it decodes
    seq.move_to(Status.PREFILLING)
    seq.move_to(Status.RUNNING)
    seq.move_to(Status.FINISHED)
    with pytest.raises(RuntimeError, match="finished -> running"):
        seq.move_to(Status.RUNNING)


@pytest.mark.parametrize("end", ["length", "eos"])
def test_an_answer_that_ends_inside_a_character_drops_it_instead_of_sending_a_replacement_character(tokenizer, end):
    rocket = "🚀".encode()
    seq = sequence(tokenizer, max_new_tokens=3 if end == "length" else 100, stop=("x",))
    got = [seq.take(byte_token(b), now=1.0) for b in b"o" + rocket[:2]]
    if end == "eos":
        got.append(seq.take(IM_END, now=2.0))
    assert got[-1] == ("", FinishReason.LENGTH if end == "length" else FinishReason.EOS)
    assert "".join(text for text, _ in got) == "o"
