"""What another site's page can make a student's browser do, over a real server: open the socket only from the
page's own origin, scheme included, and run an OpenAI-style chat only for a JSON body (which a cross-site page
cannot send without a CORS preflight this server never grants)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from scripted import script_engine
from served import running
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus


async def handshake(address: str, origin: str, headers: dict[str, str] | None = None) -> int:
    """The handshake's HTTP status: 101 when the socket opened."""
    try:
        async with connect(f"ws://{address}/ws", origin=origin, additional_headers=headers or {}):
            return 101
    except InvalidStatus as refused:
        return refused.response.status_code


def test_the_socket_takes_the_pages_own_origin_only_with_the_pages_scheme():
    with running(script_engine()) as (_, address):
        statuses = [asyncio.run(handshake(address, f"{scheme}://{address}")) for scheme in ("http", "https", "ws")]
    assert statuses == [101, 403, 403]


@pytest.mark.parametrize(("trusted", "expected"), [("127.0.0.1", [403, 101]), ("", [101, 403])])
def test_only_a_trusted_proxy_can_say_the_page_was_https(trusted, expected):
    """Behind a TLS proxy the page is https while the socket reaches us as ws: X-Forwarded-Proto from a listed
    proxy says so; from anyone else it is ignored."""
    proto = {"X-Forwarded-Proto": "https"}
    with running(script_engine(), trusted_proxies=trusted) as (_, address):
        statuses = [asyncio.run(handshake(address, f"{scheme}://{address}", proto)) for scheme in ("http", "https")]
    assert statuses == expected


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x"])
def test_a_chat_completion_needs_a_json_body_so_another_sites_form_cannot_start_one(content_type):
    body = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'
    engine = script_engine()
    with running(engine) as (_, address):
        headers = {"content-type": content_type} if content_type else {}
        refused = httpx.post(f"http://{address}/v1/chat/completions", content=body, headers=headers)
        allowed = httpx.post(f"http://{address}/v1/chat/completions", content=body,
                             headers={"content-type": "application/json; charset=utf-8"})
    assert refused.status_code == 415 and refused.json()["error"]["code"] == "unsupported_media_type"
    assert allowed.status_code == 200 and len(engine.submitted) == 1
