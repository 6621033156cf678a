"""Abuse limits for a public server, on the event loop only: each client's (a student, an API key, or an address
with neither), within its address's. `X-Forwarded-For` counts only from a trusted proxy, so that a client cannot
forge its way past the limits by sending that header itself.
"""

from __future__ import annotations

import collections
import ipaddress
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from ..config import Network


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


class Client(Protocol):
    """Whom a request is counted against: `id` (a student, an API key, or an address with neither) within its
    `address`, with its own limits."""

    @property
    def id(self) -> str: ...
    @property
    def address(self) -> str: ...
    @property
    def chats_per_minute(self) -> int: ...
    @property
    def chats_at_once(self) -> int: ...


class Limits:
    """Two levels: each client's own limits, and the address's as the outer bound (a whole school may share one
    address; `address_caps` raises that bound for a range). An address's figures are `max_per_client` connections
    and chats at once and `chats_per_minute`, times its range's cap over `max_per_client`."""

    def __init__(self, max_connections: int, max_per_client: int, chats_per_minute: int,
                 trusted_proxies: Iterable[str] = (), clock: Callable[[], float] = time.monotonic,
                 misses_per_minute: int = MISSES_PER_MINUTE, address_caps: Sequence[tuple[Network, int]] = (),
                 identities_per_minute: int = 60):
        self.max_connections, self.max_per_client = max_connections, max_per_client
        self.chats_per_minute = chats_per_minute
        self.misses_per_minute = misses_per_minute
        self.identities_per_minute = identities_per_minute
        self.trusted = frozenset(trusted_proxies)
        self.address_caps = tuple(address_caps)
        self.clock = clock
        self.open: collections.Counter[str] = collections.Counter()  # by address
        self.open_clients: collections.Counter[str] = collections.Counter()
        self.total = 0
        self.running: collections.Counter[str] = collections.Counter()  # chats at once by address, kept included
        self.running_clients: collections.Counter[str] = collections.Counter()
        self._chats: dict[str, collections.deque[float]] = {}  # by address
        self._client_chats: dict[str, collections.deque[float]] = {}
        self._misses: dict[str, collections.deque[float]] = {}
        self._issued: dict[str, collections.deque[float]] = {}

    def cap(self, address: str) -> int:
        """Connections (and chats at once) one address may hold: its range's cap, else `max_per_client`."""
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return self.max_per_client
        return next((cap for network, cap in self.address_caps if ip in network), self.max_per_client)

    def _per_minute(self, address: str, figure: int) -> int:
        return max(1, figure * self.cap(address) // self.max_per_client)

    def connect(self, client: Client) -> str | None:
        """Count a new socket of `client`; returns why it is refused (and then counts nothing), or None. A student
        or key holds at most `max_per_client` whatever its address's cap, so that one cannot take a school's; an
        address with neither is bounded by its cap alone, as its pages may be many students'."""
        address = client.address
        if self.total >= self.max_connections:
            return f"the server is full ({self.max_connections} connections); try again later"
        if self.open[address] >= (cap := self.cap(address)):
            return f"too many connections from your address (at most {cap}); close one first"
        if client.id != address and self.open_clients[client.id] >= self.max_per_client:
            return f"too many connections of yours (at most {self.max_per_client}); close one first"
        self.open[address] += 1
        self.open_clients[client.id] += 1
        self.total += 1
        return None

    def disconnect(self, client: Client) -> None:
        self.total -= 1
        _down(self.open, client.address, 1)
        _down(self.open_clients, client.id, 1)

    def allow_chat(self, client: Client, n: int = 1) -> tuple[float, str] | None:
        """Count `n` chats (a request's choices each count) of `client` in the last minute; None if allowed, else
        (seconds until they would be, why)."""
        now, most = self.clock(), 4 * self.max_connections
        address = self._per_minute(client.address, self.chats_per_minute)
        wait_s = _room(self._chats, client.address, n, address, now)
        if wait_s is not None:
            return wait_s, f"at most {address} chats a minute from one address (each of n choices counts)"
        wait_s = _room(self._client_chats, client.id, n, client.chats_per_minute, now)
        if wait_s is not None:
            return wait_s, f"at most {client.chats_per_minute} chats a minute for each student (each of n choices " \
                           "counts)"
        _add(self._chats, client.address, n, now, most)
        _add(self._client_chats, client.id, n, now, most)
        return None

    def missed(self, address: str) -> None:
        """Count a failed look-up (a resume or stream token, or a class code, that names nothing) from `address`."""
        now = self.clock()
        if _room(self._misses, address, 1, self.misses_per_minute + 1, now) is None:
            _add(self._misses, address, 1, now, 4 * self.max_connections)

    def looking_blocked(self, address: str) -> float | None:
        """Seconds until `address` may look a token up again, after `misses_per_minute` failed look-ups in a
        minute, else None: guessing is as slow as it is hopeless."""
        window = self._misses.get(address)
        now = self.clock()
        while window and window[0] <= now - 60.0:
            window.popleft()
        if window and len(window) >= self.misses_per_minute:
            return max(0.0, window[len(window) - self.misses_per_minute] + 60.0 - now)
        return None

    def issue_identity(self, address: str) -> float | None:
        """Count a new student identity for `address`; None if it may have one, else seconds until it may."""
        now = self.clock()
        wait_s = _room(self._issued, address, 1, self._per_minute(address, self.identities_per_minute), now)
        if wait_s is None:
            _add(self._issued, address, 1, now, 4 * self.max_connections)
        return wait_s

    def start_chats(self, client: Client, n: int = 1) -> str | None:
        """Count `n` running chats of `client` (kept ones too, until they end); returns why they are refused, or
        None."""
        if self.running[client.address] + n > (cap := self.cap(client.address)):
            return (f"too many chats at once from your address (at most {cap}, kept answers included); wait for "
                    "one to end")
        if self.running_clients[client.id] + n > client.chats_at_once:
            return (f"too many chats at once (at most {client.chats_at_once} for each student, kept answers "
                    "included); wait for one to end")
        self.running[client.address] += n
        self.running_clients[client.id] += n
        return None

    def end_chats(self, client: Client, n: int = 1) -> None:
        _down(self.running, client.address, n)
        _down(self.running_clients, client.id, n)


def _down(counter: collections.Counter[str], key: str, n: int) -> None:
    counter[key] -= n
    if counter[key] <= 0:
        del counter[key]


def _room(windows: dict[str, collections.deque[float]], key: str, n: int, per_minute: int,
          now: float) -> float | None:
    """None if `n` more events of `key` fit in its sliding minute, else seconds until they would."""
    window = windows.get(key)
    while window and window[0] <= now - 60.0:
        window.popleft()
    held = len(window) if window else 0
    if held + n <= per_minute:
        return None
    if n > per_minute or window is None:
        return 60.0  # never all at once
    return max(0.0, window[held + n - per_minute - 1] + 60.0 - now)  # until enough of them expire


def _add(windows: dict[str, collections.deque[float]], key: str, n: int, now: float, most_keys: int) -> None:
    windows.setdefault(key, collections.deque()).extend([now] * n)
    if len(windows) > most_keys:  # forget keys idle for a minute, boundedly
        for idle in [k for k, w in windows.items() if not w or w[-1] <= now - 60.0]:
            del windows[idle]


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
