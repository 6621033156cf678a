"""int8-lite's program cache (runners/lite/programs.py): a restart reads the programs instead of making them, answers as
the programs made from the weights do, and a changed model file, a broken entry or an unwritable folder never
serves stale programs or fails a load."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest
from helpers import Recorder
from tiny_model import random_weights, tiny_config

from typewriter import runtime
from typewriter.runners.lite.programs import ProgramCache, cache_key, make_programs
from typewriter.runners.lite.runner import LiteRunner
from typewriter.engine.request import GenerationRequest, SamplingParams

IDS = [5, 9, 40, 77, 100, 3, 8]


def load(path, cache, progress=None):
    return runtime.load(path, slots=2, max_context=64, max_queue=2, prefill_budget=8, compile="start",
                        weight_format="int8-lite", program_cache=str(cache) if cache else None,
                        progress=progress or (lambda _: None))


def greedy(engine, ids, n=8) -> list[int]:
    rec = Recorder()
    engine.submit(GenerationRequest("g", ids, SamplingParams(max_new_tokens=n, temperature=0.0,
                                                             repetition_penalty=1.0, ignore_eos=True)), rec)
    rec.wait()
    return [t.token_id for t in rec.tokens]


def test_programs_read_back_from_the_cache_are_the_ones_saved_and_decode_alike(tmp_path):
    cfg = tiny_config()
    weights = random_weights(cfg, seed=3)
    model_file = tmp_path / "model.gguf"
    model_file.write_bytes(b"stands for the model file")
    made = make_programs(cfg, weights)
    cache = ProgramCache(tmp_path / "cache")
    key = cache_key(model_file, cfg, "int8-lite")
    assert cache.load(key, cfg.n_layers) is None
    cache.save(key, made, model_file, "int8-lite")
    back = cache.load(key, cfg.n_layers)
    assert (back.first, back.layers, back.logits) == (made.first, made.layers, made.logits)
    np.testing.assert_array_equal(back.embeddings, made.embeddings)
    assert back.embeddings.dtype == np.float16
    fresh, cached = LiteRunner(cfg, weights, 1, 32, 16), LiteRunner(cfg, None, 1, 32, 16, programs=back)
    np.testing.assert_array_equal(fresh.extend(0, 0, IDS), cached.extend(0, 0, IDS))


def test_a_changed_model_file_misses_and_stale_entries_are_removed_when_a_new_one_is_saved(tmp_path):
    cfg = tiny_config()
    made = make_programs(cfg, random_weights(cfg, seed=3))
    model_file, other_file = tmp_path / "model.gguf", tmp_path / "other.gguf"
    model_file.write_bytes(b"version one")
    other_file.write_bytes(b"another model")
    cache = ProgramCache(tmp_path / "cache")
    old_key, other_key = cache_key(model_file, cfg, "int8-lite"), cache_key(other_file, cfg, "int8-lite")
    cache.save(old_key, made, model_file, "int8-lite")
    cache.save(other_key, made, other_file, "int8-lite")
    model_file.write_bytes(b"version two, longer")
    os.utime(model_file, ns=(1, 2))
    new_key = cache_key(model_file, cfg, "int8-lite")
    assert new_key != old_key and cache.load(new_key, cfg.n_layers) is None
    assert cache_key(model_file, tiny_config(n_layers=3), "int8-lite") != new_key  # another config, another entry
    cache.save(new_key, made, model_file, "int8-lite")
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted([new_key, other_key])
    other_file.unlink()  # a model that is gone: its programs go with the next save
    third = tmp_path / "third.gguf"
    third.write_bytes(b"a third model")
    cache.save(cache_key(third, cfg, "int8-lite"), made, third, "int8-lite")
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted([new_key, cache_key(third, cfg, "int8-lite")])


def test_each_lite_format_keeps_its_own_entry_for_the_same_model_file(tmp_path):
    cfg = tiny_config()
    weights = random_weights(cfg, seed=3)
    model_file = tmp_path / "model.gguf"
    model_file.write_bytes(b"one model")
    cache = ProgramCache(tmp_path / "cache")
    keys = {fmt: cache_key(model_file, cfg, fmt) for fmt in ("int8-lite", "int8-lite-fast")}
    assert keys["int8-lite"] != keys["int8-lite-fast"]
    made = {fmt: make_programs(cfg, weights, two_pass=fmt == "int8-lite") for fmt in keys}
    assert made["int8-lite"].layers[0] != made["int8-lite-fast"].layers[0]
    for fmt, key in keys.items():
        cache.save(key, made[fmt], model_file, fmt)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted(keys.values())  # neither removed
    for fmt, key in keys.items():
        assert cache.load(key, cfg.n_layers).layers == made[fmt].layers


def test_a_broken_entry_is_a_miss_with_a_warning_and_an_unwritable_folder_only_a_warning(tmp_path, caplog):
    cfg = tiny_config()
    made = make_programs(cfg, random_weights(cfg, seed=3))
    model_file = tmp_path / "model.gguf"
    model_file.write_bytes(b"model")
    cache = ProgramCache(tmp_path / "cache")
    key = cache_key(model_file, cfg, "int8-lite")
    cache.save(key, made, model_file, "int8-lite")
    (tmp_path / "cache" / key / "layer1.tflite").unlink()
    with caplog.at_level(logging.WARNING, logger="typewriter.lite"):
        assert cache.load(key, cfg.n_layers) is None
    assert "unreadable" in caplog.text and key in caplog.text
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder should be")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="typewriter.lite"):
        ProgramCache(blocked / "lite").save(key, made, model_file, "int8-lite")
    assert "could not save the int8-lite programs" in caplog.text
    assert ProgramCache(None).load(key, cfg.n_layers) is None  # no cache: nothing read
    ProgramCache(None).save(key, made, model_file, "int8-lite")  # and nothing written


@pytest.mark.slow
def test_a_second_load_reads_the_programs_from_the_cache_and_answers_the_same(tiny_gguf, tmp_path):
    said: list[str] = []
    engine, tokenizer, _ = load(tiny_gguf, tmp_path / "lite", said.append)
    try:
        first = greedy(engine, tokenizer.encode("or"))
    finally:
        engine.shutdown()
    assert not any("programs from" in line for line in said) and any("program " in line for line in said)
    assert sorted(p.name for p in (tmp_path / "lite").iterdir() if p.name != "kernels") == [
        cache_key(Path(tiny_gguf), engine.runner.cfg, "int8-lite")]
    assert len(list((tmp_path / "lite" / "kernels").glob("attention-*.so"))) == 1  # the kernel beside them
    said.clear()
    engine, tokenizer, _ = load(tiny_gguf, tmp_path / "lite", said.append)
    try:
        assert greedy(engine, tokenizer.encode("or")) == first
    finally:
        engine.shutdown()
    assert any(f"programs from {tmp_path / 'lite'}" in line for line in said)
    assert not any("weights" in line or "rotating" in line for line in said)  # nothing read or folded
    engine, _, _ = load(tiny_gguf, None)  # no cache: made again, and it answers as well
    try:
        assert greedy(engine, tokenizer.encode("or")) == first
    finally:
        engine.shutdown()


@pytest.mark.slow
def test_a_cached_program_that_does_not_load_is_made_again_and_replaced(tiny_gguf, tmp_path, caplog):
    engine, tokenizer, _ = load(tiny_gguf, tmp_path / "lite")
    try:
        first = greedy(engine, tokenizer.encode("or"))
    finally:
        engine.shutdown()
    (entry,) = (p for p in (tmp_path / "lite").iterdir() if p.name != "kernels")
    (entry / "layer1.tflite").write_bytes(b"not a flatbuffer at all")
    said: list[str] = []
    with caplog.at_level(logging.WARNING, logger="typewriter.lite"):
        engine, tokenizer, _ = load(tiny_gguf, tmp_path / "lite", said.append)
    try:
        assert greedy(engine, tokenizer.encode("or")) == first
    finally:
        engine.shutdown()
    assert "did not load" in caplog.text and any("making them again" in line for line in said)
    assert (entry / "layer1.tflite").read_bytes() != b"not a flatbuffer at all"  # saved anew

