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


MISSES_PER_MINUTE = 20  # failed look-ups a client may make: an owner's own mistakes, never a guessing run


class Limits:
    def __init__(self, max_connections: int, max_per_client: int, chats_per_minute: int,
                 trusted_proxies: Iterable[str] = (), clock: Callable[[], float] = time.monotonic,
                 misses_per_minute: int = MISSES_PER_MINUTE):
        self.max_connections, self.max_per_client = max_connections, max_per_client
        self.chats_per_minute = chats_per_minute
        self.misses_per_minute = misses_per_minute
        self.trusted = frozenset(trusted_proxies)
        self.clock = clock
        self.open: collections.Counter[str] = collections.Counter()
        self.total = 0
        self.running: collections.Counter[str] = collections.Counter()  # chats at once, kept ones included
        self._chats: dict[str, collections.deque[float]] = {}
        self._misses: dict[str, collections.deque[float]] = {}

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

    def allow_chat(self, client: str, n: int = 1) -> float | None:
        """Count `n` chats (a request's choices each count) from `client` in the last minute; None if allowed,
        else seconds until they would be."""
        return _take(self._chats, client, n, self.chats_per_minute, self.clock(), 4 * self.max_connections)

    def missed(self, client: str) -> None:
        """Count a failed look-up (a resume or stream token that names nothing) from `client`."""
        _take(self._misses, client, 1, self.misses_per_minute + 1, self.clock(), 4 * self.max_connections)

    def looking_blocked(self, client: str) -> float | None:
        """Seconds until `client` may look a token up again, after `misses_per_minute` failed look-ups in a
        minute, else None: guessing is as slow as it is hopeless."""
        window = self._misses.get(client)
        now = self.clock()
        while window and window[0] <= now - 60.0:
            window.popleft()
        if window and len(window) >= self.misses_per_minute:
            return max(0.0, window[len(window) - self.misses_per_minute] + 60.0 - now)
        return None

    def start_chats(self, client: str, n: int = 1) -> str | None:
        """Count `n` running chats of `client` (kept ones too, until they end); returns why they are refused, or
        None. A client holds no more chats at once than sockets, connected or not."""
        if self.running[client] + n > self.max_per_client:
            return (f"too many chats at once from your address (at most {self.max_per_client}, kept answers "
                    "included); wait for one to end")
        self.running[client] += n
        return None

    def end_chats(self, client: str, n: int = 1) -> None:
        self.running[client] -= n
        if self.running[client] <= 0:
            del self.running[client]



def _take(windows: dict[str, collections.deque[float]], client: str, n: int, per_minute: int, now: float,
          most_clients: int) -> float | None:
    """Count `n` events of `client` in its sliding minute, or none if they do not fit: seconds until they would."""
    window = windows.setdefault(client, collections.deque())
    while window and window[0] <= now - 60.0:
        window.popleft()
    if len(window) + n > per_minute:
        if n > per_minute:
            return 60.0  # never all at once
        return max(0.0, window[len(window) + n - per_minute - 1] + 60.0 - now)  # until enough of them expire
    window.extend([now] * n)
    if len(windows) > most_clients:  # forget clients idle for a minute, boundedly
        for key in [k for k, w in windows.items() if not w or w[-1] <= now - 60.0]:
            del windows[key]
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
