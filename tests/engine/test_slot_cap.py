"""The slot count while serving: decode-only steps set against the probe's step model raise the open slots to the
most whose step stays within the budget (a wider one, a slot for each, while chats wait for one), lower them once
the step passes the capacity bar itself, hold between, keep within their bounds, and say why."""

from __future__ import annotations

import pytest

from typewriter.engine.capacity import STEP_BUDGET_S, StepModel, typical_position
from typewriter.engine.slot_cap import EVERY, ROOM, WAITING_BUDGET_S, WAITING_EVERY, SlotCap
from typewriter.engine.step_cost import HEADROOM, INTER_TOKEN_S

MODEL = StepModel(fixed_s=0.006, per_row_s=0.0012, per_row_position_s=1e-6)
CONTEXT = 2048
POSITION = typical_position(CONTEXT)


def serve(cap: SlotCap, scale: float, rows: int, steps: int = EVERY, position: int = 300, waiting: int = 0):
    """`steps` decode-only steps of `rows` rows at `position`, each `scale` times what the model says, with
    `waiting` chats left without a slot."""
    changes = []
    for _ in range(steps):
        change = cap.observe(rows, rows * position, scale * MODEL.step_s(rows, position), waiting)
        if change is not None:
            changes.append(change)
    return changes


def most_within_budget(scale: float, most: int = 64, budget_s: float = STEP_BUDGET_S) -> int:
    n = 1
    while n < most and scale * MODEL.step_s(n + 1, POSITION) <= budget_s:
        n += 1
    return n


def test_steps_cheaper_than_the_probe_said_raise_the_count_and_say_why():
    """A probe on a busy machine measured three times the steps this one takes."""
    cap = SlotCap(MODEL, slots=most_within_budget(3.0), most=64, max_context=CONTEXT)
    assert serve(cap, 1.0, rows=cap.slots, steps=EVERY - 1) == []  # a few steps move nothing
    (change,) = serve(cap, 1.0, rows=cap.slots, steps=1)
    assert change.before < change.after == cap.slots == most_within_budget(1.0)
    assert change.why.startswith(f"raised: {change.after} slots step in about")
    assert change.why.endswith(f"within the budget of {STEP_BUDGET_S * 1000:.0f} ms (decode steps take 1.00x the "
                               "start's measurement)")


def test_steps_past_the_bar_lower_the_count_and_between_budget_and_bar_it_holds():
    start = most_within_budget(1.0)
    cap = SlotCap(MODEL, slots=start, most=64, max_context=CONTEXT)
    assert serve(cap, 0.92, rows=start, steps=4 * EVERY) == []  # a few percent cheaper opens no slot (ROOM)
    assert 0.92 * ROOM > 1.0
    assert serve(cap, 1.5, rows=start, steps=4 * EVERY) == []  # slower, but within the bar: a queue would cost more
    assert 1.5 * MODEL.step_s(start, POSITION) < INTER_TOKEN_S
    (change,) = serve(cap, 2.0, rows=start, steps=3 * EVERY)
    assert change.after == cap.slots == most_within_budget(2.0, budget_s=INTER_TOKEN_S * HEADROOM) < start
    assert change.why.startswith(f"lowered: {start} slots step in about")
    assert "past the capacity bar of 100 ms (decode steps take 2.00x" in change.why
    assert serve(cap, 2.0, rows=cap.slots, steps=3 * EVERY) == []  # where it fell, the step is within the bar


def test_the_count_stays_within_its_bounds():
    cap = SlotCap(MODEL, slots=8, most=12, max_context=CONTEXT)
    (change,) = serve(cap, 0.1, rows=8)
    assert change.after == cap.slots == 12  # never past the slots whose caches were allocated
    assert serve(cap, 0.1, rows=12, steps=3 * EVERY) == []
    cap = SlotCap(MODEL, slots=8, most=12, max_context=CONTEXT)
    (change,) = serve(cap, 50.0, rows=8)
    assert change.after == cap.slots == 1  # one student, however slow


def test_many_rows_weigh_more_than_few():
    """A one-row step is mostly fixed cost: it says little of what one more row costs."""
    cap = SlotCap(MODEL, slots=20, most=64, max_context=CONTEXT)
    serve(cap, 3.0, rows=1, steps=EVERY // 2 + 1)
    serve(cap, 1.0, rows=20, steps=EVERY // 2 - 1)
    assert cap.scale() == pytest.approx(1.0)


def test_each_change_is_judged_on_the_steps_since_the_last():
    cap = SlotCap(MODEL, slots=4, most=64, max_context=CONTEXT)
    (first,) = serve(cap, 1.0, rows=4)
    assert serve(cap, 1.0, rows=cap.slots, steps=EVERY - 1) == []
    assert first.after == cap.slots


def test_chats_waiting_for_a_slot_raise_the_count_a_slot_each_within_the_wider_budget():
    """A class of 32 on 29 slots: three students would each wait a whole answer and take another's cached talk."""
    start = most_within_budget(1.0)
    assert STEP_BUDGET_S < WAITING_BUDGET_S < INTER_TOKEN_S * HEADROOM
    assert serve(SlotCap(MODEL, slots=start, most=64, max_context=CONTEXT), 1.0, rows=start,
                 steps=3 * EVERY) == []  # full, but nobody waits: it holds
    cap = SlotCap(MODEL, slots=start, most=64, max_context=CONTEXT)
    assert serve(cap, 1.0, rows=start, steps=WAITING_EVERY - 1, waiting=3) == []  # a few steps move nothing
    (change,) = serve(cap, 1.0, rows=start, steps=1, waiting=3)
    assert (change.before, change.after) == (start, start + 3) and cap.slots == start + 3
    assert change.why.startswith(f"raised: 3 chats waited for a slot; {start + 3} slots step in about")
    assert f"within the budget while chats wait of {WAITING_BUDGET_S * 1000:.0f} ms" in change.why
    # however many wait, no further than the wider budget; and there it holds, as the step is within the bar
    (change,) = serve(cap, 1.0, rows=cap.slots, steps=WAITING_EVERY, waiting=40)
    assert change.after == cap.slots == most_within_budget(1.0, budget_s=WAITING_BUDGET_S) < start + 3 + 40
    assert serve(cap, 1.0, rows=cap.slots, steps=3 * EVERY, waiting=40) == []
    assert serve(cap, 1.0, rows=cap.slots, steps=3 * EVERY) == []


def test_waiting_chats_open_no_slot_past_the_allocated_nor_on_a_machine_that_got_slow():
    cap = SlotCap(MODEL, slots=10, most=12, max_context=CONTEXT)
    (change,) = serve(cap, 1.0, rows=10, steps=WAITING_EVERY, waiting=5)
    assert change.after == cap.slots == 12
    slow = 3.0  # steps take three times the probe's: the budget holds fewer than are open
    cap = SlotCap(MODEL, slots=most_within_budget(slow, budget_s=WAITING_BUDGET_S), most=64, max_context=CONTEXT)
    assert serve(cap, slow, rows=cap.slots, steps=3 * EVERY, waiting=5) == []
