"""The TensorFlow Transformer against a plain numpy forward pass, and its KV cache against full prefills.

The reference is written from the Llama/Qwen2 definitions (Hugging Face's modeling code), in float64, with
nothing shared with model.py: RMSNorm, rotate-half RoPE, grouped-query attention with a causal mask, SwiGLU.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tiny_model import TOLERANCE, prefill_all, random_weights, tiny_config

from typewriter.runners.xla.model import Transformer

CONFIGS = {
    "tied": tiny_config(),
    "untied": tiny_config(tie_embeddings=False),
    "qkv-bias": tiny_config(qkv_bias=True, tie_embeddings=False),
    "one-kv-head": tiny_config(n_kv_heads=1, rope_theta=500.0),
}


def reference_logits(cfg, w, tokens) -> np.ndarray:
    """Logits [t, v] at every position of `tokens`, computed from scratch."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    t, e = len(tokens), cfg.head_dim

    def rms_norm(x, g):
        return x / np.sqrt(np.mean(x**2, axis=-1, keepdims=True) + cfg.norm_eps) * g

    def rope(x):  # x [t, heads, e]; element i rotates with element i + e/2
        inv_freq = cfg.rope_theta ** (-np.arange(e // 2) * 2 / e)
        angle = np.arange(t)[:, None, None] * inv_freq  # [t, 1, e/2]
        x1, x2 = x[..., : e // 2], x[..., e // 2 :]
        return np.concatenate([x1 * np.cos(angle) - x2 * np.sin(angle), x2 * np.cos(angle) + x1 * np.sin(angle)], -1)

    x = w["tok_embeddings"][tokens]  # [t, d]
    causal = np.tril(np.ones((t, t), bool))
    for i in range(cfg.n_layers):
        p = lambda name: w[f"layers.{i}.{name}"]  # noqa: E731
        h = rms_norm(x, p("attention_norm"))
        q, k, v = h @ p("wq").T, h @ p("wk").T, h @ p("wv").T
        if cfg.qkv_bias:
            q, k, v = q + p("bq"), k + p("bk"), v + p("bv")
        q = rope(q.reshape(t, cfg.n_heads, e))
        k = np.repeat(rope(k.reshape(t, cfg.n_kv_heads, e)), cfg.groups, axis=1)  # query head j reads kv head j // g
        v = np.repeat(v.reshape(t, cfg.n_kv_heads, e), cfg.groups, axis=1)
        scores = np.einsum("qhe,khe->hqk", q, k) / np.sqrt(e)
        scores = np.where(causal, scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        x = x + np.einsum("hqk,khe->qhe", probs, v).reshape(t, -1) @ p("wo").T
        h = rms_norm(x, p("ffn_norm"))
        gate = h @ p("w_gate").T
        x = x + (gate / (1 + np.exp(-gate)) * (h @ p("w_up").T)) @ p("w_down").T
    out = w["tok_embeddings"] if cfg.tie_embeddings else w["output"]
    return rms_norm(x, w["norm"]) @ out.T


def prefill_last(model: Transformer, tokens, slot, pad_to=None) -> np.ndarray:
    padded = list(tokens) + [7] * ((pad_to or len(tokens)) - len(tokens))  # junk, not zeros, past the end
    return model.prefill(tf.constant([padded], tf.int32), tf.constant(len(tokens)), tf.constant(slot)).numpy()[0]


def decode(model: Transformer, tokens, positions, kv_len, slots=None) -> np.ndarray:
    slots = list(range(len(tokens))) if slots is None else slots
    return model.decode(tf.constant(tokens, tf.int32), tf.constant(positions, tf.int32),
                        tf.constant(slots, tf.int32), kv_len).numpy()


@pytest.fixture(scope="module")
def tiny():
    cfg = CONFIGS["untied"]
    weights = random_weights(cfg, seed=5)
    return cfg, weights, Transformer(cfg, weights, slots=3, max_len=32)


def _tokens(seed, n, vocab):
    return np.random.default_rng(seed).integers(0, vocab, n).tolist()


@pytest.mark.parametrize("variant", CONFIGS)
def test_prefill_logits_match_an_independent_numpy_forward_pass(variant):
    cfg = CONFIGS[variant]
    weights = random_weights(cfg, seed=3)
    model = Transformer(cfg, weights, slots=1, max_len=16)
    tokens = _tokens(4, 13, cfg.vocab_size)
    expected = reference_logits(cfg, weights, tokens)
    got = prefill_all(model, tokens)
    assert np.abs(expected).max() > 3  # logits of a size where a wrong layout would show
    np.testing.assert_allclose(got, expected, atol=TOLERANCE, rtol=0)
    np.testing.assert_array_equal(got.argmax(-1), expected.argmax(-1))


def test_prefill_returns_the_last_real_positions_logits_whatever_the_padding(tiny):
    cfg, weights, model = tiny
    tokens = _tokens(6, 9, cfg.vocab_size)
    expected = reference_logits(cfg, weights, tokens)[-1]
    np.testing.assert_allclose(prefill_last(model, tokens, slot=1, pad_to=16), expected, atol=TOLERANCE)
    np.testing.assert_allclose(prefill_last(model, tokens, slot=1), expected, atol=TOLERANCE)


def test_decode_after_prefill_gives_the_logits_of_a_full_prefill_of_the_longer_sequence(tiny):
    cfg, _, model = tiny
    prompt, answer = _tokens(7, 6, cfg.vocab_size), _tokens(8, 10, cfg.vocab_size)
    full = prefill_all(model, prompt + answer, slot=2)  # slot 2: scratch for full reference prefills
    prefill_last(model, prompt, slot=0, pad_to=16)
    for i, token in enumerate(answer):
        pos = len(prompt) + i
        got = decode(model, [token], [pos], kv_len=32)[0]
        np.testing.assert_allclose(got, full[pos], atol=TOLERANCE, err_msg=f"decode step {i}")


def test_two_slots_with_different_sequences_decode_in_one_batch_as_each_would_alone(tiny):
    cfg, _, model = tiny
    a, b = _tokens(9, 4, cfg.vocab_size), _tokens(10, 11, cfg.vocab_size)
    a_next, b_next = _tokens(11, 6, cfg.vocab_size), _tokens(12, 6, cfg.vocab_size)
    full_a, full_b = prefill_all(model, a + a_next, slot=2), prefill_all(model, b + b_next, slot=2)
    prefill_last(model, b, slot=1, pad_to=16)
    prefill_last(model, a, slot=0, pad_to=8)
    for i in range(6):
        got = decode(model, [a_next[i], b_next[i]], [len(a) + i, len(b) + i], kv_len=32)
        np.testing.assert_allclose(got[0], full_a[len(a) + i], atol=TOLERANCE, err_msg=f"slot 0, step {i}")
        np.testing.assert_allclose(got[1], full_b[len(b) + i], atol=TOLERANCE, err_msg=f"slot 1, step {i}")


def test_a_reused_slot_never_attends_to_the_previous_sequences_longer_cache(tiny):
    cfg, _, model = tiny
    long, short, more = _tokens(13, 20, cfg.vocab_size), _tokens(14, 3, cfg.vocab_size), _tokens(15, 4, cfg.vocab_size)
    full = prefill_all(model, short + more, slot=2)
    prefill_last(model, long, slot=0)
    prefill_last(model, short, slot=0)
    for i, token in enumerate(more):
        got = decode(model, [token], [len(short) + i], kv_len=32)[0]
        np.testing.assert_allclose(got, full[len(short) + i], atol=TOLERANCE, err_msg=f"step {i}")


def test_padding_rows_in_a_decode_batch_change_neither_the_real_rows_nor_any_cached_position(tiny):
    cfg, _, model = tiny
    a, b = _tokens(16, 5, cfg.vocab_size), _tokens(17, 7, cfg.vocab_size)
    full_a = prefill_all(model, a + [3, 9], slot=2)
    prefill_last(model, a, slot=0)
    prefill_last(model, b, slot=1)
    alone = decode(model, [3, 4], [5, 7], kv_len=32)
    prefill_last(model, a, slot=0)  # rewind both slots: decode wrote positions 5 and 7
    prefill_last(model, b, slot=1)
    with_padding = decode(model, [3, 4, 200], [5, 7, 32], kv_len=32, slots=[0, 1, 3])  # slot 3 of 3: none
    np.testing.assert_allclose(with_padding[:2], alone, atol=1e-5)
    np.testing.assert_allclose(decode(model, [9], [6], kv_len=32, slots=[0])[0], full_a[6], atol=TOLERANCE)


def test_a_decode_batch_may_hold_any_slots_in_any_order(tiny):
    cfg, _, model = tiny
    a, b = _tokens(18, 6, cfg.vocab_size), _tokens(19, 9, cfg.vocab_size)
    full_a, full_b = prefill_all(model, a + [5], slot=2), prefill_all(model, b + [6], slot=2)
    prefill_last(model, a, slot=0)
    prefill_last(model, b, slot=1)
    got = decode(model, [6, 5], [9, 6], kv_len=16, slots=[1, 0])
    np.testing.assert_allclose(got[0], full_b[9], atol=TOLERANCE)
    np.testing.assert_allclose(got[1], full_a[6], atol=TOLERANCE)


def test_a_segmented_cache_gives_the_same_logits_whether_a_step_gathers_its_slots_or_reads_all_in_place():
    """Six slots and segments ending at 8, 16 and 32: one row gathers its slot, three rows read every slot in
    place (IN_PLACE_SHARE); both, and a chunk that spans two segments, agree with full prefills."""
    from typewriter.runners.xla.model import IN_PLACE_SHARE

    cfg = CONFIGS["untied"]
    weights = random_weights(cfg, seed=21)
    model = Transformer(cfg, weights, slots=6, max_len=32, max_chunk=16, kv_buckets=(8, 16, 32))
    assert 1 < IN_PLACE_SHARE * 6 <= 3  # so both kinds of step are taken below
    seqs = {slot: _tokens(30 + slot, 20, cfg.vocab_size) for slot in (1, 3, 4)}
    full = {slot: prefill_all(model, ids, slot=0) for slot, ids in seqs.items()}  # slot 0: scratch
    for slot, ids in seqs.items():  # 6 tokens, then 9 more that cross the segment boundary at 8
        model.extend(tf.constant([ids[:6]]), tf.constant(0), tf.constant(6), tf.constant(slot), 8)
        model.extend(tf.constant([ids[6:15] + [0] * 7]), tf.constant(6), tf.constant(9), tf.constant(slot), 16)
    for pos in range(15, 18):  # one row alone (gathered), then all three (in place), across the boundary at 16
        alone = decode(model, [seqs[3][pos]], [pos], kv_len=32, slots=[3])[0]
        np.testing.assert_allclose(alone, full[3][pos], atol=TOLERANCE, err_msg=f"gathered, position {pos}")
        together = decode(model, [seqs[s][pos] for s in (4, 1, 3)], [pos] * 3, kv_len=32, slots=[4, 1, 3])
        for row, slot in enumerate((4, 1, 3)):
            np.testing.assert_allclose(together[row], full[slot][pos], atol=TOLERANCE,
                                       err_msg=f"in place, slot {slot}, position {pos}")
