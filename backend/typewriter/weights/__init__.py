"""Weight import: a declarative name table per family and source format (architecture/), checked shape by shape.

`load_weights(path)` returns a ModelConfig and a dict of float32 numpy arrays under canonical names
(PyTorch `[out, in]` layout, Q and K rows in the Hugging Face rotate-half order) from a GGUF file or a
Hugging Face model directory.
"""

from .source import load_weights, resolve_model_path

__all__ = ["load_weights", "resolve_model_path"]
