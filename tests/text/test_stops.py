import pytest

from typewriter.text.stops import StopMatcher


def feed(matcher, pieces):
    sent, stopped = "", False
    for piece in pieces:
        text, stopped = matcher.push(piece)
        sent += text
        if stopped:
            break
    return sent, stopped


def test_text_without_stops_passes_straight_through():
    m = StopMatcher(["###"])
    assert m.push("Hello, ") == ("Hello, ", False)
    assert m.push("world") == ("world", False)
    assert m.flush() == ""


def test_no_stop_sequences_holds_nothing_back():
    m = StopMatcher([])
    assert m.push("any text at all") == ("any text at all", False)


def test_a_stop_in_the_middle_of_one_push_cuts_it_and_drops_the_rest():
    m = StopMatcher(["END"])
    assert m.push("answer: 4END and more") == ("answer: 4", True)


def test_a_stop_spread_over_many_pushes_is_never_sent():
    sent, stopped = feed(StopMatcher(["<stop>"]), ["The end", "<", "s", "t", "o", "p", ">", "never"])
    assert (sent, stopped) == ("The end", True)


def test_a_partial_stop_is_held_only_while_it_can_still_complete():
    m = StopMatcher(["User:"])
    assert m.push("Hi Us") == ("Hi ", False)
    assert m.push("e") == ("", False)
    assert m.push("ful") == ("Useful", False)


def test_held_text_is_released_at_a_natural_end():
    m = StopMatcher(["\n\nQ:"])
    assert m.push("Done.\n\n") == ("Done.", False)
    assert m.flush() == "\n\n"
    assert m.flush() == ""


def test_the_earliest_stop_wins_when_several_complete_in_one_push():
    m = StopMatcher(["world", "lo"])
    assert m.push("hello world") == ("hel", True)


def test_a_false_start_followed_by_the_real_stop_keeps_the_false_start():
    sent, stopped = feed(StopMatcher(["abc"]), ["xab", "abc", "zzz"])
    assert (sent, stopped) == ("xab", True)


def test_overlapping_prefixes_hold_the_longest_possible_start():
    m = StopMatcher(["aab"])
    assert m.push("aaa") == ("a", False)  # "aa" may still become "aab"
    assert m.push("b") == ("", True)


def test_after_a_stop_nothing_more_is_sent():
    m = StopMatcher(["."])
    assert m.push("One. Two") == ("One", True)
    assert m.push("three") == ("", True)
    assert m.flush() == ""


def test_a_stop_that_is_a_whole_push_of_unicode_is_matched():
    sent, stopped = feed(StopMatcher(["🛑"]), ["go go ", "🛑", " no"])
    assert (sent, stopped) == ("go go ", True)


def test_empty_stop_sequences_are_refused():
    with pytest.raises(ValueError):
        StopMatcher([""])
