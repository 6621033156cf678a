"""Fair shares over a real server and real sockets: a scripted greedy student who fills every slot and the queue
with parallel chats cannot make a classmate wait past the next free slot, and the classmate's page is told so.
Paired with the same chat sent as the greedy student's own, which waits behind its backlog: the bound comes from
the fair share, not from luck."""

from __future__ import annotations

import asyncio
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


async def ask(address: str, cookie_header: str, chat_id: str, sent: dict, started: dict, told: dict) -> None:
    """One chat on a socket of its own; notes when it was sent, when its `start` came and the places it was told."""
    async with connect(f"ws://{address}/ws", additional_headers={"cookie": cookie_header}) as ws:
        sent[chat_id] = time.monotonic()
        await ws.send(chat_json(chat_id, f"question {chat_id}", max_new_tokens=24))
        while (frame := await recv_json(ws, 30))["type"] not in ("end", "error"):
            if frame["type"] == "queued":
                told.setdefault(chat_id, []).append(frame["position"])
            elif frame["type"] == "start":
                started[chat_id] = time.monotonic()
        assert frame["type"] == "end", frame


def run_class(late_is_classmate: bool) -> tuple[dict, dict, dict]:
    """The greedy student's chats, then one more chat once they fill the slots and wait: a classmate's, or the
    greedy student's own."""
    engine = script_engine(["ab"] * 24, step_s=0.01, slots=SLOTS, max_queue=16)
    sent, started, told = {}, {}, {}

    async def scenario(address):
        greedy, classmate = cookie(address), cookie(address)
        chats = [asyncio.create_task(ask(address, greedy, f"g{n}", sent, started, told)) for n in range(GREEDY_CHATS)]
        await asyncio.to_thread(wait_until, lambda: engine.stats().queued == GREEDY_CHATS - SLOTS, "the backlog")
        chats.append(asyncio.create_task(ask(address, classmate if late_is_classmate else greedy, "late", sent,
                                             started, told)))
        await asyncio.gather(*chats)

    with running(engine) as (_, address):
        asyncio.run(scenario(address))
    return sent, started, told


def went_before(told: dict, started: dict) -> list[str]:
    """The greedy chats that waited for a slot (each was told a place) and got one before "late"."""
    return [c for c in told if c != "late" and started[c] < started["late"]]


def test_a_greedy_students_backlog_cannot_make_a_classmate_wait_past_the_next_free_slot():
    sent, started, told = run_class(late_is_classmate=True)
    assert told["late"] == [1]  # the page says it is next, and it is
    assert len(went_before(told, started)) <= 1  # at most a greedy chat given the same step's other slot
    assert all(c in started for c in sent)  # and the greedy student was still served: nothing is refused


def test_the_same_chat_as_the_greedy_students_own_waits_behind_its_backlog():
    sent, started, told = run_class(late_is_classmate=False)
    assert told["late"][0] == GREEDY_CHATS - SLOTS + 1  # last in line, behind its own six
    assert len(went_before(told, started)) == GREEDY_CHATS - SLOTS
