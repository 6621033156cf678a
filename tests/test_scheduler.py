"""The scheduler on its own: admission order, free slots, the overload rule, queue positions, and what ends a
request before the model sees it. Pure Python, like the scheduler."""

from __future__ import annotations

import pytest
from scripted import ScriptTokenizer

from typewriter.errors import Overloaded
from typewriter.request import FinishReason, GenerationRequest, SamplingParams
from typewriter.scheduler import Scheduler
from typewriter.sequence import Sequence, Status

TOKENIZER = ScriptTokenizer(["x"])


def seq(rid: str, timeout_s: float | None = None) -> Sequence:
    request = GenerationRequest(rid, [2], SamplingParams(max_new_tokens=4, timeout_s=timeout_s))
    return Sequence(request, lambda event: None, TOKENIZER, TOKENIZER.eos_token_ids, now=0.0)


def scheduler_with(slots: int, max_queue: int, *ids: str) -> tuple[Scheduler, dict[str, Sequence]]:
    scheduler, seqs = Scheduler(slots, max_queue), {}
    for rid in ids:
        seqs[rid] = seq(rid)
        scheduler.add(seqs[rid])
    return scheduler, seqs


def test_requests_are_admitted_first_come_first_served_one_per_step_into_the_lowest_free_slot():
    scheduler, s = scheduler_with(3, 4, "a", "b", "c")
    admitted = [scheduler.schedule(set(), 0.0).prefill for _ in range(4)]
    assert admitted == [s["a"], s["b"], s["c"], None]
    assert [(x.slot, x.status) for x in admitted[:3]] == [(0, Status.RUNNING), (1, Status.RUNNING),
                                                          (2, Status.RUNNING)]
    scheduler.finish(s["a"])
    scheduler.finish(s["c"])
    d = seq("d")
    scheduler.add(d)
    assert scheduler.schedule(set(), 0.0).prefill is d and d.slot == 0


def test_the_decode_step_covers_the_running_sequences_in_slot_order_but_not_the_newcomer():
    scheduler, s = scheduler_with(3, 4, "a", "b")
    assert scheduler.schedule(set(), 0.0).decode == []
    plan = scheduler.schedule(set(), 0.0)
    assert (plan.prefill, plan.decode) == (s["b"], [s["a"]])
    assert scheduler.schedule(set(), 0.0).decode == [s["a"], s["b"]]


def test_overloaded_once_the_queue_is_full_counting_those_who_will_take_a_free_slot():
    scheduler, _ = scheduler_with(2, 1, "a", "b", "c")  # two will take the free slots, one waits
    with pytest.raises(Overloaded, match=r"full \(1 waiting\)"):
        scheduler.add(seq("d"))
    scheduler.schedule(set(), 0.0)  # a takes slot 0: one free slot, b and c wait
    with pytest.raises(Overloaded):
        scheduler.add(seq("d"))


def test_a_queue_of_zero_takes_only_as_many_as_there_are_free_slots():
    scheduler, _ = scheduler_with(1, 0, "a")
    with pytest.raises(Overloaded):
        scheduler.add(seq("b"))


def test_positions_count_only_those_who_wait_for_a_slot_and_are_reported_when_they_change():
    scheduler, s = scheduler_with(2, 4, "a", "b", "c", "d")
    plan = scheduler.schedule(set(), 0.0)  # a runs; one slot free for b: b is not queued
    assert plan.queued == [(s["c"], 1), (s["d"], 2)]
    plan = scheduler.schedule(set(), 0.0)  # b runs; no slot free
    assert plan.queued == []  # c is still 1st, d still 2nd
    scheduler.finish(s["a"])
    plan = scheduler.schedule(set(), 0.0)  # c takes a's slot
    assert (plan.prefill, plan.queued) == (s["c"], [(s["d"], 1)])


def test_cancelled_requests_end_whether_running_or_waiting_and_free_their_slot():
    scheduler, s = scheduler_with(1, 4, "a", "b", "c")
    scheduler.schedule(set(), 0.0)
    plan = scheduler.schedule({"a", "c", "unknown"}, 0.0)
    assert plan.ended == [(s["a"], FinishReason.CANCELLED), (s["c"], FinishReason.CANCELLED)]
    assert s["a"].status is s["c"].status is Status.FINISHED
    assert plan.prefill is s["b"] and s["b"].slot == 0  # a's slot went to the next in line at once
    assert scheduler.sequences() == [s["b"]] and scheduler.find("a") is None


def test_a_running_request_past_its_deadline_ends_with_timeout():
    scheduler = Scheduler(1, 1)
    late = seq("late", timeout_s=1.0)
    scheduler.add(late)
    scheduler.schedule(set(), 0.0)
    late.started = 10.0
    assert scheduler.schedule(set(), 11.0).ended == []
    assert scheduler.schedule(set(), 11.5).ended == [(late, FinishReason.TIMEOUT)]
    assert scheduler.free_slots == [0]
