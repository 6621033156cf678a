"""The real embedded SmolLM2-135M Q4_1 against reference logits from HF transformers + PyTorch (tests/golden/).

Tolerances follow tests/golden/README.md: 1e-2 absolute on logits (about 150x the measured float32 noise), argmax
equal, greedy ids equal except where the reference's own top-2 margin is under 2e-2. The greedy continuation is
teacher-forced (one prefill over prompt + reference ids), so a near-tie at one step cannot derail later steps.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf
from repo import GOLDEN_DIR

from typewriter.engine.engine import Engine
from typewriter.engine.request import Finished, FinishReason, GenerationRequest, SamplingParams, Token

pytestmark = pytest.mark.slow

GOLDEN = json.loads((GOLDEN_DIR / "smollm2_135m_q4_1.json").read_text())
PROMPTS = {p["name"]: p for p in GOLDEN["prompts"]}
FIXED_IDS = GOLDEN["meta"]["fixed_ids"]
TOLERANCE = 1e-2
NEAR_TIE = 2e-2
BUCKET = 128  # the longest prompt (53) + 39 reference tokens fits


@pytest.fixture(scope="module")
def teacher_forced(real_runner):
    """Our logits [n, v] at every position of prompt + greedy.ids[:-1], for each golden prompt."""
    model = real_runner.model
    prefill = tf.function(
        lambda tokens, length: model.prefill(tokens, length, tf.constant(0), all_logits=True),
        input_signature=[tf.TensorSpec([1, BUCKET], tf.int32), tf.TensorSpec([], tf.int32)],
        jit_compile=True,
    )
    out = {}
    for name, p in PROMPTS.items():
        ids = p["ids"] + p["greedy"]["ids"][:-1]
        tokens = np.zeros([1, BUCKET], np.int32)
        tokens[0, : len(ids)] = ids
        out[name] = prefill(tokens, np.int32(len(ids))).numpy()[0, : len(ids)].astype(np.float64)
    return out


def _logsumexp(row):
    top = row.max()
    return top + np.log(np.exp(row - top).sum())


@pytest.mark.parametrize("name", PROMPTS)
def test_our_tokenizer_encodes_each_golden_prompt_to_the_reference_ids(real_tokenizer, name):
    p = PROMPTS[name]
    if p["kind"] == "chat":
        assert real_tokenizer.render_chat(p["messages"]) == p["text"]
    assert real_tokenizer.encode(p["text"]) == p["ids"]


@pytest.mark.parametrize("name", PROMPTS)
def test_logits_at_the_recorded_positions_match_the_reference(teacher_forced, name):
    logits = teacher_forced[name]
    for rec in PROMPTS[name]["positions"]:
        row = logits[rec["pos"]]
        where = f"{name} position {rec['pos']}"
        np.testing.assert_allclose(row[rec["top_ids"]], rec["top_logits"], atol=TOLERANCE, rtol=0, err_msg=where)
        np.testing.assert_allclose(row[FIXED_IDS], rec["fixed_logits"], atol=TOLERANCE, rtol=0, err_msg=where)
        assert abs(_logsumexp(row) - rec["logsumexp"]) < TOLERANCE, where
        assert int(row.argmax()) == rec["top_ids"][0], where


@pytest.mark.parametrize("name", PROMPTS)
def test_teacher_forced_greedy_argmax_matches_the_reference_at_every_step(teacher_forced, name):
    p = PROMPTS[name]
    logits = teacher_forced[name][len(p["ids"]) - 1 :]  # row t predicts greedy token t
    greedy, margins = p["greedy"]["ids"], p["greedy"]["margins"]
    assert len(logits) == len(greedy) == 40
    for t, (row, expected, margin) in enumerate(zip(logits, greedy, margins)):
        ours = int(row.argmax())
        if ours != expected:  # only a near-tie in the reference may flip, and then ours must be near-tied too
            assert margin < NEAR_TIE and row[ours] - row[expected] < NEAR_TIE, f"{name} step {t}: {ours} != {expected}"


class _EndlessTokenizer:
    """The real tokenizer with no end-of-turn ids: the reference's greedy run did not stop at eos either."""

    eos_token_ids = frozenset()

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


def test_the_engine_continues_the_capital_of_france_exactly_as_the_reference(real_runner, real_tokenizer):
    p = PROMPTS["capital_raw"]
    engine = Engine(real_runner, _EndlessTokenizer(real_tokenizer), max_queue=0, prefill_budget=16).start()
    try:
        params = SamplingParams(max_new_tokens=36, temperature=0.0, repetition_penalty=1.0)
        events = list(engine.stream(GenerationRequest("golden", real_tokenizer.encode(p["text"]), params)))
    finally:
        engine.shutdown()
    ids = [e.token_id for e in events if isinstance(e, Token)]
    assert isinstance(events[-1], Finished) and events[-1].reason is FinishReason.LENGTH
    assert ids == p["greedy"]["ids"][:36]  # includes its <|im_end|> at step 29 and what follows
    assert "".join(e.text for e in events if isinstance(e, Token)).startswith(" Paris.")
