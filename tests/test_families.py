"""Each model family end to end on a tiny random model, written as a GGUF file and as a Hugging Face directory:
it loads through runtime.load, answers greedily as a cacheless loop over the same weights does, and its streamed
text is its tokenizer's decode of the answer."""

from __future__ import annotations

import pytest
from helpers import Recorder
from tiny_model import SPM_VOCAB_SIZE, prefill_all, random_weights, tiny_config, write_gguf, write_hf_dir

from typewriter import runtime
from typewriter.model import Transformer
from typewriter.request import FinishReason, GenerationRequest, SamplingParams
from typewriter.weights import load_weights

COMPILE_WAIT_S = 120  # the first answer compiles its programs (compile="lazy")
GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0, repetition_penalty=1.0)


def greedy_loop(model, prompt, n, eos_ids):
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(prefill_all(model, ids)[-1].argmax()))
        if ids[-1] in eos_ids:
            break
    return ids[len(prompt) :]


def answer(path, messages):
    """(prompt ids, answer ids, streamed text, tokenizer) from a real engine."""
    engine, tokenizer, _ = runtime.load(path, slots=1, max_context=64, max_queue=0, prefill_budget=8,
                                        compile="lazy")
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
    ids, answer_ids, text, tokenizer = answer(path, [{"role": "user", "content": "hello world"}])
    assert ids[0] == tokenizer.bos_token_id and tokenizer.decode(ids).endswith("hello world [/INST]")
    model = Transformer(*load_weights(path), slots=1, max_len=64)
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
