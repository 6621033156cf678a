"""ModelConfig's derived figures, on real shapes: the embedded model's, read from its GGUF file, and
Qwen2.5-Coder-0.5B's as its config.json gives it."""

from __future__ import annotations

from typewriter.architecture.model_config import ModelConfig
from typewriter.engine.request import SMALL_MODEL_PARAMETERS, SamplingParams, default_repetition_penalty
from typewriter.weights.source import GGUFFile, embedded_model_path, read_config

QWEN_0_5B = ModelConfig(name="qwen2.5-coder-0.5b", vocab_size=151936, dim=896, n_layers=24, n_heads=14, n_kv_heads=2,
                        hidden_dim=4864, norm_eps=1e-6, rope_theta=1e6, max_position=32768, tie_embeddings=True,
                        qkv_bias=True)


def test_the_parameter_count_is_the_models_own():
    # the authors' figures: SmolLM2-135M, 134.5M weights; Qwen2.5-0.5B, 0.49B (0.36B outside the embeddings)
    embedded = read_config(GGUFFile(embedded_model_path()))
    assert 134_000_000 < embedded.parameters < 135_500_000
    assert 490_000_000 < QWEN_0_5B.parameters < 496_000_000
    untied = ModelConfig(**{**QWEN_0_5B.__dict__, "tie_embeddings": False})
    assert untied.parameters - QWEN_0_5B.parameters == 151936 * 896


def test_a_small_model_keeps_the_penalty_and_a_larger_one_has_none_by_default():
    embedded = read_config(GGUFFile(embedded_model_path()))
    assert default_repetition_penalty(embedded.parameters) == SamplingParams.repetition_penalty == 1.1
    assert default_repetition_penalty(QWEN_0_5B.parameters) == 1.0
    assert default_repetition_penalty(0) == 1.1  # not known: as a small model
    assert default_repetition_penalty(SMALL_MODEL_PARAMETERS - 1) == 1.1
    assert default_repetition_penalty(SMALL_MODEL_PARAMETERS) == 1.0
