"""Weight import: both source formats reach the same canonical arrays; quantized types dequantize within their
error; every malformed source is refused with a ModelFormatError that names what is wrong."""

from __future__ import annotations

import dataclasses
import json
import re

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize
from tiny_model import random_weights, stored_name, tiny_config, write_gguf, write_hf_dir

from typewriter.errors import ModelFormatError
from typewriter.weights import load_weights
from typewriter.weights.dequantize import dequantize as dequantize_fast
from typewriter.weights.gguf_file import permute_rotary
from typewriter.weights.gguf_reader import GGUFReader, _Cursor

CONFIGS = {
    "llama-tied": tiny_config(),
    "llama-untied": tiny_config(tie_embeddings=False),
    "qwen2-qkv-bias": tiny_config(qkv_bias=True),
}


def _config_fields(cfg):
    return dataclasses.replace(cfg, name="", norm_eps=round(cfg.norm_eps, 9))  # GGUF keeps eps as float32


@pytest.mark.parametrize("variant", CONFIGS)
def test_gguf_and_hf_dir_of_the_same_weights_load_to_the_original_arrays(tmp_path, variant):
    cfg = CONFIGS[variant]
    weights = random_weights(cfg)
    gguf_cfg, from_gguf = load_weights(write_gguf(tmp_path / "m.gguf", cfg, weights))
    hf_cfg, from_hf = load_weights(write_hf_dir(tmp_path / "hf", cfg, weights))

    assert _config_fields(gguf_cfg) == _config_fields(hf_cfg) == _config_fields(cfg)
    assert from_gguf.keys() == from_hf.keys() == weights.keys()
    for name, w in weights.items():
        np.testing.assert_array_equal(from_gguf[name], w, err_msg=f"{name} from GGUF")
        np.testing.assert_array_equal(from_hf[name], w, err_msg=f"{name} from the HF directory")


def test_llama_gguf_stores_q_and_k_permuted_and_the_loader_undoes_it(tmp_path):
    cfg = CONFIGS["llama-tied"]
    weights = random_weights(cfg)
    path = write_gguf(tmp_path / "m.gguf", cfg, weights)
    stored = {t.name: np.asarray(t.data).reshape(tuple(reversed(t.shape))) for t in gguf.GGUFReader(path).tensors}
    wq, wk = weights["layers.0.wq"], weights["layers.0.wk"]
    assert not np.array_equal(stored["blk.0.attn_q.weight"], wq)  # so loading it as stored would be wrong
    np.testing.assert_array_equal(stored["blk.0.attn_k.weight"], permute_rotary(wk, cfg.n_kv_heads))
    _, loaded = load_weights(path)
    np.testing.assert_array_equal(loaded["layers.0.wq"], wq)
    np.testing.assert_array_equal(loaded["layers.0.wk"], wk)


def _rotate_half_rope(x, pos, theta=10000.0):
    """x [heads, e]: Hugging Face's layout pairs element i with i + e/2."""
    half = x.shape[-1] // 2
    angle = pos * theta ** (-np.arange(half) * 2 / x.shape[-1])
    x1, x2 = x[:, :half], x[:, half:]
    return np.concatenate([x1 * np.cos(angle) - x2 * np.sin(angle), x2 * np.cos(angle) + x1 * np.sin(angle)], -1)


def _interleaved_rope(x, pos, theta=10000.0):
    """x [heads, e]: llama.cpp's normal (GPT-J) layout pairs element 2i with 2i + 1."""
    half = x.shape[-1] // 2
    angle = pos * theta ** (-np.arange(half) * 2 / x.shape[-1])
    even, odd = x[:, 0::2], x[:, 1::2]
    out = np.empty_like(x)
    out[:, 0::2] = even * np.cos(angle) - odd * np.sin(angle)
    out[:, 1::2] = odd * np.cos(angle) + even * np.sin(angle)
    return out


def test_permuted_rows_under_llama_cpp_rope_give_the_attention_scores_of_hf_rows_under_rotate_half():
    rng = np.random.default_rng(1)
    heads, e, dim = 3, 8, 12
    wq, wk = rng.standard_normal((heads * e, dim)), rng.standard_normal((heads * e, dim))
    x_q, x_k = rng.standard_normal(dim), rng.standard_normal(dim)
    for pq, pk in [(5, 2), (17, 17), (40, 3)]:
        hf = [_rotate_half_rope((w @ x).reshape(heads, e), p) for w, x, p in [(wq, x_q, pq), (wk, x_k, pk)]]
        cpp = [
            _interleaved_rope((permute_rotary(w, heads) @ x).reshape(heads, e), p)
            for w, x, p in [(wq, x_q, pq), (wk, x_k, pk)]
        ]
        np.testing.assert_allclose((hf[0] * hf[1]).sum(-1), (cpp[0] * cpp[1]).sum(-1), rtol=1e-10, atol=1e-10)


# Worst-case |error| per 32-value block, as a fraction of the block's largest |value| (quantizer analysis plus
# the float16 rounding of each block's scale).
BLOCK_ERROR = {Q.Q8_0: 0.6 / 127, Q.Q4_0: 1.02 / 8, Q.Q4_1: 2.2 / 30, Q.Q5_0: 1.02 / 16, Q.Q5_1: 2.2 / 62}
# Float formats: relative rounding error.
RELATIVE_ERROR = {Q.F16: 2.0**-11, Q.BF16: 2.0**-8}


@pytest.mark.parametrize("quant", [*RELATIVE_ERROR, *BLOCK_ERROR], ids=lambda q: q.name)
def test_each_quantized_type_loads_within_its_error_of_the_original(tmp_path, quant):
    cfg = CONFIGS["llama-untied"]
    weights = random_weights(cfg)
    _, loaded = load_weights(write_gguf(tmp_path / "m.gguf", cfg, weights, quant=quant))
    worst = 0.0
    for name, w in weights.items():
        got = loaded[name]
        if w.ndim == 1:
            np.testing.assert_array_equal(got, w, err_msg=f"{name}: norms stay float32")
            continue
        err = np.abs(got - w)
        if quant in RELATIVE_ERROR:
            bound = np.abs(w) * RELATIVE_ERROR[quant] + 1e-7
        else:
            blocks = np.abs(w).reshape(w.shape[0], -1, 32).max(-1, keepdims=True)  # [rows, blocks, 1]
            bound = np.broadcast_to(blocks * BLOCK_ERROR[quant], (*blocks.shape[:2], 32)).reshape(w.shape)
        assert (err <= bound).all(), f"{name}: error {float((err / bound).max()):.2f}x its bound"
        # quantization is row by row and the permutation moves whole rows, so un-permuting is exact
        np.testing.assert_array_equal(got, dequantize(quantize(w, quant), quant).reshape(w.shape), err_msg=name)
        worst = max(worst, float(err.max()))
    assert worst > 0  # the file really held quantized values


@pytest.mark.parametrize("dtype", ["F16", "BF16"])
def test_hf_dir_half_precision_loads_to_the_rounded_original(tmp_path, dtype):
    cfg = CONFIGS["llama-tied"]
    weights = random_weights(cfg)
    _, loaded = load_weights(write_hf_dir(tmp_path / "hf", cfg, weights, dtype=dtype))
    for name, w in weights.items():
        if dtype == "F16":
            expected = w.astype(np.float16).astype(np.float32)
        else:
            expected = (w.view(np.uint32) & 0xFFFF0000).view(np.float32)
        assert not np.array_equal(expected, w)
        np.testing.assert_array_equal(loaded[name], expected, err_msg=name)


# ---- k-quants: gguf-py cannot quantize them, so random blocks are checked against ggml's layout ----


def _scale_min_k4(j, q):
    """ggml's get_scale_min_k4: eight 6-bit scales and mins packed into 12 bytes."""
    q = q.astype(np.int32)
    if j < 4:
        return q[j] & 63, q[j + 4] & 63
    return (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)


def q4_k_reference(block: np.ndarray) -> np.ndarray:
    """One 144-byte block_q4_K -> 256 floats, as ggml's dequantize_row_q4_K."""
    d, dmin = block[0:4].view(np.float16).astype(np.float32)
    scales, qs = block[4:16], block[16:144].astype(np.int32)
    out = []
    for i in range(4):  # 64 values per 32 bytes: low nibbles, then high nibbles
        q = qs[32 * i : 32 * (i + 1)]
        for j, nibbles in ((2 * i, q & 0xF), (2 * i + 1, q >> 4)):
            sc, m = _scale_min_k4(j, scales)
            out.append(d * sc * nibbles - dmin * m)
    return np.concatenate(out).astype(np.float32)


def q6_k_reference(block: np.ndarray) -> np.ndarray:
    """One 210-byte block_q6_K -> 256 floats, as ggml's dequantize_row_q6_K."""
    ql, qh = block[0:128].astype(np.int32), block[128:192].astype(np.int32)
    scales = block[192:208].view(np.int8).astype(np.float32)
    d = block[208:210].view(np.float16).astype(np.float32)[0]
    y = np.zeros(256, np.float32)
    for n in range(2):  # two halves of 128 values
        l_, h_, sc = ql[64 * n :], qh[32 * n :], scales[8 * n :]
        for k in range(32):
            s = k // 16
            y[128 * n + k] = d * sc[s] * (((l_[k] & 0xF) | ((h_[k] & 3) << 4)) - 32)
            y[128 * n + k + 32] = d * sc[s + 2] * (((l_[k + 32] & 0xF) | (((h_[k] >> 2) & 3) << 4)) - 32)
            y[128 * n + k + 64] = d * sc[s + 4] * (((l_[k] >> 4) | (((h_[k] >> 4) & 3) << 4)) - 32)
            y[128 * n + k + 96] = d * sc[s + 6] * (((l_[k + 32] >> 4) | (((h_[k] >> 6) & 3) << 4)) - 32)
    return y


def _random_blocks(kind: Q, rows: int, rng) -> np.ndarray:
    """Random bytes for `rows` blocks, with finite float16 scales where the format keeps them."""
    size = gguf.GGML_QUANT_SIZES[kind][1]
    blocks = rng.integers(0, 256, (rows, size), dtype=np.uint8)
    scales = rng.uniform(0.001, 0.1, (rows, 2)).astype(np.float16).view(np.uint8)  # [rows, 4]
    if kind == Q.Q4_K:
        blocks[:, 0:4] = scales  # d, dmin
    elif kind == Q.Q6_K:
        blocks[:, 208:210] = scales[:, :2]  # d
    return blocks


@pytest.mark.parametrize("kind, reference", [(Q.Q4_K, q4_k_reference), (Q.Q6_K, q6_k_reference)], ids=["Q4_K", "Q6_K"])
def test_k_quant_blocks_load_as_ggmls_layout_says(tmp_path, kind, reference):
    cfg = tiny_config(hidden_dim=256)  # w_down [64, 256]: one 256-value super-block per row
    weights = random_weights(cfg)
    blocks = _random_blocks(kind, cfg.dim, np.random.default_rng(2))
    raw = {"layers.1.w_down": (blocks, kind)}
    _, loaded = load_weights(write_gguf(tmp_path / "m.gguf", cfg, weights, raw=raw))
    expected = np.stack([reference(b) for b in blocks])
    assert np.abs(expected).max() > 0.1
    np.testing.assert_allclose(loaded["layers.1.w_down"], expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(loaded["layers.0.w_down"], weights["layers.0.w_down"])


@pytest.mark.parametrize("kind", [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0], ids=lambda q: q.name)
def test_the_whole_tensor_dequantizer_equals_gguf_pys_on_every_byte_and_scale(kind):
    """Every quant byte value, and scales of every sign and size (subnormal, zero, large), bit for bit."""
    size = gguf.GGML_QUANT_SIZES[kind][1]
    rng = np.random.default_rng(7)
    blocks = rng.integers(0, 256, (4096, size), dtype=np.uint8)
    blocks[:256, -1] = np.arange(256)  # every value of a quant byte (its high nibble too)
    halves = np.array([0.0, -0.0, 6e-8, -3e-5, 1e-3, -0.5, 2.0, 65504.0], np.float16).view(np.uint8).reshape(-1, 2)
    heads = 4 if kind in (Q.Q4_1, Q.Q5_1) else 2  # d (and Q4_1's and Q5_1's m) lead each block
    blocks[:, :heads] = np.tile(halves, (4096 // len(halves), heads // 2))
    got = dequantize_fast(blocks, kind)
    assert got.dtype == np.float32 and got.shape == (4096 * 32,)
    np.testing.assert_array_equal(got, dequantize(blocks, kind).reshape(-1))
    with pytest.raises(ValueError, match="whole"):
        dequantize_fast(blocks.reshape(-1)[:-1], kind)


@pytest.mark.parametrize("kind, dtype", [(Q.F32, np.float32), (Q.F16, np.float16)], ids=["F32", "F16"])
def test_float_tensors_read_as_gguf_py_reads_them_typed_or_as_bytes(kind, dtype):
    values = np.array([0.0, -0.0, 6e-8, -3e-5, 1e-3, -0.5, 2.0, 65504.0, np.inf, -np.inf], dtype)
    for data in (values, values.view(np.uint8)):  # the reader's typed view; a tensor's raw bytes
        got = dequantize_fast(data, kind)
        assert got.dtype == np.float32 and got.shape == (len(values),)
        np.testing.assert_array_equal(got, np.asarray(dequantize(data, kind), np.float32).reshape(-1))


# ---- malformed sources ----


@pytest.fixture(params=["gguf", "hf"])
def write_source(request, tmp_path):
    def write(cfg, weights):
        if request.param == "gguf":
            return write_gguf(tmp_path / "m.gguf", cfg, weights), False
        return write_hf_dir(tmp_path / "hf", cfg, weights), True

    return write


def test_a_tensor_of_the_wrong_shape_is_named_with_both_shapes(write_source):
    cfg = CONFIGS["llama-tied"]
    weights = random_weights(cfg)
    weights["layers.1.w_up"] = np.zeros((cfg.hidden_dim + 32, cfg.dim), np.float32)
    path, hf = write_source(cfg, weights)
    name = stored_name("layers.1.w_up", hf)
    with pytest.raises(ModelFormatError, match=re.escape(f"{name} has shape (160, 64), expected (128, 64)")):
        load_weights(path)


def test_a_missing_tensor_is_named(write_source):
    cfg = CONFIGS["llama-untied"]
    weights = random_weights(cfg)
    del weights["layers.1.wv"]
    path, hf = write_source(cfg, weights)
    with pytest.raises(ModelFormatError, match=re.escape(f"missing tensor {stored_name('layers.1.wv', hf)}")):
        load_weights(path)


def test_an_unsupported_gguf_architecture_is_named(tmp_path):
    cfg = CONFIGS["llama-tied"]
    path = write_gguf(tmp_path / "m.gguf", cfg, random_weights(cfg), arch="falcon")
    with pytest.raises(ModelFormatError, match="architecture 'falcon' is not supported"):
        load_weights(path)


def test_an_unsupported_hf_architecture_is_named(tmp_path):
    cfg = CONFIGS["llama-tied"]
    path = write_hf_dir(tmp_path / "hf", cfg, random_weights(cfg))
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(config | {"architectures": ["FalconForCausalLM"]}))
    with pytest.raises(ModelFormatError, match="architecture 'FalconForCausalLM' is not supported.*GPT2LMHeadModel"):
        load_weights(path)


def test_a_config_missing_a_field_is_named(tmp_path):
    cfg = CONFIGS["llama-tied"]
    path = write_hf_dir(tmp_path / "hf", cfg, random_weights(cfg))
    config = json.loads((path / "config.json").read_text())
    del config["hidden_size"]
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelFormatError, match="hf: the model config lacks 'hidden_size' or has it malformed"):
        load_weights(path)


def test_an_unsupported_quantization_type_is_named_with_its_tensor(tmp_path):
    cfg = CONFIGS["llama-tied"]
    blocks = _random_blocks(Q.IQ4_NL, cfg.hidden_dim * cfg.dim // 32, np.random.default_rng(3))
    raw = {"layers.0.w_up": (blocks.reshape(cfg.hidden_dim, -1), Q.IQ4_NL)}
    path = write_gguf(tmp_path / "m.gguf", cfg, random_weights(cfg), raw=raw)
    with pytest.raises(ModelFormatError, match=r"blk\.0\.ffn_up\.weight has quantization type IQ4_NL"):
        load_weights(path)


@pytest.mark.parametrize("quant", [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_1], ids=lambda q: q.name)
def test_our_gguf_reader_reads_every_field_and_tensor_as_gguf_py_does(tmp_path, quant):
    cfg = CONFIGS["llama-untied"]
    path = write_gguf(tmp_path / "m.gguf", cfg, random_weights(cfg), quant=quant)
    ours, theirs = GGUFReader(path), gguf.GGUFReader(path)
    expected = {k: f.contents() for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
    assert ours.fields == expected and "tokenizer.ggml.tokens" in ours.fields
    assert list(ours.tensors) == [t.name for t in theirs.tensors]
    for t in theirs.tensors:
        mine = ours.tensors[t.name]
        assert (mine.shape, mine.tensor_type) == (tuple(int(d) for d in t.shape), t.tensor_type)
        np.testing.assert_array_equal(mine.data, t.data, err_msg=t.name)


@pytest.mark.parametrize("nul", [False, True], ids=["plain", "a string holding a NUL"])
def test_string_arrays_read_each_string_as_decoding_it_alone_would(tmp_path, nul):
    """Read together, a string's bytes decode as they would alone: a piece of a character at its end or start, an
    invalid byte, an empty string, characters of every width; one holding a NUL is read one string at a time."""
    strings = [b"", b"plain", "é中🙂".encode(), b"\xe4\xb8", b"\xb8\xad", b"\xff", b"a\xc3", b"", "Ġthe".encode(),
               b"\xf0\x9f", b"\x98\x80 x"] + ([b"nul\x00inside"] if nul else [])
    writer = gguf.GGUFWriter(str(tmp_path / "strings.gguf"), "llama")
    writer.add_array("test.strings", strings)
    writer.add_string("test.after", "still read")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    fields = GGUFReader(tmp_path / "strings.gguf").fields
    assert fields["test.strings"] == [piece.decode("utf-8", "replace") for piece in strings]
    assert fields["test.after"] == "still read"
    assert _Cursor(memoryview(b""), 0).strings(0) == []  # gguf-py writes no empty array; a file may hold one


def test_a_gguf_file_naming_more_strings_than_it_holds_is_named_without_making_room_for_them(tmp_path):
    """A count of 2^40 tokens in a file of kilobytes: refused by name, nothing the size of the count allocated."""
    cfg = CONFIGS["llama-tied"]
    path = write_gguf(tmp_path / "m.gguf", cfg, random_weights(cfg))
    data = bytearray(path.read_bytes())
    at = data.index(b"tokenizer.ggml.tokens") + len(b"tokenizer.ggml.tokens") + 8  # the value's type, the items'
    data[at:at + 8] = (1 << 40).to_bytes(8, "little")  # the count
    path.write_bytes(bytes(data))
    with pytest.raises(ModelFormatError, match="not a readable GGUF file.*cannot fit in the file"):
        load_weights(path)


@pytest.mark.parametrize("cut", [3, 20, 200])
def test_a_truncated_gguf_file_is_named_not_a_readable_gguf(tmp_path, cut):
    cfg = CONFIGS["llama-tied"]
    path = write_gguf(tmp_path / "m.gguf", cfg, random_weights(cfg))
    path.write_bytes(path.read_bytes()[:cut] if cut < 200 else path.read_bytes()[:-100])
    with pytest.raises(ModelFormatError, match="not a readable GGUF file"):
        load_weights(path)


@pytest.mark.parametrize("past", [30, 31, 300])
def test_a_gguf_file_cut_inside_its_vocabulary_is_named_not_a_readable_gguf(tmp_path, past):
    cfg = CONFIGS["llama-tied"]
    path = write_gguf(tmp_path / "m.gguf", cfg, random_weights(cfg))
    data = path.read_bytes()
    at = data.index(b"tokenizer.ggml.tokens")  # the array of token strings follows its key
    assert len(data) > at + past + 400
    path.write_bytes(data[:at + past])  # in a string's length, in a string, further on
    with pytest.raises(ModelFormatError, match="not a readable GGUF file"):
        load_weights(path)


# ---- the embedded model ----


@pytest.mark.slow
def test_the_embedded_smollm2_loads_with_its_known_shape(real_weights):
    cfg, weights = real_weights
    assert (cfg.vocab_size, cfg.dim, cfg.n_layers, cfg.hidden_dim) == (49152, 576, 30, 1536)
    assert (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim) == (9, 3, 64)
    assert cfg.rope_theta == 100000.0 and cfg.norm_eps == pytest.approx(1e-5)
    assert cfg.max_position == 8192
    assert cfg.tie_embeddings and not cfg.qkv_bias
    assert "output" not in weights and len(weights) == 2 + 9 * 30
    assert weights["layers.29.wk"].shape == (192, 576)
    assert all(np.isfinite(w).all() for w in weights.values())


# ---- RoPE: plain RoPE over the whole head, or refused at load ----


@pytest.mark.parametrize(
    "key, value, kind, named",
    [
        ("llama.rope.scaling.type", "yarn", gguf.GGUFValueType.STRING, "llama.rope.scaling.type 'yarn'"),
        ("llama.rope.scaling.type", "linear", gguf.GGUFValueType.STRING, "llama.rope.scaling.type 'linear'"),
        ("llama.rope.scale_linear", 4.0, gguf.GGUFValueType.FLOAT32, "llama.rope.scale_linear 4.0"),
        ("llama.rope.dimension_count", 8, gguf.GGUFValueType.UINT32, "llama.rope.dimension_count 8"),
    ],
)
def test_gguf_rope_scaling_the_model_does_not_implement_is_refused_by_field(tmp_path, key, value, kind, named):
    cfg = tiny_config()
    path = write_gguf(tmp_path / "m.gguf", cfg, random_weights(cfg), edit=lambda w: w.add_key_value(key, value, kind))
    with pytest.raises(ModelFormatError, match=f"m.gguf: {named} is not supported.*plain RoPE|m.gguf: {named}"):
        load_weights(path)


def test_gguf_plain_rope_metadata_loads(tmp_path):
    cfg = tiny_config()

    def plain(w):
        w.add_key_value("llama.rope.scaling.type", "none", gguf.GGUFValueType.STRING)
        w.add_key_value("llama.rope.dimension_count", cfg.head_dim, gguf.GGUFValueType.UINT32)

    loaded = load_weights(write_gguf(tmp_path / "m.gguf", cfg, random_weights(cfg), edit=plain))[0]
    assert loaded.head_dim == cfg.head_dim and loaded.rope_theta == cfg.rope_theta


def test_gguf_llama3_rope_frequencies_are_refused(tmp_path):
    cfg = tiny_config()
    path = write_gguf(tmp_path / "m.gguf", cfg, random_weights(cfg),
                      edit=lambda w: w.add_tensor("rope_freqs.weight", np.ones(cfg.head_dim // 2, np.float32)))
    with pytest.raises(ModelFormatError, match="rope_freqs.weight .* not supported"):
        load_weights(path)


@pytest.mark.parametrize(
    "change, named",
    [
        ({"rope_scaling": {"type": "longrope", "long_factor": [1.0]}}, "rope_scaling .*longrope"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_scaling .*llama3"),
        ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling .*linear"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6}}, "rope_parameters .*yarn"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor 0.5"),
    ],
)
def test_hf_rope_scaling_the_model_does_not_implement_is_refused_by_field(tmp_path, change, named):
    cfg = tiny_config()
    path = write_hf_dir(tmp_path / "hf", cfg, random_weights(cfg))
    config = json.loads((path / "config.json").read_text()) | change
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelFormatError, match=f"config.json: {named}.* is not supported"):
        load_weights(path)


def test_hf_default_rope_parameters_load_with_their_theta(tmp_path):
    cfg = tiny_config(rope_theta=500000.0)
    path = write_hf_dir(tmp_path / "hf", cfg, random_weights(cfg))
    config = json.loads((path / "config.json").read_text())
    del config["rope_theta"]
    config |= {"rope_scaling": {"rope_type": "default"}, "rope_parameters": {"rope_type": "default",
                                                                              "rope_theta": 500000.0}}
    (path / "config.json").write_text(json.dumps(config))
    assert load_weights(path)[0].rope_theta == 500000.0


def _header(entries: dict) -> bytes:
    text = json.dumps(entries).encode()
    return len(text).to_bytes(8, "little") + text


@pytest.mark.parametrize("damage, named", [
    (b"\xff" * 64, "header too large"),  # a junk file: its first 8 bytes read as a header of exabytes
    (b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!", "not a valid safetensors file"),
    (_header({"w": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 64]}}) + b"\0" * 8, "not a valid"),
    (_header({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 8]}}) + b"\0" * 8, "not a valid"),
    (_header({"w": {"dtype": "Q9", "shape": [2], "data_offsets": [0, 8]}}) + b"\0" * 8, "not a valid"),
    (b"", "not a valid"),
    (b"\x01" * 7, "header too small"),
    ((10**6).to_bytes(8, "little") + b"{}", "invalid header length"),  # longer than the file
    ((4).to_bytes(8, "little") + b"\xff\xfe\xfd\xfc", "invalid UTF-8"),
    (_header({"w": {"dtype": "F32", "shape": [2**62, 2**62], "data_offsets": [0, 8]}}) + b"\0" * 8, "overflow"),
    (_header({"w": {"dtype": "F32", "shape": [-1, 2], "data_offsets": [0, 8]}}) + b"\0" * 8, "invalid JSON"),
    (_header({"w": {"dtype": "F32", "shape": [2], "data_offsets": ["0", "8"]}}) + b"\0" * 8, "invalid JSON"),
    (_header({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}}) + b"\0" * 8, "invalid offset"),
    (_header({"w": [1, 2]}) + b"\0" * 8, "invalid JSON"),  # an entry that is not an object
    (_header({"__metadata__": {"a": 1}}), "invalid JSON"),  # metadata values must be strings
])
def test_every_malformed_safetensors_header_is_a_named_error(tmp_path, damage, named):
    """A folder of junk as --model once ended in an OverflowError traceback (the header length was not checked)."""
    cfg = CONFIGS["llama-tied"]
    path = write_hf_dir(tmp_path / "hf", cfg, random_weights(cfg))
    (weights_file,) = path.glob("*.safetensors")
    weights_file.write_bytes(damage)
    with pytest.raises(ModelFormatError, match=named) as refused:
        load_weights(path)
    assert weights_file.name in str(refused.value)


@pytest.mark.parametrize("config", [b"\xff\xfe junk", b"{not json", b"[1, 2]"])
def test_a_config_json_that_is_not_a_json_object_is_a_named_error(tmp_path, config):
    cfg = CONFIGS["llama-tied"]
    path = write_hf_dir(tmp_path / "hf", cfg, random_weights(cfg))
    (path / "config.json").write_bytes(config)
    with pytest.raises(ModelFormatError, match="config.json"):
        load_weights(path)
