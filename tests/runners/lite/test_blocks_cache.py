"""q4-blocks' cache (runners/lite/blocks_cache.py): a restart maps the packed blocks instead of packing them again and
answers with the same bits; a damaged, cut or stale entry is a miss with a warning, packed again, never served (a cut
or stale one at once; damage inside the bytes when the check, computed while the start goes on, is waited for at the
kernel's first read)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from helpers import greedy_ids
from tiny_model import random_weights, tiny_config, write_gguf

from typewriter import assemble
from typewriter.runners.lite import blocks_cache
from typewriter.runners.lite.blocks import BlockModel
from typewriter.runners.lite.kernel import load as load_kernel
from typewriter.runners.lite.program_cache import MANIFEST, ProgramCache, cache_key
from typewriter.runners.lite.runner import LiteRunner
from typewriter.weights.source import open_source, read_config, weight_reader

IDS = [5, 9, 40, 77, 100, 3, 8]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    cfg = tiny_config(tie_embeddings=False)
    path = write_gguf(tmp_path_factory.mktemp("q4") / "tiny.gguf", cfg, random_weights(cfg, seed=5), quant=Q.Q4_1)
    cfg, reader = weight_reader(open_source(path)[0])
    kernel = load_kernel(None)
    assert kernel is not None
    return path, cfg, reader, kernel


def logits(cfg, reader, kernel, packed=None) -> np.ndarray:
    runner = LiteRunner(cfg, None, 1, 64, 64, kernel=kernel, weight_format="q4-blocks",
                        blocks=BlockModel(cfg, reader, kernel, packed))
    return runner.extend(0, 0, IDS, all_logits=True)


def test_blocks_read_back_are_the_ones_saved_and_answer_with_the_same_bits(model, tmp_path):
    path, cfg, reader, kernel = model
    cache = ProgramCache(tmp_path / "cache")
    key = cache_key(path, cfg, "q4-blocks")
    assert blocks_cache.load(cache, key) is None
    packed = BlockModel(cfg, reader, kernel)
    entry = blocks_cache.save(cache, key, packed, path)
    assert entry == tmp_path / "cache" / key
    mapped = blocks_cache.load(cache, key)
    assert mapped is not None and mapped.check()
    back = mapped.matrices
    assert list(back) == [name for name, _ in packed.matrices()]
    for name, matrix in packed.matrices():
        assert (back[name].inputs, back[name].out, back[name].format) == (matrix.inputs, matrix.out, matrix.format)
        np.testing.assert_array_equal(back[name].packed, matrix.packed)
        assert not back[name].packed.flags.writeable  # mapped read-only: the file is never written through
    np.testing.assert_array_equal(logits(cfg, reader, kernel, back), logits(cfg, reader, kernel))


def saved(model, tmp_path) -> tuple[ProgramCache, str, Path, bytearray]:
    """The model packed and saved in a cache of its own: (the cache, the key, its entry, the entry's blocks)."""
    path, cfg, reader, kernel = model
    cache = ProgramCache(tmp_path / "cache")
    key = cache_key(path, cfg, "q4-blocks")
    entry = blocks_cache.save(cache, key, BlockModel(cfg, reader, kernel), path)
    assert entry is not None
    return cache, key, entry, bytearray((entry / blocks_cache.BLOCKS).read_bytes())


@pytest.mark.parametrize("damage", ["flipped", "zeroed", "cut", "manifest"])
def test_a_damaged_entry_is_a_miss_with_a_warning_and_is_removed(model, tmp_path, caplog, damage):
    cache, key, entry, data = saved(model, tmp_path)
    if damage == "flipped":  # one bit of one weight: the kernel would run it and answer wrongly
        data[len(data) // 3] ^= 0x01
        (entry / blocks_cache.BLOCKS).write_bytes(bytes(data))
    elif damage == "zeroed":  # a page that came back from the disk as zeros
        page = slice(len(data) // 2 // 4096 * 4096, len(data) // 2 // 4096 * 4096 + 4096)
        assert any(data[page])
        data[page] = bytes(4096)
        (entry / blocks_cache.BLOCKS).write_bytes(bytes(data))
    elif damage == "cut":  # a disk that filled up midway
        (entry / blocks_cache.BLOCKS).write_bytes(bytes(data[:len(data) // 2]))
    else:
        manifest = json.loads((entry / MANIFEST).read_text())
        del manifest["pieces"]
        (entry / MANIFEST).write_text(json.dumps(manifest))
    with caplog.at_level(logging.WARNING, logger="typewriter.lite"):
        mapped = blocks_cache.load(cache, key)
        if damage in ("cut", "manifest"):  # seen before anything is mapped
            assert mapped is None
        else:  # seen by the check
            assert mapped is not None and entry.exists() and not caplog.text
            assert mapped.check() is False
    assert "q4-blocks cache entry" in caplog.text and "packing the blocks again" in caplog.text
    assert not entry.exists()  # the next save writes it whole


def test_the_check_is_waited_for_at_the_kernels_first_read_and_damage_is_packed_again_then(model, tmp_path):
    path, cfg, reader, kernel = model
    cache, key, entry, data = saved(model, tmp_path)
    data[len(data) // 4] ^= 0x10  # one weight of the first layers
    (entry / blocks_cache.BLOCKS).write_bytes(bytes(data))
    mapped = blocks_cache.load(cache, key)
    assert mapped is not None
    asked, kept = [], []

    def check() -> bool:
        asked.append(True)
        return mapped.check()

    blocks = BlockModel(cfg, reader, kernel, mapped.matrices, check=check,
                        repacked=lambda again: kept.append(blocks_cache.save(cache, key, again, path)))
    runner = LiteRunner(cfg, None, 1, 64, 64, kernel=kernel, weight_format="q4-blocks", blocks=blocks)
    assert asked == [] and kept == []  # made and bound: nothing read yet
    first = runner.extend(0, 0, IDS, all_logits=True)
    assert asked == [True] and kept == [entry]  # asked once, packed again, kept again
    np.testing.assert_array_equal(first, logits(cfg, reader, kernel))  # never the damaged weight
    np.testing.assert_array_equal(runner.extend(0, 0, IDS, all_logits=True), first)
    assert asked == [True]
    again = blocks_cache.load(cache, key)
    assert again is not None and again.check()  # the entry kept whole


def test_no_cache_or_an_unwritable_one_packs_and_keeps_nothing(model, tmp_path, caplog):
    path, cfg, reader, kernel = model
    blocks = BlockModel(cfg, reader, kernel)
    assert blocks_cache.save(ProgramCache(None), "k", blocks, path) is None
    assert blocks_cache.load(ProgramCache(None), "k") is None
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder should be")
    with caplog.at_level(logging.WARNING, logger="typewriter.lite"):
        assert blocks_cache.save(ProgramCache(blocked / "lite"), "k", blocks, path) is None
    assert "could not write" in caplog.text


def load(path, cache, progress=None):
    return assemble.load(path, slots=2, max_context=64, max_queue=2, prefill_budget=8, compile="start",
                        weight_format="q4-blocks", program_cache=str(cache) if cache else None,
                        progress=progress or (lambda _: None))


def answer(path, cache, progress=None):
    """A load's greedy answer to "or so" and its model's config, the engine shut down after it."""
    engine, tokenizer, _ = load(path, cache, progress)
    try:
        return greedy_ids(engine, tokenizer.encode("or so")), engine.runner.cfg
    finally:
        engine.shutdown()


def test_a_second_start_maps_the_blocks_and_answers_the_same_and_a_damaged_entry_is_packed_again(tiny_gguf,
                                                                                                    tmp_path, caplog):
    said: list[str] = []
    first, cfg = answer(tiny_gguf, tmp_path / "lite", said.append)
    assert any("packing the file's blocks" in line for line in said)
    layers = cfg.n_layers
    assert [line for line in said if line.endswith("packed")] == [f"q4-blocks: layer {i}/{layers} packed"
                                                                  for i in range(1, layers + 1)]  # the page's bar
    assert not any("program" in line for line in said)  # q4-blocks makes no programs
    (entry,) = (p for p in (tmp_path / "lite").iterdir() if p.name != "kernels")
    assert entry.name == cache_key(Path(tiny_gguf), cfg, "q4-blocks", blocks_cache.LAYOUT)
    assert entry.name != cache_key(Path(tiny_gguf), cfg, "q4-blocks", "another layout")
    assert sorted(p.name for p in entry.iterdir()) == [blocks_cache.BLOCKS, MANIFEST]
    said.clear()
    assert answer(tiny_gguf, tmp_path / "lite", said.append)[0] == first
    assert any(f"blocks from {tmp_path / 'lite'}" in line for line in said)
    assert not any("packing" in line for line in said)
    data = bytearray((entry / blocks_cache.BLOCKS).read_bytes())
    data[len(data) // 2] ^= 0x80
    (entry / blocks_cache.BLOCKS).write_bytes(bytes(data))
    said.clear()
    with caplog.at_level(logging.WARNING, logger="typewriter.lite"):
        assert answer(tiny_gguf, tmp_path / "lite", said.append)[0] == first  # packed again, not the damage
    assert any(f"blocks from {tmp_path / 'lite'}" in line for line in said)  # mapped, its check under way
    assert "does not match its digests" in caplog.text  # found at the first read, and packed again
    again = blocks_cache.load(ProgramCache(tmp_path / "lite"), entry.name)
    assert again is not None and again.check()  # and saved whole again


def test_a_start_from_cached_blocks_imports_no_gguf_py(tiny_gguf, tmp_path):
    """gguf-py (tens of milliseconds to import) is for packing: a start from cached blocks reads the file's float
    norms and embedding rows itself."""
    answer(tiny_gguf, tmp_path / "lite")  # packs and keeps the blocks
    env = {**os.environ, "TYPEWRITER_LITE_CACHE": str(tmp_path / "lite"), "TYPEWRITER_XLA_CACHE": str(tmp_path)}
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "typewriter", "generate", "or so", "--raw",
                           "--max-new-tokens", "4", "--model", str(tiny_gguf), "--weights", "q4-blocks"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    assert {"typewriter.runners.lite.blocks", "numpy"} <= imported  # the q4-blocks start, traced
    assert sorted(name for name in imported if name.split(".")[0] == "gguf") == []


def test_a_manifest_that_names_other_shapes_is_packed_again_not_read_out_of_bounds(tiny_gguf, tmp_path, caplog):
    """Sizes and digests that match but matrices named for another's shape (the kernel would read past them)."""
    first, _ = answer(tiny_gguf, tmp_path / "lite")
    (entry,) = (p for p in (tmp_path / "lite").iterdir() if p.name != "kernels")
    manifest = json.loads((entry / MANIFEST).read_text())
    by_name = {m[0]: m for m in manifest["matrices"]}
    by_name["layers.0.wq"][0], by_name["layers.0.w_gate"][0] = "layers.0.w_gate", "layers.0.wq"
    (entry / MANIFEST).write_text(json.dumps(manifest))
    said: list[str] = []
    with caplog.at_level(logging.WARNING, logger="typewriter.lite"):
        assert answer(tiny_gguf, tmp_path / "lite", said.append)[0] == first
    assert "does not fit the model" in caplog.text and any("packing the file's blocks" in line for line in said)


def test_the_blocks_entry_is_keyed_by_the_packing_code_not_by_gptqs_rounding_which_rounds_none_of_it(tiny_gguf,
                                                                                                      monkeypatch):
    from typewriter.runners.lite import program_cache

    cfg = read_config(open_source(Path(tiny_gguf))[0])
    blocks_key = cache_key(Path(tiny_gguf), cfg, "q4-blocks", blocks_cache.LAYOUT)
    programs_key = cache_key(Path(tiny_gguf), cfg, "int8-lite")
    monkeypatch.setattr(program_cache, "calibration_text", lambda: "another calibration text")
    assert cache_key(Path(tiny_gguf), cfg, "q4-blocks", blocks_cache.LAYOUT) == blocks_key
    assert cache_key(Path(tiny_gguf), cfg, "int8-lite") != programs_key  # the programs are rounded by it
