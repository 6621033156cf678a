"""The shape of a decoder, read from GGUF metadata or a Hugging Face config.json: one dataclass for every family
(families.py), as gpt-fast keeps one ModelArgs; `family` chooses the block."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class ModelConfig:
    name: str
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    hidden_dim: int
    norm_eps: float
    rope_theta: float
    max_position: int  # the context the model was trained for
    tie_embeddings: bool
    qkv_bias: bool = False
    head_dim: int = 0  # 0: dim // n_heads
    family: str = "llama"  # "llama" (Llama, Mistral, Qwen2), "phi3" or "gpt2"; see families.py

    def __post_init__(self) -> None:
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.dim // self.n_heads)
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")

    @property
    def groups(self) -> int:
        return self.n_heads // self.n_kv_heads

    @property
    def parameters(self) -> int:
        """The weights' count: embeddings (and an untied output), attention and MLP matrices; norms and biases,
        a fraction of a percent, are left out."""
        embeddings = self.vocab_size * self.dim * (1 if self.tie_embeddings else 2)
        attention = 2 * self.dim * self.head_dim * (self.n_heads + self.n_kv_heads)
        mlp = (2 if self.family == "gpt2" else 3) * self.dim * self.hidden_dim  # gpt2: no gate
        return embeddings + self.n_layers * (attention + mlp)

    def rope_angles(self, positions: int) -> np.ndarray:
        """RoPE's angles [positions, head_dim / 2] in float64, for positions 0..positions-1."""
        import numpy as np  # here: what a model is needs no numpy to be described

        half = self.head_dim // 2
        inv_freq = 1.0 / (self.rope_theta ** (np.arange(half, dtype=np.float64) * 2 / self.head_dim))
        return np.arange(positions, dtype=np.float64)[:, None] * inv_freq[None, :]
