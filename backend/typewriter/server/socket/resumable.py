"""A protocol v1 chat kept for resuming (docs/protocol.md, "Resuming an answer"). Its `queued` and `start` frames
carry `resume_token`, 32 random bytes only the socket that started the chat is ever sent, and its `token` frames
carry `ids`.
"""

from __future__ import annotations

import secrets

from ..chats import ChatStream
from ..refusal import Refusal
from ..resume.kept_chat import KeptChat
from ..resume.registry import Resumes
from .frames import encode
from .pump import frames


class SocketChat(KeptChat):
    def __init__(self, registry: Resumes, stream: ChatStream):
        self.token = secrets.token_urlsafe(32)
        self.next_index = 0  # the index after the last token frame kept
        super().__init__(registry, stream, self.token)

    @property
    def next_key(self) -> int:
        return self.next_index

    def check_from(self, first_index: int) -> None:
        """A `from` past the last kept token is a lie or a mix-up; one before frames dropped for room is lost."""
        if first_index > self.next_index:
            raise Refusal("invalid_request", f"from: this chat has sent tokens up to index "
                                             f"{self.next_index - 1}, so from may be at most "
                                             f"{self.next_index}; got {first_index}", self.chat_id)
        if self.lost(first_index):
            raise Refusal("not_found", f"this chat's frames from index {first_index} on are no longer all "
                                       "kept (they were sent, and room was needed); send it again as a "
                                       "chat with continue", self.chat_id)

    async def _produce(self) -> None:
        async for out in frames(self.stream):
            frame = out.frame
            if out.last:
                if self.overflowed and frame["type"] == "end":  # its last tokens were never kept
                    frame["reason"] = "resume_buffer_full"
                self.append(self.next_index, encode(frame), last=True)
                self.finish()
                return
            key = self.next_index  # a tool call: replayed to a client that has every token
            if frame["type"] in ("queued", "start"):
                frame["resume_token"] = self.token  # from the first frame on, so that a queued chat can be resumed
                key = 0 if frame["type"] == "start" else -1  # the start is replayed with token 0, a queue position never
            elif frame["type"] == "token":
                frame["ids"] = out.ids
                key = frame["index"]
            self.append(key, encode(frame))
            if frame["type"] == "token" and not self.overflowed:
                self.next_index = key + 1
