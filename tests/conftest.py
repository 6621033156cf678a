"""Shared fixtures: the tiny random model on disk, and the real embedded model loaded once per session."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import absl.logging
import pytest
from tiny_model import LONG_CONTEXT, random_weights, tiny_config, write_gguf

from typewriter.weights.source import embedded_model_path as find_embedded_model

# absl's handler (TensorFlow installs it) writes to the sys.stderr of the moment it is made, and closes that stream
# when logging.config.dictConfig (every uvicorn.Config) clears the handlers, unless it is one of the process's own.
# Under pytest's capture it would be the capture's buffer: closing that ended the whole run ("lost sys.stderr").
absl.logging.get_absl_handler().python_handler.stream = sys.__stderr__


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
def long_tiny_gguf(tmp_path_factory) -> Path:
    """`tiny_gguf`'s weights with a LONG_CONTEXT-token context, for a server whose answer must outlast a client's
    round trip (tiny_model.HOLD_TOKENS)."""
    cfg = tiny_config(tie_embeddings=False, max_position=LONG_CONTEXT)
    return write_gguf(tmp_path_factory.mktemp("tiny-4096") / "tiny.gguf", cfg, random_weights(cfg))


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
def real_runner(embedded_model_path):
    """The embedded model's compiled fp32 runner (the file's weights exactly, for the golden logits): one slot, a
    256-token context, buckets compiled on first use.
    Whoever starts an Engine on it shuts that engine down before the module ends: one thread owns a runner."""
    from typewriter.assemble import open_runner
    from typewriter.config import WeightFormat
    from typewriter.runners.options import RunnerOptions

    return open_runner(embedded_model_path, RunnerOptions(WeightFormat.FP32, 256, slots=1, compile="lazy")).runner


# ---- the opt-in `qwen` group: the 0.5B model, when scripts/fetch-qwen-0.5b.sh has put it in its cache ----

QWEN_FILE = "qwen2.5-coder-0.5b-instruct.gguf"


def qwen_model_path() -> Path | None:
    """The 0.5B model where the fetch script leaves it ($TYPEWRITER_BENCH_CACHE or ~/.cache/typewriter), or None."""
    cache = Path(os.environ.get("TYPEWRITER_BENCH_CACHE") or Path.home() / ".cache" / "typewriter")
    path = cache / "models" / QWEN_FILE
    return path if path.is_file() else None


def pytest_collection_modifyitems(config, items):
    """Without the 0.5B model the `qwen` tests are left out of the run (deselected and said so in the summary),
    not failed: the model is an opt-in download (`make test-qwen` fetches it and runs them)."""
    if qwen_model_path() is not None:
        return
    left_out = [item for item in items if item.get_closest_marker("qwen")]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if not item.get_closest_marker("qwen")]
        config._qwen_left_out = len(left_out)


def pytest_terminal_summary(terminalreporter, config):
    if left_out := getattr(config, "_qwen_left_out", 0):
        terminalreporter.write_line(f"qwen group: {left_out} tests left out, the 0.5B model is not in the cache "
                                    "(make test-qwen fetches it and runs them)")


@pytest.fixture(scope="session")
def qwen_model() -> Path:
    path = qwen_model_path()
    assert path is not None, "the qwen group runs only with the model present: scripts/fetch-qwen-0.5b.sh"
    return path
