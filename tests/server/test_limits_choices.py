"""Every choice of a request is a chat, over a real server (uvicorn on loopback, the real engine on a scripted
runner): `n` choices count `n` against the chats a minute and against the client's chats at once, so `n=8` buys
no more than eight requests would."""

from __future__ import annotations

import httpx
from scripted import script_engine
from served import running

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def test_n_choices_count_as_n_chats_a_minute():
    with running(script_engine(slots=8, max_queue=8), chats_per_minute=20) as (_, address):
        codes = [httpx.post(f"http://{address}/v1/chat/completions", json=BODY | {"n": 8}, timeout=10)
                 for _ in range(3)]
        single = httpx.post(f"http://{address}/v1/chat/completions", json=BODY | {"n": 4}, timeout=10)
        one = httpx.post(f"http://{address}/v1/chat/completions", json=BODY, timeout=10)
    assert [r.status_code for r in codes] == [200, 200, 429]
    assert codes[2].json()["error"]["code"] == "rate_limited" and codes[2].headers.get("retry-after")
    assert len(codes[0].json()["choices"]) == 8
    assert (single.status_code, one.status_code) == (200, 429)  # 16 of 20 taken: 4 more fit, then none


def test_n_choices_count_against_the_client_s_chats_at_once_and_a_smaller_request_still_fits():
    with running(script_engine(slots=8, max_queue=8), max_connections_per_client=4) as (_, address):
        eight = httpx.post(f"http://{address}/v1/chat/completions", json=BODY | {"n": 8}, timeout=10)
        three = httpx.post(f"http://{address}/v1/chat/completions", json=BODY | {"n": 3}, timeout=10)
    assert eight.status_code == 429 and "chats at once" in eight.json()["error"]["message"]
    assert three.status_code == 200 and len(three.json()["choices"]) == 3
