"""Fair shares (engine/fairness.py) and the scheduler that follows them: who takes a free slot, whose prompt gets a
step's budget, the queue positions the pages are told, and the service each class and student gets over time.
Pure Python: a scheduler driven step by step, each request answering a fixed number of tokens."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest
from scripted import ScriptTokenizer

from typewriter.engine.fairness import FORGET_AT, FairShare, Ledger, slot_shares
from typewriter.engine.request import FinishReason, GenerationRequest, SamplingParams, Share
from typewriter.engine.request_state import RequestState, Status
from typewriter.engine.scheduler import Scheduler
from typewriter.errors import InvalidRequest

TOKENIZER = ScriptTokenizer(["x"])
_words = itertools.count(100)


def request(rid: str, client: str = "", group: str = "", weight: float = 1.0, prompt: int = 4,
            answer: int = 4) -> RequestState:
    """A request whose prompt no other shares (so that no cached prefix is copied between them). Its answer is one
    token repeated: a long one runs to its length only without the loop guard."""
    ids = [next(_words) % 4000 + 3 for _ in range(prompt)]
    params = SamplingParams(max_new_tokens=answer, temperature=0.0, loop_guard=answer < 20)  # long fake answers repeat
    return RequestState(GenerationRequest(rid, ids, params, share=Share(client, group, weight)), lambda e: None,
                        TOKENIZER, TOKENIZER.eos_token_ids, now=0.0)


class Run:
    """A scheduler and what the engine would do with its plans: prefill the chunks, one token per decoding row,
    and end an answer at its length. Records each request's queue positions and the step it started in."""

    def __init__(self, slots: int, budget: int = 64, max_queue: int = 64, check=None, keep_for_readers_s: float = 0.0):
        """`check(run, plan)`: called with each plan, before the engine would run it. Each step takes a second of
        `now`."""
        self.scheduler = Scheduler(slots, max_queue, max_chunk=64, budget=budget, idle_budget=budget,
                                   keep_for_readers_s=keep_for_readers_s)
        self.check = check
        self.now = 0.0
        self.steps = 0
        self.started: dict[str, int] = {}
        self.told: dict[str, list[int]] = {}
        self.served: dict[str, int] = {}  # tokens generated, by client
        self.finished: list[RequestState] = []

    def add(self, *requests: RequestState) -> None:
        for r in requests:
            self.scheduler.add(r)

    def step(self) -> None:
        scheduler = self.scheduler
        plan = scheduler.schedule(set(), self.now)
        self.now += 1.0
        self.steps += 1
        for r, position in plan.queued:
            self.told.setdefault(r.id, []).append(position)
        for r in plan.admitted:
            self.started[r.id] = self.steps
        if self.check is not None:
            self.check(self, plan)
        taking = list(plan.decode)
        for chunk in plan.chunks:
            r = scheduler.running[chunk.slot]
            scheduler.prefilled(chunk)
            if chunk.wants_logits:
                taking.append(r)
        for r in taking:
            _, reason = r.take(0, now=0.0)
            self.served[r.share.client] = self.served.get(r.share.client, 0) + 1
            if reason is not None:
                assert reason is FinishReason.LENGTH
                scheduler.finish(r)
                self.finished.append(r)

    def until(self, condition, most: int = 1000) -> None:
        for _ in range(most):
            if condition():
                return
            self.step()
        raise AssertionError("the condition was not met")


# ---- the counters ----


def test_a_newcomer_starts_at_the_least_counter_of_those_waiting_so_idle_time_banks_no_credit():
    ledger = Ledger()
    ledger.arrive("busy")
    ledger.accounts["busy"].served = 50.0
    ledger.arrive("new")
    assert ledger.accounts["new"].served == 50.0
    ledger.leave("new")
    ledger.accounts["busy"].served = 80.0
    ledger.arrive("new")  # back after a while: lifted to the busy one's counter, no credit for the time away
    assert ledger.accounts["new"].served == 80.0


def test_a_counter_is_never_lowered_by_coming_back():
    ledger = Ledger()
    ledger.arrive("a")
    ledger.accounts["a"].served = 90.0
    ledger.leave("a")
    ledger.arrive("b")
    ledger.arrive("a")
    assert ledger.accounts["a"].served == 90.0


def test_idle_counters_are_forgotten_so_that_the_ledger_stays_bounded():
    ledger = Ledger()
    for n in range(10 * FORGET_AT):
        ledger.arrive(f"s{n}")
        ledger.leave(f"s{n}")
    assert len(ledger.accounts) <= 2 * FORGET_AT + 1


def test_a_group_is_charged_its_service_over_its_weight_and_a_client_the_service_itself():
    fair = FairShare()
    heavy, light = Share("ana", "algebra", 2.0), Share("ben", "biology", 1.0)
    fair.arrive(heavy)
    fair.arrive(light)
    fair.charge(heavy, 10.0)
    fair.charge(light, 10.0)
    assert fair.served(heavy) == (5.0, 10.0) and fair.served(light) == (10.0, 10.0)


@pytest.mark.parametrize("weight", [0.0, -1.0, float("nan"), float("inf")])
def test_a_share_needs_a_positive_finite_weight(weight):
    with pytest.raises(InvalidRequest, match="share.weight"):
        Share("a", "g", weight)


# ---- the scheduler ----


def test_without_shares_slots_go_first_come_first_served():
    run = Run(slots=1)
    run.add(*(request(f"r{n}") for n in range(4)))
    run.until(lambda: len(run.finished) == 4)
    assert [r.id for r in run.finished] == ["r0", "r1", "r2", "r3"]


def test_a_classmate_takes_the_next_free_slot_ahead_of_a_greedy_students_backlog():
    run = Run(slots=2)  # the greedy student and ben hold a slot each: their shares, so nobody parks
    run.add(request("ben", "ben", "class", answer=60))
    run.add(*(request(f"greedy{n}", "greedy", "class") for n in range(8)))
    run.until(lambda: run.scheduler.free_slots == [] and len(run.started) == 2)
    run.add(request("classmate", "classmate", "class"))
    run.step()
    assert run.told["classmate"] == [1]  # told it is next, not seventh
    arrived = run.steps
    run.until(lambda: "classmate" in run.started)
    first_after = min(step for step in run.started.values() if step > arrived)
    assert run.started["classmate"] == first_after  # nobody waiting went before it


def test_the_greedy_students_places_move_back_when_a_classmate_goes_ahead():
    run = Run(slots=1)
    run.add(*(request(f"greedy{n}", "greedy", "class", answer=6) for n in range(3)))
    run.step()
    assert run.told == {"greedy1": [1], "greedy2": [2]}
    run.add(request("classmate", "classmate", "class"))
    run.step()
    assert run.told["classmate"] == [1]
    assert run.told["greedy1"] == [1, 2] and run.told["greedy2"] == [2, 3]


def test_queue_positions_count_down_in_the_order_slots_are_taken():
    run = Run(slots=2)
    clients = ["ana", "ben", "ana", "cho", "ana", "ben", "dee", "ana", "ana", "cho"]
    run.add(*(request(f"{c}{n}", c, "class", answer=3 + n % 4) for n, c in enumerate(clients)))
    run.step()
    first = {rid: positions[0] for rid, positions in run.told.items()}
    assert sorted(first.values()) == list(range(1, len(first) + 1))
    run.until(lambda: len(run.started) == len(clients))
    assert sorted(first, key=lambda rid: (run.started[rid], first[rid])) == sorted(first, key=first.get)
    for positions in run.told.values():  # a place only ever comes nearer
        assert positions == sorted(positions, reverse=True)


def test_every_waiting_request_told_a_place_holds_its_place_in_the_current_order():
    checked = []

    def truthful(run, plan):
        free = len(run.scheduler.free_slots)
        for rank, r in enumerate(run.scheduler.order(), start=1):
            if r.id in run.told:
                assert run.told[r.id][-1] == (rank - free if rank > free else 1), (run.steps, r.id)
                checked.append(rank <= free)

    run = Run(slots=3, budget=4, check=truthful)  # a small budget: some wait beside a free slot
    clients = itertools.cycle(["ana", "ben", "ana", "ana", "cho"])
    for n in range(40):
        if n % 3 == 0:
            run.add(*(request(f"r{n}-{k}", next(clients), "class", prompt=8, answer=2 + n % 5) for k in range(3)))
        run.step()
    assert any(checked) and not all(checked)  # both kinds of place were seen


def test_each_student_of_a_class_gets_an_equal_share_however_many_chats_one_sends():
    run = Run(slots=2)
    pending = {"greedy": 0, "ana": 0, "ben": 0}
    ids = itertools.count()

    def top_up():  # the greedy student keeps 6 chats in the engine, the others one each
        for client, most in (("greedy", 6), ("ana", 1), ("ben", 1)):
            while pending[client] < most:
                pending[client] += 1
                r = request(f"{client}{next(ids)}", client, "class", answer=8)
                run.add(r)

    top_up()
    for _ in range(600):
        done = len(run.finished)
        run.step()
        for r in run.finished[done:]:
            pending[r.share.client] -= 1
        top_up()
    served = run.served
    assert served["ana"] == pytest.approx(served["greedy"], rel=0.15)
    assert served["ben"] == pytest.approx(served["greedy"], rel=0.15)


def test_two_busy_classes_are_served_in_the_ratio_of_their_weights():
    run = Run(slots=3, max_queue=200)
    ids = itertools.count()
    students = {"algebra": ["a1", "a2", "a3"], "biology": ["b1", "b2", "b3"]}
    weights = {"algebra": 2.0, "biology": 1.0}
    for group, names in students.items():
        for name in names:
            run.add(*(request(f"{name}-{next(ids)}", name, group, weights[group], answer=6) for _ in range(20)))
    run.until(lambda: sum(run.served.values()) >= 360)  # before either class runs out
    by_class = {g: sum(run.served.get(n, 0) for n in names) for g, names in students.items()}
    assert by_class["algebra"] / by_class["biology"] == pytest.approx(2.0, rel=0.15)


def test_a_lone_client_uses_every_slot_work_conserving():
    run = Run(slots=3)
    run.add(*(request(f"r{n}", "only", "class", answer=20) for n in range(5)))
    run.until(lambda: len(run.scheduler.running) == 3 and all(
        r.status is Status.RUNNING for r in run.scheduler.running.values()))
    assert len(run.scheduler.waiting) == 2


def test_the_step_budget_goes_to_the_least_served_prompt_first():
    run = Run(slots=3, budget=8)
    run.add(request("g0", "greedy", "class", prompt=4, answer=60))
    run.step()
    assert run.scheduler.running[0].status is Status.RUNNING
    run.add(request("g1", "greedy", "class", prompt=60))
    run.step()
    run.step()  # g1 is admitted before anyone else asks, and prefills
    run.add(request("new", "new", "class", prompt=60))
    run.step()
    plan = run.scheduler.schedule(set(), 0.0)
    assert [r.id for r in run.scheduler.prefilling] == ["g1", "new"]  # in the order they were admitted
    assert [run.scheduler.running[c.slot].id for c in plan.chunks] == ["new", "g1"]  # the least served first


def test_a_request_waiting_to_copy_a_prefix_keeps_a_slot_and_others_go_meanwhile():
    run = Run(slots=3, budget=8)
    leader = request("leader", "ana", "class", prompt=40)
    follower = RequestState(GenerationRequest("follower", list(leader.prompt_ids), leader.params, follows="leader",
                                              share=leader.share), lambda e: None, TOKENIZER,
                            TOKENIZER.eos_token_ids, now=0.0)
    other = request("other", "ben", "class", prompt=4)
    run.add(leader, follower, other)
    run.step()
    assert set(run.started) == {"leader", "other"}
    run.until(lambda: "follower" in run.started)
    assert follower.reused == len(leader.prompt_ids) - 1  # copied, all but the token left for its logits


# ---- slots given back: a client over its share parks a request while another waits under its own ----


def test_slot_shares_are_max_min_fair_by_class_weight_then_equal_per_student_capped_at_demand():
    demand = {("algebra", "greedy"): 8, ("algebra", "ana"): 1, ("biology", "ben"): 5, ("biology", "cy"): 5}
    shares = slot_shares(demand, {"algebra": 2.0, "biology": 1.0}, 12)
    assert shares[("algebra", "ana")] == 1.0  # asks for less than its share: the rest goes to its classmate
    assert shares[("algebra", "greedy")] == pytest.approx(7.0)
    assert shares[("biology", "ben")] == shares[("biology", "cy")] == pytest.approx(2.0)
    assert sum(shares.values()) == pytest.approx(12.0)
    few = slot_shares({("c", "a"): 1, ("c", "b"): 2}, {"c": 1.0}, 16)  # more slots than anyone asks for
    assert few == {("c", "a"): 1.0, ("c", "b"): 2.0}


def test_a_student_holding_more_than_its_share_parks_its_latest_chat_for_a_classmate_who_waits():
    run = Run(slots=4)
    greedy = [request(f"g{n}", "greedy", "class", answer=40) for n in range(4)]
    run.add(*greedy)
    run.until(lambda: all(r.status is Status.RUNNING for r in greedy))
    ana, ben = request("ana", "ana", "class", answer=40), request("ben", "ben", "class", answer=40)
    run.add(ana, ben)
    plan = run.scheduler.schedule(set(), 0.0)
    assert [r.id for r in plan.parked] == ["g3", "g2"]  # the latest admitted first
    assert {r.id for r in plan.admitted} == {"ana", "ben"}
    assert [r.id for r in run.scheduler.waiting] == ["g3", "g2"]
    assert not plan.queued  # a parked answer is not told a queue place: its page shows the answer


def test_students_at_their_share_park_nothing_and_a_newcomer_beyond_the_slots_waits():
    run = Run(slots=3)
    first = [request(f"s{n}", f"s{n}", "class", answer=40) for n in range(3)]
    run.add(*first)
    run.until(lambda: all(r.status is Status.RUNNING for r in first))
    run.add(request("late", "late", "class", answer=40))
    for _ in range(5):
        plan = run.scheduler.schedule(set(), 0.0)
        assert not plan.parked and not plan.admitted


def test_a_parked_answer_resumes_once_a_slot_frees_and_keeps_every_token_it_had():
    run = Run(slots=2)
    greedy = [request(f"g{n}", "greedy", "class", prompt=6, answer=30) for n in range(2)]
    run.add(*greedy)
    run.until(lambda: len(greedy[1].output_ids) >= 5)
    had = list(greedy[1].output_ids)
    run.add(request("ana", "ana", "class", answer=3))
    run.step()
    assert greedy[1].status is Status.WAITING and greedy[1].parks == 1 and greedy[1].output_ids == had
    run.until(lambda: greedy[1].status is not Status.WAITING)  # ana's short answer ended
    assert "ana" in {r.id for r in run.finished}
    plan = run.scheduler.schedule(set(), 0.0)
    fill = [c for c in plan.chunks if c.slot == greedy[1].slot]
    assert fill and fill[-1].start + len(fill[-1].token_ids) <= len(greedy[1].prompt_ids) + len(had)
    assert greedy[1].cached_ids() == (greedy[1].prompt_ids + had)[: greedy[1].prefilled]


def test_a_parked_answer_back_in_its_untouched_slot_reuses_its_own_cache():
    run = Run(slots=2)
    greedy = [request(f"g{n}", "greedy", "class", prompt=6, answer=30) for n in range(2)]
    run.add(*greedy)
    run.until(lambda: len(greedy[1].output_ids) >= 5)
    slot = greedy[1].slot
    ana = request("ana", "ana", "class", answer=2)
    run.add(ana)
    run.step()  # greedy's latest parks, ana takes its slot
    assert ana.slot == slot
    run.until(lambda: ana.status is Status.FINISHED)
    run.until(lambda: greedy[1].status is not Status.WAITING)
    # ana's prompt overwrote the slot, so the resumed answer computes what was lost; nothing it still holds
    assert greedy[1].prefilled <= len(greedy[1].fill_ids) - 1


def test_a_parked_request_neither_times_out_in_the_queue_nor_takes_a_place_in_its_bound():
    scheduler = Scheduler(2, max_queue=1, max_chunk=64, budget=64, idle_budget=64, queue_timeout_s=5.0)
    greedy = [request(f"g{n}", "greedy", "class", answer=40) for n in range(2)]
    for r in greedy:
        scheduler.add(r)
    for _ in range(3):
        plan = scheduler.schedule(set(), 0.0)
        for chunk in plan.chunks:
            scheduler.prefilled(chunk)
    scheduler.add(request("ana", "ana", "class"))
    plan = scheduler.schedule(set(), 1.0)
    assert [r.id for r in plan.parked] == ["g1"]
    scheduler.add(request("ben", "ben", "class"))  # the queue's one place is free: the parked one holds none
    plan = scheduler.schedule(set(), 60.0)  # long past the queue timeout
    assert "g1" not in {r.id for r, _ in plan.ended}
    assert {r.id for r, reason in plan.ended} == {"ben"}  # ben waited past it


def test_a_greedy_student_beside_a_class_takes_no_more_than_a_classmate_while_they_wait():
    """15 students each with one chat and one with 8, on 16 slots: while the class waits, the greedy one's
    answers are parked down to its share, so a classmate's first token never waits behind its backlog."""
    run = Run(slots=16, max_queue=64)
    greedy = [request(f"g{n}", "greedy", "class", answer=200) for n in range(8)]
    run.add(*greedy)
    run.until(lambda: all(r.status is Status.RUNNING for r in greedy))
    class_ = [request(f"s{n}", f"s{n}", "class", answer=50) for n in range(15)]
    run.add(*class_)
    run.until(lambda: all(r.output_ids for r in class_), most=20)
    held = sum(1 for r in run.scheduler.running.values() if r.share.client == "greedy")
    assert held == 1
    run.until(lambda: all(r.status is Status.FINISHED for r in class_))
    run.until(lambda: all(r.status is Status.FINISHED for r in greedy), most=3000)
    assert all(len(r.output_ids) == 200 for r in greedy)  # every parked answer resumed and ran to its length


def test_an_answer_holding_logits_for_its_constraint_is_not_parked_so_they_are_never_lost():
    run = Run(slots=2)
    greedy = [request(f"g{n}", "greedy", "class", answer=40) for n in range(2)]
    run.add(*greedy)
    run.until(lambda: all(r.status is Status.RUNNING for r in greedy))
    for r in greedy:  # each token waits on its mask: what the engine leaves in ConstrainedAnswer.held
        r.constraint = SimpleNamespace(held=np.zeros(4, np.float32))
    run.add(request("ana", "ana", "class"))
    plan = run.scheduler.schedule(set(), 0.0)
    assert not plan.parked and not plan.admitted
    greedy[1].constraint = SimpleNamespace(held=None)  # its mask came, its token taken
    plan = run.scheduler.schedule(set(), 0.0)
    assert [r.id for r in plan.parked] == ["g1"] and [r.id for r in plan.admitted] == ["ana"]


def test_nothing_is_parked_for_a_slot_the_waiting_student_could_not_take():
    run = Run(slots=3)
    greedy = [request(f"g{n}", "greedy", "class", answer=40) for n in range(3)]
    run.add(*greedy)
    run.until(lambda: all(r.status is Status.RUNNING for r in greedy))
    run.scheduler.open = 2  # the slot count was lowered: three run where two may
    run.add(request("ana", "ana", "class"))
    plan = run.scheduler.schedule(set(), 0.0)
    assert not plan.parked and not plan.admitted
    run.scheduler.open = 3
    plan = run.scheduler.schedule(set(), 0.0)
    assert [r.id for r in plan.parked] == ["g2"] and [r.id for r in plan.admitted] == ["ana"]


# ---- slots kept for students reading ----


def held_by(run: Run, client: str) -> int:
    return sum(1 for r in run.scheduler.running.values() if r.share.client == client)


def class_reading(keep_for_readers_s: float) -> tuple[Run, list[RequestState]]:
    """Four slots; three students ask once and read, a greedy one runs four long chats: (the run once the three
    answers ended, the greedy one's chats)."""
    run = Run(slots=4, keep_for_readers_s=keep_for_readers_s)
    class_ = [request(f"s{n}", f"s{n}", "class", answer=4) for n in range(3)]
    greedy = [request(f"g{n}", "greedy", "class", answer=400) for n in range(4)]
    run.add(*class_, *greedy)
    run.until(lambda: all(r.status is Status.FINISHED for r in class_))
    return run, greedy


def test_without_kept_readers_a_greedy_student_takes_the_slots_its_readings_classmates_left():
    run, _ = class_reading(0.0)
    run.until(lambda: held_by(run, "greedy") == 4, most=3)  # work-conserving: no slot idles while it waits


def test_a_student_reading_keeps_its_share_so_a_greedy_one_holds_no_more_than_a_classmate():
    """While its classmates read their answers, the greedy student holds one slot, the three others stay free,
    and its waiting chats are told their places; once the readers are gone the slots are its own again."""
    run, greedy = class_reading(30.0)
    assert set(run.scheduler.readers) == {("class", f"s{n}") for n in range(3)}
    for _ in range(20):
        run.step()
        assert held_by(run, "greedy") == 1
        assert len(run.scheduler.free_slots) == 3
    waiting = [r for r in greedy if r.status is Status.WAITING]
    assert len(waiting) == 3 and sorted(r.last_position for r in waiting) == [1, 2, 3]
    run.until(lambda: held_by(run, "greedy") == 4, most=40)  # the readers' 30 seconds passed
    assert not run.scheduler.readers


def test_a_reader_who_asks_again_starts_at_once_and_nothing_is_parked_for_it():
    run, _ = class_reading(30.0)
    parked: list[RequestState] = []
    run.check = lambda _, plan: parked.extend(plan.parked)
    run.step()
    again = request("s0-again", "s0", "class", answer=4)
    run.add(again)
    run.step()
    assert again.status is not Status.WAITING and again.id in run.started
    assert not parked
    assert ("class", "s0") not in run.scheduler.readers


def test_a_reader_keeps_a_slot_only_for_what_its_share_would_be():
    """More readers than slots: each one's share is under a slot, but they keep only what the students asking are
    not owed: the greedy student is owed one slot (its two-fifths, rounded up) and takes it, no more; a newcomer is
    owed one too, so the readers keep nothing from it."""
    run = Run(slots=2, keep_for_readers_s=30.0)
    class_ = [request(f"s{n}", f"s{n}", "class", answer=2) for n in range(4)]
    run.add(*class_)
    run.until(lambda: all(r.status is Status.FINISHED for r in class_))
    greedy = [request(f"g{n}", "greedy", "class", answer=50) for n in range(2)]
    run.add(*greedy)
    run.step()
    assert held_by(run, "greedy") == 1 and len(run.scheduler.free_slots) == 1  # the other kept for the readers
    newcomer = request("n", "newcomer", "class", answer=4)
    run.add(newcomer)
    run.step()
    assert newcomer.status is not Status.WAITING


@pytest.mark.parametrize(("slots", "per_class", "readers", "kept"), [(8, 2, 2, 2), (4, 2, 4, 0), (3, 3, 6, 0)])
def test_busy_classes_keep_their_weights_beside_another_class_reading(slots, per_class, readers, kept):
    """Readers of a third class keep their share of the slots only beyond what the busy students may hold by their
    own: with room, two slots stay free for them; with none (more students than slots), the busy classes share
    every slot by the counters. Either way the weights hold."""
    run = Run(slots=slots, max_queue=400, keep_for_readers_s=10_000.0)
    history = [request(f"h{n}", f"h{n}", "history", answer=1) for n in range(readers)]
    run.add(*history)
    run.until(lambda: all(r.status is Status.FINISHED for r in history))
    ids = itertools.count()
    weights = {"algebra": 2.0, "biology": 1.0}
    students = {g: [f"{g[0]}{n}" for n in range(per_class)] for g in weights}
    for group, names in students.items():
        for name in names:
            run.add(*(request(f"{name}-{next(ids)}", name, group, weights[group], answer=6) for _ in range(40)))
    run.served.clear()
    free: list[int] = []  # as each step's plan leaves them
    run.check = lambda r, plan: free.append(len(r.scheduler.free_slots))
    run.until(lambda: sum(run.served.values()) >= 80 * slots)
    by_class = {g: sum(run.served.get(n, 0) for n in names) for g, names in students.items()}
    assert by_class["algebra"] / by_class["biology"] == pytest.approx(2.0, rel=0.15)
    assert set(free) == {kept} and len(run.scheduler.readers) == readers
