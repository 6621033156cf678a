"""assemble.py assembles: for a model and a weight format it picks a runner, hands it what it asks for, and starts
an engine that describes that runner truthfully (what /readyz shows)."""

from __future__ import annotations

import pytest
from tiny_model import gpt2_config, random_gpt2_weights, random_weights, tiny_config, write_gpt2_gguf

from typewriter import assemble
from typewriter.config import Settings
from typewriter.runners.lite.runner import LiteRunner
from typewriter.runners.xla.runner import XlaRunner


def test_auto_picks_int8_lite_for_the_llama_family_and_fp32_for_the_others():
    assert Settings().weights == "auto"
    assert assemble.resolve_format(tiny_config(), "auto") == "int8-lite"
    assert assemble.resolve_format(gpt2_config(), "auto") == "fp32"
    assert assemble.resolve_format(tiny_config(), "fp32") == "fp32"


def _load(path, weight_format, tmp_path, compile="start"):
    return assemble.load(path, slots=2, max_context=64, max_queue=2, prefill_budget=8, compile=compile,
                        weight_format=weight_format, program_cache=str(tmp_path / "lite"))


def test_int8_lite_is_described_as_what_it_is_programs_made_at_load_and_nothing_to_compile(tiny_gguf, tmp_path):
    engine, _, _ = _load(tiny_gguf, "auto", tmp_path)
    try:
        assert isinstance(engine.runner, LiteRunner) and engine.runner.compiler is None
        described = engine.describe_runtime()
    finally:
        engine.shutdown()
    assert described["name"] == described["weights"] == "int8-lite"
    assert described["programs"] == {"made_at_load": tiny_config().n_layers + 2}
    assert described["attention"] in ("kernel", "numpy")


def test_xla_is_described_with_its_programs_compiled_so_far_of_all(tiny_gguf, tmp_path):
    engine, _, times = _load(tiny_gguf, "fp32", tmp_path, compile="start")
    try:
        assert isinstance(engine.runner, XlaRunner) and engine.runner.compiler is not None
        described = engine.describe_runtime()
    finally:
        engine.shutdown()
    assert (described["name"], described["weights"]) == ("xla", "fp32")
    programs = described["programs"]
    assert 2 <= programs["compiled"] <= programs["total"] and set(programs) == {"compiled", "total", "compiling"}
    assert times.compile_s > 0


def test_another_family_at_auto_runs_on_xla(tmp_path):
    path = write_gpt2_gguf(tmp_path / "gpt2.gguf", gpt2_config(), random_gpt2_weights(gpt2_config()))
    engine, tokenizer, _ = _load(path, "auto", tmp_path, compile="lazy")
    try:
        assert engine.describe_runtime()["name"] == "xla" and tokenizer.name
    finally:
        engine.shutdown()
    assert not (tmp_path / "lite").exists()  # nothing of int8-lite's was made or kept


def test_build_runner_picks_the_runner_of_the_format_asked_for():
    cfg = tiny_config()
    weights = random_weights(cfg)
    assert isinstance(assemble.build_runner(cfg, weights, 1, 32, "int8-lite"), LiteRunner)
    assert isinstance(assemble.build_runner(cfg, weights, 1, 32, "fp32"), XlaRunner)
    with pytest.raises(ValueError, match="int8-lite weight format runs Llama-family models"):
        assemble.build_runner(gpt2_config(), random_gpt2_weights(gpt2_config()), 1, 32, "int8-lite")
