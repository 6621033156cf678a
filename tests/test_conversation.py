"""A conversation that outgrows the context drops its oldest exchanges, keeping a client's system message and the
latest question; only a question that cannot fit alone is prompt_too_long."""

from __future__ import annotations

import pytest

from typewriter.text.conversation import fit_conversation
from typewriter.errors import PromptTooLong


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
