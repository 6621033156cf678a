"""assemble.py assembles: for a model and a weight format it picks a runner, hands it what it asks for, and starts
an engine that describes that runner truthfully (what /readyz shows)."""

from __future__ import annotations

import pytest
from tiny_model import gpt2_config, random_gpt2_weights, random_weights, tiny_config, write_gguf, write_gpt2_gguf

from typewriter import assemble
from typewriter.config import Settings, WeightFormat
from typewriter.errors import ModelFormatError
from typewriter.runners.lite.runner import LiteRunner
from typewriter.runners.options import RunnerOptions
from typewriter.runners.xla.runner import XlaRunner


def test_auto_picks_q4_blocks_on_avx512_vnni_else_int8_lite_for_the_llama_family_and_fp32_for_the_others():
    assert Settings().model.weights == "auto"
    auto, llama = WeightFormat(Settings().model.weights), tiny_config().family
    assert auto.resolved(llama, wide_blocks=True) is WeightFormat.Q4_BLOCKS
    assert auto.resolved(llama, wide_blocks=False) is WeightFormat.INT8_LITE
    assert WeightFormat.AUTO.resolved(gpt2_config().family, wide_blocks=True) is WeightFormat.FP32
    assert WeightFormat.FP32.resolved(llama, wide_blocks=True) is WeightFormat.FP32
    assert WeightFormat.INT8_LITE.resolved(llama, wide_blocks=True) is WeightFormat.INT8_LITE


def test_q4_blocks_is_counted_wide_only_where_the_cpu_has_avx512_vnni_and_the_heads_fit(monkeypatch):
    from typewriter.runners.lite import kernel

    monkeypatch.setattr(kernel, "_cpu_flags", lambda: {"avx2", "fma", "f16c", *kernel.WIDE_FLAGS})
    assert kernel.blocks_run_wide(64)
    assert not kernel.blocks_run_wide(40)  # heads the attention kernel cannot take
    monkeypatch.setattr(kernel, "_cpu_flags", lambda: {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl"})
    assert not kernel.blocks_run_wide(64)  # no VNNI: AVX2's path, slower at a batch
    monkeypatch.setattr(kernel, "_cpu_flags", lambda: None)
    assert not kernel.blocks_run_wide(64)


def test_the_default_runs_what_this_machine_s_kernel_runs_fastest(tiny_gguf, tmp_path):
    from typewriter.runners.lite.kernel import blocks_run_wide

    engine, _, _ = _load(tiny_gguf, "auto", tmp_path)
    try:
        described = engine.describe_runtime()
    finally:
        engine.shutdown()
    assert described["weights"] == ("q4-blocks" if blocks_run_wide(tiny_config().head_dim) else "int8-lite")
    assert described["draft_tokens"] == (3 if described["weights"] == "q4-blocks" else 0)  # as asked, on q4-blocks


def _load(path, weight_format, tmp_path, compile="start"):
    return assemble.load(path, slots=2, max_context=64, max_queue=2, prefill_budget=8, compile=compile,
                        weight_format=weight_format, program_cache=str(tmp_path / "lite"), draft_tokens=3)


def test_int8_lite_is_described_as_what_it_is_programs_made_at_load_and_nothing_to_compile(tiny_gguf, tmp_path):
    engine, _, _ = _load(tiny_gguf, "int8-lite", tmp_path)
    try:
        assert isinstance(engine.runner, LiteRunner) and engine.runner.compiler is None
        described = engine.describe_runtime()
    finally:
        engine.shutdown()
    assert described["name"] == described["weights"] == "int8-lite"
    assert described["draft_tokens"] == 0  # asked for 3: its programs allocate again at each change of rows
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


def test_open_runner_opens_the_runtime_of_the_format_asked_for(tiny_gguf, tmp_path):
    """Tests, benchmarks and the server open a runner the one way (assemble.open_runner)."""
    def opened(path, fmt):
        return assemble.open_runner(path, RunnerOptions(fmt, 32, slots=1, program_cache=str(tmp_path / "lite"),
                                                        compile="lazy")).runner

    assert isinstance(opened(tiny_gguf, WeightFormat.INT8_LITE), LiteRunner)
    assert isinstance(opened(tiny_gguf, WeightFormat.FP32), XlaRunner)
    gpt2 = write_gpt2_gguf(tmp_path / "gpt2.gguf", gpt2_config(), random_gpt2_weights(gpt2_config()))
    with pytest.raises(ModelFormatError, match="int8-lite weight format runs Llama-family models"):
        opened(gpt2, WeightFormat.INT8_LITE)


def test_the_servers_engine_keeps_readers_as_long_as_its_settings_say(tiny_gguf, monkeypatch, tmp_path):
    monkeypatch.setattr(assemble, "lite_cache_dir", lambda: str(tmp_path / "lite"))
    for environ, kept in (({}, Settings().engine.keep_for_readers_s), ({"TYPEWRITER_KEEP_FOR_READERS_S": "0"}, 0.0)):
        settings = Settings.from_env(environ, model_path=str(tiny_gguf), max_active=2, max_context=64)
        engine, _ = assemble.load_engine(settings)
        try:
            assert engine.scheduler.keep_for_readers_s == kept
        finally:
            engine.shutdown()
    assert Settings().engine.keep_for_readers_s > 0  # on by default: a class is served, not only its busiest


@pytest.mark.parametrize("weight_format", ["int8-lite", "q4-blocks", "fp32"])
def test_a_tokenizer_refused_ends_the_load_with_its_own_named_error(tmp_path, weight_format):
    """The tokenizer is made beside the runner: a first start's calibration waits for it, so int8-lite makes and
    keeps no program for a model whose tokenizer is refused, and q4-blocks keeps no blocks (it asks for the
    tokenizer before saving them); XLA's load ends with the same error."""
    cfg = tiny_config()
    path = write_gguf(tmp_path / "odd.gguf", cfg, random_weights(cfg))
    data = path.read_bytes()
    assert data.count(b"gpt-2") == 1  # tokenizer.ggml.pre
    path.write_bytes(data.replace(b"gpt-2", b"gpt-x"))
    with pytest.raises(ModelFormatError, match="'gpt-x' is not a known pre-tokenizer"):
        _load(path, weight_format, tmp_path, compile="lazy")
    kept = tmp_path / "lite"
    assert not kept.exists() or [p.name for p in kept.iterdir() if p.name != "kernels"] == []
