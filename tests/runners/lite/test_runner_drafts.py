"""Drafts on the real models (engine/drafting.py): q4-blocks checks a draft in one chunk, and each of its rows is the
bits decoding that token alone gives, so an answer with drafts is the answer without, token for token; on a maths
problem whose answer repeats its numbers and words, some guesses are taken."""

from __future__ import annotations

import pytest
from helpers import Recorder

from typewriter import assemble
from typewriter.config import MOST_DRAFT_TOKENS, lite_cache_dir
from typewriter.engine.engine import StepStats
from typewriter.engine.request import GenerationRequest, SamplingParams

QUESTIONS = [
    "Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins for her friends "
    "every day with four. She sells the remainder at the farmers' market daily for $2 per fresh duck egg. How much "
    "in dollars does she make every day at the farmers' market?",
    "This prints 3.33 instead of 4. Fix the function and show the whole corrected code:\n\ndef average(numbers):\n"
    "    total = 0\n    for i in range(1, len(numbers)):\n        total += numbers[i]\n    return total / len(numbers)",
]


def answers_with_and_without_drafts(model_path, **params) -> None:
    engine, tokenizer, _ = assemble.load(model_path, slots=1, max_context=1024, max_queue=0, prefill_budget=16,
                                        weight_format="q4-blocks", program_cache=lite_cache_dir(),
                                        draft_tokens=MOST_DRAFT_TOKENS)
    try:
        assert engine.draft_tokens == MOST_DRAFT_TOKENS  # q4-blocks' rows are exact alone
        stats: list[StepStats] = []
        engine.on_step = stats.append
        taken = 0
        for i, question in enumerate(QUESTIONS):
            prompt = tokenizer.encode_chat([{"role": "user", "content": question}])
            answers = {}
            for drafts in (MOST_DRAFT_TOKENS, 0):
                engine.draft_tokens = drafts
                stats.clear()
                rec = Recorder()
                engine.submit(GenerationRequest(f"q{i}-{drafts}", prompt, SamplingParams(max_new_tokens=120, **params)),
                              rec)
                finished = rec.wait()
                answers[drafts] = ([(t.token_id, t.text) for t in rec.tokens], finished.reason)
                if drafts:
                    taken += sum(s.taken for s in stats)
                else:
                    assert not any(s.drafted for s in stats)
            assert answers[MOST_DRAFT_TOKENS] == answers[0], question
        assert taken > 20  # the answers repeat the questions' numbers and code
    finally:
        engine.shutdown()


@pytest.mark.slow
def test_the_embedded_model_answers_the_same_with_drafts(embedded_model_path):
    answers_with_and_without_drafts(embedded_model_path, temperature=0.0)


@pytest.mark.slow
def test_the_embedded_model_samples_the_same_with_drafts_for_a_seed(embedded_model_path):
    answers_with_and_without_drafts(embedded_model_path, temperature=0.7, seed=3)


@pytest.mark.qwen
@pytest.mark.slow
def test_the_0_5b_answers_the_same_with_drafts(qwen_model):
    """Its layers Q5_0, Q8_0 and Q6_K: each of blocks.c's formats but Q4's checks rows alone too."""
    answers_with_and_without_drafts(qwen_model, temperature=0.0)
