"""GPT-2 (and DistilGPT-2): its name table and its config, from GGUF metadata or a Hugging Face config.json; the
block is runners/xla/gpt2.py. Hugging Face's Conv1D projections are stored [in, out] (HF_TRANSPOSED), llama.cpp's
[out, in]; checkpoints name the tensors with and without the `transformer.` prefix, and both are looked for.
"""

from __future__ import annotations

from typing import Any

from .model_config import ModelConfig

# canonical name -> (GGUF name, Hugging Face name without "transformer."); "{i}" is the layer index.
GLOBAL = {
    "tok_embeddings": ("token_embd.weight", "wte.weight"),
    "pos_embeddings": ("position_embd.weight", "wpe.weight"),
    "norm": ("output_norm.weight", "ln_f.weight"),
    "norm_bias": ("output_norm.bias", "ln_f.bias"),
}
PER_LAYER = {
    "attention_norm": ("blk.{i}.attn_norm.weight", "h.{i}.ln_1.weight"),
    "attention_norm_bias": ("blk.{i}.attn_norm.bias", "h.{i}.ln_1.bias"),
    "wqkv": ("blk.{i}.attn_qkv.weight", "h.{i}.attn.c_attn.weight"),
    "bqkv": ("blk.{i}.attn_qkv.bias", "h.{i}.attn.c_attn.bias"),
    "wo": ("blk.{i}.attn_output.weight", "h.{i}.attn.c_proj.weight"),
    "bo": ("blk.{i}.attn_output.bias", "h.{i}.attn.c_proj.bias"),
    "ffn_norm": ("blk.{i}.ffn_norm.weight", "h.{i}.ln_2.weight"),
    "ffn_norm_bias": ("blk.{i}.ffn_norm.bias", "h.{i}.ln_2.bias"),
    "w_up": ("blk.{i}.ffn_up.weight", "h.{i}.mlp.c_fc.weight"),
    "b_up": ("blk.{i}.ffn_up.bias", "h.{i}.mlp.c_fc.bias"),
    "w_down": ("blk.{i}.ffn_down.weight", "h.{i}.mlp.c_proj.weight"),
    "b_down": ("blk.{i}.ffn_down.bias", "h.{i}.mlp.c_proj.bias"),
}
HF_TRANSPOSED = frozenset({"wqkv", "wo", "w_up", "w_down"})  # Conv1D: [in, out]
HF_PREFIX = "transformer."


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every canonical tensor, [out, in] (Hugging Face's Conv1D ones once transposed)."""
    d, f = cfg.dim, cfg.hidden_dim
    shapes: dict[str, tuple[int, ...]] = {
        "tok_embeddings": (cfg.vocab_size, d), "pos_embeddings": (cfg.max_position, d), "norm": (d,), "norm_bias": (d,),
    }
    for i in range(cfg.n_layers):
        layer = {
            "attention_norm": (d,), "attention_norm_bias": (d,), "wqkv": (3 * d, d), "bqkv": (3 * d,),
            "wo": (d, d), "bo": (d,), "ffn_norm": (d,), "ffn_norm_bias": (d,),
            "w_up": (f, d), "b_up": (f,), "w_down": (d, f), "b_down": (d,),
        }
        shapes |= {f"layers.{i}.{k}": v for k, v in layer.items()}
    return shapes


def source_names(canonical: str, source: int) -> tuple[str, ...]:
    if canonical.startswith("layers."):
        _, i, key = canonical.split(".", 2)
        name = PER_LAYER[key][source].format(i=i)
    else:
        name = GLOBAL[canonical][source]
    return (name, HF_PREFIX + name) if source == 1 else (name,)


def gguf_config(file: Any, vocab: int) -> ModelConfig:
    """From llama.cpp's `gpt2.*` keys of a weights.gguf_file.GGUFFile."""
    field, name = file.field, str(file.field("general.name", file.path.stem))
    dim, heads = int(file.required("gpt2.embedding_length")), int(file.required("gpt2.attention.head_count"))
    return ModelConfig(
        name=name, family="gpt2", vocab_size=vocab, dim=dim, n_layers=int(file.required("gpt2.block_count")),
        n_heads=heads, n_kv_heads=heads, hidden_dim=int(field("gpt2.feed_forward_length", 4 * dim)),
        norm_eps=float(field("gpt2.attention.layer_norm_epsilon", 1e-5)), rope_theta=0.0,
        max_position=int(field("gpt2.context_length", 1024)), tie_embeddings=True, qkv_bias=True,
    )


def hf_config(name: str, c: dict[str, Any]) -> ModelConfig:
    """From GPT2Config's keys (n_embd, n_layer, n_head, n_inner, n_positions, layer_norm_epsilon)."""
    from ..errors import ModelFormatError

    dim, heads = int(c["n_embd"]), int(c["n_head"])
    if c.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ModelFormatError(f"{name}/config.json: activation_function {c['activation_function']!r} is not "
                               "supported (supported: gelu_new, gelu_pytorch_tanh: GELU with the tanh approximation)")
    if c.get("scale_attn_by_inverse_layer_idx") or c.get("scale_attn_weights") is False:
        raise ModelFormatError(f"{name}/config.json: attention scaling other than 1/sqrt(head_dim) "
                               "(scale_attn_by_inverse_layer_idx, scale_attn_weights) is not supported")
    return ModelConfig(
        name=name, family="gpt2", vocab_size=int(c["vocab_size"]), dim=dim, n_layers=int(c["n_layer"]),
        n_heads=heads, n_kv_heads=heads, hidden_dim=int(c.get("n_inner") or 4 * dim),
        norm_eps=float(c.get("layer_norm_epsilon", 1e-5)), rope_theta=0.0,
        max_position=int(c.get("n_positions", 1024)), tie_embeddings=True, qkv_bias=True,
    )
