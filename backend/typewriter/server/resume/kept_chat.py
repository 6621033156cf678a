"""One kept chat: its log, the one reader it is sent to by a task of its own (so that a slow or dead reader holds
nothing up), and the grace period."""

from __future__ import annotations

import asyncio
import bisect
import enum
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, Protocol

from ..chats import Cancel, ChatStream
from ..identity import Identity, Kind

log = logging.getLogger("typewriter.server")


class Registry(Protocol):
    grace_s: float

    def make_room(self, chat: KeptChat, size: int) -> bool: ...
    def grow(self, chat: KeptChat, size: int) -> None: ...  # the chat's log holds `size` more bytes (or fewer)
    def release(self, chat: KeptChat) -> None: ...


class Reader(Protocol):
    """Where a kept chat's output goes: a socket's session, or an HTTP response."""

    async def deliver(self, text: str) -> bool:
        """Send one item; False once the connection is gone."""
        ...

    def released(self, chat: KeptChat) -> None:
        """This reader is done with the chat: its end is about to be sent, or another reader took it over."""
        ...


class Life(enum.Enum):
    RUNNING = "running"
    ENDED = "ended"  # its terminal item is in the log
    FORGOTTEN = "forgotten"  # out of the registry, its log dropped


_NEXT = {Life.RUNNING: {Life.ENDED}, Life.ENDED: {Life.FORGOTTEN}, Life.FORGOTTEN: set()}


class KeptChat:
    """One chat's log and its reader. A subclass's `_produce` appends to the log; `attach` starts a reader.
    Positions count items from the chat's first; `base` of them were dropped from the front."""

    def __init__(self, registry: Registry, stream: ChatStream, key: str):
        self.registry, self.stream = registry, stream
        self.client = stream.client.id if stream.client is not None else ""  # whose share of the buffers it uses
        self.key_hash = digest(key)
        self.life = Life.RUNNING
        self.keys: list[int] = []  # each kept item's position key (a token index or byte offset), non-decreasing
        self.items: list[str] = []
        self.sizes: list[int] = []
        self.base = 0
        self.kept_from = 0  # once items were dropped (base > 0): the position key they were dropped up to
        self.final: int | None = None  # the terminal item's position, once it is in
        self.bytes = 0
        self.sent = 0  # the position up to which a reader has been sent the log
        self.overflowed = False
        self.ended_at: float | None = None
        self.reader: Reader | None = None
        self._more = asyncio.Event()  # set (and replaced) whenever the log grows or the reader changes
        self._timer: asyncio.TimerHandle | None = None
        self._abandoned = False
        self._held: Callable[[], None] | None = None  # a gone reader's place among its client's connections
        self._tasks: set[asyncio.Task[None]] = set()
        self._spawn(self._run(), f"kept-{stream.engine_id}")

    @property
    def chat_id(self) -> str:
        return self.stream.chat_id

    def readable_by(self, who: Identity) -> bool:
        """A student's or a key's kept chat is theirs alone; an address's is its token's holder's, as an address
        changes when a phone changes networks."""
        mine = self.stream.client
        return mine is None or mine.kind is Kind.ADDRESS or mine.id == who.id

    @property
    def ended(self) -> bool:
        return self.life is not Life.RUNNING

    @property
    def end(self) -> int:
        return self.base + len(self.items)

    def move(self, life: Life) -> None:
        if life not in _NEXT[self.life]:
            raise RuntimeError(f"kept chat {self.stream.engine_id}: cannot go from {self.life.value} to {life.value}")
        self.life = life
        if life is Life.ENDED:  # however it ended: the registry drops the logs of the longest ended first
            self.ended_at = time.monotonic()

    async def _run(self) -> None:
        try:
            await self._produce()
        finally:
            if not self.ended:  # the task was cancelled (the server is stopping): the chat goes with it
                self.stream.cancel(Cancel.DISCONNECT)
                self.stream.end()
                self.move(Life.ENDED)
                self._wake()

    async def _produce(self) -> None:
        raise NotImplementedError

    @property
    def next_key(self) -> int:
        """The position key the next item will have (the next token index, or byte offset)."""
        raise NotImplementedError

    def append(self, key: int, text: str, last: bool = False) -> None:
        """Add one item to the log. Past the bounds the chat is cancelled and further items are dropped, except
        the `last` one, which always goes in so that every reader sees the end."""
        if self.overflowed and not last:
            return
        size = len(text.encode())
        if not last and not self.registry.make_room(self, size):
            self.overflowed = True
            log.warning("chat %s: its resume buffer is full (%d bytes unsent); ending it", self.stream.engine_id,
                        self.bytes)
            self.stream.cancel(Cancel.BUFFER)
            return
        if last:
            self.final = self.end
        self.keys.append(key)
        self.items.append(text)
        self.sizes.append(size)
        self.bytes += size
        self.registry.grow(self, size)
        self._wake()

    def finish(self) -> None:
        """The terminal item is in: the chat is over, and its log is kept for the grace period."""
        self._let_go()
        self.stream.end()
        self.move(Life.ENDED)
        self._wake()
        if self._abandoned:  # nobody came back while it ran: nobody will read its end
            self.forget()
        else:
            self._restart_timer(self.forget)

    def drop_sent(self, enough: Callable[[int], bool]) -> None:
        """Drop items a reader was already sent, oldest first, until `enough(bytes freed)`."""
        n = 0
        freed = 0
        while self.base + n < self.sent and not enough(freed):
            freed += self.sizes[n]
            n += 1
        if n:
            del self.keys[:n], self.items[:n], self.sizes[:n]
            self.base += n
            self.kept_from = self.keys[0] if self.keys else self.next_key
            self.bytes -= freed
            self.registry.grow(self, -freed)

    def hold(self, release: Callable[[], None]) -> None:
        """Keep a gone reader's place among its client's connections (`release` gives it back) while the chat
        runs with nobody attached: no client holds more disconnected than it could connected."""
        if self.life is not Life.RUNNING or self.reader is not None or self._held is not None:
            release()
        else:
            self._held = release

    def _let_go(self) -> None:
        if self._held is not None:
            release, self._held = self._held, None
            release()

    def lost(self, key: int) -> bool:
        """Whether items from position key `key` on are no longer all kept."""
        return self.base > 0 and key < self.kept_from

    def position(self, key: int) -> int:
        """The position of the first item at or after position key `key`."""
        return self.base + bisect.bisect_left(self.keys, key)

    def attach(self, reader: Reader, position: int) -> None:
        self._let_go()  # the new reader's connection counts instead
        previous, self.reader = self.reader, reader
        self._abandoned = False
        self.sent = position
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.ended:
            self._restart_timer(self.forget)
        if previous is not None and previous is not reader:
            previous.released(self)
        self._wake()
        self._spawn(self._follow(reader, position), f"reader-{self.stream.engine_id}")

    def detach(self, reader: Reader) -> None:
        """`reader`'s connection is gone. The chat runs on for the grace period, unless another reader comes."""
        if self.reader is not reader:
            return
        self.reader = None
        self._wake()
        if self.life is Life.RUNNING:
            self._restart_timer(self._abandon)

    async def _follow(self, reader: Reader, position: int) -> None:
        async for text in self._items(reader, position):
            if not await reader.deliver(text):
                self.detach(reader)
                return

    async def _items(self, reader: Reader, position: int) -> AsyncIterator[str]:
        while self.reader is reader:
            if position < self.end:
                text = self.items[position - self.base]
                if position == self.final:
                    reader.released(self)  # before its end goes out: the client may start its next chat at once
                position += 1
                self.sent = max(self.sent, position)
                yield text
                continue
            if self.ended:
                return
            more = self._more
            await more.wait()

    def _spawn(self, work: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s failed", task.get_name(), exc_info=task.exception())

    def _wake(self) -> None:
        self._more.set()
        self._more = asyncio.Event()

    def _restart_timer(self, then: Callable[[], None]) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(self.registry.grace_s, then)

    def _abandon(self) -> None:
        self._timer = None
        if self.reader is None and self.life is Life.RUNNING:
            log.info("chat %s: no client came back within %.0f s; cancelling it", self.stream.engine_id,
                     self.registry.grace_s)
            self._abandoned = True
            self.stream.cancel(Cancel.ABANDONED)

    def replaced(self) -> None:
        """A new chat took this one's key: nobody can reach it any more."""
        if self.life is Life.RUNNING:
            self._abandoned = True
            self.stream.cancel(Cancel.STOP)
        else:
            self.forget()

    def forget(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.life is Life.FORGOTTEN:
            return
        self.move(Life.FORGOTTEN)  # only an ended chat: a running one is cancelled, and forgotten once it ends
        self.registry.release(self)
        if self.reader is not None:  # one that fell a grace period behind: it is not sent the rest
            self.reader.released(self)
            self.reader = None
        self.keys, self.items, self.sizes = [], [], []
        self._wake()


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()
