"""A tiny Llama-family model with random weights, written as a GGUF file and as a Hugging Face directory.

Both forms hold the same weights, so a test can load either and expect the same canonical arrays. The name
tables and the Q/K permutation here are written from llama.cpp's converter and transformers' conventions, not
taken from `typewriter.weights`, so a mistake there is not mirrored here. The tokenizer is byte-level BPE:
three ChatML specials, the 256 byte tokens, and a few merges; or (`tokenizer="spm"` and friends) a SentencePiece
one as TinyLlama and Llama-2 have: <unk> <s> </s>, the 256 <0xNN> byte tokens, and scored "▁" pieces.

    cfg = tiny_config()                      # or tiny_config(tie_embeddings=False), tiny_config(qkv_bias=True)
    weights = random_weights(cfg)            # canonical name -> float32 [out, in]
    write_gguf(tmp / "m.gguf", cfg, weights, quant=Q.Q8_0)
    write_hf_dir(tmp / "m", cfg, weights)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.quants import quantize
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as RawTokenizer

from typewriter.architecture.model_config import ModelConfig
from typewriter.weights.gguf_file import permute_rotary

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
IM_START, IM_END = 1, 2
BYTE_OFFSET = len(SPECIALS)  # the token of byte b has id BYTE_OFFSET + b
MERGES = ["h e", "l l", "he ll", "hell o", "Ġ w", "o r"]
VOCAB_SIZE = len(SPECIALS) + 256 + len(MERGES)
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# canonical name -> (llama.cpp GGUF name, Hugging Face name)
GLOBAL_NAMES = {
    "tok_embeddings": ("token_embd.weight", "model.embed_tokens.weight"),
    "norm": ("output_norm.weight", "model.norm.weight"),
    "output": ("output.weight", "lm_head.weight"),
}
LAYER_NAMES = {
    "attention_norm": ("attn_norm.weight", "input_layernorm.weight"),
    "wq": ("attn_q.weight", "self_attn.q_proj.weight"),
    "wk": ("attn_k.weight", "self_attn.k_proj.weight"),
    "wv": ("attn_v.weight", "self_attn.v_proj.weight"),
    "wo": ("attn_output.weight", "self_attn.o_proj.weight"),
    "bq": ("attn_q.bias", "self_attn.q_proj.bias"),
    "bk": ("attn_k.bias", "self_attn.k_proj.bias"),
    "bv": ("attn_v.bias", "self_attn.v_proj.bias"),
    "ffn_norm": ("ffn_norm.weight", "post_attention_layernorm.weight"),
    "w_gate": ("ffn_gate.weight", "mlp.gate_proj.weight"),
    "w_up": ("ffn_up.weight", "mlp.up_proj.weight"),
    "w_down": ("ffn_down.weight", "mlp.down_proj.weight"),
}

# `long_tiny_gguf`'s context (conftest.py), and an answer of it that is still running when a client acts however fast
# the machine: the tiny model writes 256 tokens in tens of milliseconds, HOLD_TOKENS in about half a second
LONG_CONTEXT = 4096
HOLD_TOKENS = 3900
LONG_SETTINGS = {"TYPEWRITER_MAX_CONTEXT": str(LONG_CONTEXT), "TYPEWRITER_MAX_NEW_TOKENS_CAP": str(HOLD_TOKENS)}


TOLERANCE = 2e-4  # float32 against float64 (measured 1e-5), logits of magnitude up to ~50


def prefill_all(model, tokens, slot=0) -> np.ndarray:
    """Logits [t, v] at every position of `tokens`, from a full prefill of a `typewriter.runners.xla.model.Transformer`: the
    cacheless answer that cached decoding is compared with."""
    import tensorflow as tf

    ids = tf.constant([tokens], tf.int32)
    return model.prefill(ids, tf.constant(len(tokens)), tf.constant(slot), all_logits=True).numpy()[0]


def greedy_loop(model, prompt, n: int, eos_ids) -> list[int]:
    """Argmax of a full prefill of everything so far, one token at a time: the answer with no cache involved."""
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(prefill_all(model, ids)[-1].argmax()))
        if ids[-1] in eos_ids:
            break
    return ids[len(prompt) :]


def tiny_config(**changes) -> ModelConfig:
    fields = dict(
        name="tiny", vocab_size=VOCAB_SIZE, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=128,
        norm_eps=1e-5, rope_theta=10000.0, max_position=256, tie_embeddings=True, qkv_bias=False,
    )
    return ModelConfig(**(fields | changes))


def random_weights(cfg: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Canonical float32 weights, scaled so activations and logits stay of order one to ten."""
    rng = np.random.default_rng(seed)
    q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim

    def matrix(rows, cols):
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    def bias(n):
        return (0.5 * rng.standard_normal(n)).astype(np.float32)

    w = {"tok_embeddings": rng.standard_normal((cfg.vocab_size, cfg.dim)).astype(np.float32), "norm": norm(cfg.dim)}
    if not cfg.tie_embeddings:
        w["output"] = matrix(cfg.vocab_size, cfg.dim) * 4
    for i in range(cfg.n_layers):
        layer = {
            "attention_norm": norm(cfg.dim), "wq": matrix(q, cfg.dim), "wk": matrix(kv, cfg.dim),
            "wv": matrix(kv, cfg.dim), "wo": matrix(cfg.dim, q), "ffn_norm": norm(cfg.dim),
            "w_gate": matrix(cfg.hidden_dim, cfg.dim), "w_up": matrix(cfg.hidden_dim, cfg.dim),
            "w_down": matrix(cfg.dim, cfg.hidden_dim),
        }
        if cfg.qkv_bias:
            layer |= {"bq": bias(q), "bk": bias(kv), "bv": bias(kv)}
        w |= {f"layers.{i}.{k}": v for k, v in layer.items()}
    return w


def stored_name(canonical: str, hf: bool) -> str:
    if canonical.startswith("layers."):
        _, i, key = canonical.split(".", 2)
        return f"model.layers.{i}.{LAYER_NAMES[key][1]}" if hf else f"blk.{i}.{LAYER_NAMES[key][0]}"
    return GLOBAL_NAMES[canonical][hf]


def gguf_arch(cfg: ModelConfig) -> str:
    return "qwen2" if cfg.qkv_bias else "llama"


# ---- GGUF ----


def write_gguf(
    path: Path,
    cfg: ModelConfig,
    weights: Mapping[str, np.ndarray],
    quant: Q = Q.F32,
    arch: str | None = None,
    raw: Mapping[str, tuple[np.ndarray, Q]] | None = None,
    tokenizer: str = "bpe",
    edit: Callable[[gguf.GGUFWriter], None] | None = None,
) -> Path:
    """Matrices stored as `quant` (norms and biases stay F32, as llama.cpp keeps them): F32, F16, BF16 or any
    type gguf.quants can quantize (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1; not the k-quants). `raw` replaces a tensor by
    ready-made blocks (uint8 [rows, bytes per row]) of any type. A tensor left out of `weights` is left out.
    `tokenizer`: "bpe" (byte-level, VOCAB_SIZE) or "spm" (SentencePiece, SPM_VOCAB_SIZE: TinyLlama's kind).
    `edit(writer)` runs last, to add metadata or tensors a test needs."""
    arch = arch or gguf_arch(cfg)
    raw = raw or {}
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(cfg.name)
    w.add_context_length(cfg.max_position)
    w.add_embedding_length(cfg.dim)
    w.add_block_count(cfg.n_layers)
    w.add_feed_forward_length(cfg.hidden_dim)
    w.add_head_count(cfg.n_heads)
    w.add_head_count_kv(cfg.n_kv_heads)
    w.add_layer_norm_rms_eps(cfg.norm_eps)
    w.add_rope_freq_base(cfg.rope_theta)
    if tokenizer == "spm":
        add_spm_tokenizer(w)
    else:
        add_bpe_tokenizer(w)
    for name, x in weights.items():
        key = name.rsplit(".", 1)[-1]
        if arch == "llama" and key in ("wq", "wk"):  # llama.cpp's converter: per-head interleaved rotary rows
            x = permute_rotary(x, cfg.n_heads if key == "wq" else cfg.n_kv_heads)
        if name in raw:
            blocks, kind = raw[name]
            w.add_tensor(stored_name(name, hf=False), blocks, raw_dtype=kind)
        elif x.ndim == 1 or quant == Q.F32:
            w.add_tensor(stored_name(name, hf=False), np.ascontiguousarray(x, np.float32))
        elif quant == Q.F16:
            w.add_tensor(stored_name(name, hf=False), x.astype(np.float16))
        else:
            w.add_tensor(stored_name(name, hf=False), quantize(x, quant), raw_dtype=quant)
    if edit is not None:
        edit(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def add_bpe_tokenizer(w: gguf.GGUFWriter) -> None:
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(vocab_tokens())
    w.add_token_types([gguf.TokenType.CONTROL] * len(SPECIALS) + [gguf.TokenType.NORMAL] * (VOCAB_SIZE - len(SPECIALS)))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(IM_START)
    w.add_eos_token_id(IM_END)
    w.add_chat_template(CHAT_TEMPLATE)


def vocab_tokens() -> list[str]:
    alphabet = byte_alphabet()
    return SPECIALS + [alphabet[b] for b in range(256)] + [m.replace(" ", "") for m in MERGES]


def byte_alphabet() -> dict[int, str]:
    """GPT-2's printable stand-in character for each byte."""
    kept = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    moved = [b for b in range(256) if b not in kept]
    return {b: chr(b) for b in kept} | {b: chr(256 + n) for n, b in enumerate(moved)}


def byte_token(b: int) -> int:
    return BYTE_OFFSET + b


# ---- Hugging Face directory ----


def write_hf_dir(path: Path, cfg: ModelConfig, weights: Mapping[str, np.ndarray], dtype: str = "F32",
                 tokenizer: str = "bpe") -> Path:
    """config.json, model.safetensors (F32, F16 or BF16), tokenizer.json and tokenizer_config.json. `tokenizer`:
    "bpe", or a SentencePiece form of `spm_tokenizer_json` ("legacy", "metaspace", "metaspace_decoder")."""
    path.mkdir(parents=True, exist_ok=True)
    qwen = cfg.qkv_bias
    config = {
        "architectures": ["Qwen2ForCausalLM" if qwen else "LlamaForCausalLM"],
        "model_type": "qwen2" if qwen else "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.dim,
        "intermediate_size": cfg.hidden_dim,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "max_position_embeddings": cfg.max_position,
        "tie_word_embeddings": cfg.tie_embeddings,
        "bos_token_id": IM_START if tokenizer == "bpe" else SPM_BOS,
        "eos_token_id": IM_END if tokenizer == "bpe" else SPM_EOS,
    }
    (path / "config.json").write_text(json.dumps(config, indent=1))
    write_safetensors(path / "model.safetensors", {stored_name(n, hf=True): x for n, x in weights.items()}, dtype)
    if tokenizer != "bpe":
        write_spm_tokenizer_dir(path, tokenizer)
        return path
    hf_tokenizer().save(str(path / "tokenizer.json"))
    tokenizer_config = {"chat_template": CHAT_TEMPLATE, "bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return path


def write_safetensors(path: Path, tensors: Mapping[str, np.ndarray], dtype: str) -> None:
    """The safetensors layout by hand (8-byte header length, JSON header, raw little-endian data): numpy has no
    bfloat16, so BF16 is the top half of each float32 (truncated, as a plain cast would round)."""
    header, blobs, offset = {}, [], 0
    for name, x in tensors.items():
        x = np.ascontiguousarray(x, np.float32)
        if dtype == "BF16":
            data = (x.view(np.uint32) >> 16).astype("<u2").tobytes()
        else:
            data = x.astype({"F32": "<f4", "F16": "<f2"}[dtype]).tobytes()
        header[name] = {"dtype": dtype, "shape": list(x.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    path.write_bytes(len(head).to_bytes(8, "little") + head + b"".join(blobs))


def hf_tokenizer() -> RawTokenizer:
    vocab = {t: i for i, t in enumerate(vocab_tokens())}
    raw = RawTokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in MERGES]))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    raw.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    return raw


# ---- a SentencePiece-style tokenizer (Llama-2, TinyLlama): "▁" for a space, <0xNN> byte fallback, scores ----

SPM_SPECIALS = ["<unk>", "<s>", "</s>"]
SPM_BOS, SPM_EOS = 1, 2
SPM_BYTE_OFFSET = len(SPM_SPECIALS)  # <0xNN> has id SPM_BYTE_OFFSET + NN, as in Llama-2's vocab
# piece -> score. llama.cpp merges the pair whose joined piece scores highest; "▁the" outscores "he" on purpose,
# so a merge order by id alone would be caught.
SPM_PIECES = {
    "▁": -1.0, "e": -2.0, "h": -3.0, "l": -4.0, "o": -5.0, "t": -6.0, "w": -7.0, "r": -8.0, "d": -9.0, "a": -10.0,
    "s": -11.0, "i": -12.0, "n": -13.0, ".": -14.0, ",": -15.0, "!": -16.0, "?": -17.0, "你": -18.0, "好": -19.0,
    "世": -20.0, "界": -21.0, "▁t": -30.0, "he": -31.0, "▁the": -5.5, "ll": -33.0, "▁h": -34.0, "▁he": -35.0,
    "llo": -36.0, "▁hello": -37.0, "▁w": -38.0, "or": -39.0, "▁wor": -40.0, "ld": -41.0, "▁world": -42.0,
    "你好": -43.0, "▁你好": -44.0, "▁a": -45.0, "at": -46.0, "▁at": -47.0, "in": -48.0, "▁in": -49.0, "is": -50.0,
    "▁is": -51.0, "▁▁": -52.0, "▁▁▁▁": -53.0,
}
SPM_TOKENS = SPM_SPECIALS + [f"<0x{b:02X}>" for b in range(256)] + list(SPM_PIECES)
SPM_SCORES = [0.0] * SPM_BYTE_OFFSET + [0.0] * 256 + list(SPM_PIECES.values())
SPM_VOCAB_SIZE = len(SPM_TOKENS)
LLAMA2_CHAT_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set system = '<<SYS>>\\n' + messages[0]['content'] + "
    "'\\n<</SYS>>\\n\\n' %}{% set messages = messages[1:] %}{% else %}{% set system = '' %}{% endif %}"
    "{% for message in messages %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + "
    "(system if loop.first else '') + message['content'] + ' [/INST]' }}{% else %}{{ ' ' + message['content'] + "
    "' ' + eos_token }}{% endif %}{% endfor %}"
)


def add_spm_tokenizer(w: gguf.GGUFWriter, space_prefix: bool = True) -> None:
    """The `llama` tokenizer metadata, as llama.cpp's converter writes it for a SentencePiece model."""
    T = gguf.TokenType
    w.add_tokenizer_model("llama")
    w.add_token_list(SPM_TOKENS)
    w.add_token_scores(SPM_SCORES)
    w.add_token_types([T.UNKNOWN, T.CONTROL, T.CONTROL] + [T.BYTE] * 256 + [T.NORMAL] * len(SPM_PIECES))
    w.add_bos_token_id(SPM_BOS)
    w.add_eos_token_id(SPM_EOS)
    w.add_unk_token_id(0)
    w.add_add_space_prefix(space_prefix)
    w.add_chat_template(LLAMA2_CHAT_TEMPLATE)


def spm_tokenizer_json(form: str) -> RawTokenizer:
    """The tiny SentencePiece tokenizer as transformers' LlamaConverter writes tokenizer.json, in one of the forms
    found in published checkpoints: "legacy" (a normalizer prepends "▁" and replaces spaces: older Llama-2 files),
    "metaspace" (a Metaspace pre-tokenizer does: newer files), "metaspace_decoder" (SpmConverter's Metaspace
    decoder, which spells byte tokens as they are)."""
    from tokenizers import normalizers

    vocab = {t: i for i, t in enumerate(SPM_TOKENS)}
    merges = []  # as transformers' SentencePieceExtractor: every split into two pieces, by the piece's score
    for n, piece in enumerate(SPM_TOKENS):
        cuts = [(piece[:c], piece[c:]) for c in range(1, len(piece)) if piece[:c] in vocab and piece[c:] in vocab]
        merges += [(-SPM_SCORES[n], n, vocab[a], vocab[b], a, b) for a, b in cuts]
    merges = [(a, b) for *_, a, b in sorted(merges)]
    raw = RawTokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    sequence = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    if form == "legacy":
        raw.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        raw.decoder = sequence
    elif form == "metaspace":
        raw.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
        raw.decoder = sequence
    elif form == "metaspace_decoder":
        raw.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=False)
        raw.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=False)
    else:
        raise ValueError(form)
    raw.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPM_SPECIALS[1:]])
    return raw


def write_spm_tokenizer_dir(path: Path, form: str) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    spm_tokenizer_json(form).save(str(path / "tokenizer.json"))
    config = {"chat_template": LLAMA2_CHAT_TEMPLATE, "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


# ---- GPT-2: its own names (llama.cpp's gpt2 tensors; HF GPT2LMHeadModel, Conv1D kept [in, out]) ----

GPT2_GLOBAL_NAMES = {
    "wte": ("token_embd.weight", "wte.weight"), "wpe": ("position_embd.weight", "wpe.weight"),
    "ln_f.w": ("output_norm.weight", "ln_f.weight"), "ln_f.b": ("output_norm.bias", "ln_f.bias"),
}
GPT2_LAYER_NAMES = {
    "ln_1.w": ("attn_norm.weight", "ln_1.weight"), "ln_1.b": ("attn_norm.bias", "ln_1.bias"),
    "c_attn.w": ("attn_qkv.weight", "attn.c_attn.weight"), "c_attn.b": ("attn_qkv.bias", "attn.c_attn.bias"),
    "attn_proj.w": ("attn_output.weight", "attn.c_proj.weight"), "attn_proj.b": ("attn_output.bias", "attn.c_proj.bias"),
    "ln_2.w": ("ffn_norm.weight", "ln_2.weight"), "ln_2.b": ("ffn_norm.bias", "ln_2.bias"),
    "c_fc.w": ("ffn_up.weight", "mlp.c_fc.weight"), "c_fc.b": ("ffn_up.bias", "mlp.c_fc.bias"),
    "mlp_proj.w": ("ffn_down.weight", "mlp.c_proj.weight"), "mlp_proj.b": ("ffn_down.bias", "mlp.c_proj.bias"),
}


def gpt2_config(**changes) -> ModelConfig:
    fields = dict(name="tiny-gpt2", family="gpt2", vocab_size=VOCAB_SIZE, dim=64, n_layers=2, n_heads=4,
                  n_kv_heads=4, hidden_dim=256, norm_eps=1e-5, rope_theta=0.0, max_position=128,
                  tie_embeddings=True, qkv_bias=True)
    return ModelConfig(**(fields | changes))


def random_gpt2_weights(cfg: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """HF layout: "wte" [v, d], "wpe" [n_pos, d], and per layer "{i}.c_attn.w" [d, 3d] etc., Conv1D [in, out]."""
    rng = np.random.default_rng(seed)
    d, f = cfg.dim, cfg.hidden_dim

    def conv1d(n_in, n_out):
        return (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)

    def vec(n, scale=0.3, mean=0.0):
        return (mean + scale * rng.standard_normal(n)).astype(np.float32)

    w = {"wte": rng.standard_normal((cfg.vocab_size, d)).astype(np.float32),
         "wpe": (0.5 * rng.standard_normal((cfg.max_position, d))).astype(np.float32),
         "ln_f.w": vec(d, 0.1, 1.0), "ln_f.b": vec(d)}
    for i in range(cfg.n_layers):
        w |= {f"{i}.ln_1.w": vec(d, 0.1, 1.0), f"{i}.ln_1.b": vec(d), f"{i}.c_attn.w": conv1d(d, 3 * d),
              f"{i}.c_attn.b": vec(3 * d), f"{i}.attn_proj.w": conv1d(d, d), f"{i}.attn_proj.b": vec(d),
              f"{i}.ln_2.w": vec(d, 0.1, 1.0), f"{i}.ln_2.b": vec(d), f"{i}.c_fc.w": conv1d(d, f),
              f"{i}.c_fc.b": vec(f), f"{i}.mlp_proj.w": conv1d(f, d), f"{i}.mlp_proj.b": vec(d)}
    return w


def _gpt2_stored(name: str, hf: bool) -> str:
    if name in GPT2_GLOBAL_NAMES:
        return GPT2_GLOBAL_NAMES[name][hf]
    i, key = name.split(".", 1)
    return f"h.{i}.{GPT2_LAYER_NAMES[key][1]}" if hf else f"blk.{i}.{GPT2_LAYER_NAMES[key][0]}"


def write_gpt2_gguf(path: Path, cfg: ModelConfig, weights: Mapping[str, np.ndarray], quant: Q = Q.F32) -> Path:
    """As llama.cpp's convert_hf_to_gguf writes GPT-2: Conv1D weights transposed to [out, in]."""
    w = gguf.GGUFWriter(str(path), "gpt2")
    w.add_name(cfg.name)
    w.add_context_length(cfg.max_position)
    w.add_embedding_length(cfg.dim)
    w.add_feed_forward_length(cfg.hidden_dim)
    w.add_block_count(cfg.n_layers)
    w.add_head_count(cfg.n_heads)
    w.add_layer_norm_eps(cfg.norm_eps)
    add_bpe_tokenizer(w)
    for name, x in weights.items():
        if name.endswith(".w") and x.ndim == 2:
            x = x.T  # [out, in]
        if x.ndim == 1 or quant == Q.F32:
            w.add_tensor(_gpt2_stored(name, hf=False), np.ascontiguousarray(x, np.float32))
        else:
            w.add_tensor(_gpt2_stored(name, hf=False), quantize(np.ascontiguousarray(x), quant), raw_dtype=quant)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_gpt2_hf_dir(path: Path, cfg: ModelConfig, weights: Mapping[str, np.ndarray], prefix: str = "") -> Path:
    """GPT2LMHeadModel's files; `prefix` "transformer." as re-saved checkpoints name the tensors, "" as gpt2 and
    distilgpt2 on the hub do."""
    path.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": cfg.vocab_size,
              "n_embd": cfg.dim, "n_layer": cfg.n_layers, "n_head": cfg.n_heads, "n_inner": None,
              "n_positions": cfg.max_position, "layer_norm_epsilon": cfg.norm_eps, "activation_function": "gelu_new",
              "bos_token_id": IM_START, "eos_token_id": IM_END}
    (path / "config.json").write_text(json.dumps(config, indent=1))
    tensors = {prefix + _gpt2_stored(n, hf=True): x for n, x in weights.items()}
    write_safetensors(path / "model.safetensors", tensors, "F32")
    hf_tokenizer().save(str(path / "tokenizer.json"))
    tokenizer_config = {"chat_template": CHAT_TEMPLATE, "bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return path


def gpt2_reference_logits(cfg: ModelConfig, w: Mapping[str, np.ndarray], tokens: list[int]) -> np.ndarray:
    """Logits [t, v] in float64, as transformers' modeling_gpt2 computes them (GPT2Attention, GPT2MLP with
    gelu_new, pre-LayerNorm blocks, ln_f, lm_head tied to wte)."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    t, h, e = len(tokens), cfg.n_heads, cfg.dim // cfg.n_heads

    def layer_norm(x, g, b):
        mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + cfg.norm_eps) * g + b

    def gelu_new(x):
        return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))

    x = w["wte"][tokens] + w["wpe"][np.arange(t)]
    causal = np.tril(np.ones((t, t), bool))
    for i in range(cfg.n_layers):
        a = layer_norm(x, w[f"{i}.ln_1.w"], w[f"{i}.ln_1.b"]) @ w[f"{i}.c_attn.w"] + w[f"{i}.c_attn.b"]
        q, k, v = (m.reshape(t, h, e).transpose(1, 0, 2) for m in np.split(a, 3, axis=-1))  # [h, t, e]
        scores = np.where(causal, q @ k.transpose(0, 2, 1) / np.sqrt(e), -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        attended = (probs @ v).transpose(1, 0, 2).reshape(t, cfg.dim)
        x = x + attended @ w[f"{i}.attn_proj.w"] + w[f"{i}.attn_proj.b"]
        m = gelu_new(layer_norm(x, w[f"{i}.ln_2.w"], w[f"{i}.ln_2.b"]) @ w[f"{i}.c_fc.w"] + w[f"{i}.c_fc.b"])
        x = x + m @ w[f"{i}.mlp_proj.w"] + w[f"{i}.mlp_proj.b"]
    return layer_norm(x, w["ln_f.w"], w["ln_f.b"]) @ w["wte"].T


# ---- Phi-3: the Llama block, its Q/K/V and gate/up projections fused ----


def write_phi3_gguf(path: Path, cfg: ModelConfig, weights: Mapping[str, np.ndarray], sliding_window: int = 0,
                    edit: Callable[[gguf.GGUFWriter], None] | None = None) -> Path:
    """As llama.cpp's converter writes phi3: attn_qkv and ffn_up (gate rows, then up rows), Q/K unpermuted."""
    def edit_phi3(w):
        if sliding_window:
            w.add_sliding_window(sliding_window)
        if edit:
            edit(w)

        for name, x in _phi3_fused(cfg, weights, hf=False).items():
            w.add_tensor(name, np.ascontiguousarray(x, np.float32))

    unfused = {k: v for k, v in weights.items() if not k.endswith((".wq", ".wk", ".wv", ".w_gate", ".w_up"))}
    return write_gguf(path, cfg, unfused, arch="phi3", tokenizer="spm", edit=edit_phi3)


def _phi3_fused(cfg: ModelConfig, weights: Mapping[str, np.ndarray], hf: bool) -> dict[str, np.ndarray]:
    out = {}
    for i in range(cfg.n_layers):
        w = {k: weights[f"layers.{i}.{k}"] for k in ("wq", "wk", "wv", "w_gate", "w_up")}
        qkv, gate_up = np.concatenate([w["wq"], w["wk"], w["wv"]]), np.concatenate([w["w_gate"], w["w_up"]])
        if hf:
            out[f"model.layers.{i}.self_attn.qkv_proj.weight"] = qkv
            out[f"model.layers.{i}.mlp.gate_up_proj.weight"] = gate_up
        else:
            out[f"blk.{i}.attn_qkv.weight"] = qkv
            out[f"blk.{i}.ffn_up.weight"] = gate_up
    return out


def write_phi3_hf_dir(path: Path, cfg: ModelConfig, weights: Mapping[str, np.ndarray], sliding_window: int = 0,
                      ) -> Path:
    write_hf_dir(path, cfg, {}, tokenizer="legacy")
    config = json.loads((path / "config.json").read_text())
    config |= {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "rope_scaling": None,
               "sliding_window": sliding_window or None, "attention_bias": False, "pad_token_id": 0}
    (path / "config.json").write_text(json.dumps(config, indent=1))
    tensors = {stored_name(n, hf=True): x for n, x in weights.items()
               if not n.endswith((".wq", ".wk", ".wv", ".w_gate", ".w_up"))}
    write_safetensors(path / "model.safetensors", tensors | _phi3_fused(cfg, weights, hf=True), "F32")
    return path
