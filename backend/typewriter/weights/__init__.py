"""Weight import: a declarative name table per family and source format (architecture/), checked shape by shape,
into float32 arrays under canonical names ([out, in], Q and K rows in Hugging Face's rotate-half order).
"""

from .source import load_weights, resolve_model_path

__all__ = ["load_weights", "resolve_model_path"]
