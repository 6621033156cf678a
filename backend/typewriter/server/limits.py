"""Abuse limits for a public server, on the event loop only. `X-Forwarded-For` counts only from a trusted proxy, so
that a client cannot forge its way past the limits by sending that header itself.
"""

from __future__ import annotations

import collections
import ipaddress
import time
from collections.abc import Callable, Iterable, Mapping


def client_address(peer: str | None, headers: Mapping[str, str], trusted: frozenset[str]) -> str:
    address = peer or "unknown"
    if address not in trusted:
        return address
    hops = [h.strip() for h in headers.get("x-forwarded-for", "").split(",") if h.strip()]
    for hop in reversed(hops):  # the right-most entries were added by the proxies nearest to us
        if hop not in trusted:
            return hop if _is_ip(hop) else address
    return address


def forwarded_https(peer: str | None, headers: Mapping[str, str], trusted: frozenset[str]) -> bool:
    """From any peer but a trusted proxy, `X-Forwarded-Proto` is ignored."""
    if (peer or "unknown") not in trusted:
        return False
    return headers.get("x-forwarded-proto", "").split(",")[0].strip().lower() == "https"


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


class Limits:
    def __init__(self, max_connections: int, max_per_client: int, chats_per_minute: int,
                 trusted_proxies: Iterable[str] = (), clock: Callable[[], float] = time.monotonic):
        self.max_connections, self.max_per_client = max_connections, max_per_client
        self.chats_per_minute = chats_per_minute
        self.trusted = frozenset(trusted_proxies)
        self.clock = clock
        self.open: collections.Counter[str] = collections.Counter()
        self.total = 0
        self._chats: dict[str, collections.deque[float]] = {}

    def connect(self, client: str) -> str | None:
        """Count a new socket from `client`; returns why it is refused (and then counts nothing), or None."""
        if self.total >= self.max_connections:
            return f"the server is full ({self.max_connections} connections); try again later"
        if self.open[client] >= self.max_per_client:
            return f"too many connections from your address (at most {self.max_per_client}); close one first"
        self.open[client] += 1
        self.total += 1
        return None

    def disconnect(self, client: str) -> None:
        self.open[client] -= 1
        self.total -= 1
        if self.open[client] <= 0:
            del self.open[client]

    def allow_chat(self, client: str) -> float | None:
        """Count a chat from `client` in the last minute; None if allowed, else seconds until one would be."""
        now = self.clock()
        window = self._chats.setdefault(client, collections.deque())
        while window and window[0] <= now - 60.0:
            window.popleft()
        if len(window) >= self.chats_per_minute:
            return max(0.0, window[0] + 60.0 - now)
        window.append(now)
        if len(self._chats) > 4 * self.max_connections:  # forget addresses idle for a minute, boundedly
            for key in [k for k, w in self._chats.items() if not w or w[-1] <= now - 60.0]:
                del self._chats[key]
        return None


class FrameRate:
    """Frames one socket may send: `per_second` on average, in bursts of up to twice that (a token bucket)."""

    def __init__(self, per_second: float, clock: Callable[[], float] = time.monotonic):
        self.per_second, self.burst = per_second, 2 * per_second
        self.clock = clock
        self.tokens, self.at = self.burst, clock()

    def allow(self) -> bool:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.per_second)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True
