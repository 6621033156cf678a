"""The compiled constraints kept (engine/constraints.py): bounded in estimated bytes, in all and per owner (a
client); an owner's compiles evict its own first, and another's only while that one holds more; an owner never
finds another's entry (a hit would tell it what a classmate asked for), yet the engine's copy for an answer finds any.
Over the tiny byte-level tokenizer."""

from __future__ import annotations

import pytest
from tiny_model import VOCAB_SIZE

from typewriter.engine import constraints
from typewriter.engine.constraints import Grammars
from typewriter.engine.request import Constraint, ConstraintKind
from typewriter.errors import InvalidRequest
from typewriter.text.tokenizer import Tokenizer

SMALL = 32 << 10  # what each small regex below is estimated to take: the floor


@pytest.fixture(scope="module")
def tokenizer(tiny_gguf):
    return Tokenizer.load(tiny_gguf)


def regex(i: int) -> Constraint:
    return Constraint(ConstraintKind.REGEX, f"item {i}: [a-z]{{1,8}}", "response_format")


def test_an_owner_keeps_at_most_its_share_evicting_its_own_oldest_first(tokenizer):
    grammars = Grammars(tokenizer, VOCAB_SIZE, cache_bytes=10 * SMALL, owner_bytes=3 * SMALL)
    kept = [grammars.compile(regex(i), "a") for i in range(5)]
    assert grammars._kept.held("a") == 3 * SMALL
    assert grammars.compile(regex(4), "a") is kept[4]  # the owner still finds its own
    assert grammars.compile(regex(0), "a") is not kept[0]  # its oldest went first


def test_past_the_total_the_biggest_holder_gives_way_never_a_smaller_one(tokenizer):
    grammars = Grammars(tokenizer, VOCAB_SIZE, cache_bytes=6 * SMALL, owner_bytes=4 * SMALL)
    student = grammars.compile(regex(100), "student")
    for i in range(40):  # two scripts, each filling its share over and over
        grammars.compile(regex(i), "script-1")
        grammars.compile(regex(1000 + i), "script-2")
    assert grammars.compile(regex(100), "student") is student
    assert grammars._kept.bytes <= 6 * SMALL
    assert max(grammars._kept.held("script-1"), grammars._kept.held("script-2")) <= 4 * SMALL


def test_an_owner_never_finds_another_owners_entry_but_an_answer_copies_any(tokenizer, monkeypatch):
    grammars = Grammars(tokenizer, VOCAB_SIZE)
    theirs = grammars.compile(regex(1), "a")
    assert grammars.compile(regex(1), "b") is not theirs
    built = []
    monkeypatch.setattr(constraints, "grammar_text", lambda c: built.append(c) or "")
    grammars.start(regex(1))
    assert built == []  # copied from a kept one, not compiled again


def test_a_constraint_estimated_over_one_owners_share_is_refused_by_name(tokenizer):
    grammars = Grammars(tokenizer, VOCAB_SIZE, owner_bytes=1 << 20)
    with pytest.raises(InvalidRequest, match=r"^response_format: too costly to keep: compiled, it would take about "
                                             r"\d+ MiB, more than one client may \(1 MiB\)"):
        grammars.compile(Constraint(ConstraintKind.REGEX, "0{5000}", "response_format"))
    assert grammars._kept.bytes == 0


def test_an_answer_whose_constraint_is_no_longer_kept_gets_its_own_copy_that_counts_in_no_share(tokenizer):
    grammars = Grammars(tokenizer, VOCAB_SIZE)
    answer = grammars.start(regex(1))  # as after its owner's compile was evicted
    assert grammars._kept.bytes == 0 and not answer.complete


def test_warmed_grammars_build_their_tokenizers_once_and_a_first_constraint_then_waits_for_none(tokenizer,
                                                                                               monkeypatch):
    grammars = Grammars(tokenizer, VOCAB_SIZE)
    builds = []
    build = grammars._build_tokenizer
    monkeypatch.setattr(grammars, "_build_tokenizer", lambda: builds.append(1) or build())
    grammars.warm()
    grammars.warm()
    grammars.compile(regex(1), "a")
    assert builds == [1]


def test_a_vocabulary_llguidance_cannot_take_fails_the_warm_up_quietly_and_the_first_constraint_by_name(
        tokenizer, monkeypatch, caplog):
    grammars = Grammars(tokenizer, VOCAB_SIZE)

    def panics():
        raise BaseException("assertion failed: num_parents <= (1 << PARENT_BITS) as usize")  # as pyo3 raises a panic

    monkeypatch.setattr(grammars, "_build_tokenizer", panics)
    grammars.warm()  # on a thread of its own: it must not raise
    assert "could not be built ahead of the first one" in caplog.text
    with pytest.raises(BaseException, match="num_parents"):
        grammars.compile(regex(1), "a")


def test_evicted_constraints_hand_their_freed_memory_back_once_per_trim_share_not_at_every_eviction(tokenizer,
                                                                                                  monkeypatch):
    trims = []
    monkeypatch.setattr(constraints, "return_freed_memory", lambda: trims.append(grammars._kept.bytes))
    monkeypatch.setattr(constraints, "TRIM_AFTER_BYTES", 3 * SMALL)
    grammars = Grammars(tokenizer, VOCAB_SIZE, cache_bytes=10 * SMALL, owner_bytes=2 * SMALL)
    for i in range(2):  # the share filled: nothing evicted yet
        grammars.compile(regex(i), "a")
    assert trims == []
    for i in range(2, 8):  # six evictions: a trim after the third and the sixth
        grammars.compile(regex(i), "a")
    assert trims == [2 * SMALL, 2 * SMALL]
    grammars.compile(regex(7), "a")  # found, nothing evicted
    assert len(trims) == 2
