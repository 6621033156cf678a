"""Fair shares over a real server and real sockets: a scripted greedy student who fills every slot and the queue
with parallel chats cannot make a classmate wait for a slot at all: the greedy student's latest answer is parked
the step the classmate comes, and still ends whole. Paired with the same chat sent as the greedy student's own,
which waits behind its backlog: the bound comes from the fair share, not from luck. And with readers kept, a
classmate reading an answer keeps its share: the greedy student's extra chats wait while a slot stays free, and the
classmate's next question starts at once."""

from __future__ import annotations

import asyncio
import re
import time

import httpx
from helpers import chat_json, recv_json, wait_until
from scripted import script_engine
from served import running
from websockets.asyncio.client import connect

GREEDY_CHATS = 8
SLOTS = 2


def cookie(address: str) -> str:
    return httpx.get(f"http://{address}/").headers["set-cookie"].split(";", 1)[0]


async def ask(address: str, cookie_header: str, chat_id: str, sent: dict, started: dict, told: dict,
              texts: dict) -> None:
    """One chat on a socket of its own; notes when it was sent, when its `start` came, the places it was told and
    its answer."""
    async with connect(f"ws://{address}/ws", additional_headers={"cookie": cookie_header}) as ws:
        sent[chat_id] = time.monotonic()
        await ws.send(chat_json(chat_id, f"question {chat_id}", max_new_tokens=24))
        texts[chat_id] = ""
        while (frame := await recv_json(ws, 30))["type"] not in ("end", "error"):
            if frame["type"] == "queued":
                told.setdefault(chat_id, []).append(frame["position"])
            elif frame["type"] == "start":
                assert chat_id not in started, "a second start"
                started[chat_id] = time.monotonic()
            elif frame["type"] == "token":
                texts[chat_id] += frame["text"]
        assert frame["type"] == "end", frame


def run_class(late_is_classmate: bool) -> tuple[dict, dict, dict, dict]:
    """The greedy student's chats, then one more chat once they fill the slots and wait: a classmate's, or the
    greedy student's own."""
    engine = script_engine(["ab"] * 24, step_s=0.01, slots=SLOTS, max_queue=16)
    sent, started, told, texts = {}, {}, {}, {}

    async def scenario(address):
        greedy, classmate = cookie(address), cookie(address)
        chats = [asyncio.create_task(ask(address, greedy, f"g{n}", sent, started, told, texts))
                 for n in range(GREEDY_CHATS)]
        await asyncio.to_thread(wait_until, lambda: engine.stats().queued == GREEDY_CHATS - SLOTS, "the backlog")
        chats.append(asyncio.create_task(ask(address, classmate if late_is_classmate else greedy, "late", sent,
                                             started, told, texts)))
        await asyncio.gather(*chats)
        metrics = httpx.get(f"http://{address}/metrics").text
        texts["parked"] = float(re.search(r"^typewriter_parked_requests_total (\S+)$", metrics, re.M).group(1))

    with running(engine) as (_, address):
        asyncio.run(scenario(address))
    return sent, started, told, texts


def went_before(told: dict, started: dict) -> list[str]:
    """The greedy chats that waited for a slot (each was told a place) and got one before "late"."""
    return [c for c in told if c != "late" and started[c] < started["late"]]


def test_a_greedy_students_backlog_cannot_make_a_classmate_wait_for_a_slot():
    sent, started, told, texts = run_class(late_is_classmate=True)
    assert "late" not in told  # never queued: a slot was given back for it at once
    assert went_before(told, started) == []  # none of the greedy student's waiting chats went first
    assert all(c in started for c in sent)  # and the greedy student was still served: nothing is refused
    assert texts.pop("parked") >= 1
    assert len(set(texts.values())) == 1 and len(texts["g0"]) == 48  # every answer whole, a parked one too


def test_the_same_chat_as_the_greedy_students_own_waits_behind_its_backlog():
    sent, started, told, _ = run_class(late_is_classmate=False)
    assert told["late"][0] == GREEDY_CHATS - SLOTS + 1  # last in line, behind its own six
    assert len(went_before(told, started)) == GREEDY_CHATS - SLOTS


def metric(address: str, name: str) -> float:
    text = httpx.get(f"http://{address}/metrics").text
    return float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))


def test_a_classmate_reading_keeps_a_slot_that_the_greedy_students_extra_chats_do_not_take():
    engine = script_engine(["ab"] * 24, step_s=0.01, slots=SLOTS, max_queue=16, keep_for_readers_s=60.0)
    sent, started, told, texts = {}, {}, {}, {}

    async def scenario(address):
        greedy, classmate = cookie(address), cookie(address)
        await ask(address, classmate, "first", sent, started, told, texts)  # answered: the classmate reads it
        chats = [asyncio.create_task(ask(address, greedy, f"g{n}", sent, started, told, texts)) for n in range(4)]
        await asyncio.to_thread(wait_until, lambda: engine.stats().queued == 3, "the greedy student's backlog")
        stats = engine.stats()
        assert (stats.active, stats.readers) == (1, 1)  # one slot free, kept for the reader
        assert metric(address, "typewriter_readers_kept") == 1
        await ask(address, classmate, "again", sent, started, told, texts)
        await asyncio.gather(*chats)
        assert metric(address, "typewriter_parked_requests_total") == 0  # the kept slot was free: nothing parked

    with running(engine) as (_, address):
        asyncio.run(scenario(address))
    assert "again" not in told and "first" not in told
    assert sorted(p[0] for c, p in told.items() if c.startswith("g")) == [1, 2, 3]
    assert len(set(texts.values())) == 1 and len(texts["g0"]) == 48
