"""Resumable chats, by the hash of their key. Their logs are bounded per chat, per client and in total; when room
is needed, only the client's own least-needed items go (its finished chats, then items already sent): one client
never evicts another's kept answer. Unsent items are never dropped: their chat ends instead.
"""

from __future__ import annotations

from collections import Counter as Counter_
from collections.abc import Callable
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge

from ...config import Settings
from .kept_chat import KeptChat, Registry, digest

Kept = TypeVar("Kept", bound=KeptChat)


class Resumes(Registry):
    def __init__(self, settings: Settings, registry: CollectorRegistry):
        self.grace_s = settings.resume.resume_grace_s
        self.per_chat = settings.resume.resume_buffer_bytes
        self.total = settings.resume.resume_buffer_total_bytes
        self.per_client = min(settings.resume.resume_buffer_client_bytes, self.total)
        self.bytes = 0
        self.client_bytes: Counter_[str] = Counter_()
        self.chats: dict[bytes, KeptChat] = {}
        Gauge("typewriter_kept_chats", "Resumable chats kept: running, or finished and within their grace period.",
              registry=registry).set_function(lambda: len(self.chats))
        Gauge("typewriter_resume_buffer_bytes", "Bytes the kept chats' logs hold.",
              registry=registry).set_function(lambda: self.bytes)
        self.resumes = Counter("typewriter_resumes", "Attempts to resume a kept chat, by outcome.", ["outcome"],
                               registry=registry)

    @property
    def enabled(self) -> bool:
        return self.grace_s > 0

    def keep(self, chat: Kept) -> Kept:
        previous = self.chats.pop(chat.key_hash, None)
        if previous is not None:  # the same key again (an OpenAI conversation's next request): the old one goes
            previous.replaced()
        self.chats[chat.key_hash] = chat
        return chat

    def find(self, key: str) -> KeptChat | None:
        return self.chats.get(digest(key)) if key else None

    def drop(self, chat: KeptChat) -> None:
        """A newer chat takes this one's place (the next turn of its conversation): nobody reads it any more."""
        if self.chats.get(chat.key_hash) is chat:
            del self.chats[chat.key_hash]
            chat.replaced()

    def counted(self, outcome: str) -> None:
        """One attempt to resume: `resumed`, `not_found`, `lost` (its items were dropped) or `refused`."""
        self.resumes.labels(outcome=outcome).inc()

    def make_room(self, chat: KeptChat, size: int) -> bool:
        if chat.bytes + size > self.per_chat:
            chat.drop_sent(lambda freed: chat.bytes - freed + size <= self.per_chat)
            if chat.bytes + size > self.per_chat:
                return False
        client = chat.client
        return (self._fit(client, size, lambda: self.per_client - self.client_bytes[client])
                and self._fit(client, size, lambda: self.total - self.bytes))

    def _fit(self, client: str, size: int, room: Callable[[], int]) -> bool:
        if room() < size:
            self._free(client, lambda freed: room() + freed >= size)
        return room() >= size

    def _free(self, client: str, enough: Callable[[int], bool]) -> None:
        """Make room among `client`'s own kept chats only: its finished ones, longest ended first, then what its
        running ones' readers were already sent. `enough(bytes freed by the chat at hand)`."""
        own = [c for c in self.chats.values() if c.client == client]
        for old in sorted((c for c in own if c.ended_at is not None), key=lambda c: c.ended_at or 0.0):
            if old.reader is not None and old.sent < old.end:  # its reader is still being sent its end
                old.drop_sent(enough)
            else:
                old.forget()
            if enough(0):
                return
        for running in sorted(own, key=lambda c: -c.bytes):
            running.drop_sent(enough)
            if enough(0):
                return

    def grow(self, chat: KeptChat, size: int) -> None:
        self.bytes += size
        self.client_bytes[chat.client] += size
        if self.client_bytes[chat.client] <= 0:
            del self.client_bytes[chat.client]

    def release(self, chat: KeptChat) -> None:
        if self.chats.get(chat.key_hash) is chat:
            del self.chats[chat.key_hash]
        self.grow(chat, -chat.bytes)
        chat.bytes = 0
