"""q4-blocks (lite/blocks.py, blocks.c): the GGUF file's blocks repacked exactly, the kernel's products on them
(AVX-512 VNNI and AVX2 alike, each row alone), and the runner (no programs: every step by the kernel) against fp32
and against itself."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize
from helpers import Recorder
from tiny_model import prefill_all, random_weights, tiny_config, write_gguf

from typewriter import assemble
from typewriter.config import Settings, WeightFormat
from typewriter.engine.request import FinishReason, GenerationRequest, SamplingParams
from typewriter.engine.runner import PrefillChunk
from typewriter.runners.lite import blocks as blocks_module
from typewriter.runners.lite.blocks import Blocks, BlocksKernel, blocks_of, rounded_to_q8
from typewriter.runners.lite.kernel import load as load_kernel
from typewriter.runners.lite.runner import LiteRunner
from typewriter.runners.xla.model import Transformer
from typewriter.weights import load_weights
from typewriter.weights.source import open_source, weight_reader

IDS = [5, 9, 40, 77, 100, 3, 8, 12, 200, 31, 64, 65, 66]


@pytest.fixture(scope="module")
def kernel():
    k = load_kernel(None)
    assert k is not None, "the kernel builds wherever the tests run"
    return BlocksKernel(k)


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64) - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def kl(want: np.ndarray, got: np.ndarray) -> np.ndarray:
    p, q = log_softmax(want), log_softmax(got)
    return (np.exp(p) * (p - q)).sum(-1)


def k_quant_blocks(kind: Q, out: int, n: int, rng) -> np.ndarray:
    """Random Q4_K, Q5_K or Q6_K rows [out, row bytes] with their float16 scales in a weight's range."""
    size = {Q.Q4_K: 144, Q.Q5_K: 176, Q.Q6_K: 210}[kind]
    raw = rng.integers(0, 256, (out * n // 256, size), dtype=np.uint8)
    scales = rng.uniform(1e-3, 4e-3, (len(raw), 2)).astype(np.float16).view(np.uint8)
    if kind in (Q.Q4_K, Q.Q5_K):
        raw[:, 0:4] = scales  # d, dmin
    else:
        raw[:, 208:210] = scales[:, :2]  # d, at the end
    return raw.reshape(out, -1)


@pytest.mark.parametrize("kind", [Q.Q4_0, Q.Q4_1, Q.Q8_0, Q.Q5_0, Q.Q5_1])
def test_the_file_s_own_block_types_repack_to_exactly_the_values_gguf_dequantizes(kind):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((48, 128)).astype(np.float32)
    raw = quantize(w, kind)
    blocks = blocks_of(raw, kind, 48, 128)
    assert blocks.format == {Q.Q4_0: 4, Q.Q4_1: 41, Q.Q8_0: 8, Q.Q5_0: 5, Q.Q5_1: 51}[kind]
    np.testing.assert_array_equal(blocks.dequantized(), dequantize(raw, kind))


def test_q5_k_repacks_to_its_sub_blocks_up_to_float16_scales():
    rng = np.random.default_rng(2)
    raw = k_quant_blocks(Q.Q5_K, 32, 512, rng)
    blocks = blocks_of(raw, Q.Q5_K, 32, 512)
    want = dequantize(raw, Q.Q5_K)
    assert blocks.format == 51 and blocks.mins is not None and blocks.supers is None
    assert blocks.q.min() >= 0 and blocks.q.max() == 31  # the fifth bits are there
    step = blocks.scales.astype(np.float32).repeat(32, axis=1)  # a step of each weight's block
    assert np.abs(blocks.dequantized() - want).max() < 0.02 * step.max()  # float16 scales: far below a step


@pytest.mark.parametrize("kind, fmt, scales", [(Q.Q4_K, 42, (32, 512 // 32)), (Q.Q6_K, 62, (32, 512 // 16))])
def test_q4_k_and_q6_k_repack_their_scales_as_the_file_has_them_to_exactly_what_gguf_dequantizes(kind, fmt, scales):
    rng = np.random.default_rng(2)
    raw = k_quant_blocks(kind, 32, 512, rng)
    blocks = blocks_of(raw, kind, 32, 512)
    assert blocks.format == fmt and blocks.scales.shape == scales and blocks.supers is not None
    assert blocks.supers.shape == (32, 512 // 256, 2 if kind == Q.Q4_K else 1)
    if kind == Q.Q4_K:
        assert blocks.q.min() == 0 and blocks.q.max() == 15 and blocks.scales.max() == blocks.mins.max() == 63
    else:
        assert blocks.q.min() == -32 and blocks.q.max() == 31  # both high bits are there
        assert blocks.mins is None and blocks.scales.min() < 0 < blocks.scales.max()
    np.testing.assert_array_equal(blocks.dequantized(), dequantize(raw, kind))


@pytest.mark.parametrize("kind, per_block", [(Q.Q4_K, 18.5), (Q.Q6_K, 26.5)])
def test_k_quants_pack_within_a_fortieth_of_their_file_s_bytes(kernel, kind, per_block):
    """A group of 16 outputs holds each super-block's float16 d (Q4_K's dmin too) once: Q4_K's 144 bytes a
    super-block of 256 but for its 6-bit scales and minimums kept a byte each, Q6_K's 210 and 2 to keep its blocks on
    cache lines."""
    raw = k_quant_blocks(kind, 48, 1024, np.random.default_rng(3))
    packed = kernel.pack(blocks_of(raw, kind, 48, 1024))
    assert packed.packed.nbytes == 48 * 1024 // 32 * per_block
    assert kernel.bytes(1024 + 32, 48, 42) == kernel.bytes(1024 + 32, 48, 62) == 0  # whole super-blocks only


def test_other_types_round_to_8_bit_blocks_within_half_a_step():
    rng = np.random.default_rng(3)
    want = (rng.standard_normal((16, 256)) * 0.02).astype(np.float16)
    blocks = blocks_of(want, Q.F16, 16, 256)
    want = want.astype(np.float32)
    half_step = blocks.scales.astype(np.float32).repeat(32, axis=1) * 0.51  # float16 scales: a hair over half
    assert blocks.format == 8 and (np.abs(blocks.dequantized() - want) <= half_step).all()
    zero = rounded_to_q8(np.zeros((16, 64), np.float32))
    assert not zero.dequantized().any()


def rows_at_8_bits(x: np.ndarray) -> np.ndarray:
    """x [rows, in] as the kernel rounds it: 8 bits a block of 32, to nearest even."""
    b = x.reshape(x.shape[0], -1, 32)
    top = np.abs(b).max(-1, keepdims=True)
    inv = np.where(top > 0, np.float32(127) / np.where(top > 0, top, 1), 0).astype(np.float32)
    return (np.rint(b * inv) * (top / np.float32(127))).reshape(x.shape)


def some_blocks(fmt: str, out: int, n: int, rng) -> Blocks:
    if fmt == "q8":
        return rounded_to_q8(rng.standard_normal((out, n)).astype(np.float32))
    if fmt in ("q4k", "q6k"):
        kind = Q.Q4_K if fmt == "q4k" else Q.Q6_K
        return blocks_of(k_quant_blocks(kind, out, n, rng).reshape(-1), kind, out, n)
    levels = {"q5": 32, "q5m": 32}.get(fmt, 16)
    q = rng.integers(0, levels, (out, n)).astype(np.int8) - np.int8(levels // 2 if fmt in ("q4", "q5") else 0)
    mins = rng.uniform(-0.1, 0.1, (out, n // 32)).astype(np.float16) if fmt.endswith("m") else None
    code = {"q4": 4, "q4m": 41, "q5": 5, "q5m": 51}[fmt]
    scales = rng.uniform(0.01, 0.02, (out, n // 32)) * rng.choice([-1, 1], (out, n // 32))
    return Blocks(q, scales.astype(np.float16), mins, code)


@pytest.mark.parametrize("fmt", ["q4", "q4m", "q4k", "q5", "q5m", "q6k", "q8"])
@pytest.mark.parametrize("out", [80, 265], ids=["whole-groups", "a-padded-group"])
def test_the_kernel_multiplies_8_bit_rows_by_the_blocks_on_avx512_and_avx2_to_the_same_bits(kernel, fmt, out):
    rng = np.random.default_rng(4)
    blocks = some_blocks(fmt, out, 512, rng)  # two of a K-quant's super-blocks
    packed = kernel.pack(blocks)
    x = rng.standard_normal((11, 512)).astype(np.float32)
    x[3, 5] *= 50  # an outlier spoils only its own block's steps
    x[4] = 0.0
    want = rows_at_8_bits(x).astype(np.float64) @ blocks.dequantized().T.astype(np.float64)
    paths = {}
    for wide in ([True, False] if kernel.wide else [False]):  # without AVX-512 VNNI, AVX2 alone
        kernel.set_wide(wide)
        try:
            paths[wide] = kernel.matmul(packed, x, threads=2)
            for few in (slice(0, 1), slice(3, 6)):  # a row alone and in a short tile: its own bits
                np.testing.assert_array_equal(kernel.matmul(packed, x[few], threads=2), paths[wide][few])
        finally:
            kernel.set_wide(True)
    got = paths[False]
    assert got.shape == (11, out)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * np.abs(want).max())
    assert not got[4].any()
    if True in paths:
        np.testing.assert_array_equal(paths[True], paths[False])


def test_q5_0_held_at_5_bits_gives_the_bits_it_gave_at_8(kernel):
    """Q5 reads 22 bytes a block of 32 where Q8 read 34, and its sums are the same exact integers."""
    rng = np.random.default_rng(6)
    raw = quantize(rng.standard_normal((40, 256)).astype(np.float32), Q.Q5_0)
    five = blocks_of(raw, Q.Q5_0, 40, 256)
    eight = Blocks(five.q, five.scales, None, 8)
    x = rng.standard_normal((7, 256)).astype(np.float32)
    packed = kernel.pack(five)
    assert packed.packed.nbytes * 34 == kernel.pack(eight).packed.nbytes * 22
    np.testing.assert_array_equal(kernel.matmul(packed, x, threads=2), kernel.matmul(kernel.pack(eight), x, threads=2))


def test_a_row_gets_the_same_bits_alone_beside_others_and_on_either_thread_count(kernel):
    rng = np.random.default_rng(5)
    packed = kernel.pack(some_blocks("q4m", 512, 128, rng))
    x = rng.standard_normal((9, 128)).astype(np.float32)
    together = kernel.matmul(packed, x, threads=2)
    for row in (0, 4, 8):
        np.testing.assert_array_equal(kernel.matmul(packed, x[row:row + 1], threads=1)[0], together[row])
    with pytest.raises(ValueError, match="do not fit"):
        kernel.matmul(packed, x[:, :64])


# ---- the runner ----

@pytest.fixture(scope="module", params=[Q.Q4_1, Q.Q4_0])
def quantized(request, tmp_path_factory):
    """A tiny llama (Q/K rows permuted as llama.cpp stores them) in one of the file types q4-blocks runs exactly,
    its fp32 reference (the same file dequantized), and a q4-blocks runner on it."""
    cfg = tiny_config(tie_embeddings=False)
    path = write_gguf(tmp_path_factory.mktemp("q4") / "tiny.gguf", cfg, random_weights(cfg, seed=11),
                      quant=request.param)
    cfg, weights = load_weights(path)
    _, reader = weight_reader(open_source(path)[0])
    runner = LiteRunner(cfg, reader, 3, 400, 64, weight_format=WeightFormat.Q4_BLOCKS)
    return cfg, Transformer(cfg, weights, slots=1, max_len=64), runner


def test_q4_blocks_is_a_setting():
    assert Settings.from_env({"TYPEWRITER_WEIGHTS": "q4-blocks"}).model.weights == WeightFormat.Q4_BLOCKS
    assert WeightFormat.Q4_BLOCKS.lite


def test_decode_steps_stay_close_to_fp32_on_the_file_s_own_blocks(quantized):
    cfg, fp32, runner = quantized
    want = prefill_all(fp32, IDS)
    got = np.stack([runner.decode([0], [t], [p])[0] for p, t in enumerate(IDS)])  # one row a step: the kernel's
    divergence = kl(want, got)
    assert divergence.mean() < 2e-3 and divergence.max() < 1e-2, divergence  # 8-bit rows on the file's weights
    assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.9  # random weights have near-ties
    described = runner.describe()
    assert described["blocks"] == {"avx512_vnni": runner.blocks.kernel.wide, "bytes": runner.blocks.nbytes}
    assert runner.programs is None and described["programs"] == {"made_at_load": 0}  # held once, as blocks


def test_embedding_rows_kept_are_the_file_s_rows_and_stay_bounded(quantized, monkeypatch):
    cfg, _, runner = quantized
    model = runner.blocks
    _, reader = weight_reader(open_source(model._gguf.path)[0])
    want = reader.rows("tok_embeddings", 0, cfg.vocab_size)
    monkeypatch.setattr(blocks_module, "EMBEDDING_ROWS_KEPT", 5)
    model._rows_kept.clear()
    ids = [3, 1, 3, 7, 2, 9, 11, 3, 1, 0, 5, 7]
    got = model.embed(ids)
    np.testing.assert_array_equal(got, want[ids])
    got[:] = 0  # the caller's copy: the rows kept are untouched
    np.testing.assert_array_equal(model.embed(ids), want[ids])
    assert len(model._rows_kept) == 5


def test_a_decoded_token_is_the_same_bits_as_that_token_in_a_chunk(quantized):
    _, _, runner = quantized
    chunk = runner.extend(1, 0, IDS, all_logits=True)  # a chunk of rows, in one kernel call
    decoded = [runner.decode([2], [t], [p])[0] for p, t in enumerate(IDS)]
    np.testing.assert_array_equal(np.stack(decoded), chunk)
    for layer in range(runner.cfg.n_layers):
        np.testing.assert_array_equal(runner.cache.k[layer][1], runner.cache.k[layer][2])


def test_rows_decoded_together_give_what_each_gives_alone(quantized):
    _, _, runner = quantized
    for slot in (0, 1):
        runner.extend(slot, 0, IDS[:6 + slot])
    alone = [runner.decode([s], [7], [6 + s])[0] for s in (0, 1)]
    together = runner.step([0, 1], [7, 7], [6, 7], [PrefillChunk(2, 0, IDS[:3])])
    np.testing.assert_array_equal(together.decoded, np.stack(alone))


def test_a_chunk_that_checks_a_draft_gives_each_row_the_bits_decoding_it_alone_gives(quantized):
    """Beside a decode row and a prompt's chunk in the same step: the check's logits [n, v] after each of its
    tokens, what the engine takes a draft's tokens from (engine/drafting.py)."""
    _, _, runner = quantized
    assert runner.checks_drafts
    for slot in (0, 1, 2):
        runner.extend(slot, 0, IDS[:8])
    alone = np.stack([runner.decode([2], [t], [8 + p])[0] for p, t in enumerate(IDS[8:13])])
    decode_alone = runner.decode([0], [IDS[3]], [8])[0]
    runner.extend(0, 0, IDS[:8])
    out = runner.step([0], [IDS[3]], [8], [PrefillChunk(1, 8, IDS[8:13], every_logits=True)])
    assert out.prefilled[0].shape == (5, runner.vocab_size)
    np.testing.assert_array_equal(out.prefilled[0], alone)
    np.testing.assert_array_equal(out.decoded[0], decode_alone)
    for layer in range(runner.cfg.n_layers):  # the check's K/V written as decoding writes them (keys in tiles)
        np.testing.assert_array_equal(runner.cache.k[layer][1][:, 0, :, :13], runner.cache.k[layer][2][:, 0, :, :13])
        np.testing.assert_array_equal(runner.cache.v[layer][1][:, :13], runner.cache.v[layer][2][:, :13])


def test_one_thread_and_two_give_the_same_bits_with_each_layer_s_attention_shared(tmp_path):
    """On two threads each layer's attention groups (one a kv head of a decode row) are shared with blocks.c's
    helper; each group is computed alone, so the logits and the cache are the bits one thread gives. A model wide
    enough that its matmuls keep the helper spinning, and a context long enough that it takes groups."""
    cfg = tiny_config(dim=256, n_heads=8, n_kv_heads=4, hidden_dim=512, max_position=1024, tie_embeddings=False)
    path = write_gguf(tmp_path / "wide.gguf", cfg, random_weights(cfg, seed=5), quant=Q.Q4_0)
    cfg, _ = load_weights(path)
    runner = LiteRunner(cfg, weight_reader(open_source(path)[0])[1], 2, 1024, 64,
                        weight_format=WeightFormat.Q4_BLOCKS)
    assert runner.cache.threads == 2
    prompt = [int(i) for i in np.random.default_rng(2).integers(0, cfg.vocab_size, 700)]
    logits, shared = {}, {}
    for slot, threads in ((0, 1), (1, 2)):
        runner.cache.threads = threads
        before = runner.cache.kernel.shared_groups()
        runner.extend(slot, 0, prompt)
        logits[threads] = np.stack([runner.decode([slot], [t], [700 + p])[0] for p, t in enumerate(IDS * 4)])
        shared[threads] = runner.cache.kernel.shared_groups() - before
    assert shared[1] == 0 and shared[2] > 0, shared  # the helper took groups: the bits below are its too
    np.testing.assert_array_equal(logits[1], logits[2])
    for layer in range(cfg.n_layers):
        np.testing.assert_array_equal(runner.cache.k[layer][0], runner.cache.k[layer][1])
        np.testing.assert_array_equal(runner.cache.v[layer][0], runner.cache.v[layer][1])


def test_a_long_prompt_in_chunks_stays_close_to_fp32_and_decodes_as_in_one_call(quantized):
    """40 tokens in chunks of 8 and in one call: the same bits (each row alone), close to fp32, and the decode step
    after either reads the same cache."""
    cfg, fp32, runner = quantized
    ids = [int(i) for i in np.random.default_rng(6).integers(0, cfg.vocab_size, 40)]
    whole = runner.extend(0, 0, ids[:-1], all_logits=True)
    chunked = np.concatenate([runner.extend(1, start, ids[start:min(start + 8, 39)], all_logits=True)
                              for start in range(0, 39, 8)])
    np.testing.assert_array_equal(whole, chunked)
    assert kl(prefill_all(fp32, ids[:-1]), whole).mean() < 2e-3
    after_whole, after_chunks = (runner.decode([s], [ids[-1]], [39])[0] for s in (0, 1))
    np.testing.assert_array_equal(after_whole, after_chunks)


def test_q4_blocks_needs_the_kernel_and_a_llama():
    cfg = tiny_config()
    with pytest.raises(ValueError, match="q4-blocks runs in the C kernel"):
        LiteRunner(cfg, random_weights(cfg), 1, 32, 32, kernel=None, weight_format=WeightFormat.Q4_BLOCKS)


def test_the_engine_answers_greedily_as_the_kernel_prefills_the_whole_text(tiny_gguf):
    engine, tokenizer, _ = assemble.load(tiny_gguf, slots=2, max_context=64, max_queue=2, prefill_budget=8,
                                        compile="start", weight_format="q4-blocks")
    try:
        runner = engine.runner
        assert isinstance(runner, LiteRunner) and runner.blocks is not None
        assert runner.describe()["weights"] == "q4-blocks"
        _, reader = weight_reader(open_source(tiny_gguf)[0])
        reference = LiteRunner(runner.cfg, reader, slots=1, max_len=64, max_chunk=64, calibration=None,
                               weight_format=WeightFormat.Q4_BLOCKS)
        ids = tokenizer.encode("or so the story goes, or so")  # a prefill of several rows, then decode steps
        greedy = SamplingParams(max_new_tokens=10, temperature=0.0, repetition_penalty=1.0)
        rec = Recorder()
        engine.submit(GenerationRequest("raw", ids, greedy), rec)
        assert rec.wait().reason in (FinishReason.LENGTH, FinishReason.EOS)
        expected, seq = [], list(ids)
        for _ in range(10):
            seq.append(int(reference.extend(0, 0, seq).argmax()))
            expected.append(seq[-1])
            if seq[-1] in tokenizer.eos_token_ids:
                break
        assert [t.token_id for t in rec.tokens] == expected
    finally:
        engine.shutdown()
