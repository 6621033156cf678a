"""Whose conversation a chat continues, for the prefix cache (engine/prefix_cache.py): a chat reuses the cached
tokens of its own owner's earlier turns, and of anyone else's only the prefix every chat shares, the server's
system prompt. So nothing a client sees (`cached_tokens`, how soon its first token comes) depends on another
student's text.

A socket is an owner: a student's turns on the page reuse each other. The OpenAI-style API and gRPC carry one
chat per request, so each request is its own owner unless it sends back the conversation key the server gave
with an earlier answer (`typewriter-conversation`, a header or metadata). A key is signed with a secret made at
start-up: one the server did not issue (made up, or another server's) starts a new conversation, so no client
can name another's.
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

CONVERSATION_KEY = "typewriter-conversation"  # the HTTP header and the gRPC metadata key, both ways


class Owners:
    def __init__(self) -> None:
        self._secret = secrets.token_bytes(32)
        self._sockets = itertools.count(1)

    def socket(self) -> str:
        """A new socket's owner: never one an earlier socket had."""
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
    """What every chat with the server's own system prompt `system` begins with (`chat_prefix`: the tokenizer's,
    lifecycle.ChatEncoder's); nothing if the template will not say."""
    try:
        return list(chat_prefix(system))
    except Exception:  # a template that refuses a chat of one user message: nothing is shared across owners
        log.warning("the chat template would not render a one-message chat; no prefix is shared between chats",
                    exc_info=True)
        return []


def shared_length(prefix: Sequence[int], prompt: Sequence[int]) -> int:
    """`prefix`'s length if `prompt` begins with it (its shared part), else 0 (it shares nothing)."""
    return len(prefix) if common_prefix(prefix, prompt) == len(prefix) else 0
