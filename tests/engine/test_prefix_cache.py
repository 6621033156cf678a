"""The prefix cache on its own: which free slot a prompt goes to, when a busy slot's prefix is copied, and how a
prompt whose text matches a cached conversation is rewritten to its tokens. Pure Python, like the cache."""

from __future__ import annotations

from typewriter.engine.prefix_cache import MIN_COPY, Held, PrefixCache, common_prefix, realign


def test_common_prefix_counts_the_equal_leading_ids():
    assert [common_prefix(a, b) for a, b in (([1, 2, 3], [1, 2, 4]), ([1, 2], [1, 2, 3]), ([], [1]), ([5], [6]))] \
        == [2, 2, 0, 0]


def test_a_prompt_goes_to_the_free_slot_holding_its_longest_prefix_leaving_one_token_to_compute():
    cache = PrefixCache(3)
    cache.release(0, [1, 2, 3, 4])
    cache.release(1, [1, 2, 9])
    cache.release(2, [7])
    assert cache.place([1, 2, 3, 4, 5], free=[0, 1, 2], busy=lambda s: [], busy_slots=[]).slot == 0
    cache.release(0, [1, 2, 3, 4])
    place = cache.place([1, 2, 3, 4], free=[0, 1, 2], busy=lambda s: [], busy_slots=[])
    assert (place.slot, place.reused, place.copy_from) == (0, 3, None)  # the last token gives the logits


def test_with_no_prefix_anywhere_the_least_recently_used_free_slot_is_taken():
    cache = PrefixCache(3)
    for slot in (2, 0, 1):
        cache.release(slot, [slot + 10])
    assert cache.place([99], free=[0, 1, 2], busy=lambda s: [], busy_slots=[]).slot == 2


def test_a_long_prefix_in_a_busy_slot_is_copied_into_the_least_recently_used_free_slot():
    cache = PrefixCache(3)
    cache.release(1, [50])
    cache.release(2, [60])
    shared = list(range(100, 100 + MIN_COPY))
    place = cache.place(shared + [1], free=[1, 2], busy=lambda s: Held(shared + [7], None), busy_slots=[0])
    assert (place.slot, place.reused, place.copy_from) == (1, MIN_COPY, 0)
    short = shared[: MIN_COPY - 1]
    place = cache.place(short + [1], free=[2], busy=lambda s: Held(short + [7], None), busy_slots=[0])
    assert (place.reused, place.copy_from) == (0, None)  # too short to be worth a copy


PIECES = {1: b"he", 2: b"llo", 3: b"hell", 4: b"o", 5: b" world", 6: b"", 7: b"!", 8: b"<|im_end|>", 9: b"x"}  # 6: special


def piece(token_id: int) -> bytes:  # as the engine gives realign: a special token's own mark
    return PIECES[token_id] or b"\xff%d\xff" % token_id


def test_realign_finds_where_two_spellings_of_one_text_last_meet_at_a_boundary_of_both():
    cached, prompt = [1, 2, 5, 6], [3, 4, 5, 6, 7]  # "he|llo| world|<end>" and "hell|o| world|<end>|!"
    assert realign(prompt, cached, 0, piece) == (4, 4)  # the whole cached text, special token included
    assert realign([3, 7], cached, 0, piece) is None  # "hell!" parts from "hello" inside the first token
    assert realign([1, 2, 5, 8], cached, 3, piece) is None  # a special token never equals its text typed


def test_a_prompt_whose_text_matches_a_cached_conversation_is_rewritten_to_its_tokens():
    cache = PrefixCache(2)
    cache.release(0, [1, 2, 5, 6])  # the answer as generated
    cache.release(1, [9])
    place = cache.place([3, 4, 5, 6, 7], free=[0, 1], busy=lambda s: [], busy_slots=[], piece=piece, room=0)
    assert (place.slot, place.reused, place.prompt) == (0, 4, [1, 2, 5, 6, 7])
    cache.release(0, [1, 2, 5, 6])
    assert cache.place([3, 4, 5, 6, 7], free=[0], busy=lambda s: [], busy_slots=[]).prompt is None  # no pieces
    cache.release(0, [1, 2, 5, 6])
    longer = cache.place([3, 5, 6, 7], free=[0], busy=lambda s: [], busy_slots=[], piece=lambda t: {
        3: b"hello"}.get(t) or piece(t), room=0)  # "hello" one token here, two cached: one token over the room
    assert longer.prompt is None and longer.reused == 0


def test_a_next_turn_reuses_an_answer_whose_text_encodes_to_other_tokens(real_tokenizer):
    """The embedded model's tokenizer: an answer generated a letter at a time, sent back as text, encodes to
    whole words; the next turn still finds its whole history cached, as the same text."""
    from typewriter.engine.engine import _piece

    tok = real_tokenizer
    question = [{"role": "user", "content": "What is photosynthesis?"}]
    answer = "Photosynthesis is how plants make food."
    generated = [t for ch in "Photosynthesis" for t in tok.encode(ch)] + tok.encode(" is how plants make food.")
    assert tok.decode(generated) == answer and generated != tok.encode(answer)
    cached = tok.encode_chat(question) + generated
    fresh = tok.encode_chat([*question, {"role": "assistant", "content": answer},
                             {"role": "user", "content": "And why do leaves look green?"}])
    assert common_prefix(fresh, cached) < len(cached) - 10  # exact tokens would reuse little of the answer
    cache = PrefixCache(1)
    cache.release(0, cached)
    place = cache.place(fresh, free=[0], busy=lambda s: [], busy_slots=[], piece=_piece(tok), room=64)
    assert place.reused == len(cached) and place.prompt[:len(cached)] == cached
    assert tok.decode(place.prompt, skip_special_tokens=False) == tok.decode(fresh, skip_special_tokens=False)


# ---- owners: a conversation is reused by its own owner; others get the shared prefix or nothing ----

SYSTEM = list(range(500, 520))  # the server's system prompt, as every request of the server begins


def test_another_owners_conversation_gives_the_shared_prefix_whether_a_guess_of_it_is_right_or_wrong():
    secret, wrong = [71, 38, 44], [71, 38, 45]  # "My student ID is 7138...": the right and a wrong guess
    results = {}
    for guess in ("right", "wrong"):
        cache = PrefixCache(2)
        cache.release(0, SYSTEM + secret + [9, 9], owner="alice")
        prompt = SYSTEM + (secret if guess == "right" else wrong) + [1]
        place = cache.place(prompt, free=[0, 1], busy=lambda s: Held([], None), busy_slots=[], owner="bob",
                            shared=(len(SYSTEM),))
        results[guess] = (place.slot, place.reused, place.copy_from)
    # the least recently used slot, with the system prompt copied in: alice's conversation stays for her
    assert results["right"] == results["wrong"] == (1, len(SYSTEM), 0)


def test_the_owner_reuses_its_whole_conversation_and_nobody_reuses_part_of_the_shared_prefix():
    cache = PrefixCache(2)
    cache.release(0, SYSTEM + [71, 38, 9], owner="alice")
    cache.release(1, SYSTEM[:10] + [3], owner="carol")  # began with only part of it
    turn = SYSTEM + [71, 38, 9, 5]
    assert cache.place(turn, free=[0, 1], busy=None, busy_slots=[], owner="alice", shared=(len(SYSTEM),)).reused == 23
    cache.release(0, SYSTEM + [71, 38, 9], owner="alice")
    assert cache.place(SYSTEM[:10] + [4], free=[1], busy=None, busy_slots=[], owner="bob", shared=(10,)).reused == 10
    cache.release(1, SYSTEM[:10] + [3], owner="carol")
    stranger = cache.place(SYSTEM + [4], free=[1], busy=None, busy_slots=[], owner="bob", shared=(len(SYSTEM),))
    assert stranger.reused == 0  # carol's tokens agree for 10 of the 20 it shares: all or nothing
    no_shared = cache.place([*SYSTEM, 71, 38, 1], free=[0], busy=None, busy_slots=[], owner="bob", shared=())
    assert no_shared.reused == 0  # a prompt that does not begin with the server's shared prefix


def test_of_several_shared_lengths_another_owner_gives_the_longest_both_prompts_begin_with():
    """The class's prompt then the question's start (22 tokens), or the class's prompt alone where a client's own
    system text follows it (20): a chat of each kind shares with the other what they have in common, no more."""
    opening, question = SYSTEM, SYSTEM + [3, 4]
    cache = PrefixCache(2)
    cache.release(0, opening + [71, 38, 9], owner="api")  # a client's own system text followed the class's prompt
    page = cache.place(question + [5, 6], free=[0, 1], busy=None, busy_slots=[], owner="student",
                       shared=(len(question), len(opening)))
    assert page.reused == len(opening)  # not 0: the longer length does not fit, the shorter does
    cache.release(0, question + [8, 8], owner="other student")
    page = cache.place(question + [5, 6], free=[0, 1], busy=None, busy_slots=[], owner="student",
                       shared=(len(question), len(opening)))
    assert page.reused == len(question)


def test_a_busy_slot_of_another_owner_is_copied_only_for_the_shared_prefix():
    cache = PrefixCache(2)
    cache.release(1, [7])
    running = Held(SYSTEM + [71, 38, 44] + list(range(30)), "alice")  # alice's answer still streaming
    for guess in ([71, 38, 44], [1, 2, 3]):
        place = cache.place(SYSTEM + guess + list(range(30)) + [1], free=[1], busy=lambda s: running,
                            busy_slots=[0], owner="bob", shared=(len(SYSTEM),))
        assert (place.reused, place.copy_from) == (len(SYSTEM), 0)
        cache.release(1, [7])
    mine = cache.place(running.tokens + [1], free=[1], busy=lambda s: running, busy_slots=[0], owner="alice",
                       shared=(len(SYSTEM),))
    assert (mine.reused, mine.copy_from) == (len(running.tokens), 0)


def test_only_the_owners_own_conversation_is_rewritten_to_its_tokens():
    for owner, expected in (("alice", [1, 2, 5, 6, 7]), ("bob", None)):
        cache = PrefixCache(1)
        cache.release(0, [1, 2, 5, 6], owner="alice")
        place = cache.place([3, 4, 5, 6, 7], free=[0], busy=None, busy_slots=[], piece=piece, room=0, owner=owner)
        assert place.prompt == expected


def test_a_newcomer_takes_the_least_recently_used_slot_not_a_conversation_holding_the_shared_prefix():
    cache = PrefixCache(3)
    cache.release(2, SYSTEM + [1, 2], owner="alice")
    cache.release(0, SYSTEM + [3, 4], owner="bob")  # bob's is the more recent; slot 1 was never used
    place = cache.place(SYSTEM + [5], free=[0, 1, 2], busy=None, busy_slots=[], owner="carol", shared=(len(SYSTEM),))
    assert (place.slot, place.reused, place.copy_from) == (1, len(SYSTEM), 2)
    short = SYSTEM[: MIN_COPY - 1]
    place = cache.place(short + [5], free=[0, 1, 2], busy=None, busy_slots=[], owner="carol", shared=(len(short),))
    assert (place.slot, place.reused, place.copy_from) == (1, 0, None)  # too short to be worth a copy
