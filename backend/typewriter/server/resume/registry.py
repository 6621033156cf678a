"""Resumable chats, by the hash of their key. When room is needed, what is least likely to be asked for again goes
first (finished chats, then items already sent); unsent items are never dropped: their chat ends instead.
"""

from __future__ import annotations

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
        self.bytes = 0
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
        return self.chats.get(digest(key))

    def counted(self, outcome: str) -> None:
        """One attempt to resume: `resumed`, `not_found`, `lost` (its items were dropped) or `refused`."""
        self.resumes.labels(outcome=outcome).inc()

    def make_room(self, chat: KeptChat, size: int) -> bool:
        if chat.bytes + size > self.per_chat:
            chat.drop_sent(size, self.per_chat)
            if chat.bytes + size > self.per_chat:
                return False
        if self.bytes + size > self.total:
            ended = {c: c.ended_at for c in self.chats.values() if c.ended_at is not None}
            for old in sorted(ended, key=ended.__getitem__):
                if old.reader is not None and old.sent < old.end:  # its reader is still being sent its end
                    old.drop_sent(size, self.total, total=True)
                else:
                    old.forget()
                if self.bytes + size <= self.total:
                    return True
            for running in sorted(self.chats.values(), key=lambda c: -c.bytes):
                running.drop_sent(size, self.total, total=True)
                if self.bytes + size <= self.total:
                    return True
            return False
        return True

    def release(self, chat: KeptChat) -> None:
        if self.chats.get(chat.key_hash) is chat:
            del self.chats[chat.key_hash]
        self.bytes -= chat.bytes
        chat.bytes = 0
