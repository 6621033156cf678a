"""Continue anywhere: a request that carries the start of an answer (`AnswerStart`) goes on from it as the same
assistant turn. Its tokens are replayed through the text pipeline first, so held-back text, stop sequences, the
answer's length limit, token numbering and the sampler's random draws are where an uninterrupted run's are; with
greedy decoding, and with a seed, the continued answer is the uninterrupted one. Checked on the tiny tokenizer
(the pipeline), the tiny random model (every cut point) and the real embedded model (its own words)."""

from __future__ import annotations

import pytest
from helpers import Recorder
from tiny_model import IM_END, byte_token

from typewriter import assemble
from typewriter.engine.request import AnswerStart, FinishReason, GenerationRequest, SamplingParams
from typewriter.engine.request_state import RequestState
from typewriter.errors import InvalidRequest
from typewriter.text.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tokenizer(tiny_gguf):
    return Tokenizer.load(tiny_gguf)


def state(tokenizer, start: bytes = b"", text: str | None = None, **params) -> RequestState:
    ids = tuple(byte_token(b) for b in start)
    request = GenerationRequest("s", [byte_token(ord("q"))], SamplingParams(**({"max_new_tokens": 100} | params)),
                                AnswerStart(ids, text))
    return RequestState(request, lambda event: None, tokenizer, tokenizer.eos_token_ids, now=0.0)


# ---- the text pipeline ----


def test_the_answer_start_is_read_as_prompt_and_the_next_token_is_numbered_after_it(tokenizer):
    seq = state(tokenizer, b"ab", "ab")
    assert seq.prompt_ids == [byte_token(b) for b in b"qab"]
    assert seq.take(byte_token(ord("c")), now=1.0) == ("c", None)
    assert (seq.last_index, seq.output_ids) == (2, [byte_token(ord("c"))])


def test_a_character_cut_in_half_by_the_drop_arrives_whole_after_it(tokenizer):
    e_acute = "é".encode()
    seq = state(tokenizer, b"x" + e_acute[:1], "x")  # the client was shown "x"; the first byte of é was held
    assert seq.take(byte_token(e_acute[1]), now=1.0) == ("é", None)


def test_a_stop_sequence_begun_before_the_drop_still_ends_the_answer_after_it(tokenizer):
    seq = state(tokenizer, b"ax", "a", stop=("xyz",))  # "x" was held back: it might begin the stop
    assert seq.take(byte_token(ord("y")), now=1.0) == ("", None)
    assert seq.take(byte_token(ord("z")), now=1.0) == ("", FinishReason.STOP_SEQUENCE)


def test_held_text_that_was_not_a_stop_after_all_is_released_after_the_drop(tokenizer):
    seq = state(tokenizer, b"ax", "a", stop=("xyz",))
    assert seq.take(byte_token(ord("b")), now=1.0) == ("xb", None)


def test_the_start_counts_against_the_answer_length(tokenizer):
    seq = state(tokenizer, b"abc", "abc", max_new_tokens=4)
    assert seq.take(byte_token(ord("d")), now=1.0) == ("d", FinishReason.LENGTH)


@pytest.mark.parametrize(("start", "params", "why"), [
    (b"ab", {"max_new_tokens": 2}, "ended at its token 1 \\(length\\)"),
    (b"abcd", {"stop": ("bc",)}, "ended at its token 2 \\(stop_sequence\\)"),
])
def test_an_answer_that_had_already_ended_is_refused(tokenizer, start, params, why):
    with pytest.raises(InvalidRequest, match=f"continue: the answer already {why}"):
        state(tokenizer, start, None, **params)


def test_an_eos_inside_the_start_is_refused(tokenizer):
    request = GenerationRequest("s", [byte_token(ord("q"))], SamplingParams(),
                                AnswerStart((byte_token(ord("a")), IM_END)))
    with pytest.raises(InvalidRequest, match="already ended at its token 1 \\(eos\\)"):
        RequestState(request, lambda event: None, tokenizer, tokenizer.eos_token_ids, now=0.0)


def test_ids_that_do_not_spell_the_text_the_client_shows_are_refused(tokenizer):
    with pytest.raises(InvalidRequest, match="do not spell continue.text"):
        state(tokenizer, b"ab", "abc")


# ---- a real engine ----


def answer(engine, name: str, prompt: list[int], params: SamplingParams,
           start: tuple[int, ...] = (), text: str | None = None) -> Recorder:
    rec = Recorder()
    engine.submit(GenerationRequest(name, prompt, params, AnswerStart(start, text) if start else None), rec)
    rec.wait()
    return rec


def continued_everywhere(engine, tokenizer, prompt: list[int], params: SamplingParams, cuts) -> None:
    """Cut the uninterrupted answer after each of `cuts` tokens and continue it: the same tokens, and the
    continuation's text after the text of the start is the uninterrupted text, with each token numbered as it was."""
    whole = answer(engine, "whole", prompt, params)
    ids = [e.token_id for e in whole.tokens]
    assert len(ids) > max(cuts), "the uninterrupted answer is too short to cut there"
    if params.stop:
        assert whole.events[-1].reason is FinishReason.STOP_SEQUENCE
    for cut in cuts:
        shown = "".join(e.text for e in whole.tokens[:cut])
        rest = answer(engine, f"cut{cut}", prompt, params, tuple(ids[:cut]), shown)
        assert [e.token_id for e in rest.tokens] == ids[cut:], f"cut after {cut} tokens"
        assert [e.index for e in rest.tokens] == [e.index for e in whole.tokens[cut:]]
        assert shown + rest.text == whole.text
        end, whole_end = rest.events[-1], whole.events[-1]
        assert (end.reason, end.prompt_tokens, end.completion_tokens) == \
            (whole_end.reason, len(prompt) + cut, len(ids) - cut)


@pytest.fixture(scope="module")
def tiny_engine(tiny_gguf):
    engine, tokenizer, _ = assemble.load(tiny_gguf, slots=2, max_context=64, max_queue=2, prefill_budget=8,
                                        compile="lazy", weight_format="fp32")
    yield engine, tokenizer
    engine.shutdown()


@pytest.mark.parametrize("params", [
    SamplingParams(max_new_tokens=20, temperature=0.0),
    SamplingParams(max_new_tokens=20, temperature=1.0, top_p=0.95, seed=7),
], ids=["greedy", "seeded"])
def test_the_tiny_model_continues_from_every_cut_as_if_never_cut(tiny_engine, params):
    engine, tokenizer = tiny_engine
    prompt = tokenizer.encode_chat([{"role": "user", "content": "hello"}], system="")
    continued_everywhere(engine, tokenizer, prompt, params, range(1, 20))


def test_a_continuation_computed_from_scratch_equals_one_from_the_cache(tiny_engine):
    """On a fresh replica nothing is cached: the whole conversation and answer start are prefilled."""
    engine, tokenizer = tiny_engine
    prompt = tokenizer.encode_chat([{"role": "user", "content": "hello"}], system="")
    params = SamplingParams(max_new_tokens=16, temperature=0.0)
    whole = [e.token_id for e in answer(engine, "whole", prompt, params).tokens]
    cold = SamplingParams(max_new_tokens=16, temperature=0.0, cache_prompt=False)
    rest = answer(engine, "cold", prompt, cold, tuple(whole[:9]))
    assert [e.token_id for e in rest.tokens] == whole[9:]
    assert rest.of(type(rest.events[-1]))[0].prompt_tokens == len(prompt) + 9


def test_the_engine_refuses_start_ids_outside_the_vocabulary(tiny_engine):
    engine, tokenizer = tiny_engine
    with pytest.raises(InvalidRequest, match="continue.ids: every token id must be between 0 and"):
        engine.submit(GenerationRequest("bad", [1, 2], SamplingParams(max_new_tokens=8), AnswerStart((1, 10**9))),
                      Recorder())


@pytest.fixture(scope="module")
def real_engine():
    engine, tokenizer, _ = assemble.load(None, slots=2, max_context=512, max_queue=2, prefill_budget=16,
                                        compile="lazy")
    yield engine, tokenizer
    engine.shutdown()


CUTS = (1, 2, 5, 17, 40, 63, 99, 108)
SYSTEM = "You are a helpful science tutor."  # pinned: the tutor's default may change, and with it the answer
QUESTION = [{"role": "user", "content": "Explain how plants make food."}]


@pytest.mark.slow
@pytest.mark.parametrize("params", [
    SamplingParams(max_new_tokens=120, temperature=0.0),  # the server's default repetition penalty, 1.1
    SamplingParams(max_new_tokens=120, temperature=0.7, seed=11),
], ids=["greedy", "seeded"])
def test_the_real_model_continues_its_own_words_as_if_never_cut(real_engine, params):
    engine, tokenizer = real_engine
    continued_everywhere(engine, tokenizer, tokenizer.encode_chat(QUESTION, system=SYSTEM), params, CUTS)


@pytest.mark.slow
def test_the_real_model_continues_inside_a_stop_sequence_it_was_holding_back(real_engine):
    """The stop is the words of the model's own greedy answer at tokens 107-111 (whatever this machine's weight
    format makes them): their start is held back as a possible stop, and two cuts fall inside it."""
    engine, tokenizer = real_engine
    prompt = tokenizer.encode_chat(QUESTION, system=SYSTEM)
    free = answer(engine, "free", prompt, SamplingParams(max_new_tokens=120, temperature=0.0))
    texts = [e.text for e in free.tokens]
    before, stop = "".join(texts[:107]), "".join(texts[107:112]).strip()
    assert len(stop) >= 8 and free.text.find(stop) >= len(before), f"{stop!r} is not new at token 107"
    params = SamplingParams(max_new_tokens=120, temperature=0.0, stop=(stop,))
    continued_everywhere(engine, tokenizer, prompt, params, (*CUTS, 109, 110))
