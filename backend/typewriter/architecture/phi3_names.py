"""Phi-3: the Llama block with its projections fused (`qkv_proj`, and `gate_up_proj` gate rows first); the loader
hands each fused tensor's parts to the canonical Llama names, so the model is the Llama block's, unchanged. Q/K
rows are stored unpermuted (llama.cpp's phi3 RoPE is rotate-half). Phi-3-mini-4k's sliding window is not
implemented, so its context is capped at the window, within which the two agree; LongRoPE is refused at load.
"""

from __future__ import annotations

from . import llama_names as llama
from .model_config import ModelConfig

GLOBAL = llama.GLOBAL
# canonical Llama key -> (GGUF name, Hugging Face name, which part of the fused tensor)
PER_LAYER = {
    "attention_norm": ("blk.{i}.attn_norm.weight", "model.layers.{i}.input_layernorm.weight", None),
    "wq": ("blk.{i}.attn_qkv.weight", "model.layers.{i}.self_attn.qkv_proj.weight", 0),
    "wk": ("blk.{i}.attn_qkv.weight", "model.layers.{i}.self_attn.qkv_proj.weight", 1),
    "wv": ("blk.{i}.attn_qkv.weight", "model.layers.{i}.self_attn.qkv_proj.weight", 2),
    "wo": ("blk.{i}.attn_output.weight", "model.layers.{i}.self_attn.o_proj.weight", None),
    "ffn_norm": ("blk.{i}.ffn_norm.weight", "model.layers.{i}.post_attention_layernorm.weight", None),
    "w_gate": ("blk.{i}.ffn_up.weight", "model.layers.{i}.mlp.gate_up_proj.weight", 0),
    "w_up": ("blk.{i}.ffn_up.weight", "model.layers.{i}.mlp.gate_up_proj.weight", 1),
    "w_down": ("blk.{i}.ffn_down.weight", "model.layers.{i}.mlp.down_proj.weight", None),
}
HF_TRANSPOSED: frozenset[str] = frozenset()


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    return llama.expected_shapes(cfg)


def source_names(canonical: str, source: int) -> tuple[str, ...]:
    if canonical.startswith("layers."):
        _, i, key = canonical.split(".", 2)
        return (str(PER_LAYER[key][source]).format(i=i),)
    return (GLOBAL[canonical][source],)


def fused_part(canonical: str, cfg: ModelConfig) -> tuple[int, list[int]] | None:
    """(part, row counts of every part) where `canonical` is part of a fused tensor, else None."""
    key = canonical.rsplit(".", 1)[-1]
    part = PER_LAYER[key][2] if canonical.startswith("layers.") else None
    if part is None:
        return None
    if key in ("wq", "wk", "wv"):
        q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        return part, [q, kv, kv]
    return part, [cfg.hidden_dim, cfg.hidden_dim]
