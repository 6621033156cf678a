"""Each model family end to end on a tiny random model, written as a GGUF file and as a Hugging Face directory:
it loads through assemble.load, answers greedily as a cacheless loop over the same weights does, and its streamed
text is its tokenizer's decode of the answer."""

from __future__ import annotations

import json

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from helpers import Recorder
from repo import GOLDEN_DIR
from tiny_model import (
    SPM_VOCAB_SIZE,
    TOLERANCE,
    gpt2_config,
    gpt2_reference_logits,
    greedy_loop,
    prefill_all,
    random_gpt2_weights,
    random_weights,
    tiny_config,
    write_gguf,
    write_gpt2_gguf,
    write_gpt2_hf_dir,
    write_hf_dir,
    write_phi3_gguf,
    write_phi3_hf_dir,
)

from typewriter import assemble
from typewriter.engine.request import FinishReason, GenerationRequest, SamplingParams
from typewriter.errors import ModelFormatError
from typewriter.runners.xla.gpt2 import GPT2Transformer
from typewriter.runners.xla.model import Transformer
from typewriter.runners.xla.start import build_model
from typewriter.weights import load_weights

COMPILE_WAIT_S = 120  # the first answer compiles its programs (compile="lazy")
GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0, repetition_penalty=1.0)


def answer(path, messages, weight_format="auto"):
    """(prompt ids, answer ids, streamed text, tokenizer) from a real engine."""
    engine, tokenizer, _ = assemble.load(path, slots=1, max_context=64, max_queue=0, prefill_budget=8,
                                        compile="lazy", weight_format=weight_format)
    try:
        ids = tokenizer.encode_chat(messages, system="")
        rec = Recorder()
        engine.submit(GenerationRequest("r", ids, GREEDY), rec)
        assert rec.finished.wait(COMPILE_WAIT_S), "no answer: compiling the programs on two busy cores?"
        assert rec.wait().reason in (FinishReason.LENGTH, FinishReason.EOS)
        return ids, [t.token_id for t in rec.tokens], rec.text, tokenizer
    finally:
        engine.shutdown()


# ---- TinyLlama / Llama-2 shape: the llama block with a SentencePiece tokenizer ----


@pytest.mark.parametrize("form", ["gguf", "metaspace"])  # the legacy form encodes as gguf does
def test_a_llama_with_a_sentencepiece_tokenizer_answers_as_the_greedy_loop_and_streams_its_decode(tmp_path, form):
    cfg = tiny_config(vocab_size=SPM_VOCAB_SIZE, tie_embeddings=False)
    weights = random_weights(cfg)
    if form == "gguf":
        path = write_gguf(tmp_path / "tiny.gguf", cfg, weights, tokenizer="spm")
    else:
        path = write_hf_dir(tmp_path / "hf", cfg, weights, tokenizer=form)
    # int8-lite, whose 16-bit rows keep a random model's greedy answer on fp32's: q4-blocks takes each row to 8 bits
    # a block, as llama.cpp does, and a random model's near-ties may then go the other way (its greedy parity with
    # its own kernel: runners/lite/test_blocks.py)
    ids, answer_ids, text, tokenizer = answer(path, [{"role": "user", "content": "hello world"}], "int8-lite")
    assert ids[0] == tokenizer.bos_token_id and tokenizer.decode(ids).endswith("hello world [/INST]")
    model = build_model(*load_weights(path), slots=1, max_len=64)
    assert answer_ids == greedy_loop(model, ids, GREEDY.max_new_tokens, tokenizer.eos_token_ids)
    assert text == llama_cpp_text(tokenizer, answer_ids)
    if "\ufffd" not in tokenizer.decode(answer_ids):
        assert text == tokenizer.decode(answer_ids)


def llama_cpp_text(tokenizer, ids) -> str:
    """What llama.cpp's server shows for a SentencePiece answer: each piece's bytes ("▁" a space, <0xNN> the byte
    NN) joined, then read as UTF-8 leaving out what is not, less the first leading space. Where a run of byte
    tokens is not UTF-8 as a whole, transformers' decode shows U+FFFD for every byte of the run instead, whole
    characters inside it included; a random model's answers do that, a trained model's hardly ever."""
    pieces = [tokenizer.raw.id_to_token(i) for i in ids if i not in tokenizer.special_ids]
    spelt = b"".join(
        bytes([int(p[3:5], 16)]) if p.startswith("<0x") and len(p) == 6 else p.replace("\u2581", " ").encode()
        for p in pieces
    )
    text = spelt.decode("utf-8", errors="ignore")
    return text[1:] if text.startswith(" ") else text


# ---- GPT-2 (DistilGPT-2 is the same shape with 6 layers) ----

PROMPT = [5, 80, 120, 3, 44, 200, 17, 9, 250, 101, 33, 7]


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    cfg = gpt2_config()
    weights = random_gpt2_weights(cfg)
    folder = tmp_path_factory.mktemp("gpt2")
    paths = {"gguf": write_gpt2_gguf(folder / "tiny.gguf", cfg, weights),
             "hf": write_gpt2_hf_dir(folder / "hf", cfg, weights),
             "hf_prefixed": write_gpt2_hf_dir(folder / "hf_prefixed", cfg, weights, prefix="transformer.")}
    return cfg, weights, paths


@pytest.mark.parametrize("form", ["gguf", "hf", "hf_prefixed"])
def test_gpt2_logits_match_a_numpy_forward_pass_of_hf_modeling_gpt2_at_every_position(gpt2, form):
    cfg, weights, paths = gpt2
    loaded_cfg, loaded = load_weights(paths[form])
    assert loaded_cfg.family == "gpt2" and loaded_cfg.n_layers == cfg.n_layers and loaded_cfg.dim == cfg.dim
    model = build_model(loaded_cfg, loaded, slots=1, max_len=64)
    assert isinstance(model, GPT2Transformer)
    expected = gpt2_reference_logits(cfg, weights, PROMPT)
    got = prefill_all(model, PROMPT)
    assert np.abs(got - expected).max() < TOLERANCE * max(1.0, np.abs(expected).max())


def test_gpt2_cached_decoding_gives_the_logits_of_a_full_prefill(gpt2):
    cfg, _, paths = gpt2
    model = build_model(*load_weights(paths["gguf"]), slots=2, max_len=64)
    import tensorflow as tf

    full = prefill_all(model, PROMPT, slot=1)
    model.prefill(tf.constant([PROMPT[:-3]]), tf.constant(len(PROMPT) - 3), tf.constant(0))
    for n in range(len(PROMPT) - 3, len(PROMPT)):
        logits = model.decode(tf.constant([PROMPT[n]]), tf.constant([n]), tf.constant([0]), 64).numpy()[0]
        assert np.abs(logits - full[n]).max() < TOLERANCE * max(1.0, np.abs(full[n]).max())


def test_gpt2_answers_as_the_greedy_loop_over_the_numpy_reference(gpt2):
    cfg, weights, paths = gpt2
    ids, answer_ids, text, tokenizer = answer(paths["hf"], [{"role": "user", "content": "hello world"}])
    expected = list(ids)
    for _ in range(len(answer_ids)):
        expected.append(int(gpt2_reference_logits(cfg, weights, expected)[-1].argmax()))
    assert answer_ids == expected[len(ids):] and len(answer_ids) > 0
    assert text == tokenizer.decode(answer_ids).replace("\ufffd", "")


def test_gpt2_quantized_gguf_stays_close(gpt2, tmp_path):
    cfg, weights, _ = gpt2
    model = build_model(*load_weights(write_gpt2_gguf(tmp_path / "q8.gguf", cfg, weights, quant=Q.Q8_0)),
                        slots=1, max_len=64)
    expected = gpt2_reference_logits(cfg, weights, PROMPT)
    assert np.abs(prefill_all(model, PROMPT) - expected).max() < 0.05 * np.abs(expected).max()


def test_a_gpt2_tensor_of_the_wrong_shape_or_missing_is_named(gpt2, tmp_path):
    cfg, weights, _ = gpt2
    bad = dict(weights) | {"0.c_attn.w": weights["0.c_attn.w"][:, :-1]}
    with pytest.raises(ModelFormatError, match=r"h.0.attn.c_attn.weight has shape \(191, 64\), expected \(192, 64\)"):
        load_weights(write_gpt2_hf_dir(tmp_path / "bad", cfg, bad))
    missing = {k: v for k, v in weights.items() if k != "1.ln_2.b"}
    with pytest.raises(ModelFormatError, match="missing tensor blk.1.ffn_norm.bias"):
        load_weights(write_gpt2_gguf(tmp_path / "missing.gguf", cfg, missing))


# ---- Phi-3: the llama block, fused projections ----


@pytest.fixture(scope="module")
def phi3(tmp_path_factory):
    cfg = tiny_config(vocab_size=SPM_VOCAB_SIZE, tie_embeddings=False, n_kv_heads=4)
    weights = random_weights(cfg, seed=3)
    folder = tmp_path_factory.mktemp("phi3")
    return cfg, weights, {"gguf": write_phi3_gguf(folder / "phi3.gguf", cfg, weights),
                          "hf": write_phi3_hf_dir(folder / "hf", cfg, weights)}


@pytest.mark.parametrize("form", ["gguf", "hf"])
def test_phi3_fused_tensors_load_to_the_llama_blocks_canonical_arrays(phi3, form):
    cfg, weights, paths = phi3
    loaded_cfg, loaded = load_weights(paths[form])
    assert loaded_cfg.family == "phi3" and not loaded_cfg.qkv_bias
    assert loaded.keys() == weights.keys()
    for name, w in weights.items():
        np.testing.assert_array_equal(loaded[name], w, err_msg=name)
    assert type(build_model(loaded_cfg, loaded, slots=1, max_len=16)) is Transformer


def test_phi3_answers_alike_from_both_formats_as_the_greedy_loop(phi3):
    cfg, weights, paths = phi3
    answers = [answer(paths[form], [{"role": "user", "content": "hello"}]) for form in ("gguf", "hf")]
    (ids, answer_ids, text, tokenizer), other = answers[0], answers[1]
    assert (ids, answer_ids, text) == other[:3]
    model = build_model(cfg, weights, slots=1, max_len=64)
    assert answer_ids == greedy_loop(model, ids, GREEDY.max_new_tokens, tokenizer.eos_token_ids)


def test_phi3_sliding_window_caps_the_context(tmp_path):
    cfg = tiny_config(vocab_size=SPM_VOCAB_SIZE, tie_embeddings=False)
    weights = random_weights(cfg)
    assert load_weights(write_phi3_gguf(tmp_path / "w.gguf", cfg, weights, sliding_window=100))[0].max_position == 100
    assert load_weights(write_phi3_hf_dir(tmp_path / "w", cfg, weights, sliding_window=100))[0].max_position == 100


def test_phi3_longrope_is_refused(tmp_path):
    cfg = tiny_config(vocab_size=SPM_VOCAB_SIZE, tie_embeddings=False)
    weights = random_weights(cfg)
    path = write_phi3_gguf(tmp_path / "long.gguf", cfg, weights, edit=lambda w: w.add_tensor(
        "rope_factors_long.weight", np.ones(cfg.head_dim // 2, np.float32)))
    with pytest.raises(ModelFormatError, match="rope_factors_long.weight .*LongRoPE.* not supported"):
        load_weights(path)


def test_a_phi3_fused_tensor_of_the_wrong_size_is_named(tmp_path):
    cfg = tiny_config(vocab_size=SPM_VOCAB_SIZE, tie_embeddings=False)
    bad = random_weights(cfg) | {"layers.0.w_up": np.zeros((cfg.hidden_dim - 1, cfg.dim), np.float32)}
    with pytest.raises(ModelFormatError, match=r"blk.0.ffn_up.weight has shape \(255, 64\), expected \(256, ...\)"):
        load_weights(write_phi3_gguf(tmp_path / "bad.gguf", cfg, bad))


# ---- against transformers + PyTorch: tests/golden/tiny_families.json (scripts/make_golden.py --families) ----

GOLDEN = json.loads((GOLDEN_DIR / "tiny_families.json").read_text())
GOLDEN_TOLERANCE = 1e-5  # relative to the largest logit; measured 1.5e-5 absolute (gpt2, logits up to 44): 30x


def golden_models(tmp_path):
    """The same tiny models make_golden.py gave transformers, from the same seeds."""
    llama = tiny_config(vocab_size=SPM_VOCAB_SIZE, tie_embeddings=False)
    phi3 = tiny_config(vocab_size=SPM_VOCAB_SIZE, tie_embeddings=False, n_kv_heads=4)
    gpt2 = gpt2_config()
    return {
        "llama_spm": (write_hf_dir, write_gguf, llama, random_weights(llama, seed=0), {"tokenizer": "legacy"}),
        "phi3": (write_phi3_hf_dir, write_phi3_gguf, phi3, random_weights(phi3, seed=3), {}),
        "gpt2": (write_gpt2_hf_dir, write_gpt2_gguf, gpt2, random_gpt2_weights(gpt2, seed=0), {}),
    }


@pytest.mark.parametrize("family", ["llama_spm", "phi3", "gpt2"])
def test_logits_and_greedy_continuation_match_transformers_from_both_formats(tmp_path, family):
    golden = GOLDEN["families"][family]
    write_hf, write_gguf_file, cfg, weights, options = golden_models(tmp_path)[family]
    assert sum(float(np.abs(w).sum()) for w in weights.values()) == pytest.approx(golden["weights_abs_sum"])
    expected = np.array(golden["logits"])
    prompt, n = GOLDEN["meta"]["prompt"], GOLDEN["meta"]["new_tokens"]
    gguf_options = {"tokenizer": "spm"} if family == "llama_spm" else {}
    for path in (write_hf(tmp_path / "hf", cfg, weights, **options),
                 write_gguf_file(tmp_path / "m.gguf", cfg, weights, **gguf_options)):
        model = build_model(*load_weights(path), slots=1, max_len=64)
        got = prefill_all(model, prompt)
        assert np.abs(got - expected).max() < GOLDEN_TOLERANCE * max(1.0, np.abs(expected).max()), path.name
        assert greedy_loop(model, prompt, n, eos_ids=()) == golden["greedy"], path.name
