"""A kept chat's log and the registry's bounds (server/resume/registry.py), driven item by item: what is dropped when a
log must shrink (finished chats' logs first, then what readers were already sent, never what no reader has been
sent), what a resume from a dropped position is told, and the grace period's timers. The chat is a stand-in; the
same rules over real sockets and the real engine are in server/socket/test_resumable.py."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from typewriter.config import Settings
from typewriter.server.chats import Cancel
from typewriter.server.resume.kept_chat import KeptChat, Life
from typewriter.server.resume.registry import Resumes


class Stream:
    """What a kept chat uses of its ChatStream."""

    def __init__(self, name: str):
        self.engine_id = self.chat_id = name
        self.client = SimpleNamespace(id="student")  # whose share of the buffers its log counts in
        self.cancelled: list[Cancel] = []
        self.ended = False

    def cancel(self, why: Cancel) -> None:
        self.cancelled.append(why)

    def end(self) -> None:
        self.ended = True


class Chat(KeptChat):
    """Appends what the test puts on `feed`: (key, text), or None to finish."""

    def __init__(self, registry: Resumes, name: str):
        self.feed: asyncio.Queue = asyncio.Queue()
        self.next = 0
        super().__init__(registry, Stream(name), name)

    @property
    def next_key(self) -> int:
        return self.next

    async def _produce(self) -> None:
        while (item := await self.feed.get()) is not None:
            self.append(*item)
            self.next = item[0] + 1
        self.append(self.next, "end", last=True)
        self.finish()


class Reader:
    def __init__(self):
        self.got: list[str] = []

    async def deliver(self, text: str) -> bool:
        self.got.append(text)
        return True

    def released(self, chat) -> None:
        pass


def registry(per_chat: int = 4096, total: int = 4096 * 3, grace_s: float = 60.0) -> Resumes:
    return Resumes(Settings.of(resume_buffer_bytes=per_chat, resume_buffer_total_bytes=total, resume_grace_s=grace_s),
                   CollectorRegistry())


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def produce(chat: Chat, *items) -> None:
    for item in items:
        await chat.feed.put(item)
    await settle()


def run(coro):
    return asyncio.run(coro)


def test_unsent_items_are_never_dropped_so_a_chat_that_outgrows_its_bound_with_them_ends():
    async def go():
        resumes = registry(per_chat=4096)
        chat = resumes.keep(Chat(resumes, "a"))
        await produce(chat, *[(i, "x" * 1000) for i in range(5)])
        return chat

    chat = run(go())
    assert chat.overflowed and chat.stream.cancelled[0] is Cancel.BUFFER
    assert chat.keys == [0, 1, 2, 3] and chat.bytes == 4000


def test_items_a_reader_was_sent_make_room_and_a_resume_from_before_them_is_lost():
    async def go():
        resumes = registry(per_chat=4096)
        chat = resumes.keep(Chat(resumes, "a"))
        reader = Reader()
        chat.attach(reader, 0)
        for i in range(10):
            await produce(chat, (i, "x" * 1000))
        return chat, reader

    chat, reader = run(go())
    assert not chat.overflowed and len(reader.got) == 10
    assert chat.keys[0] > 0 and chat.bytes <= 4096
    assert chat.lost(0) and chat.lost(chat.keys[0] - 1) and not chat.lost(chat.keys[0])


def test_the_total_bound_forgets_finished_chats_longest_ended_first_then_drops_sent_items_then_refuses():
    async def go():
        resumes = registry(per_chat=4096, total=6000)
        old, newer = (resumes.keep(Chat(resumes, n)) for n in ("old", "newer"))
        await produce(old, (0, "o" * 1500), None)
        await produce(newer, (0, "n" * 1500), None)
        running = resumes.keep(Chat(resumes, "running"))
        reader = Reader()
        running.attach(reader, 0)
        await produce(running, (0, "r" * 2000))  # 5,000 of 6,000
        steps = []
        for i, size in enumerate((1500, 2500, 3000), start=1):
            other = resumes.keep(Chat(resumes, f"more{i}"))
            await produce(other, (0, "m" * size))
            steps.append((old.life, newer.life, running.base, other.overflowed, resumes.bytes))
        return steps

    steps = run(go())
    assert steps[0][:2] == (Life.FORGOTTEN, Life.ENDED)  # the chat that ended longest ago went first
    assert steps[1][:3] == (Life.FORGOTTEN, Life.FORGOTTEN, 0)  # then the other finished one
    assert steps[2][2:4] == (1, True)  # then what the running chat's reader had been sent: not enough, refused
    assert all(total <= 6000 + 3 for *_, total in steps)  # the terminal items are 3 bytes each


def test_a_chat_nobody_comes_back_for_is_cancelled_after_the_grace_period_and_forgotten_once_it_ends():
    async def go():
        resumes = registry(grace_s=0.05)
        chat = resumes.keep(Chat(resumes, "a"))
        reader = Reader()
        chat.attach(reader, 0)
        chat.detach(reader)
        while not chat.stream.cancelled:
            await asyncio.sleep(0.01)
        await produce(chat, None)  # the engine ends it (cancelled)
        return resumes, chat

    resumes, chat = run(go())
    assert chat.stream.cancelled == [Cancel.ABANDONED]
    assert chat.life is Life.FORGOTTEN and not resumes.chats and resumes.bytes == 0


def test_a_reader_that_comes_back_in_time_keeps_the_chat_and_is_sent_what_it_missed():
    async def go():
        resumes = registry(grace_s=0.05)
        chat = resumes.keep(Chat(resumes, "a"))
        first, second = Reader(), Reader()
        chat.attach(first, 0)
        await produce(chat, (0, "a"), (1, "b"))
        chat.detach(first)
        await produce(chat, (2, "c"))
        chat.attach(second, chat.position(1))
        await asyncio.sleep(0.1)  # past the grace period: the new reader holds the chat
        await produce(chat, (3, "d"), None)
        return chat, first, second

    chat, first, second = run(go())
    assert Cancel.ABANDONED not in chat.stream.cancelled
    assert first.got == ["a", "b"] and second.got == ["b", "c", "d", "end"]


@pytest.mark.parametrize("ended", [False, True])
def test_a_new_chat_with_the_same_key_replaces_the_old_one(ended):
    async def go():
        resumes = registry()
        old = resumes.keep(Chat(resumes, "conv"))
        if ended:
            await produce(old, None)
        new = resumes.keep(Chat(resumes, "conv"))
        return resumes, old, new

    resumes, old, new = run(go())
    assert resumes.find("conv") is new
    assert old.life is Life.FORGOTTEN if ended else old.stream.cancelled[0] is Cancel.STOP


def test_a_finished_chat_whose_reader_is_still_being_sent_it_keeps_what_that_reader_lacks():
    class Slow(Reader):
        def __init__(self):
            super().__init__()
            self.go = asyncio.Event()

        async def deliver(self, text: str) -> bool:
            await self.go.wait()
            return await super().deliver(text)

    async def go():
        resumes = registry(per_chat=4096, total=4096)
        slow_chat = resumes.keep(Chat(resumes, "slow"))
        reader = Slow()
        slow_chat.attach(reader, 0)
        await produce(slow_chat, (0, "s" * 1000), (1, "s" * 1000), None)
        other = resumes.keep(Chat(resumes, "other"))
        await produce(other, (0, "o" * 3500))  # does not fit beside the 1,000 bytes the reader still lacks
        reader.go.set()
        await settle()
        return slow_chat, other, reader

    slow_chat, other, reader = run(go())
    assert reader.got == ["s" * 1000, "s" * 1000, "end"]  # its end arrived
    assert other.overflowed
