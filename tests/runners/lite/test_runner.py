"""The int8-lite weight format (lite/): TensorFlow Lite int8 programs with attention on the host, against fp32
and against itself (rows alone or together, cached or from scratch), and through the engine."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import Recorder
from tiny_model import gpt2_config, prefill_all, random_weights, tiny_config

from typewriter import assemble
from typewriter.config import ConfigError, Settings, WeightFormat
from typewriter.engine.request import FinishReason, GenerationRequest, SamplingParams
from typewriter.engine.runner import PrefillChunk
from typewriter.runners.lite import attention
from typewriter.runners.lite.flatbuffer import ProgramBuilder
from typewriter.runners.lite.interpreter import lite_interpreter
from typewriter.runners.lite.kernel import load as load_kernel
from typewriter.runners.lite.programs import make_programs
from typewriter.runners.lite.runner import LiteRunner
from typewriter.runners.lite.start import calibration_ids
from typewriter.runners.rotation import quantize_int8
from typewriter.runners.xla.model import Transformer
from typewriter.weights import load_weights


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64) - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


@pytest.fixture(scope="module", params=[False, True], ids=["llama", "qkv-bias"])
def pair(request):
    cfg = tiny_config(qkv_bias=request.param, tie_embeddings=not request.param)
    weights = random_weights(cfg, seed=11)
    return cfg, weights, Transformer(cfg, weights, slots=1, max_len=64), LiteRunner(cfg, weights, 3, 64, 16)


IDS = [5, 9, 40, 77, 100, 3, 8, 12, 200, 31, 64, 65, 66]


def test_an_int8_matmul_program_resizes_to_any_rows_and_each_row_is_its_own():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((96, 40)).astype(np.float32)
    q = np.clip(np.round(w / (np.abs(w).max(0) / 127)), -127, 127).astype(np.int8)
    scale = (np.abs(w).max(0) / 127).astype(np.float32)
    p = ProgramBuilder(rows=1)
    x_in = p.input(96)
    it = lite_interpreter(p.finish([p.int8_matmul(x_in, q, scale)]), threads=2)
    x = rng.standard_normal((5, 96)).astype(np.float32)
    x[:, 7] *= 30
    outs = []
    for rows in (5, 1):
        it.resize_tensor_input(it.get_input_details()[0]["index"], [rows, 96])
        it.allocate_tensors()
        it.set_tensor(it.get_input_details()[0]["index"], x[:rows])
        it.invoke()
        outs.append(it.get_tensor(it.get_output_details()[0]["index"]))
    want = x @ (q * scale)
    assert outs[0].shape == (5, 40) and outs[1].shape == (1, 40)
    assert np.abs(outs[0] - want).max() < 0.03 * np.abs(want).max()  # 8-bit rows: close, not equal
    np.testing.assert_array_equal(outs[1], outs[0][:1])


def run_program(flatbuffer: bytes, x: np.ndarray) -> np.ndarray:
    it = lite_interpreter(flatbuffer, threads=2)
    it.resize_tensor_input(it.get_input_details()[0]["index"], list(x.shape))
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    return it.get_tensor(it.get_output_details()[0]["index"])


def test_a_matmul_takes_its_rows_to_about_16_bits_where_xnnpack_alone_rounds_them_to_8():
    """Each row goes in twice, as XNNPACK rounds it and that rounding's error; the program must reproduce
    XNNPACK's rounding exactly for the two to add up (else the error would stay at 8 bits' size)."""
    rng = np.random.default_rng(1)
    q, scale = quantize_int8(rng.standard_normal((96, 40)).astype(np.float32))
    x = rng.standard_normal((7, 96)).astype(np.float32) * np.float32([[1e-3], [1], [10], [1], [1], [1], [1]])
    x[3, 7] *= 40  # a row with an outlier channel
    x[4] = np.abs(x[4])  # a row of one sign: XNNPACK's range would start at 0
    x[5] = 0.0  # an all-zero row
    x[6, :] = x[1, :]
    x[6, 0] = np.abs(x[6]).max() * 1.5  # its largest element first
    outputs = {}
    for name, two_pass in (("two", True), ("one", False)):
        p = ProgramBuilder(rows=1)
        x_in = p.input(96)
        outputs[name] = run_program(p.finish([p.int8_matmul(x_in, q, scale, two_pass=two_pass)]), x)
    want = x.astype(np.float64) @ (q * scale.astype(np.float64))
    for row in (0, 1, 2, 3, 4, 6):
        two = np.abs(outputs["two"][row] - want[row]).max()
        one = np.abs(outputs["one"][row] - want[row]).max()
        assert two < 0.02 * one, (row, two, one)
    assert not outputs["two"][5].any()


def test_int8_lite_logits_stay_close_to_fp32(pair):
    cfg, _, fp32, lite = pair
    want = prefill_all(fp32, IDS)
    got = lite.extend(0, 0, IDS, all_logits=True)
    p, q = log_softmax(want), log_softmax(got)
    kl = (np.exp(p) * (p - q)).sum(-1)
    assert got.shape == want.shape == (len(IDS), cfg.vocab_size)
    assert kl.mean() < 0.02 and kl.max() < 0.1, kl
    assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.9


def test_decoding_from_the_cache_gives_what_one_prefill_of_everything_gives(pair):
    _, _, _, lite = pair
    everything = lite.extend(2, 0, IDS, all_logits=True)
    lite.extend(1, 0, IDS[:5])
    lite.extend(1, 5, IDS[5:8])  # a second chunk after the first
    steps = [lite.decode([1], [t], [8 + j])[0] for j, t in enumerate(IDS[8:])]
    np.testing.assert_allclose(np.stack(steps), everything[8:], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("split", [False, True], ids=["one-thread", "two-threads"])
def test_rows_decoded_together_give_what_each_gives_alone(pair, split, monkeypatch):
    _, _, _, lite = pair
    monkeypatch.setattr(attention, "SPLIT_POSITIONS", 0 if split else 10**9)  # numpy's
    if lite.cache.kernel:  # the kernel's helper thread
        lite.cache.kernel.split_from(0 if split else 10**12)
    try:
        for slot in (0, 1):
            lite.extend(slot, 0, IDS[:6 + slot])
        alone = [lite.decode([s], [7], [6 + s])[0] for s in (0, 1)]
        together = lite.decode([0, 1], [7, 7], [6, 7])  # overwrites the same positions with the same K/V
    finally:
        if lite.cache.kernel:
            lite.cache.kernel.split_from(None)
    np.testing.assert_array_equal(together, np.stack(alone))  # the same bits: each row is computed alone


@pytest.mark.parametrize("attention", ["kernel", "numpy"])
def test_a_prompt_prefilled_in_chunks_of_any_sizes_gives_the_same_bits(pair, attention):
    """Greedy answers must not depend on how the scheduler cut a prompt (its budget, what was reused): with int8
    rows a last-bit difference in attention can round an activation the other way and change the answer."""
    cfg, weights, _, _ = pair
    lite = LiteRunner(cfg, weights, 2, 400, 64, kernel="auto" if attention == "kernel" else None)  # several tiles
    assert (lite.cache.kernel is not None) == (attention == "kernel")
    ids = [int(i) for i in np.random.default_rng(5).integers(0, cfg.vocab_size, 330)]
    cuts = {0: [64] * 5 + [10], 1: [1, 7, 64, 13, 2, 64, 50, 3, 64, 40, 22]}
    last, later = {}, {}
    for slot, sizes in cuts.items():
        assert sum(sizes) == len(ids)
        start = 0
        for size in sizes:
            last[slot] = lite.extend(slot, start, ids[start:start + size])
            start += size
        later[slot] = lite.decode([slot], [4], [len(ids)])[0]
    np.testing.assert_array_equal(last[0], last[1])
    np.testing.assert_array_equal(later[0], later[1])
    for layer in range(cfg.n_layers):
        np.testing.assert_array_equal(lite.cache.k[layer][0], lite.cache.k[layer][1])
        np.testing.assert_array_equal(lite.cache.v[layer][0, :, :331], lite.cache.v[layer][1, :, :331])


def test_with_the_kernel_a_decoded_token_is_the_same_bits_as_that_token_prefilled(pair):
    """So a conversation's next turn, which reuses the answer as it was decoded, goes on exactly as the same
    history sent fresh would (issue 8: greedy output identical with and without reuse)."""
    cfg, weights, _, _ = pair
    lite = LiteRunner(cfg, weights, 3, 400, 64)
    assert lite.cache.kernel is not None
    ids = [int(i) for i in np.random.default_rng(6).integers(0, cfg.vocab_size, 300)]
    lite.extend(0, 0, ids[:290])
    decoded = [lite.decode([0, 2], [ids[p], ids[p]], [p, p - 290])[0] for p in range(290, 300)]  # beside another
    np.testing.assert_array_equal(np.stack(decoded[:-1]), lite.extend(1, 0, ids[:299], all_logits=True)[290:])
    np.testing.assert_array_equal(decoded[-1], lite.step([], [], [], [PrefillChunk(1, 299, ids[299:])]).prefilled[0])
    for layer in range(cfg.n_layers):
        np.testing.assert_array_equal(lite.cache.k[layer][0], lite.cache.k[layer][1])


def test_the_kernel_and_numpy_attend_alike(pair):
    cfg = pair[0]
    rng = np.random.default_rng(7)
    width = (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim
    qkv = [rng.standard_normal((n, width)).astype(np.float32) for n in (150, 40, 2)]
    runs = []
    for kernel in (load_kernel(None), None):
        cache = attention.HostCache(cfg, 2, 256, kernel)
        runs.append([cache.extend(0, qkv[0], 0, 0), cache.extend(0, qkv[1], 0, 150), cache.extend(1, qkv[0][:7], 0, 0),
                     cache.decode(0, qkv[2], np.array([0, 1]), np.array([190, 7]))])
    for ours, theirs in zip(*runs):  # the kernel keeps float16 keys and values
        np.testing.assert_allclose(ours, theirs, rtol=3e-3, atol=3e-3)


def test_one_pass_of_a_whole_step_gives_what_its_separate_calls_give(pair):
    _, _, _, lite = pair
    lite.extend(0, 0, IDS[:6])
    lite.extend(1, 0, IDS[:4])
    alone = lite.decode([0], [7], [6])[0], lite.extend(1, 4, IDS[4:9]), lite.extend(2, 0, IDS[:3])
    out = lite.step([0], [7], [6], [PrefillChunk(1, 4, IDS[4:9]), PrefillChunk(2, 0, IDS[:3])])  # the same K/V again
    decoded, prefilled = out.decoded, out.prefilled
    assert decoded.shape == (1, lite.vocab_size) and len(prefilled) == 2
    np.testing.assert_allclose(np.stack([decoded[0], *prefilled]), np.stack(alone), rtol=1e-5, atol=1e-5)
    later = lite.decode([1, 2], [4, 4], [9, 3])  # each slot goes on from what the one pass wrote
    np.testing.assert_allclose(later[0], lite.extend(1, 0, [*IDS[:9], 4]), rtol=1e-4, atol=1e-4)
    # A chunk that does not end its prompt needs no logits: None in its place, the others the same.
    again = lite.step([0], [7], [6], [PrefillChunk(1, 4, IDS[4:9], wants_logits=False), PrefillChunk(2, 0, IDS[:3])])
    decoded_again, partial = again.decoded, again.prefilled
    assert partial[0] is None
    np.testing.assert_allclose(np.stack([decoded_again[0], partial[1]]), np.stack([decoded[0], prefilled[1]]),
                               rtol=1e-5, atol=1e-5)


def test_a_copied_slot_continues_as_the_original(pair):
    _, _, _, lite = pair
    lite.extend(0, 0, IDS[:9])
    lite.copy_slot(0, 2)
    np.testing.assert_array_equal(lite.decode([2], [4], [9]), lite.decode([0], [4], [9]))


def test_positions_past_the_cache_are_refused_by_name(pair):
    _, _, _, lite = pair
    with pytest.raises(ValueError, match="past the cache's 64"):
        lite.extend(0, 60, IDS[:6])
    with pytest.raises(ValueError, match="past the cache's 64"):
        lite.decode([0], [1], [64])


def test_the_format_is_a_setting_and_other_families_are_refused_by_name():
    assert Settings.from_env({"TYPEWRITER_WEIGHTS": "int8-lite"}).model.weights == "int8-lite"
    with pytest.raises(ConfigError, match="int8-lite"):
        Settings.from_env({"TYPEWRITER_WEIGHTS": "int4"})
    cfg = gpt2_config()
    with pytest.raises(ValueError, match="int8-lite weight format runs Llama-family models.*gpt2"):
        LiteRunner(cfg, random_weights(tiny_config()), slots=1, max_len=32, max_chunk=32)


def test_the_engine_answers_concurrently_as_one_cacheless_prefill_per_token(tiny_gguf, capfd):
    engine, tokenizer, _ = assemble.load(tiny_gguf, slots=2, max_context=64, max_queue=2, prefill_budget=8,
                                        compile="start", weight_format="int8-lite")
    try:
        assert isinstance(engine.runner, LiteRunner)
        reference = LiteRunner(*load_weights(tiny_gguf), slots=1, max_len=64, max_chunk=64,
                               calibration=calibration_ids(tokenizer.encode))  # rounded as the server rounds
        prompts = {"chat": tokenizer.encode_chat([{"role": "user", "content": "hello"}], system=""),
                   "raw": tokenizer.encode("or")}
        greedy = SamplingParams(max_new_tokens=12, temperature=0.0, repetition_penalty=1.0)
        recs = {name: Recorder() for name in prompts}
        for name, ids in prompts.items():
            engine.submit(GenerationRequest(name, ids, greedy), recs[name])
        for name, ids in prompts.items():
            assert recs[name].wait().reason in (FinishReason.LENGTH, FinishReason.EOS)
            expected, seq = [], list(ids)
            for _ in range(12):
                seq.append(int(reference.extend(0, 0, seq).argmax()))
                expected.append(seq[-1])
                if seq[-1] in tokenizer.eos_token_ids:
                    break
            assert [t.token_id for t in recs[name].tokens] == expected, name
    finally:
        engine.shutdown()
    assert "XNNPACK" not in capfd.readouterr().err  # its notice per interpreter is filtered


def test_int8_lite_fast_keeps_rows_at_8_bits_and_stays_close_to_fp32(tmp_path):
    cfg = tiny_config()
    weights = random_weights(cfg, seed=11)
    assert Settings.from_env({"TYPEWRITER_WEIGHTS": "int8-lite-fast"}).model.weights == "int8-lite-fast"
    fast = LiteRunner(cfg, weights, slots=1, max_len=64, max_chunk=64, weight_format=WeightFormat.INT8_LITE_FAST)
    exact = LiteRunner(cfg, weights, slots=1, max_len=64, max_chunk=64, weight_format=WeightFormat.INT8_LITE)
    assert (fast.weight_format, exact.weight_format) == ("int8-lite-fast", "int8-lite")
    for fmt in ("int8-lite", "int8-lite-fast"):
        (tmp_path / fmt).mkdir()
    sizes = {fmt: make_programs(cfg, weights, tmp_path / fmt, two_pass=fmt == "int8-lite").layer(0).stat().st_size
             for fmt in ("int8-lite", "int8-lite-fast")}
    assert sizes["int8-lite-fast"] < sizes["int8-lite"]  # no second pass in its programs
    want = log_softmax(prefill_all(Transformer(cfg, weights, slots=1, max_len=64), IDS))
    for runner in (fast, exact):
        got = log_softmax(runner.extend(0, 0, IDS, all_logits=True))
        assert (np.exp(want) * (want - got)).sum(-1).mean() < 0.02
    with pytest.raises(ValueError, match="not 'int8'"):
        LiteRunner(cfg, weights, 1, 64, 16, weight_format="int8")
