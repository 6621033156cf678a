"""A kept chat is its client's, over real sockets (uvicorn on loopback, the real engine on a scripted runner, two
clients told apart by a trusted proxy's X-Forwarded-For): it holds the place of the socket that left it among its
client's connections until it ends, so no client holds more disconnected than connected; and its frames count in
its client's share of the resume buffers, which is all its client can ever make room from."""

from __future__ import annotations

import asyncio
import json

from helpers import until_terminal_async, wait_until
from scripted import script_engine
from served import running
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

PROXIED = {"trusted_proxies": "127.0.0.1"}


def client(n: int) -> dict[str, str]:
    return {"X-Forwarded-For": f"198.51.100.{n}"}


def chat(request_id: str, tokens: int = 64, resumable: bool = True) -> str:
    return json.dumps({"type": "chat", "id": request_id, "messages": [{"role": "user", "content": "go on"}],
                       "params": {"max_new_tokens": tokens}, "resumable": resumable})


async def recv(ws) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), 10))


def test_a_kept_chat_holds_its_socket_s_place_until_it_ends_and_another_client_goes_on():
    """One socket at a time, each starting a long resumable chat and closing on its first frame: with 3 places per
    client, the third kept chat fills them and a fourth socket from that client is refused (1013), while another
    client still chats; once the kept chats end, the places come back."""
    engine = script_engine(["z "] * 2000, step_s=0.01, max_context=4096, slots=4)

    async def talk(address):
        for n in range(3):
            async with connect(f"ws://{address}/ws", additional_headers=client(1)) as ws:
                await ws.send(chat(f"k{n}", tokens=1500))
                assert (await recv(ws))["type"] in ("queued", "start")  # its resume token came with it
        try:
            async with connect(f"ws://{address}/ws", additional_headers=client(1)) as ws:
                await ws.send(json.dumps({"type": "ping"}))
                fourth = (await recv(ws))["type"]
        except ConnectionClosed as closed:
            fourth = closed.rcvd.code
        async with connect(f"ws://{address}/ws", additional_headers=client(2)) as ws:
            await ws.send(chat("other", tokens=4, resumable=False))
            other = (await until_terminal_async(ws))[-1]
        return fourth, other

    with running(engine, max_context=4096, max_new_tokens_cap=2000, max_connections_per_client=3,
                 **PROXIED) as (server, address):
        fourth, other = asyncio.run(talk(address))
        limits = server.config.app.state.server.limits
        held = limits.open["198.51.100.1"]
        for n in range(3):
            engine.cancel(f"r{n + 1}")  # the three kept chats end: their places come back
        wait_until(lambda: not limits.open.get("198.51.100.1"), "the kept chats' places are given back")
    assert fourth == 1013 and held == 3
    assert other["type"] == "end" and other["reason"] == "length"


def test_one_client_s_kept_chats_never_push_out_another_client_s_kept_answer():
    """With small buffers (4 KiB a chat, 8 KiB a client, 16 KiB in all), one client's six long chats dropped mid-
    answer cannot make room from another client's finished answer within its grace: it resumes whole. The first
    client's own chats end with resume_buffer_full instead."""
    engine = script_engine(["y" * 50] * 60, step_s=0.005, max_context=512)

    async def talk(address):
        async with connect(f"ws://{address}/ws", additional_headers=client(2)) as b:
            await b.send(chat("b", tokens=30))
            kept = await until_terminal_async(b)  # about 1,900 bytes of frames, finished and kept
        hoggers = []
        for n in range(6):
            ws = await connect(f"ws://{address}/ws", additional_headers=client(1))
            await ws.send(chat(f"a{n}", tokens=60))
            await recv(ws)
            hoggers.append(ws)
        for ws in hoggers:
            await ws.close()  # kept, nobody reading: their frames pile up unsent
        await asyncio.sleep(1.0)
        async with connect(f"ws://{address}/ws", additional_headers=client(2)) as b:
            await b.send(json.dumps({"type": "resume", "id": "b", "token": kept[0]["resume_token"], "from": 0}))
            again = await until_terminal_async(b)
        return kept, again

    with running(engine, resume_buffer_bytes=4096, resume_buffer_client_bytes=8192,
                 resume_buffer_total_bytes=16384, **PROXIED) as (_, address):
        kept, again = asyncio.run(talk(address))
    assert again[0]["type"] == "resumed" and again[-1]["reason"] == kept[-1]["reason"] == "length"
    assert "".join(f["text"] for f in again if f["type"] == "token") == \
        "".join(f["text"] for f in kept if f["type"] == "token")
