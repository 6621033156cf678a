"""Whose conversation a chat continues: the prefix cache reuses only its owner's turns and the shared system
prompt, so that nothing a client sees depends on another student's text. Conversation keys are signed with a
start-up secret, so that no client can name another's conversation.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import logging
import secrets
from collections.abc import Callable, Sequence

from ..engine.prefix_cache import common_prefix

log = logging.getLogger("typewriter.server")

CONVERSATION_KEY = "typewriter-conversation"


class Owners:
    def __init__(self) -> None:
        self._secret = secrets.token_bytes(32)
        self._sockets = itertools.count(1)

    def socket(self) -> str:
        return f"socket:{next(self._sockets)}"

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


def shared_prefix(chat_prefix: Callable[[str | None], Sequence[int]], system: str | None) -> list[int]:
    """What every chat with the server's system prompt begins with; nothing if the template will not say."""
    try:
        return list(chat_prefix(system))
    except Exception:
        log.warning("the chat template would not render a one-message chat; no prefix is shared between chats",
                    exc_info=True)
        return []


def shared_length(prefix: Sequence[int], prompt: Sequence[int]) -> int:
    return len(prefix) if common_prefix(prefix, prompt) == len(prefix) else 0
