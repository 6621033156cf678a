"""Shared fixtures: the tiny random model on disk, and the real embedded model loaded once per session."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import absl.logging
import pytest
from tiny_model import random_weights, tiny_config, write_gguf

from typewriter.weights.load import embedded_model_path as find_embedded_model


# absl's handler (TensorFlow installs it) writes to the sys.stderr of the moment it is made, and closes that stream
# when logging.config.dictConfig (every uvicorn.Config) clears the handlers, unless it is one of the process's own.
# Under pytest's capture it would be the capture's buffer: closing that ended the whole run ("lost sys.stderr").
absl.logging.get_absl_handler().python_handler.stream = sys.__stderr__


# Where scripts/fetch-qwen-0.5b.sh assembles Qwen2.5-Coder-0.5B-Instruct (never a dependency of `make test`).
QWEN_GGUF = Path(os.environ.get("TYPEWRITER_BENCH_CACHE") or Path.home() / ".cache" / "typewriter") / "models" \
    / "qwen2.5-coder-0.5b-instruct.gguf"


@pytest.fixture(scope="session")
def qwen_gguf() -> Path:
    """The `qwen` group's model: its tests run where scripts/fetch-qwen-0.5b.sh has put the file, and say how to
    get it where it has not."""
    if not QWEN_GGUF.is_file():
        pytest.skip(f"the qwen group needs {QWEN_GGUF}: run scripts/fetch-qwen-0.5b.sh")
    return QWEN_GGUF


@pytest.fixture(scope="session")
def embedded_model_path() -> Path:
    return find_embedded_model()


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory) -> Path:
    """The tiny model (llama, F32) as a GGUF file with its tokenizer. Untied: with random tied embeddings the
    argmax is nearly always the last token again, which would hide cache bugs from greedy comparisons."""
    cfg = tiny_config(tie_embeddings=False)
    return write_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf", cfg, random_weights(cfg))


@pytest.fixture(scope="session")
def real_weights(embedded_model_path):
    """(ModelConfig, canonical float32 weights) of the embedded SmolLM2 model."""
    from typewriter.weights import load_weights

    return load_weights(embedded_model_path)


@pytest.fixture(scope="session")
def real_tokenizer(embedded_model_path):
    from typewriter.text.tokenizer import Tokenizer

    return Tokenizer.load(embedded_model_path)


@pytest.fixture(scope="session")
def real_runner(real_weights):
    """The embedded model's compiled fp32 runner (the file's weights exactly, for the golden logits): one slot, a
    256-token context, buckets compiled on first use.
    Whoever starts an Engine on it shuts that engine down before the module ends: one thread owns a runner."""
    from typewriter.runtime import build_runner

    cfg, weights = real_weights
    return build_runner(cfg, weights, slots=1, max_context=256, weight_format="fp32")
