"""`typewriter export`: a model of the Llama block (llama, phi3) written as a TensorFlow SavedModel whose two
XLA-compiled signatures read and write one sequence's K/V cache, held as variables, so a TensorFlow tool can
generate with them alone:

- `prefill(tokens [1, chunk] int32, start [] int32, length [] int32) -> logits [1, vocab]`: a prompt chunk (padded
  past `length`) written at positions start..; the logits after its last real token.
- `decode_step(token [1] int32, position [] int32) -> logits [1, vocab]`: one generated token.

The manifest and the tokenizer go in assets.extra/typewriter/; `typewriter --model DIR` reads only the weights
(weights/saved_model.py).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from ... import __version__
from ...architecture.families import LLAMA_BLOCK
from ...architecture.model_config import ModelConfig
from ...errors import ExportError
from ...weights.saved_model import EXTRA, FORMAT, MANIFEST, TOKENIZER, VERSION
from .tf_env import import_tensorflow

if TYPE_CHECKING:
    import tensorflow as tf

    from .model import Transformer

PREFILL_CHUNK = 64  # the prefill signature's chunk: the engine's own middle chunk size


class ExportedTokenizer(Protocol):
    @property
    def name(self) -> str: ...

    def save(self, folder: Path) -> None:
        """Write its files into `folder`."""


def check_out(out: Path) -> None:
    """Before anything is loaded."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"{out}: already exists and is not an empty folder; choose another --out or remove it")


def write_saved_model(cfg: ModelConfig, weights: dict[str, np.ndarray], tokenizer: ExportedTokenizer, path: Path,
                      out: Path, max_context: int, progress: Callable[[str], None] = lambda _: None) -> Path:
    check_out(out)
    if cfg.family not in LLAMA_BLOCK:
        raise ExportError(f"{path}: a {cfg.family} model cannot be exported yet (supported: the llama and phi3 "
                          "families); serve its GGUF file or Hugging Face directory instead")
    max_context = min(max_context, cfg.max_position)
    chunk = min(PREFILL_CHUNK, max_context)
    tf = import_tensorflow()
    from .model import Transformer

    model = Transformer(cfg, weights, slots=1, max_len=max_context, max_chunk=chunk)
    del weights
    module = _Signatures(model, chunk)
    progress(f"writing the SavedModel to {out}")
    try:
        tf.saved_model.save(module, str(out), signatures={"prefill": module.prefill,
                                                          "decode_step": module.decode_step})
        extra = out / EXTRA
        tokenizer.save(extra / TOKENIZER)
        manifest = {"format": FORMAT, "version": VERSION, "exported_by": f"typewriter {__version__}",
                    "source": str(path), "model": dataclasses.asdict(cfg), "tokenizer_name": tokenizer.name,
                    "max_context": max_context, "prefill_chunk": chunk}
        (extra / MANIFEST).write_text(json.dumps(manifest, indent=1))
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)  # no half-written export that a later --model would trip over
        raise
    progress(f"exported {cfg.name} ({max_context} positions) to {out}")
    return out


def _Signatures(model: Transformer, chunk: int) -> tf.Module:
    import tensorflow as tf  # imported already (import_tensorflow)

    kv_len = model.cache.max_len

    # tf.Module and tf.function are Any: TensorFlow ships no type information
    class Signatures(tf.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(name="typewriter")
            self.model = model

        @tf.function(jit_compile=True, input_signature=[  # type: ignore[untyped-decorator]
            tf.TensorSpec([1, chunk], tf.int32, "tokens"), tf.TensorSpec([], tf.int32, "start"),
            tf.TensorSpec([], tf.int32, "length")])
        def prefill(self, tokens: tf.Tensor, start: tf.Tensor, length: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"logits": self.model.extend(tokens, start, length, tf.constant(0), kv_len)}

        @tf.function(jit_compile=True, input_signature=[  # type: ignore[untyped-decorator]
            tf.TensorSpec([1], tf.int32, "token"), tf.TensorSpec([], tf.int32, "position")])
        def decode_step(self, token: tf.Tensor, position: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"logits": self.model.decode(token, position[None], tf.constant([0]), kv_len)}

    return Signatures()
