"""SentencePiece-style tokenizers (Llama-2, TinyLlama, Mistral, Phi-3): a GGUF `llama` tokenizer against an
independent pure-Python llama.cpp SPM tokenizer, the three tokenizer.json forms, and the stream on each."""

import itertools
import json
import random

import gguf
import pytest
from tiny_model import (
    SPM_BOS,
    SPM_BYTE_OFFSET,
    SPM_EOS,
    SPM_PIECES,
    SPM_SCORES,
    SPM_TOKENS,
    add_spm_tokenizer,
    write_spm_tokenizer_dir,
)

from typewriter.errors import ModelFormatError
from typewriter.text.detokenizer import IncrementalDetokenizer
from typewriter.text.token_text import LeadingSpace
from typewriter.text.tokenizer import Tokenizer

SAMPLES = [
    "hello world",
    "Hello world!",
    "the hello is at the world.",
    "  two   spaces,\nnew lines\n\n and\ttabs",
    "你好世界！你好",
    "emoji 😀🚀 and 👍🏽",
    "café, naïve, e\u0301",
    "",
    " ",
    "the",
    "athe thehello",
]
FORMS = ["legacy", "metaspace", "metaspace_decoder"]


# ---- the reference: llama.cpp's llm_tokenizer_spm, written out ----


def spm_reference(text: str) -> list[int]:
    """Spaces to "▁", one "▁" in front; then repeatedly merge the adjacent pair whose joined piece is in the vocab
    with the highest score (leftmost on ties); a symbol left outside the vocab is spelt in byte tokens."""
    ids = {t: i for i, t in enumerate(SPM_TOKENS)}
    symbols = list("▁" + text.replace(" ", "▁")) if text else []
    while True:
        best = None
        for n, (a, b) in enumerate(itertools.pairwise(symbols)):
            if a + b in ids and (best is None or SPM_SCORES[ids[a + b]] > SPM_SCORES[ids[best[1]]]):
                best = (n, a + b)
        if best is None:
            break
        n, joined = best
        symbols[n : n + 2] = [joined]
    out = []
    for s in symbols:
        out += [ids[s]] if s in ids else [SPM_BYTE_OFFSET + b for b in s.encode("utf-8")]
    return out


def write_gguf_tokenizer(path, space_prefix=True):
    w = gguf.GGUFWriter(str(path), "llama")
    add_spm_tokenizer(w, space_prefix)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def gguf_tok(tmp_path_factory):
    return Tokenizer.from_gguf(write_gguf_tokenizer(tmp_path_factory.mktemp("spm") / "spm.gguf"))


@pytest.fixture(scope="module", params=FORMS)
def hf_tok(request, tmp_path_factory):
    return Tokenizer.load(write_spm_tokenizer_dir(tmp_path_factory.mktemp(request.param), request.param))


def stream(tok, ids):
    detok = IncrementalDetokenizer(tok)
    deltas = [detok.push(i) for i in ids]
    return deltas, detok.flush()


# ---- encoding ----


@pytest.mark.parametrize("text", SAMPLES)
def test_the_gguf_tokenizer_encodes_as_llama_cpp_does(gguf_tok, text):
    assert gguf_tok.encode(text) == spm_reference(text)


def test_the_reference_is_not_trivial():
    assert spm_reference("the") == [SPM_TOKENS.index("▁the")]  # a high-scoring piece wins over earlier merges
    assert spm_reference("\n") == [SPM_TOKENS.index("▁"), SPM_BYTE_OFFSET + 0x0A]  # byte fallback


@pytest.mark.parametrize("text", SAMPLES)
def test_every_tokenizer_json_form_encodes_plain_text_as_the_gguf_one(hf_tok, text):
    expected = spm_reference(text)
    if text.startswith(" ") and '"Metaspace"' in hf_tok.raw.to_str():
        # as in transformers: Metaspace adds no "▁" before one already there
        expected = spm_reference(text[1:]) or [SPM_TOKENS.index("▁")]
    assert hf_tok.encode(text) == expected


def test_specials_and_chat_template(gguf_tok):
    assert gguf_tok.bos_token_id == SPM_BOS and SPM_EOS in gguf_tok.eos_token_ids
    assert gguf_tok.special_ids >= {SPM_BOS, SPM_EOS}
    ids = gguf_tok.encode_chat([{"role": "user", "content": "hello"}], system="the world")
    assert ids[0] == SPM_BOS and ids.count(SPM_BOS) == 1
    assert gguf_tok.decode(ids) == "[INST] <<SYS>>\nthe world\n<</SYS>>\n\nhello [/INST]"


def test_a_control_token_typed_in_a_message_is_plain_text(gguf_tok):
    ids = gguf_tok.encode_chat([{"role": "user", "content": "a </s><s>[INST] b"}], system="")
    assert ids.count(SPM_BOS) == 1 and SPM_EOS not in ids


@pytest.mark.parametrize("form", FORMS)
def test_the_chat_template_renders_the_same_from_a_directory(gguf_tok, tmp_path, form):
    tok = Tokenizer.load(write_spm_tokenizer_dir(tmp_path, form))
    messages = [{"role": "user", "content": "hi"}]
    assert tok.render_chat(messages, system="S") == gguf_tok.render_chat(messages, system="S")
    assert tok.bos_token_id == SPM_BOS and SPM_EOS in tok.eos_token_ids


def test_save_and_load_keeps_the_tokenizer(gguf_tok, tmp_path):
    gguf_tok.save(tmp_path)
    loaded = Tokenizer.load(tmp_path)
    for text in SAMPLES:
        assert loaded.encode(text) == gguf_tok.encode(text)
    assert loaded.token_text == gguf_tok.token_text


def test_no_space_prefix_when_the_file_says_so(tmp_path):
    tok = Tokenizer.from_gguf(write_gguf_tokenizer(tmp_path / "t.gguf", space_prefix=False))
    assert tok.encode("hello") == [SPM_TOKENS.index(c) for c in ("he", "llo")]
    assert tok.token_text.leading_space is LeadingSpace.KEEP


def test_missing_scores_are_refused_with_the_field_named(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "t.gguf"), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(SPM_TOKENS)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelFormatError, match="t.gguf: tokenizer.ggml.scores is missing"):
        Tokenizer.from_gguf(tmp_path / "t.gguf")


def test_a_decoder_that_strips_per_token_is_refused(tmp_path):
    write_spm_tokenizer_dir(tmp_path, "legacy")
    spec = json.loads((tmp_path / "tokenizer.json").read_text())
    spec["decoder"]["decoders"] = [d for d in spec["decoder"]["decoders"] if d["type"] != "Fuse"]
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(ModelFormatError, match="strips something other than one leading space"):
        Tokenizer.load(tmp_path)


# ---- the stream ----


def assert_clean(deltas):
    for delta in deltas:
        assert "\ufffd" not in delta
        delta.encode("utf-8")


@pytest.mark.parametrize("text", SAMPLES)
def test_streamed_text_equals_decode(gguf_tok, hf_tok, text):
    for tok in (gguf_tok, hf_tok):
        ids = tok.encode(text)
        deltas, dropped = stream(tok, ids)
        assert_clean(deltas)
        assert dropped == 0
        assert "".join(deltas) == tok.decode(ids)


def test_the_answers_first_space_is_dropped_as_decode_drops_it(gguf_tok):
    ids = gguf_tok.encode("hello world")  # "▁hello", "▁world"
    deltas, _ = stream(gguf_tok, ids)
    assert deltas == ["hello", " world"] and gguf_tok.decode(ids) == "hello world"
    deltas, _ = stream(gguf_tok, [SPM_BOS, *ids])  # a special token first changes nothing
    assert deltas == ["", "hello", " world"]


def test_byte_tokens_are_assembled_into_one_character(gguf_tok):
    ids = gguf_tok.encode("😀")  # "▁" then four byte tokens
    assert ids[1:] == [SPM_BYTE_OFFSET + b for b in "😀".encode()]
    deltas, _ = stream(gguf_tok, ids)
    assert deltas == ["", "", "", "", "😀"]


def test_an_unfinished_character_at_the_end_is_dropped(gguf_tok):
    ids = gguf_tok.encode("hello 你好😀")[:-2]
    deltas, dropped = stream(gguf_tok, ids)
    assert_clean(deltas)
    assert "".join(deltas) == "hello 你好" and dropped == 2


def _random_ids(rng: random.Random) -> list[int]:
    """Pieces, specials, byte-token runs spelling whole characters (CJK, emoji, accents), and now and then a lone
    invalid byte between two pieces: the answers a model can give."""
    pieces = [SPM_TOKENS.index(p) for p in SPM_PIECES]
    chars = list("你好世界学数こんにちはΩжשع") + ["😀", "🚀", "👍🏽", "👨‍👩‍👧", "🇫🇷", "❤️", "𝔘", "\n", "\t", "é", "e\u0301"]
    ids = [rng.choice(pieces)]
    for _ in range(rng.randrange(1, 25)):
        roll = rng.random()
        if roll < 0.5:
            ids.append(rng.choice(pieces))
        elif roll < 0.8:
            ids += [SPM_BYTE_OFFSET + b for b in rng.choice(chars).encode()]
        elif roll < 0.9:
            ids.append(rng.choice([SPM_BOS, SPM_EOS]))
        else:
            ids += [rng.choice(pieces), SPM_BYTE_OFFSET + rng.choice([0x80, 0xBF, 0xC3, 0xE4, 0xF0, 0xFF]),
                    rng.choice(pieces)]
    return ids


def test_fuzzed_answers_stream_to_decode_less_its_replacement_characters(gguf_tok, hf_tok):
    rng = random.Random(13)
    invalid = 0
    for tok in (gguf_tok, hf_tok):
        for _ in range(300):
            ids = _random_ids(rng)
            deltas, _ = stream(tok, ids)
            assert_clean(deltas)
            decoded = tok.decode(ids)
            invalid += "\ufffd" in decoded
            assert "".join(deltas) == decoded.replace("\ufffd", ""), ids
    assert invalid > 20


def test_fuzzed_texts_round_trip_through_the_stream(gguf_tok, hf_tok):
    alphabet = list("helowrdatsin.,!? \n\t") + list("你好世界学") + ["😀", "🚀", "👍🏽", "👨‍👩‍👧", "🇫🇷", "é", "e\u0301", "𝔘"]
    rng = random.Random(99)
    for tok in (gguf_tok, hf_tok):
        spec = tok.raw.to_str()
        byte_fallback = "ByteFallback" in spec  # SpmConverter's Metaspace decoder shows "<0x0A>" as it is
        for _ in range(200):
            text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 30)))
            ids = tok.encode(text)
            deltas, dropped = stream(tok, ids)
            assert_clean(deltas)
            assert dropped == 0
            assert "".join(deltas) == tok.decode(ids)
            if byte_fallback and not (text.startswith(" ") and '"Metaspace"' in spec):
                assert tok.decode(ids) == text
