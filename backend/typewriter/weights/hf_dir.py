"""Read a Hugging Face model directory of any family in architecture/families.py: config.json and *.safetensors
(memory-mapped)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError, safe_open

from ..architecture.families import HF_ARCHITECTURES, family_of_hf
from ..architecture.model_config import ModelConfig
from ..errors import ModelFormatError

SUPPORTED_ARCHITECTURES = set(HF_ARCHITECTURES)


class HFDirectory:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        cfg_path = self.path / "config.json"
        if not cfg_path.is_file():
            raise ModelFormatError(f"{self.path}: no config.json (expected a Hugging Face model directory)")
        try:
            self.raw = json.loads(cfg_path.read_bytes())
        except (ValueError, OSError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            raise ModelFormatError(f"{cfg_path}: not a readable JSON file ({e})") from None
        if not isinstance(self.raw, dict):
            raise ModelFormatError(f"{cfg_path}: expected a JSON object, got {type(self.raw).__name__}")
        archs = self.raw.get("architectures") or [self.raw.get("model_type", "?")]
        family = family_of_hf(archs)
        if family is None:
            raise ModelFormatError(
                f"{self.path.name}: architecture {archs[0]!r} is not supported "
                f"(supported: {', '.join(sorted(SUPPORTED_ARCHITECTURES))})"
            )
        self.family: str = family
        files = sorted(self.path.glob("*.safetensors"))
        if not files:
            raise ModelFormatError(f"{self.path}: no *.safetensors weights (PyTorch .bin files are not read)")
        self.where: dict[str, tuple[np.memmap, dict[str, Any]]] = {}
        for f in files:
            self.where |= read_safetensors_index(f)
        self.arch = next(a for a in archs if a in SUPPORTED_ARCHITECTURES)

    def config(self) -> ModelConfig:
        c = self.raw
        if self.family == "gpt2":
            from ..architecture import gpt2_names

            return gpt2_names.hf_config(self.path.name, c)
        rope = check_rope(self.path, c)
        n_heads = int(c["num_attention_heads"])
        return ModelConfig(
            name=self.path.name,
            vocab_size=int(c["vocab_size"]),
            dim=int(c["hidden_size"]),
            n_layers=int(c["num_hidden_layers"]),
            n_heads=n_heads,
            n_kv_heads=int(c.get("num_key_value_heads") or n_heads),
            hidden_dim=int(c["intermediate_size"]),
            norm_eps=float(c.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope.get("rope_theta") or c.get("rope_theta", 10000.0)),
            max_position=self.max_position(),
            tie_embeddings=bool(c.get("tie_word_embeddings", False)) or "lm_head.weight" not in self.where,
            qkv_bias=bool(c.get("attention_bias", False)) or self.arch == "Qwen2ForCausalLM",
            head_dim=int(c.get("head_dim") or 0),
            family=self.family,
        )

    def max_position(self) -> int:
        context = int(self.raw.get("max_position_embeddings", 2048))
        window = self.raw.get("sliding_window") if self.family == "phi3" else None
        return min(context, int(window)) if window else context  # see architecture/phi3_names.py

    def has(self, name: str) -> bool:
        return name in self.where

    def tensor(self, name: str, cfg: ModelConfig) -> np.ndarray:
        data, info = self.where[name]
        begin, end = info["data_offsets"]
        dtype, shape = info["dtype"], tuple(info["shape"])
        raw = data[begin:end]
        if dtype == "BF16":  # numpy has no bfloat16: its bits are the top half of a float32
            return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
        if dtype not in _DTYPES:
            raise ModelFormatError(f"{name}: safetensors dtype {dtype} is not supported (F32, F16, BF16 are)")
        return raw.view(_DTYPES[dtype]).astype(np.float32).reshape(shape)


def check_rope(path: Path, c: dict[str, Any]) -> dict[str, Any]:
    """The RoPE parameters (transformers 5's `rope_parameters`, else {}), refused unless plain RoPE over the
    whole head: the model implements no scaling (linear, dynamic, YaRN, LongRoPE, llama3) nor a partial rotary."""
    for key in ("rope_scaling", "rope_parameters"):
        rope = c.get(key) or {}
        kind = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else rope
        if kind != "default":
            raise ModelFormatError(f"{path / 'config.json'}: {key} {json.dumps(rope)[:120]} is not supported "
                                   "(supported: none or rope_type 'default', plain RoPE)")
    if c.get("partial_rotary_factor", 1.0) != 1.0:
        raise ModelFormatError(f"{path / 'config.json'}: partial_rotary_factor {c['partial_rotary_factor']} is not "
                               "supported (supported: 1.0, RoPE over the whole head)")
    return c.get("rope_parameters") or {}


_DTYPES = {"F32": np.float32, "F16": np.float16}


def read_safetensors_index(path: Path) -> dict[str, tuple[np.memmap, dict[str, Any]]]:
    """Map each tensor name to the file's bytes after the header and its entry (dtype, shape, offsets).

    The safetensors library checks the whole header first (its length against the file, the JSON, every dtype,
    shape and offset, the offsets covering the data exactly), so a malformed file is a named error here; the data
    is then mapped by hand, because numpy has no bfloat16 and the library would copy every tensor."""
    try:
        with safe_open(path, framework="numpy"):
            pass
    except SafetensorError as e:
        raise ModelFormatError(f"{path}: not a valid safetensors file ({e})") from None
    except OSError as e:
        raise ModelFormatError(f"{path}: cannot be read ({e.strerror or e})") from None
    with open(path, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(header_len))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_len)
    header.pop("__metadata__", None)
    return {name: (data, info) for name, info in header.items()}
