"""Read a SavedModel written by `typewriter export` (runners/xla/export.py): its manifest, its weights and its
tokenizer. The weights come straight from the variables checkpoint, without loading the graphs, as the engine
compiles its own programs; `canonical` turns the Transformer's fused layout back into the canonical one.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..architecture.families import LLAMA_BLOCK
from ..architecture.llama_names import expected_shapes
from ..architecture.model_config import ModelConfig
from ..errors import ModelFormatError

FORMAT = "typewriter.saved_model"
VERSION = 1  # bump when the manifest, the variables' layout or the signatures change
EXTRA = Path("assets.extra") / "typewriter"  # SavedModel's folder for files its graphs do not read
MANIFEST = "typewriter.json"
TOKENIZER = "tokenizer"


def is_saved_model(path: Path) -> bool:
    return path.is_dir() and (path / "saved_model.pb").is_file()


class SavedModelDir:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        manifest_path = self.path / EXTRA / MANIFEST
        if not manifest_path.is_file():
            raise ModelFormatError(f"{self.path}: a SavedModel, but not one written by `typewriter export` (no "
                                   f"{EXTRA / MANIFEST}); export the model with `typewriter export --out DIR`")
        try:
            self.manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ModelFormatError(f"{manifest_path}: cannot be read ({e}); export the model again") from None
        found = (self.manifest.get("format"), self.manifest.get("version"))
        if found != (FORMAT, VERSION):
            raise ModelFormatError(f"{self.path}: exported in format {found[0]!r} version {found[1]!r}, and this "
                                   f"typewriter reads version {VERSION}; export it again with this version "
                                   "(`typewriter export --model SOURCE --out DIR`)")
        self.tokenizer_dir = self.path / EXTRA / TOKENIZER

    def config(self) -> ModelConfig:
        try:
            cfg = ModelConfig(**self.manifest["model"])
        except (KeyError, TypeError, ValueError) as e:
            raise ModelFormatError(f"{self.path}: the manifest's model config is unusable ({e}); export it "
                                   "again") from None
        if cfg.family not in LLAMA_BLOCK:  # `canonical` inverts the Llama block's variables only
            raise ModelFormatError(f"{self.path}: an exported {cfg.family} model cannot be loaded back yet (supported: "
                                   "the llama and phi3 families); serve its GGUF file or Hugging Face directory "
                                   "instead")
        return cfg

    def weights(self, cfg: ModelConfig) -> dict[str, np.ndarray]:
        import tensorflow as tf

        unreadable = (tf.errors.OpError, ValueError, IndexError)  # a damaged file raises any of these
        try:
            reader = tf.train.load_checkpoint(str(self.path / "variables" / "variables"))
        except unreadable as e:
            raise ModelFormatError(f"{self.path}: its variables cannot be read ({type(e).__name__}: {e}); export "
                                   "the model again") from None
        stored = {name.split("/.ATTRIBUTES")[0]: name for name in reader.get_variable_to_shape_map()}

        def get(name: str) -> np.ndarray:
            if name not in stored:
                raise ModelFormatError(f"{self.path}: variable {name} is missing; export the model again")
            try:
                return np.asarray(reader.get_tensor(stored[name]))
            except unreadable as e:
                raise ModelFormatError(f"{self.path}: variable {name} cannot be read ({type(e).__name__}: {e}); "
                                       "export the model again") from None

        weights = canonical(cfg, get)
        for name, shape in expected_shapes(cfg).items():
            if weights[name].shape != shape:
                raise ModelFormatError(f"{self.path}: {name} has shape {weights[name].shape}, expected {shape}")
        return weights


def canonical(cfg: ModelConfig, get: Callable[[str], np.ndarray]) -> dict[str, np.ndarray]:
    """Canonical [out, in] tensors from the Transformer's own variables (runners/xla/model.py), `get(name)` reading
    `model/<attribute path>`: the inverse of what Transformer.__init__ does to them."""
    q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    output = get("model/output").T  # stored [d, v]
    weights = {"norm": get("model/norm"),
               "tok_embeddings": output if cfg.tie_embeddings else get("model/tok_embeddings")}
    if not cfg.tie_embeddings:
        weights["output"] = output
    for i in range(cfg.n_layers):
        at = f"model/layers/{i}"
        wq, wk, wv = np.split(get(f"{at}/wqkv").T, [q, q + kv])  # [(h + 2k) * e, d]
        gate, up = np.split(get(f"{at}/w_gate_up").T, 2)
        layer = {"attention_norm": get(f"{at}/attention_norm"), "ffn_norm": get(f"{at}/ffn_norm"),
                 "wq": wq, "wk": wk, "wv": wv, "wo": get(f"{at}/wo").T,
                 "w_gate": gate, "w_up": up, "w_down": get(f"{at}/w_down").T}
        if cfg.qkv_bias:
            layer["bq"], layer["bk"], layer["bv"] = np.split(get(f"{at}/bqkv"), [q, q + kv])
        weights |= {f"layers.{i}.{k}": np.ascontiguousarray(v) for k, v in layer.items()}
    return weights
