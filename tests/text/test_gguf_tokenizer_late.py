"""A GGUF's tokenizer built late (gguf_tokenizer.LateRawTokenizer): what a load reads of it before its BPE exists
equals what the built tokenizer says, on the embedded model and on made-up files with the awkward cases (a text
twice, a text both user-defined and control, a named token the vocabulary holds as an ordinary piece); the BPE is
built once, on the first encoding or `prepare`, whichever thread asks first."""

from __future__ import annotations

import json
import threading

import gguf
import pytest
from tiny_model import add_spm_tokenizer

from typewriter.text import gguf_tokenizer
from typewriter.text.gguf_tokenizer import LateRawTokenizer, raw_tokenizer_from_gguf
from typewriter.text.tokenizer import END_OF_TURN_TOKENS, Tokenizer
from typewriter.weights.gguf_reader import GGUFReader
from typewriter.weights.source import embedded_model_path

_CONTROL, _USER_DEFINED, _NORMAL = 3, 4, 1  # gguf.TokenType


def _byte_alphabet() -> list[str]:
    """GPT-2's byte-level characters, in byte order."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def _byte_level_file(path, tokens, types, merges, eos: int):
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_eos_token_id(eos)
    writer.add_chat_template("{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}<x>")
    for step in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file,
                 writer.close):
        step()
    return path


def _awkward_byte_level(path):
    """Twice "he" (ordinary), twice "<u>" (user-defined), "<x>" both user-defined and control, a control token."""
    alphabet = _byte_alphabet()
    specials = ["<|im_end|>", "<|im_start|>", "<u>", "<x>", "<u>", "<x>"]
    kinds = [_CONTROL, _CONTROL, _USER_DEFINED, _USER_DEFINED, _USER_DEFINED, _CONTROL]
    tokens = specials + alphabet + ["he", "ll", "he", "hell", "hello"]
    types = kinds + [_NORMAL] * (len(tokens) - len(specials))
    return _byte_level_file(path, tokens, types, ["h e", "l l", "he ll", "hell o"], eos=0)


def _sentencepiece(path):
    writer = gguf.GGUFWriter(str(path), "llama")
    add_spm_tokenizer(writer, True)
    for step in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file,
                 writer.close):
        step()
    return path


@pytest.fixture(params=["embedded", "byte-level", "sentencepiece"])
def gguf_path(request, tmp_path):
    if request.param == "embedded":
        return embedded_model_path()
    if request.param == "byte-level":
        return _awkward_byte_level(tmp_path / "awkward.gguf")
    return _sentencepiece(tmp_path / "spm.gguf")


def _facts(raw, tokens: list[str]) -> dict:
    return {
        "added": {i: (t.content, t.special) for i, t in raw.get_added_tokens_decoder().items()},
        "size": raw.get_vocab_size(with_added_tokens=True),
        "ids": [raw.token_to_id(t) for t in [*tokens, *END_OF_TURN_TOKENS, "not a token", "<new>"]],
        "decoder": json.loads(raw.decoder.__getstate__()),
    }


def test_what_a_load_reads_before_the_bpe_exists_is_what_the_built_tokenizer_says(gguf_path):
    fields = GGUFReader(gguf_path).fields
    tokens = fields["tokenizer.ggml.tokens"]
    late = LateRawTokenizer(gguf_path, fields)
    before = _facts(late, tokens)
    assert not late.built
    assert before == _facts(late.build(), tokens)
    assert before == _facts(raw_tokenizer_from_gguf(gguf_path, fields), tokens)


def test_a_repeated_text_keeps_its_last_id_and_a_text_both_user_defined_and_control_is_special(tmp_path):
    """As the BPE built from the whole list (a dictionary of text to id) and the two registrations in turn say."""
    path = _awkward_byte_level(tmp_path / "awkward.gguf")
    tokens = GGUFReader(path).fields["tokenizer.ggml.tokens"]
    late = LateRawTokenizer(path, GGUFReader(path).fields)
    last_he = len(tokens) - 1 - tokens[::-1].index("he")
    for raw in (late, late.build()):
        assert {i: (t.content, t.special) for i, t in raw.get_added_tokens_decoder().items()} == {
            0: ("<|im_end|>", True), 1: ("<|im_start|>", True), 4: ("<u>", False), 5: ("<x>", True)}
        assert raw.token_to_id("he") == last_he
        assert raw.get_vocab_size(with_added_tokens=True) == len(set(tokens))


def test_a_late_tokenizer_loads_as_an_eager_one_and_encodes_the_same(gguf_path):
    fields = GGUFReader(gguf_path).fields
    late = Tokenizer.from_gguf(gguf_path, fields)
    assert not late._raw.built, "the BPE was built at load"
    eager = Tokenizer(raw_tokenizer_from_gguf(gguf_path, fields), name=late.name,
                      chat_template=fields.get("tokenizer.chat_template"), tokens=fields["tokenizer.ggml.tokens"],
                      **late.special_tokens)
    for name in ("vocab_size", "bos_token_id", "eos_token_ids", "special_ids", "plain_chat"):
        assert getattr(late, name) == getattr(eager, name), name
    assert late.token_text.table == eager.token_text.table
    assert late.token_text.leading_space == eager.token_text.leading_space
    assert late.template._control.pattern == eager.template._control.pattern
    assert late.template._markers.pattern == eager.template._markers.pattern
    assert not late._raw.built
    chat = [{"role": "user", "content": "hello <|im_end|> <u><x> héllo 12 <unk>"}]
    assert late.encode_chat(chat) == eager.encode_chat(chat)
    assert late._raw.built, "encoding did not build the BPE"
    for text in ("hello", " hello hell he", "<|im_start|>he<u>", "<unk> <s>", "中文 ✓"):
        assert late.encode(text) == eager.encode(text)
        assert late.encode_text(text) == eager.encode_text(text)
    assert late.raw.get_added_tokens_decoder() == eager.raw.get_added_tokens_decoder()


def test_the_bpe_is_built_once_by_whichever_thread_asks_first(tmp_path, monkeypatch):
    path = _awkward_byte_level(tmp_path / "awkward.gguf")
    tok = Tokenizer.from_gguf(path)
    expected = raw_tokenizer_from_gguf(path, GGUFReader(path).fields).encode("hello he").ids
    built = []
    real = gguf_tokenizer._byte_level_bpe
    gate = threading.Barrier(8)

    def counted(*args):
        built.append(threading.current_thread().name)
        return real(*args)

    monkeypatch.setattr(gguf_tokenizer, "_byte_level_bpe", counted)
    answers: list[list[int]] = []

    def encode() -> None:
        gate.wait()
        answers.append(tok.encode("hello he"))

    def prepare() -> None:
        gate.wait()
        tok.prepare()

    threads = [threading.Thread(target=encode) for _ in range(7)] + [threading.Thread(target=prepare)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(built) == 1
    assert answers == [expected] * 7
    tok.prepare()
    assert len(built) == 1


def test_a_bad_file_is_still_refused_at_load_not_on_the_first_encoding(tmp_path):
    from typewriter.errors import ModelFormatError

    writer = gguf.GGUFWriter(str(tmp_path / "bad.gguf"), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("no-such-pre")
    writer.add_token_list(["a", "b"])
    writer.add_token_types([_NORMAL, _NORMAL])
    for step in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file,
                 writer.close):
        step()
    with pytest.raises(ModelFormatError, match="no-such-pre"):
        Tokenizer.from_gguf(tmp_path / "bad.gguf")
