"""A conversation that outgrows the context drops its oldest exchanges, keeping a client's system message and the
latest question; only a question that cannot fit alone is prompt_too_long. The cut is searched, and is the one
dropping an exchange at a time finds, reading text only about as far as the context reaches."""

from __future__ import annotations

import pytest
from helpers import quadratic_reference

from typewriter.errors import PromptTooLong
from typewriter.text.conversation import fit_conversation


def encode(messages):
    """Ten tokens per message."""
    return [len(m["content"]) for m in messages for _ in range(10)]


def talk(exchanges: int, system: bool = False) -> list[dict]:
    messages = [{"role": "system", "content": "rules"}] if system else []
    for i in range(exchanges):
        messages += [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]
    return messages + [{"role": "user", "content": "last"}]


def test_a_conversation_that_fits_is_sent_whole_with_the_default_length():
    fitted = fit_conversation(talk(2), encode, context=200, default=64)
    assert (len(fitted.prompt_ids), fitted.max_new_tokens, fitted.dropped_messages) == (50, 64, 0)


def test_the_oldest_exchanges_go_until_the_answer_fits_with_a_quarter_of_the_context_to_spare():
    fitted = fit_conversation(talk(10), encode, context=200, default=64)  # 210 tokens of history
    assert fitted.dropped_messages % 2 == 0
    assert len(fitted.prompt_ids) + 64 <= 150 < len(fitted.prompt_ids) + 64 + 20  # no more than needed
    assert fitted.max_new_tokens == 64


def test_a_system_message_and_the_latest_question_always_stay():
    kept = []
    fit_conversation(talk(10, system=True), lambda m: kept.append(m) or encode(m), context=200, default=64)
    assert kept[-1][0]["role"] == "system" and kept[-1][-1]["content"] == "last"
    assert [m["role"] for m in kept[-1][1:]] == ["user", "assistant"] * ((len(kept[-1]) - 2) // 2) + ["user"]


def test_an_asked_length_is_what_must_fit():
    fitted = fit_conversation(talk(3), encode, context=100, default=16, asked=50)
    assert fitted.max_new_tokens == 50 and len(fitted.prompt_ids) + 50 <= 75


def test_a_question_that_cannot_fit_alone_is_prompt_too_long():
    with pytest.raises(PromptTooLong, match="leaves room for"):
        fit_conversation(talk(0), encode, context=40, default=64)


# ---- the cut is searched, and what is read is bounded by the context, not the frame ----


def outcome(fit, context):
    """The fitted prompt, or prompt_too_long from the fitting or, for an asked length that does not fit, from the
    engine, which refuses such a request."""
    try:
        fitted = fit()
    except PromptTooLong as e:
        return "prompt_too_long", e.prompt_tokens
    if len(fitted.prompt_ids) + fitted.max_new_tokens > context:
        return "prompt_too_long", len(fitted.prompt_ids)
    return fitted.prompt_ids, fitted.max_new_tokens, fitted.dropped_messages


def random_talk(rng, tokenizer_words=("tea", "photosynthesis", "7138", "fraction", "why", " ", "\n", "#")) -> list:
    messages = [{"role": "system", "content": "Be brief."}] if rng.random() < 0.3 else []
    for i in range(rng.randrange(0, 40)):
        messages.append({"role": "user" if i % 2 == 0 else "assistant",
                         "content": " ".join(rng.choice(tokenizer_words) for _ in range(rng.randrange(0, 120)))})
    if messages and messages[-1]["role"] == "user":
        messages.append({"role": "assistant", "content": "ok"})
    return messages + [{"role": "user", "content": " ".join(["why"] * rng.randrange(1, 300))}]


def test_the_searched_cut_is_the_one_dropping_an_exchange_at_a_time_finds(real_tokenizer):
    """The embedded model's tokenizer, random conversations, contexts and lengths: the same prompt, answer length
    and dropped messages as the quadratic fitting, or the same prompt_too_long."""
    import random

    rng = random.Random(31)
    tok = real_tokenizer
    for _ in range(150):
        messages, context = random_talk(rng), rng.choice([256, 512, 1024, 2048])
        default, asked = rng.choice([16, 200, 512]), rng.choice([None, None, 8, 100])
        encode = lambda m: tok.encode_chat(m, "Be a tutor.")  # noqa: E731
        new = outcome(lambda: fit_conversation(messages, encode, context, default, asked, tok.count), context)
        old = outcome(lambda: quadratic_reference(messages, encode, context, default, asked), context)
        if new[0] == "prompt_too_long":  # the new one may say so from a count, without encoding the question
            assert old[0] == "prompt_too_long" and new[1] <= old[1]
        else:
            assert new == old


class Reading:
    """A tokenizer of a token a word that records how many characters each call read."""

    def __init__(self):
        self.encoded, self.counted, self.calls = 0, 0, 0

    def encode(self, messages):
        self.calls += 1
        self.encoded += sum(len(m["content"]) for m in messages)
        return [0 for m in messages for _ in range(1 + len(m["content"].split()))]

    def count(self, text, limit):
        self.counted += len(text)
        return len(text.split())


def test_a_127_message_chat_is_read_about_as_far_as_the_context_and_encoded_a_few_times():
    word = "abcdefghijklmnopqr "  # 19 characters a token: 127 messages of 100 words are about 245 KB
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": word * 100} for i in range(127)]
    reading, quadratic = Reading(), Reading()
    fitted = fit_conversation(messages, reading.encode, 2048, 512, None, reading.count)
    reference = quadratic_reference(messages, quadratic.encode, 2048, 512)
    assert (fitted.prompt_ids, fitted.dropped_messages) == (reference.prompt_ids, reference.dropped_messages)
    kept = sum(len(m["content"]) for m in messages[fitted.dropped_messages:])
    assert reading.counted <= (2048 // 100 + 2) * len(word * 100)  # as many messages as the context holds
    assert reading.calls <= 4 and reading.encoded <= 4 * kept
    assert quadratic.calls == 60 and quadratic.encoded > 50 * len(word * 100) * 60  # what it cost before


def test_a_question_far_over_the_context_is_prompt_too_long_without_being_encoded():
    reading = Reading()
    with pytest.raises(PromptTooLong, match=r"the prompt is at least \d+ tokens"):
        fit_conversation([{"role": "user", "content": "word " * 50000}], reading.encode, 2048, 512, None,
                         reading.count)
    assert reading.calls == 0
