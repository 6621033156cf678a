"""Whose conversation a chat continues: the prefix cache reuses only its owner's turns and the shared system
prompt, so that nothing a client sees depends on another student's text. One person (a student, a student's own
key) owns all their conversations, across sockets, tabs and requests; an address or a class's key may be many
people, so their chats are owned by the socket, or by a conversation key signed with a start-up secret, so that no
client can name another's conversation.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import logging
import secrets
from collections.abc import Callable, Sequence

from ..engine.prefix_cache import common_prefix
from ..text.conversation import append_system
from .identity import Identity

log = logging.getLogger("typewriter.server")

CONVERSATION_KEY = "typewriter-conversation"


class Owners:
    def __init__(self) -> None:
        self._secret = secrets.token_bytes(32)
        self._sockets = itertools.count(1)

    def socket(self) -> str:
        return f"socket:{next(self._sockets)}"

    def of_socket(self, client: Identity) -> str:
        """The owner of a socket's chats: its person, else the socket (its chats are one conversation's turns)."""
        return client.id if client.personal else self.socket()

    def of_request(self, client: Identity, key: str | None) -> tuple[str, str]:
        """(owner, key) of an HTTP or gRPC chat: its person whatever key it brings, else the conversation `key`
        names; `key` is returned either way, for the client's next turn."""
        owner, key = self.conversation(key)
        return (client.id if client.personal else owner), key

    def conversation(self, key: str | None) -> tuple[str, str]:
        """(owner, key): the conversation `key` names if this server issued it, else a new one and its key."""
        if key:
            nonce, _, mac = key.partition(".")
            if nonce and hmac.compare_digest(mac.encode(), self._sign(nonce).encode()):
                return f"conversation:{nonce}", key
        nonce = secrets.token_urlsafe(16)
        return f"conversation:{nonce}", f"{nonce}.{self._sign(nonce)}"

    def _sign(self, nonce: str) -> str:
        return hmac.new(self._secret, nonce.encode(), hashlib.sha256).hexdigest()[:32]


# What a client's system message may begin with, so that the tokens before it are found whatever it says.
_FOLLOWERS = ("a", "Z", "1", " a", "\n", "{", "<", "#", "é", "你")


def shared_prefixes(chat_prefix: Callable[[str | None], Sequence[int]], system: str | None,
                    default_system: str) -> tuple[list[int], ...]:
    """What chats with the server's system prompt `system` begin with, longest first: the template's opening of a
    first question (every chat without a system message of its own), and where a client's system message may
    follow the server's (a door that appends one); none if the template will not say. Both are the template's and
    the server's tokens only, so every client may share them; a chat that shared only the second would compute the
    template's few closing tokens again, and a class arriving together waits on them
    (docs/measurements/2026-12-05-bounds-classroom.md)."""
    try:
        full = list(chat_prefix(system))
        ours = default_system if system is None else system
        opening = full
        for follower in _FOLLOWERS:
            opening = opening[: common_prefix(opening, chat_prefix(append_system(ours, follower)))]
    except Exception:
        log.warning("the chat template would not render a one-message chat; no prefix is shared between chats",
                    exc_info=True)
        return ()
    if not full:
        return ()
    return (full, opening) if 0 < len(opening) < len(full) else (full,)


def shared_lengths(prefixes: Sequence[Sequence[int]], prompt: Sequence[int]) -> tuple[int, ...]:
    """The lengths of those `prefixes` that `prompt` begins with: what GenerationRequest.shared_prefix holds."""
    return tuple(len(p) for p in prefixes if common_prefix(p, prompt) == len(p))
