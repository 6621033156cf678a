"""A tiny Llama-family model with random weights, written as a GGUF file and as a Hugging Face directory.

Both forms hold the same weights, so a test can load either and expect the same canonical arrays. The name
tables and the Q/K permutation here are written from llama.cpp's converter and transformers' conventions, not
taken from `typewriter.weights`, so a mistake there is not mirrored here. The tokenizer is byte-level BPE:
three ChatML specials, the 256 byte tokens, and a few merges.

    cfg = tiny_config()                      # or tiny_config(tie_embeddings=False), tiny_config(qkv_bias=True)
    weights = random_weights(cfg)            # canonical name -> float32 [out, in]
    write_gguf(tmp / "m.gguf", cfg, weights, quant=Q.Q8_0)
    write_hf_dir(tmp / "m", cfg, weights)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.quants import quantize
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as RawTokenizer

from typewriter.model_config import ModelConfig
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


TOLERANCE = 2e-4  # float32 against float64 (measured 1e-5), logits of magnitude up to ~50


def prefill_all(model, tokens, slot=0) -> np.ndarray:
    """Logits [t, v] at every position of `tokens`, from a full prefill of a `typewriter.model.Transformer`: the
    cacheless answer that cached decoding is compared with."""
    import tensorflow as tf

    ids = tf.constant([tokens], tf.int32)
    return model.prefill(ids, tf.constant(len(tokens)), tf.constant(slot), all_logits=True).numpy()[0]


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
) -> Path:
    """Matrices stored as `quant` (norms and biases stay F32, as llama.cpp keeps them): F32, F16, BF16 or any
    type gguf.quants can quantize (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1; not the k-quants). `raw` replaces a tensor by
    ready-made blocks (uint8 [rows, bytes per row]) of any type. A tensor left out of `weights` is left out."""
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
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(vocab_tokens())
    w.add_token_types([gguf.TokenType.CONTROL] * len(SPECIALS) + [gguf.TokenType.NORMAL] * (VOCAB_SIZE - len(SPECIALS)))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(IM_START)
    w.add_eos_token_id(IM_END)
    w.add_chat_template(CHAT_TEMPLATE)
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
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


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


def write_hf_dir(path: Path, cfg: ModelConfig, weights: Mapping[str, np.ndarray], dtype: str = "F32") -> Path:
    """config.json, model.safetensors (F32, F16 or BF16), tokenizer.json and tokenizer_config.json."""
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
        "bos_token_id": IM_START,
        "eos_token_id": IM_END,
    }
    (path / "config.json").write_text(json.dumps(config, indent=1))
    write_safetensors(path / "model.safetensors", {stored_name(n, hf=True): x for n, x in weights.items()}, dtype)
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
