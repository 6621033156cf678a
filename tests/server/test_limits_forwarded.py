"""Forged `X-Forwarded-For` over a real server: `TRUSTED_PROXIES` is the only thing that makes the server believe
the header. uvicorn's own proxy handling trusted it from loopback by default and rewrote the client address
before the limits saw it, so any client whose TCP peer is loopback (a same-host TLS terminator, tunnel or sidecar
passing the header through) chose its own address: a probe opened 70 of 70 sockets past a cap of 64."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from helpers import until_terminal_async
from scripted import script_engine
from served import running
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed


def forged(n: int) -> dict[str, str]:
    return {"X-Forwarded-For": f"198.51.100.{n}"}


async def open_sockets(address: str, headers: list[dict[str, str]]) -> list[int | None]:
    """Open one socket per header set and hold them all; each one's close code once refused, None if it stays."""
    async with asyncio.timeout(10):
        sockets = [await connect(f"ws://{address}/ws", additional_headers=h) for h in headers]
        codes = []
        for ws in sockets:
            try:
                await ws.send(json.dumps({"type": "ping"}))
                assert json.loads(await ws.recv())["type"] == "pong"
                codes.append(None)
            except ConnectionClosed as closed:
                codes.append(closed.rcvd.code)
        for ws in sockets:
            await ws.close()
    return codes


def test_forged_addresses_from_an_untrusted_peer_all_count_as_that_peer():
    with running(script_engine(), max_connections_per_client=2) as (_, address):
        codes = asyncio.run(open_sockets(address, [forged(n) for n in range(4)]))
    assert codes == [None, None, 1013, 1013]


def test_forged_addresses_do_not_get_past_the_chats_a_minute():
    async def chats(address):
        ends = []
        for n in range(3):
            async with connect(f"ws://{address}/ws", additional_headers=forged(n)) as ws:
                await ws.send(json.dumps({"type": "chat", "id": f"c{n}", "params": {"max_new_tokens": 2},
                                          "messages": [{"role": "user", "content": "hi"}]}))
                ends.append((await until_terminal_async(ws, 5))[-1])
        return ends

    with running(script_engine(), chats_per_minute=2) as (_, address):
        ends = asyncio.run(chats(address))
    assert [e.get("code", e["type"]) for e in ends] == ["end", "end", "rate_limited"]


@pytest.mark.parametrize("header", ["X-Forwarded-For", "Forwarded"])
def test_a_forged_address_does_not_get_past_the_chats_a_minute_over_http(header):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    with running(script_engine(), chats_per_minute=1) as (_, address):
        statuses = [httpx.post(f"http://{address}/v1/chat/completions", json=body,
                               headers={header: f"for=198.51.100.{n}" if header == "Forwarded" else f"198.51.100.{n}"}
                               ).status_code for n in range(2)]
    assert statuses == [200, 429]


def test_behind_a_listed_proxy_the_forwarded_address_counts_and_a_client_cannot_prepend_its_own():
    proxy = [{"X-Forwarded-For": f"6.6.6.{n}, 198.51.100.{n % 2}"} for n in range(5)]  # the proxy adds the last
    with running(script_engine(), trusted_proxies="127.0.0.1", max_connections_per_client=2) as (_, address):
        codes = asyncio.run(open_sockets(address, proxy))
    assert codes == [None, None, None, None, 1013]  # two per forwarded address; the left-most entries are ignored
