"""The scheduler on its own: admission order, free slots, the overload rule, queue positions, the prefill
budget, prefix placement, and what ends a request before the model sees it. Pure Python, like the scheduler."""

from __future__ import annotations

import itertools

import pytest
from scripted import ScriptTokenizer

from typewriter.engine.request import FinishReason, GenerationRequest, SamplingParams
from typewriter.engine.request_state import RequestState, Status
from typewriter.engine.scheduler import Scheduler
from typewriter.engine.step_cost import COLD_CHUNK, HEADROOM, INTER_TOKEN_S, SEEN, STALL, attended
from typewriter.errors import Overloaded

TOKENIZER = ScriptTokenizer(["x"])


def seq(rid: str, prompt=(2,), timeout_s: float | None = None) -> RequestState:
    request = GenerationRequest(rid, list(prompt), SamplingParams(max_new_tokens=4, timeout_s=timeout_s))
    return RequestState(request, lambda event: None, TOKENIZER, TOKENIZER.eos_token_ids, now=0.0)


def scheduler_with(slots: int, max_queue: int, *ids: str, budget: int = 1, max_chunk: int = 8):
    scheduler, seqs = Scheduler(slots, max_queue, max_chunk=max_chunk, budget=budget, idle_budget=budget), {}
    for rid in ids:
        seqs[rid] = seq(rid)
        scheduler.add(seqs[rid])
    return scheduler, seqs


def run(scheduler: Scheduler, plan) -> None:
    """What the engine does with a plan, minus the model: prefill the chunks, and one token per decoded row."""
    for chunk in plan.chunks:
        request = scheduler.running[chunk.slot]
        scheduler.prefilled(chunk)
        if chunk.wants_logits:
            request.take(0, now=0.0)
    for s in plan.decode:
        s.take(0, now=0.0)


def test_requests_are_admitted_first_come_first_served_as_the_budget_allows():
    scheduler, s = scheduler_with(3, 4, "a", "b", "c")  # one-token prompts, a budget of one token
    admitted = []
    for _ in range(4):
        plan = scheduler.schedule(set(), 0.0)
        admitted.append(plan.admitted)
        run(scheduler, plan)
    assert admitted == [[s["a"]], [s["b"]], [s["c"]], []]
    assert [(x.slot, x.status) for x in s.values()] == [(0, Status.RUNNING), (1, Status.RUNNING), (2, Status.RUNNING)]


def test_the_decode_step_covers_the_running_sequences_in_slot_order_but_not_the_prefilling_ones():
    scheduler, s = scheduler_with(3, 4, "a", "b")
    plan = scheduler.schedule(set(), 0.0)
    assert plan.decode == [] and [scheduler.running[c.slot] for c in plan.chunks] == [s["a"]]
    run(scheduler, plan)
    plan = scheduler.schedule(set(), 0.0)
    assert (plan.admitted, plan.decode) == ([s["b"]], [s["a"]])
    run(scheduler, plan)
    assert scheduler.schedule(set(), 0.0).decode == [s["a"], s["b"]]


def test_with_answers_decoding_a_step_prefills_at_most_the_budget_and_alone_up_to_the_idle_budget():
    scheduler = Scheduler(3, 4, max_chunk=8, budget=4, idle_budget=12)
    long, other = seq("long", prompt=range(10, 40)), seq("other", prompt=range(50, 60))  # 30 and 10 tokens
    scheduler.add(long)
    scheduler.add(other)
    plan = scheduler.schedule(set(), 0.0)  # idle: 12 tokens, one chunk of at most 8 per sequence
    assert [(scheduler.running[c.slot].id, c.start, c.length) for c in plan.chunks] == [("long", 0, 8), ("other", 0, 4)]
    run(scheduler, plan)
    run(scheduler, scheduler.schedule(set(), 0.0))
    run(scheduler, scheduler.schedule(set(), 0.0))
    assert other.status is Status.RUNNING and long.prefilled == 24  # 8 + 8 + 8 while nothing decoded
    plan = scheduler.schedule(set(), 0.0)  # now `other` decodes: the budget is 4
    assert plan.decode == [other] and [(c.start, c.length) for c in plan.chunks] == [(24, 4)]


def machine_s(plan) -> float:
    """A made-up machine's step: 5 ms to decode, and a chunk adds 1 ms a token and 2 us a cached position each of
    its tokens attends to."""
    return (0.005 if plan.decode else 0.0) + sum(0.001 * c.length + 2e-6 * attended(c.start, c.length)
                                                 for c in plan.chunks)


def test_while_answers_stream_a_chunk_is_sized_to_keep_the_step_within_the_stall_bound_and_alone_it_is_not():
    def chunks_of(long: RequestState, streaming: bool) -> list[tuple[int, int, float]]:
        scheduler = Scheduler(3, 4, max_chunk=64, budget=16, idle_budget=64)
        if streaming:
            scheduler.add(seq("running"))
            run(scheduler, scheduler.schedule(set(), 0.0))  # from here an answer streams
            for _ in range(3):
                plan = scheduler.schedule(set(), 0.0)
                scheduler.costs.observe(len(plan.decode), [], machine_s(plan))
                run(scheduler, plan)
        scheduler.add(long)
        chunks = []
        while long.status is not Status.RUNNING:
            plan = scheduler.schedule(set(), 0.0)
            assert bool(plan.decode) == streaming
            took = machine_s(plan)
            scheduler.costs.observe(len(plan.decode), [(c.start, c.length) for c in plan.chunks], took)
            chunks += [(c.start, c.length, took) for c in plan.chunks if scheduler.running[c.slot] is long]
            run(scheduler, plan)
        assert chunks[-1][0] + chunks[-1][1] == 1000
        assert all(b == a + n for (a, n, _), (b, _, _) in itertools.pairwise(chunks))  # no gap, no overlap
        return chunks

    alone = chunks_of(seq("long", prompt=range(10, 1010)), streaming=False)  # a 1,000-token prompt
    assert all(n == 64 for _, n, _ in alone[:-1])  # nothing decodes: the idle budget, however far in
    streaming = chunks_of(seq("long", prompt=range(10, 1010)), streaming=True)
    assert [n for _, n, _ in streaming[:SEEN]] == [COLD_CHUNK] * SEEN  # small until the costs are known
    learned = streaming[SEEN:-1]
    assert all(took <= STALL * 0.005 + 1e-9 for _, _, took in learned)  # within the bound, however far in
    for start, n, _ in learned:  # and as long as it may be: a token more would pass the bound or the budget
        assert n == 16 or 0.005 + 0.001 * (n + 1) + 2e-6 * attended(start, n + 1) > STALL * 0.005 - 1e-9
    lengths = [n for _, n, _ in learned]
    assert lengths == sorted(lengths, reverse=True) and lengths[0] > lengths[-1] >= 1  # fewer far into it


def test_a_step_that_cannot_fit_even_one_token_still_moves_its_first_prompt_on_and_admits_no_one_else():
    scheduler = Scheduler(4, 4, max_chunk=64, budget=16, idle_budget=64)
    scheduler.add(seq("running"))
    run(scheduler, scheduler.schedule(set(), 0.0))
    scheduler.costs.observe(1, [], 0.001)  # decoding takes 1 ms
    for n in range(1, 4):
        scheduler.costs.observe(1, [(0, n)], 0.001 + 0.1 * n)  # and every chunk token 100 ms: past the bar
    first, second = seq("first", prompt=range(10, 40)), seq("second", prompt=range(50, 80))
    scheduler.add(first)
    scheduler.add(second)
    plan = scheduler.schedule(set(), 0.0)
    assert [(scheduler.running[c.slot].id, c.length) for c in plan.chunks] == [("first", 1)] and plan.admitted == [first]
    run(scheduler, plan)
    assert [(scheduler.running[c.slot].id, c.length) for c in scheduler.schedule(set(), 0.0).chunks] == [("first", 1)]


def test_overloaded_once_the_queue_is_full_counting_those_who_will_take_a_free_slot():
    scheduler, _ = scheduler_with(2, 1, "a", "b", "c")  # two will take the free slots, one waits
    with pytest.raises(Overloaded, match=r"full \(1 waiting\)"):
        scheduler.add(seq("d"))
    scheduler.schedule(set(), 0.0)  # a takes a slot: one free slot, b and c wait
    with pytest.raises(Overloaded):
        scheduler.add(seq("d"))


def test_a_queue_of_zero_takes_only_as_many_as_there_are_free_slots():
    scheduler, _ = scheduler_with(1, 0, "a")
    with pytest.raises(Overloaded):
        scheduler.add(seq("b"))


def test_positions_count_only_those_who_wait_for_a_slot_and_are_reported_when_they_change():
    scheduler, s = scheduler_with(2, 4, "a", "b", "c", "d")
    plan = scheduler.schedule(set(), 0.0)  # a takes a slot; one slot free for b: b is not queued
    assert plan.queued == [(s["c"], 1), (s["d"], 2)]
    run(scheduler, plan)
    plan = scheduler.schedule(set(), 0.0)  # b takes the other slot
    assert plan.queued == []  # c is still 1st, d still 2nd
    run(scheduler, plan)
    scheduler.finish(s["a"])
    plan = scheduler.schedule(set(), 0.0)  # c takes a's slot
    assert (plan.admitted, plan.queued) == ([s["c"]], [(s["d"], 1)])


def test_cancelled_requests_end_whether_running_or_waiting_and_free_their_slot():
    scheduler, s = scheduler_with(1, 4, "a", "b", "c")
    run(scheduler, scheduler.schedule(set(), 0.0))
    plan = scheduler.schedule({"a", "c", "unknown"}, 0.0)
    assert plan.ended == [(s["a"], FinishReason.CANCELLED), (s["c"], FinishReason.CANCELLED)]
    assert s["a"].status is s["c"].status is Status.FINISHED
    assert plan.admitted == [s["b"]] and s["b"].slot == 0  # a's slot went to the next in line at once
    assert scheduler.requests() == [s["b"]] and scheduler.find("a") is None


def test_a_running_request_past_its_deadline_ends_with_timeout():
    scheduler = Scheduler(1, 1, max_chunk=8, budget=8)
    late = seq("late", timeout_s=1.0)
    scheduler.add(late)
    run(scheduler, scheduler.schedule(set(), 0.0))
    late.started = 10.0
    assert scheduler.schedule(set(), 11.0).ended == []
    assert scheduler.schedule(set(), 11.5).ended == [(late, FinishReason.TIMEOUT)]
    assert scheduler.free_slots == [0]


# ---- prefix placement ----


def test_a_finished_sequence_leaves_its_prompt_and_answer_reusable_in_its_slot():
    scheduler = Scheduler(2, 4, max_chunk=8, budget=8)
    first = seq("first", prompt=[5, 6, 7])
    scheduler.add(first)
    run(scheduler, scheduler.schedule(set(), 0.0))  # prompt prefilled; answer token 0 sampled
    run(scheduler, scheduler.schedule(set(), 0.0))  # token 0 fed; answer token 0 sampled again
    scheduler.finish(first)
    turn = seq("turn", prompt=[5, 6, 7, 0, 0, 8])
    scheduler.add(turn)
    plan = scheduler.schedule(set(), 0.0)
    assert (turn.slot, turn.reused) == (first.slot, 4)  # the prompt and the fed answer token
    assert [(c.start, c.length) for c in plan.chunks] == [(4, 2)]


def test_a_request_that_asks_for_no_cached_prefix_computes_its_whole_prompt_and_leaves_it_reusable():
    scheduler = Scheduler(2, 4, max_chunk=8, budget=8)
    first = seq("first", prompt=[5, 6, 7])
    scheduler.add(first)
    run(scheduler, scheduler.schedule(set(), 0.0))
    scheduler.finish(first)
    request = GenerationRequest("again", [5, 6, 7, 9], SamplingParams(max_new_tokens=4, cache_prompt=False))
    again = RequestState(request, lambda event: None, TOKENIZER, TOKENIZER.eos_token_ids, now=0.0)
    scheduler.add(again)
    plan = scheduler.schedule(set(), 0.0)
    assert again.reused == 0 and [(c.start, c.length) for c in plan.chunks] == [(0, 4)]
    assert again.slot != first.slot  # the least recently used slot, not the one holding the prefix
    run(scheduler, plan)
    scheduler.finish(again)
    later = seq("later", prompt=[5, 6, 7, 9, 1])
    scheduler.add(later)
    scheduler.schedule(set(), 0.0)
    assert (later.slot, later.reused) == (again.slot, 4)  # what it computed is reused by the next one


def test_a_request_that_waits_longer_than_the_queue_allows_ends_with_queue_timeout_and_the_others_go_on():
    scheduler = Scheduler(1, 2, max_chunk=8, budget=8, queue_timeout_s=30.0)
    running, patient, late = seq("running"), seq("patient"), seq("late")
    for s in (running, late):
        scheduler.add(s)
    patient.submitted = 20.0  # came later, so waited less
    scheduler.add(patient)
    run(scheduler, scheduler.schedule(set(), 0.0))
    assert scheduler.schedule(set(), 30.0).ended == []
    plan = scheduler.schedule(set(), 30.5)
    assert plan.ended == [(late, FinishReason.QUEUE_TIMEOUT)] and late.status is Status.FINISHED
    assert plan.queued == [(patient, 1)]  # moved up
    assert scheduler.schedule(set(), 51.0).ended == [(patient, FinishReason.QUEUE_TIMEOUT)]
    assert running.status is Status.RUNNING  # a running request is past the queue: only its own deadline counts




def test_the_prompt_budget_grows_with_a_large_batch_and_stays_at_small_ones():
    from typewriter.engine.scheduler import BUDGET_ROWS

    scheduler = Scheduler(64, 4, max_chunk=64, budget=16, idle_budget=64)
    assert [scheduler.step_budget(rows) for rows in (0, 1, BUDGET_ROWS, 2 * BUDGET_ROWS, 4 * BUDGET_ROWS)] == \
        [64, 16, 16, 32, 64]


def test_newcomers_arriving_together_share_a_step_that_one_alone_would_not_be_given():
    def ready(scheduler):
        scheduler.add(seq("running"))
        run(scheduler, scheduler.schedule(set(), 0.0))
        scheduler.costs.observe(1, [], 0.010)  # decoding takes 10 ms
        for n in range(1, SEEN + 1):
            scheduler.costs.observe(1, [(0, n)], 0.010 + 0.001 * n)  # and every chunk token 1 ms

    alone = Scheduler(8, 8, max_chunk=64, budget=16, idle_budget=64)
    ready(alone)
    alone.add(seq("only", prompt=range(10, 40)))
    (chunk,) = alone.schedule(set(), 0.0).chunks
    assert chunk.length == 7  # within STALL times the 10 ms step: 7.5 ms
    together = Scheduler(8, 8, max_chunk=64, budget=32, idle_budget=64)  # four budgets: the time rule binds
    ready(together)
    for name in "abcd":
        together.add(seq(name, prompt=range(10, 40)))  # 30 tokens each
    plan = together.schedule(set(), 0.0)
    took = sum(c.length for c in plan.chunks)
    assert [together.running[c.slot].id for c in plan.chunks] == ["a", "b", "c"]
    assert plan.chunks[0].length == 30  # first come first
    assert 0.070 < 0.001 * took <= INTER_TOKEN_S * HEADROOM - 0.010 + 1e-9  # up to the bar's step, 80 ms


def test_while_the_costs_are_unknown_a_step_prefills_a_few_small_chunks_however_many_arrive():
    scheduler = Scheduler(16, 16, max_chunk=64, budget=16, idle_budget=64)
    scheduler.add(seq("running"))
    run(scheduler, scheduler.schedule(set(), 0.0))
    for n in range(12):
        scheduler.add(seq(f"n{n}", prompt=range(10, 40)))
    plan = scheduler.schedule(set(), 0.0)
    assert [c.length for c in plan.chunks] == [COLD_CHUNK] * (16 // COLD_CHUNK)  # the budget, not 12 of them


def test_a_newcomer_waits_for_the_shared_prefix_another_is_computing_and_then_copies_it():
    """A class arriving together on a fresh server: the second student copies the system prompt the first is
    computing instead of computing it too; the queue stays first come, first served."""
    def student(rid, prefix, owner):
        request = GenerationRequest(rid, [*prefix, *range(100, 106)], SamplingParams(max_new_tokens=4),
                                    owner=owner, shared_prefix=(len(prefix),))
        return RequestState(request, lambda event: None, TOKENIZER, TOKENIZER.eos_token_ids, now=0.0)

    system = list(range(10, 30))  # 20 tokens
    scheduler = Scheduler(4, 4, max_chunk=8, budget=8, idle_budget=8)
    first, second = student("first", system, "a"), student("second", system, "b")
    other = student("other", list(range(40, 60)), "c")
    for s in (first, second, other):
        scheduler.add(s)
    plan = scheduler.schedule(set(), 0.0)
    assert plan.admitted == [first] and [(scheduler.running[c.slot].id, c.length) for c in plan.chunks] == [("first", 8)]
    run(scheduler, plan)
    plan = scheduler.schedule(set(), 0.0)  # 8 of 20 computed: the second still waits, and the third behind it
    assert plan.admitted == []
    run(scheduler, plan)
    run(scheduler, scheduler.schedule(set(), 0.0))  # 24 of 26: the system prompt is in the cache
    plan = scheduler.schedule(set(), 0.0)
    assert second in plan.admitted and (first.slot, second.slot) in plan.copies and second.reused == len(system)
