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


def shared_prefix(chat_prefix: Callable[[str | None], Sequence[int]], system: str | None,
                  default_system: str) -> list[int]:
    """What every chat with the server's system prompt `system` begins with, whether or not a client's system
    message follows that prompt (the template's opening and the server's prompt); nothing if the template will
    not say."""
    try:
        shared = list(chat_prefix(system))
        ours = default_system if system is None else system
        for follower in _FOLLOWERS:
            shared = shared[: common_prefix(shared, chat_prefix(append_system(ours, follower)))]
    except Exception:
        log.warning("the chat template would not render a one-message chat; no prefix is shared between chats",
                    exc_info=True)
        return []
    return shared


def shared_length(prefix: Sequence[int], prompt: Sequence[int]) -> int:
    return len(prefix) if common_prefix(prefix, prompt) == len(prefix) else 0
