"""Abuse limits: the client address (X-Forwarded-For only from a trusted proxy), sockets in total and per
address, chats a minute per address. Unit tests on `Limits` with a hand-moved clock, then the app over a socket."""

from __future__ import annotations

from dataclasses import dataclass
from ipaddress import ip_network

import pytest
from helpers import chat, receive, serving, until_terminal
from starlette.websockets import WebSocketDisconnect

from typewriter.config import ConfigError, Settings
from typewriter.server.limits import FrameRate, Limits, client_address

PROXY = frozenset({"10.0.0.1"})


@pytest.mark.parametrize(("peer", "forwarded", "expected"), [
    ("203.0.113.7", "", "203.0.113.7"),
    ("203.0.113.7", "198.51.100.1", "203.0.113.7"),  # not a trusted proxy: its header is ignored
    ("10.0.0.1", "198.51.100.1", "198.51.100.1"),
    ("10.0.0.1", "6.6.6.6, 198.51.100.1", "198.51.100.1"),  # the client wrote the left-most entry itself
    ("10.0.0.1", "198.51.100.1, 10.0.0.1", "198.51.100.1"),  # two trusted hops
    ("10.0.0.1", "", "10.0.0.1"),
    ("10.0.0.1", "not-an-address", "10.0.0.1"),
    (None, "", "unknown"),
])
def test_the_client_address_trusts_x_forwarded_for_only_from_a_trusted_proxy(peer, forwarded, expected):
    headers = {"x-forwarded-for": forwarded} if forwarded else {}
    assert client_address(peer, headers, PROXY) == expected


@dataclass(frozen=True)
class Who:
    """A client as the limits see one (identity.Identity is the server's)."""

    id: str
    address: str = ""
    chats_per_minute: int = 1000
    chats_at_once: int = 1000

    def __post_init__(self):
        if not self.address:
            object.__setattr__(self, "address", self.id)


def test_sockets_are_limited_in_total_and_per_client_and_freed_on_disconnect():
    limits = Limits(max_connections=3, max_per_client=2, chats_per_minute=10)
    a, b, c = Who("a"), Who("b"), Who("c")
    assert limits.connect(a) is None and limits.connect(a) is None
    assert "too many connections from your address (at most 2)" in limits.connect(a)
    assert limits.connect(b) is None
    assert "the server is full (3 connections)" in limits.connect(c)
    limits.disconnect(a)
    assert limits.connect(c) is None and limits.total == 3


def test_chats_a_minute_per_client_slide_with_the_clock():
    now = [0.0]
    limits = Limits(max_connections=8, max_per_client=8, chats_per_minute=2, clock=lambda: now[0])
    a = Who("a")
    assert limits.allow_chat(a) is None
    now[0] = 20.0
    assert limits.allow_chat(a) is None
    wait_s, why = limits.allow_chat(a)
    assert wait_s == pytest.approx(40.0) and "at most 2 chats a minute from one address" in why  # at 60 s
    assert limits.allow_chat(Who("b")) is None  # another address has its own minute
    now[0] = 60.0
    assert limits.allow_chat(a) is None


SCHOOL = "10.20.1.5"
CAPS = ((ip_network("10.20.0.0/16"), 40),)


def test_a_school_range_holds_more_connections_but_each_student_no_more_than_anyone():
    limits = Limits(max_connections=100, max_per_client=4, chats_per_minute=10, address_caps=CAPS)
    ana, ben = Who("student:ana", SCHOOL), Who("student:ben", SCHOOL)
    assert (limits.cap(SCHOOL), limits.cap("192.0.2.1"), limits.cap("unknown")) == (40, 4, 4)
    assert all(limits.connect(ana) is None for _ in range(4))
    assert "too many connections of yours (at most 4)" in limits.connect(ana)
    assert all(limits.connect(ben) is None for _ in range(4))  # the school's address has room for both
    for n in range(32):
        assert limits.connect(Who(SCHOOL)) is None, n  # pages with no identity: the address, up to its cap
    assert "too many connections from your address (at most 40)" in limits.connect(Who("student:cho", SCHOOL))


def test_each_students_chats_are_limited_within_the_schools_raised_figures():
    now = [0.0]
    limits = Limits(max_connections=100, max_per_client=4, chats_per_minute=10, address_caps=CAPS,
                    clock=lambda: now[0])
    ana = Who("student:ana", SCHOOL, chats_per_minute=3, chats_at_once=2)
    assert limits.allow_chat(ana, 3) is None
    wait_s, why = limits.allow_chat(ana)
    assert "at most 3 chats a minute for each student" in why
    assert limits.start_chats(ana, 2) is None
    assert "at most 2 for each student" in limits.start_chats(ana)
    limits.end_chats(ana)
    assert limits.start_chats(ana) is None
    # the address's own figures grow with its range: 10 x 40/4 chats a minute, 40 at once
    others = [Who(f"student:{n}", SCHOOL) for n in range(40)]
    assert sum(limits.allow_chat(o, 3) is None for o in others) == (100 - 3) // 3
    assert sum(limits.start_chats(o) is None for o in others) == 40 - 2


def test_a_refused_chat_counts_against_neither_level():
    limits = Limits(max_connections=8, max_per_client=8, chats_per_minute=2)
    ana = Who("student:ana", "192.0.2.1", chats_per_minute=1)
    assert limits.allow_chat(ana) is None
    assert limits.allow_chat(ana) is not None  # the student's own minute is spent
    assert limits.allow_chat(Who("student:ben", "192.0.2.1")) is None  # the address's second chat is still there


def test_new_identities_an_address_is_issued_are_limited_and_grow_with_its_range():
    now = [0.0]
    limits = Limits(max_connections=100, max_per_client=4, chats_per_minute=10, address_caps=CAPS,
                    identities_per_minute=2, clock=lambda: now[0])
    assert [limits.issue_identity("192.0.2.1") for _ in range(3)][:2] == [None, None]
    assert limits.issue_identity("192.0.2.1") == pytest.approx(60.0)
    assert sum(limits.issue_identity(SCHOOL) is None for _ in range(30)) == 20  # 2 x 40/4
    now[0] = 60.0
    assert limits.issue_identity("192.0.2.1") is None


def test_a_bad_trusted_proxies_setting_is_a_named_error():
    with pytest.raises(ConfigError, match="TYPEWRITER_TRUSTED_PROXIES: 'proxy.local' is not an IP address"):
        Settings.of(trusted_proxies="10.0.0.1, proxy.local")


def test_over_the_chat_rate_a_chat_gets_rate_limited_and_the_socket_stays_usable():
    with serving(chats_per_minute=2) as (client, _):
        with client.websocket_connect("/ws") as ws:
            ends = []
            for n in range(2):
                ws.send_json(chat(f"c{n}", max_new_tokens=2))
                ends.append(until_terminal(lambda: receive(ws))[-1])
            ws.send_json(chat("c2", max_new_tokens=2))
            limited = receive(ws)
            ws.send_json({"type": "stop", "id": "nothing"})
            still_open = receive(ws)
    assert [e["type"] for e in ends] == ["end", "end"]
    assert (limited["type"], limited["code"], limited["id"]) == ("error", "rate_limited", "c2")
    assert "at most 2 chats a minute" in limited["message"]
    assert still_open["code"] == "not_found"


def test_a_socket_over_the_per_client_limit_is_closed_with_1013_and_a_reason():
    with serving(max_connections_per_client=1) as (client, _):
        with client.websocket_connect("/ws") as first:
            with client.websocket_connect("/ws") as second:
                with pytest.raises(WebSocketDisconnect) as closed:
                    second.receive_json()
            first.send_json(chat("ok", max_new_tokens=2))
            assert until_terminal(lambda: receive(first))[-1]["type"] == "end"
        with client.websocket_connect("/ws") as again:  # the first one's place is free again
            again.send_json(chat("again", max_new_tokens=2))
            assert until_terminal(lambda: receive(again))[-1]["type"] == "end"
    assert closed.value.code == 1013 and "too many connections from your address" in closed.value.reason


def test_frames_a_second_allow_bursts_of_twice_the_rate_then_refill_with_the_clock():
    now = [0.0]
    rate = FrameRate(5, clock=lambda: now[0])
    assert [rate.allow() for _ in range(11)] == [True] * 10 + [False]
    now[0] = 0.2  # one frame's worth
    assert [rate.allow(), rate.allow()] == [True, False]
    now[0] = 100.0  # refills only up to the burst
    assert sum(rate.allow() for _ in range(20)) == 10


def test_a_socket_flooding_frames_is_closed_with_1008_and_other_sockets_keep_streaming():
    with serving(frames_per_second=5) as (client, _):
        with client.websocket_connect("/ws") as calm:
            calm.send_json(chat("calm", max_new_tokens=2))
            with client.websocket_connect("/ws") as flood:
                with pytest.raises(WebSocketDisconnect) as closed:
                    for _ in range(50):
                        flood.send_json({"type": "ping"})
                    while True:
                        flood.receive_json()
            assert until_terminal(lambda: receive(calm))[-1]["type"] == "end"
    assert closed.value.code == 1008 and "more than 5 frames a second" in closed.value.reason
