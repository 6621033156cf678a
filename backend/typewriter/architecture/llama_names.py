"""Canonical tensor names, where each source keeps them, and the shape each must have."""

from __future__ import annotations

from .model_config import ModelConfig

# canonical name -> (GGUF name, Hugging Face name); "{i}" is the layer index.
GLOBAL = {
    "tok_embeddings": ("token_embd.weight", "model.embed_tokens.weight"),
    "norm": ("output_norm.weight", "model.norm.weight"),
    "output": ("output.weight", "lm_head.weight"),
}
PER_LAYER = {
    "attention_norm": ("blk.{i}.attn_norm.weight", "model.layers.{i}.input_layernorm.weight"),
    "wq": ("blk.{i}.attn_q.weight", "model.layers.{i}.self_attn.q_proj.weight"),
    "wk": ("blk.{i}.attn_k.weight", "model.layers.{i}.self_attn.k_proj.weight"),
    "wv": ("blk.{i}.attn_v.weight", "model.layers.{i}.self_attn.v_proj.weight"),
    "wo": ("blk.{i}.attn_output.weight", "model.layers.{i}.self_attn.o_proj.weight"),
    "bq": ("blk.{i}.attn_q.bias", "model.layers.{i}.self_attn.q_proj.bias"),
    "bk": ("blk.{i}.attn_k.bias", "model.layers.{i}.self_attn.k_proj.bias"),
    "bv": ("blk.{i}.attn_v.bias", "model.layers.{i}.self_attn.v_proj.bias"),
    "ffn_norm": ("blk.{i}.ffn_norm.weight", "model.layers.{i}.post_attention_layernorm.weight"),
    "w_gate": ("blk.{i}.ffn_gate.weight", "model.layers.{i}.mlp.gate_proj.weight"),
    "w_up": ("blk.{i}.ffn_up.weight", "model.layers.{i}.mlp.up_proj.weight"),
    "w_down": ("blk.{i}.ffn_down.weight", "model.layers.{i}.mlp.down_proj.weight"),
}
BIASES = {"bq", "bk", "bv"}
GGUF, HF = 0, 1


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every canonical tensor the model needs, with its shape in [out, in] layout."""
    hd = cfg.head_dim
    q, kv = cfg.n_heads * hd, cfg.n_kv_heads * hd
    shapes: dict[str, tuple[int, ...]] = {"tok_embeddings": (cfg.vocab_size, cfg.dim), "norm": (cfg.dim,)}
    if not cfg.tie_embeddings:
        shapes["output"] = (cfg.vocab_size, cfg.dim)
    for i in range(cfg.n_layers):
        layer = {
            "attention_norm": (cfg.dim,),
            "wq": (q, cfg.dim),
            "wk": (kv, cfg.dim),
            "wv": (kv, cfg.dim),
            "wo": (cfg.dim, q),
            "ffn_norm": (cfg.dim,),
            "w_gate": (cfg.hidden_dim, cfg.dim),
            "w_up": (cfg.hidden_dim, cfg.dim),
            "w_down": (cfg.dim, cfg.hidden_dim),
        }
        if cfg.qkv_bias:
            layer |= {"bq": (q,), "bk": (kv,), "bv": (kv,)}
        shapes |= {f"layers.{i}.{k}": v for k, v in layer.items()}
    return shapes


def source_name(canonical: str, source: int) -> str:
    if canonical.startswith("layers."):
        _, i, key = canonical.split(".", 2)
        return PER_LAYER[key][source].format(i=i)
    return GLOBAL[canonical][source]


HF_TRANSPOSED: frozenset[str] = frozenset()  # every Llama-family tensor is stored [out, in]


def source_names(canonical: str, source: int) -> tuple[str, ...]:
    """Where `source` may keep the tensor, first choice first."""
    return (source_name(canonical, source),)
