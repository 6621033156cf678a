"""A kept chat whose producer stopped without finishing (it failed, or the server cancelled it) counts as ended like
any other: the registry's room-making, which drops the logs of the longest-ended chats first, can still order it.
Found by mypy (server/resume/registry.py sorted ended chats by an `ended_at` that such a chat never set)."""

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
    def __init__(self, name: str):
        self.engine_id = self.chat_id = name
        self.client = SimpleNamespace(id="student")  # whose share of the buffers its log counts in
        self.cancelled: list[Cancel] = []

    def cancel(self, why: Cancel) -> None:
        self.cancelled.append(why)

    def end(self) -> None:
        pass


class Chat(KeptChat):
    """Appends (key, text) items from `feed`; None finishes it, an exception makes its producer fail."""

    def __init__(self, registry: Resumes, name: str):
        self.feed: asyncio.Queue[tuple[int, str] | BaseException | None] = asyncio.Queue()
        super().__init__(registry, Stream(name), name)

    @property
    def next_key(self) -> int:
        return 0

    async def _produce(self) -> None:
        while (item := await self.feed.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            self.append(*item)
        self.append(1, "end", last=True)
        self.finish()


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


@pytest.mark.parametrize("stop", [RuntimeError("the producer failed"), None])
def test_a_chat_whose_producer_stopped_is_ended_with_a_time_and_room_can_still_be_made(stop):
    async def main() -> None:
        resumes = Resumes(Settings.of(resume_buffer_bytes=4096, resume_buffer_total_bytes=8192, resume_grace_s=60.0),
                          CollectorRegistry())
        stopped, finished = resumes.keep(Chat(resumes, "stopped")), resumes.keep(Chat(resumes, "finished"))
        await stopped.feed.put((0, "a" * 3000))
        await finished.feed.put((0, "b" * 3000))
        await finished.feed.put(None)
        await _settle()
        if stop is None:  # the server stopping cancels the producer
            next(iter(stopped._tasks)).cancel()
        else:
            await stopped.feed.put(stop)
        await _settle()
        assert stopped.life is Life.ENDED and stopped.ended_at is not None
        assert stopped.stream.cancelled == [Cancel.DISCONNECT]

        late = resumes.keep(Chat(resumes, "late"))
        await late.feed.put((0, "c" * 3000))  # over the total: the ended chats' logs make room
        await _settle()
        assert not late.overflowed and late.items == ["c" * 3000]
        for chat in (stopped, finished, late):
            for task in chat._tasks:
                task.cancel()
        await _settle()

    asyncio.run(main())
