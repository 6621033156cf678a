"""int8-lite's program cache (runners/lite/program_cache.py): a restart maps the programs instead of making them,
answers as the programs made from the weights do, and a changed model file, a broken or damaged entry or an
unwritable folder never serves stale programs or fails a load."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest
from helpers import greedy_ids
from tiny_model import random_weights, tiny_config

from typewriter import assemble
from typewriter.runners.lite import runner as runner_module
from typewriter.runners.lite.program_cache import MANIFEST, ProgramCache, cache_key
from typewriter.runners.lite.programs import make_programs
from typewriter.runners.lite.runner import LiteRunner

IDS = [5, 9, 40, 77, 100, 3, 8]


def load(path, cache, progress=None):
    return assemble.load(path, slots=2, max_context=64, max_queue=2, prefill_budget=8, compile="start",
                        weight_format="int8-lite", program_cache=str(cache) if cache else None,
                        progress=progress or (lambda _: None))


def saved(cache, key, cfg, weights, model_file, fmt="int8-lite"):
    """Programs made in the cache's staging folder and saved as `key`, as a load makes them."""
    with cache.making(key) as folder:
        return cache.save(key, make_programs(cfg, weights, folder, two_pass=fmt == "int8-lite"), model_file, fmt)


def contents(programs) -> list[bytes]:
    return [path.read_bytes() for path in programs.files()]


def test_programs_read_back_from_the_cache_are_the_ones_saved_and_decode_alike(tmp_path):
    cfg = tiny_config()
    weights = random_weights(cfg, seed=3)
    model_file = tmp_path / "model.gguf"
    model_file.write_bytes(b"stands for the model file")
    cache = ProgramCache(tmp_path / "cache")
    key = cache_key(model_file, cfg, "int8-lite")
    assert cache.load(key, cfg.n_layers) is None
    made = saved(cache, key, cfg, weights, model_file)
    assert made.folder == tmp_path / "cache" / key
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [key]  # no staging folder left behind
    back = cache.load(key, cfg.n_layers)
    assert contents(back) == contents(made)
    assert back.embeddings().dtype == np.float16 and back.embeddings().shape == (cfg.vocab_size, cfg.dim)
    fresh, cached = LiteRunner(cfg, weights, 1, 32, 16), LiteRunner(cfg, None, 1, 32, 16, programs=back)
    np.testing.assert_array_equal(fresh.extend(0, 0, IDS), cached.extend(0, 0, IDS))


def test_a_changed_model_file_misses_and_stale_entries_are_removed_when_a_new_one_is_saved(tmp_path):
    cfg = tiny_config()
    weights = random_weights(cfg, seed=3)
    model_file, other_file = tmp_path / "model.gguf", tmp_path / "other.gguf"
    model_file.write_bytes(b"version one")
    other_file.write_bytes(b"another model")
    cache = ProgramCache(tmp_path / "cache")
    old_key, other_key = cache_key(model_file, cfg, "int8-lite"), cache_key(other_file, cfg, "int8-lite")
    saved(cache, old_key, cfg, weights, model_file)
    saved(cache, other_key, cfg, weights, other_file)
    model_file.write_bytes(b"version two, longer")
    os.utime(model_file, ns=(1, 2))
    new_key = cache_key(model_file, cfg, "int8-lite")
    assert new_key != old_key and cache.load(new_key, cfg.n_layers) is None
    assert cache_key(model_file, tiny_config(n_layers=3), "int8-lite") != new_key  # another config, another entry
    saved(cache, new_key, cfg, weights, model_file)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted([new_key, other_key])
    other_file.unlink()  # a model that is gone: its programs go with the next save
    third = tmp_path / "third.gguf"
    third.write_bytes(b"a third model")
    saved(cache, cache_key(third, cfg, "int8-lite"), cfg, weights, third)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted([new_key, cache_key(third, cfg, "int8-lite")])


def test_each_lite_format_keeps_its_own_entry_for_the_same_model_file(tmp_path):
    cfg = tiny_config()
    weights = random_weights(cfg, seed=3)
    model_file = tmp_path / "model.gguf"
    model_file.write_bytes(b"one model")
    cache = ProgramCache(tmp_path / "cache")
    keys = {fmt: cache_key(model_file, cfg, fmt) for fmt in ("int8-lite", "int8-lite-fast")}
    assert keys["int8-lite"] != keys["int8-lite-fast"]
    made = {fmt: saved(cache, key, cfg, weights, model_file, fmt) for fmt, key in keys.items()}
    assert made["int8-lite"].layer(0).read_bytes() != made["int8-lite-fast"].layer(0).read_bytes()
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted(keys.values())  # neither removed
    for fmt, key in keys.items():
        assert contents(cache.load(key, cfg.n_layers)) == contents(made[fmt])


def test_a_broken_or_damaged_entry_is_a_miss_with_a_warning_and_an_unwritable_folder_only_a_warning(tmp_path,
                                                                                                     caplog):
    cfg = tiny_config()
    weights = random_weights(cfg, seed=3)
    model_file = tmp_path / "model.gguf"
    model_file.write_bytes(b"model")
    cache = ProgramCache(tmp_path / "cache")
    key = cache_key(model_file, cfg, "int8-lite")
    saved(cache, key, cfg, weights, model_file)
    (tmp_path / "cache" / key / "layer1.tflite").unlink()
    with caplog.at_level(logging.WARNING, logger="typewriter.lite"):
        assert cache.load(key, cfg.n_layers) is None
    assert "unreadable or damaged" in caplog.text and key in caplog.text
    assert not (tmp_path / "cache" / key).exists()  # removed, so the next save writes it whole
    damaged = saved(cache, key, cfg, weights, model_file)
    data = bytearray(damaged.layer(0).read_bytes())
    data[len(data) // 2] ^= 0x10  # one flipped bit in the middle of a weight: LiteRT would load it silently
    damaged.layer(0).write_bytes(bytes(data))
    loaded = cache.load(key, cfg.n_layers)  # the digests are worked out as the reader asks for each file
    assert loaded is not None and loaded.checked(loaded.first) == loaded.first
    with pytest.raises(ValueError, match="layer0.tflite does not match its digest"):
        loaded.checked(loaded.layer(0))
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder should be")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="typewriter.lite"):
        in_temp = saved(ProgramCache(blocked / "lite"), key, cfg, weights, model_file)
    assert "could not write the int8-lite program cache" in caplog.text
    assert not in_temp.folder.exists()  # made in a temporary folder, gone once the caller has mapped it
    assert ProgramCache(None).load(key, cfg.n_layers) is None  # no cache: nothing read
    assert not saved(ProgramCache(None), key, cfg, weights, model_file).folder.exists()  # and nothing kept


@pytest.mark.slow
def test_a_second_load_reads_the_programs_from_the_cache_and_answers_the_same(tiny_gguf, tmp_path):
    said: list[str] = []
    engine, tokenizer, _ = load(tiny_gguf, tmp_path / "lite", said.append)
    try:
        first = greedy_ids(engine, tokenizer.encode("or"))
    finally:
        engine.shutdown()
    assert not any("programs from" in line for line in said) and any("program " in line for line in said)
    assert sorted(p.name for p in (tmp_path / "lite").iterdir() if p.name != "kernels") == [
        cache_key(Path(tiny_gguf), engine.runner.cfg, "int8-lite")]
    assert len(list((tmp_path / "lite" / "kernels").glob("kernels-*.so"))) == 1  # the kernels beside them
    said.clear()
    engine, tokenizer, _ = load(tiny_gguf, tmp_path / "lite", said.append)
    try:
        assert greedy_ids(engine, tokenizer.encode("or")) == first
    finally:
        engine.shutdown()
    assert any(f"programs from {tmp_path / 'lite'}" in line for line in said)
    assert not any("weights" in line or "rotating" in line for line in said)  # nothing read or folded
    engine, _, _ = load(tiny_gguf, None)  # no cache: made again, and it answers as well
    try:
        assert greedy_ids(engine, tokenizer.encode("or")) == first
    finally:
        engine.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["flipped", "refused"])
def test_a_cached_program_that_is_damaged_or_does_not_load_is_made_again_and_replaced(tiny_gguf, tmp_path, caplog,
                                                                                      monkeypatch, damage):
    engine, tokenizer, _ = load(tiny_gguf, tmp_path / "lite")
    try:
        first = greedy_ids(engine, tokenizer.encode("or"))
    finally:
        engine.shutdown()
    (entry,) = (p for p in (tmp_path / "lite").iterdir() if p.name != "kernels")
    if damage == "flipped":  # a disk's damage: the digest no longer matches
        data = bytearray((entry / "layer1.tflite").read_bytes())
        for i in range(100, len(data), 97):
            data[i] ^= 0xFF
        (entry / "layer1.tflite").write_bytes(bytes(data))
    else:  # the digest matches (written with the entry), but LiteRT refuses the file
        (entry / "layer1.tflite").write_bytes(b"not a flatbuffer at all")
        manifest = json.loads((entry / MANIFEST).read_text())
        manifest["files"]["layer1.tflite"] = hashlib.sha256(b"not a flatbuffer at all").hexdigest()
        (entry / MANIFEST).write_text(json.dumps(manifest))
    damaged = hashlib.sha256((entry / "layer1.tflite").read_bytes()).hexdigest()
    seen: list[str] = []  # what LiteRT was handed, by digest (the entry made again has the damaged file's path)
    real = runner_module.lite_interpreter

    def interpreter(program, threads):
        seen.append(hashlib.sha256(Path(program).read_bytes()).hexdigest())
        return real(program, threads)

    monkeypatch.setattr(runner_module, "lite_interpreter", interpreter)
    said: list[str] = []
    with caplog.at_level(logging.WARNING, logger="typewriter.lite"):
        engine, tokenizer, _ = load(tiny_gguf, tmp_path / "lite", said.append)
    try:
        assert greedy_ids(engine, tokenizer.encode("or")) == first
    finally:
        engine.shutdown()
    assert any("making them again" in line for line in said)
    if damage == "flipped":  # caught before LiteRT saw the file
        assert "layer1.tflite does not match its digest" in caplog.text and damaged not in seen
    else:
        assert "did not load" in caplog.text and damaged in seen
    assert ProgramCache(tmp_path / "lite").load(entry.name, 2) is not None  # saved anew, whole

