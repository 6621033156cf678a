"""Read a GGUF file of any family in architecture/families.py: its ModelConfig and its tensors, dequantized to
float32 only when asked for. llama.cpp stores the Q and K projections of `llama` models permuted for its
interleaved rotary layout; that is undone, so every source reaches the model in rotate-half order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..architecture.families import GGUF_ARCHITECTURES, family_of_gguf
from ..architecture.model_config import ModelConfig
from ..errors import ModelFormatError
from .dequantize import dequantize
from .ggml_types import GGMLQuantizationType as Q
from .gguf_reader import GGUFReader

SUPPORTED_ARCHITECTURES = set(GGUF_ARCHITECTURES)
PERMUTED_QK = {"llama", "mistral"}  # llama.cpp permutes Q/K for these; qwen2 is stored as is
SUPPORTED_TYPES = {
    Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K,
}


class GGUFFile:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self.reader = GGUFReader(self.path)
        except (OSError, ValueError) as e:  # GGUFFormatError is a ValueError
            raise ModelFormatError(f"{self.path}: not a readable GGUF file ({e})") from e
        self.fields = self.reader.fields
        self.tensors = self.reader.tensors
        self.arch = self.field("general.architecture")
        family = family_of_gguf(self.arch)
        if family is None:
            raise ModelFormatError(
                f"{self.path.name}: architecture {self.arch!r} is not supported "
                f"(supported: {', '.join(sorted(SUPPORTED_ARCHITECTURES))})"
            )
        self.family: str = family

    def field(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)

    def required(self, key: str) -> Any:
        if key not in self.fields:
            raise KeyError(key)  # load_weights names it
        return self.fields[key]

    def config(self) -> ModelConfig:
        a = self.arch
        n_heads = int(self.required(f"{a}.attention.head_count"))
        dim = int(self.required(f"{a}.embedding_length"))
        vocab = self.field(f"{a}.vocab_size") or len(self.fields["tokenizer.ggml.tokens"])
        if self.family == "gpt2":
            from ..architecture import gpt2_names

            return gpt2_names.gguf_config(self, int(vocab))
        head_dim = int(self.field(f"{a}.attention.key_length", 0) or dim // n_heads)
        self.check_rope(head_dim)
        return ModelConfig(
            name=str(self.field("general.name", self.path.stem)),
            vocab_size=int(vocab),
            dim=dim,
            n_layers=int(self.required(f"{a}.block_count")),
            n_heads=n_heads,
            n_kv_heads=int(self.field(f"{a}.attention.head_count_kv", n_heads)),
            hidden_dim=int(self.required(f"{a}.feed_forward_length")),
            norm_eps=float(self.field(f"{a}.attention.layer_norm_rms_epsilon", 1e-5)),
            rope_theta=float(self.field(f"{a}.rope.freq_base", 10000.0)),
            max_position=self.max_position(),
            tie_embeddings="output.weight" not in self.tensors,
            qkv_bias="blk.0.attn_q.bias" in self.tensors,
            head_dim=head_dim,
            family=self.family,
        )

    def max_position(self) -> int:
        context = int(self.field(f"{self.arch}.context_length", 2048))
        window = self.field(f"{self.arch}.attention.sliding_window") if self.family == "phi3" else None
        return min(context, int(window)) if window else context  # see architecture/phi3_names.py

    def check_rope(self, head_dim: int) -> None:
        """Plain RoPE over the whole head is what the model computes; a file asking for more is refused here,
        where llama.cpp would scale (linear, YaRN, LongRoPE, Llama-3.1's rope_freqs) or rotate part of a head."""
        a = self.arch
        kind = self.field(f"{a}.rope.scaling.type")
        if kind not in (None, "none"):
            raise ModelFormatError(f"{self.path.name}: {a}.rope.scaling.type {kind!r} is not supported "
                                   "(supported: none, plain RoPE)")
        linear = self.field(f"{a}.rope.scale_linear")
        if linear not in (None, 1.0):
            raise ModelFormatError(f"{self.path.name}: {a}.rope.scale_linear {linear} is not supported "
                                   "(supported: 1.0, plain RoPE)")
        if "rope_freqs.weight" in self.tensors:
            raise ModelFormatError(f"{self.path.name}: tensor rope_freqs.weight (Llama-3.1-style RoPE scaling) is "
                                   "not supported (supported: plain RoPE)")
        if "rope_factors_long.weight" in self.tensors:
            raise ModelFormatError(f"{self.path.name}: tensor rope_factors_long.weight (LongRoPE, Phi-3's 128k "
                                   "models) is not supported (supported: plain RoPE)")
        rotated = self.field(f"{a}.rope.dimension_count")
        if rotated not in (None, head_dim):
            raise ModelFormatError(f"{self.path.name}: {a}.rope.dimension_count {rotated} is not supported "
                                   f"(supported: the whole head, {head_dim})")

    def has(self, name: str) -> bool:
        return name in self.tensors

    def plain_rows(self, name: str) -> bool:
        """Whether `rows` can read part of this tensor: its type is supported and its rows are not permuted."""
        return self.tensors[name].tensor_type in SUPPORTED_TYPES and not (
            self.arch in PERMUTED_QK and (".attn_q." in name or ".attn_k." in name))

    def rows(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows start..stop-1 of a 2-D tensor [rows, cols] as float32, reading only their blocks."""
        t = self.tensors[name]
        cols = int(t.shape[0])
        return dequantize(t.data[start:stop], t.tensor_type).reshape(stop - start, cols)

    def tensor(self, name: str, cfg: ModelConfig) -> np.ndarray:
        """The tensor in numpy's row-major [out, in] order (GGUF lists dims innermost first), as float32."""
        t = self.tensors[name]
        if t.tensor_type not in SUPPORTED_TYPES:
            raise ModelFormatError(
                f"{self.path.name}: tensor {name} has quantization type {t.tensor_type.name}, which is not supported "
                f"(supported: {', '.join(sorted(q.name for q in SUPPORTED_TYPES))})"
            )
        shape = tuple(int(d) for d in reversed(t.shape))
        w = dequantize(t.data, t.tensor_type).reshape(shape)
        if self.arch in PERMUTED_QK and (".attn_q." in name or ".attn_k." in name):
            heads = cfg.n_heads if ".attn_q." in name else cfg.n_kv_heads
            w = unpermute_rotary(w, heads)
        return w


def unpermute_rotary(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's `permute`: per head, interleaved (x0, y0, x1, y1, ...) rows back to halves (x..., y...)."""
    rows = w.shape[0]
    # [heads, head_dim/2, 2, ...] -> [heads, 2, head_dim/2, ...]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def permute_rotary(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf `permute` (used by tests that write GGUF files)."""
    rows = w.shape[0]
    # [heads, 2, head_dim/2, ...] -> [heads, head_dim/2, 2, ...]
    return w.reshape(n_heads, 2, rows // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
