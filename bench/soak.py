"""Soak: many clients doing random things to a real server for minutes; nothing may leak or go missing.

    .venv/bin/python bench/soak.py --clients 32 --seconds 600 --json artifacts/soak.json

Without --url it starts `typewriter serve` (its defaults, the per-address limits lifted: every client is on
loopback) and stops it at the end. Each client connects and then, again and again, picks one of: a chat it reads
to its end, a chat it stops after the first token, a chat it abandons by disconnecting mid-answer (then it
reconnects), a garbage frame (not JSON, an unknown type, a binary frame: the last closes the socket, and it
reconnects), or a ping. Reported: chats completed and cancelled, errors by code, closes by code, chats that did
not get exactly one terminal frame (must be 0; abandoned chats are not counted), leaked streams (the server's
active streams once every client has left; must be 0) and the server's RSS at the start and the end.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import random
import sys
import time
from pathlib import Path

import httpx
from classroom_servers import HOST, Server, free_port
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

QUESTIONS = ["What is a prime number?", "Why is the sky blue?", "How do I add fractions?", "What is gravity?"]
GARBAGE = ["{not json", '{"type": "dance"}', '{"type": "chat", "id": 5}', "[]", b"\x00\x01binary"]


class Tally:
    def __init__(self):
        self.counts = collections.Counter()
        self.errors = collections.Counter()
        self.closes = collections.Counter()
        self.terminals: collections.Counter[str] = collections.Counter()  # chat id -> terminal frames seen
        self.watched: set[str] = set()  # chats whose terminal frame the client waited for


async def client(n: int, url: str, deadline: float, tally: Tally, rng: random.Random) -> None:
    turn = 0
    while time.monotonic() < deadline:
        try:
            async with connect(url, open_timeout=30, max_size=None) as ws:
                while time.monotonic() < deadline:
                    turn += 1
                    if not await act(ws, f"c{n}-{turn}", rng, tally):
                        break  # it left on purpose: reconnect
        except ConnectionClosed as e:
            tally.closes[e.rcvd.code if e.rcvd else "none"] += 1
        except TimeoutError:  # the server did not answer within 120 s: a failure of the run
            tally.counts["timeouts"] += 1
        except OSError:
            tally.counts["connect_failed"] += 1
            await asyncio.sleep(1)


async def act(ws, rid: str, rng: random.Random, tally: Tally) -> bool:
    """One action; False when the client closed the socket on purpose."""
    roll = rng.random()
    if roll < 0.15:  # garbage
        frame = rng.choice(GARBAGE)
        await ws.send(frame)
        if isinstance(frame, bytes):
            await ws.recv()  # the close (1003) raises ConnectionClosed here
        await until(ws, rid, tally, lambda f: f["type"] == "error")
        tally.counts["garbage"] += 1
        return True
    if roll < 0.25:
        await ws.send(json.dumps({"type": "ping"}))
        await until(ws, rid, tally, lambda f: f["type"] == "pong")
        return True
    chat = {"type": "chat", "id": rid, "messages": [{"role": "user", "content": rng.choice(QUESTIONS)}],
            "params": {"max_new_tokens": rng.choice([8, 32, 64])}}
    await ws.send(json.dumps(chat))
    # Only this chat's frames count: a `not_found` for the last chat's stop (it crossed that chat's `end`) can
    # arrive first, and taken for this chat's end it left this chat's real end unread (seen under load).
    mine = ("token", "end", "error")
    if roll < 0.40:  # abandon mid-answer
        await until(ws, rid, tally, lambda f: f.get("id") == rid and f["type"] in mine)
        tally.counts["abandoned"] += 1
        await ws.close()
        return False
    tally.watched.add(rid)
    end = None
    if roll < 0.55:  # stop after the first token
        first = await until(ws, rid, tally, lambda f: f.get("id") == rid and f["type"] in mine)
        if first["type"] == "token":
            await ws.send(json.dumps({"type": "stop", "id": rid}))
        else:
            end = first
    end = end or await until(ws, rid, tally, lambda f: f.get("id") == rid and f["type"] in ("end", "error"))
    tally.counts["cancelled" if end.get("reason") == "cancelled" else "completed" if end["type"] == "end"
                 else "failed"] += 1
    return True


async def until(ws, rid: str, tally: Tally, done) -> dict:
    """Frames until one satisfies `done`; every frame is tallied on the way."""
    while True:
        frame = json.loads(await asyncio.wait_for(ws.recv(), 120))
        # a `not_found` answers a stop that crossed its chat's `end` on the wire (an 8-token answer can end
        # within 10 ms): it ends no chat, so it is not a second terminal frame
        if frame["type"] in ("end", "error") and frame.get("id") and frame.get("code") != "not_found":
            tally.terminals[frame["id"]] += 1
        if frame["type"] == "error":
            tally.errors[frame["code"]] += 1
        if done(frame):
            return frame


def active_streams(http_url: str) -> float:
    for line in httpx.get(http_url + "/metrics", timeout=5).text.splitlines():
        if line.startswith("typewriter_active_streams "):
            return float(line.split()[-1])
    raise RuntimeError("no typewriter_active_streams in /metrics")


def run(url: str, http_url: str, clients: int, seconds: float, seed: int, server: Server | None) -> dict:
    tally = Tally()
    rss_start = server.status("VmRSS") // 1024 if server else None
    started = time.monotonic()

    async def everyone():
        deadline = time.monotonic() + seconds
        await asyncio.gather(*(client(n, url, deadline, tally, random.Random(seed * 1000 + n))
                               for n in range(clients)))

    asyncio.run(everyone())
    wall = time.monotonic() - started
    leaked, wait_until = active_streams(http_url), time.monotonic() + 30
    while leaked and time.monotonic() < wait_until:
        time.sleep(0.5)
        leaked = active_streams(http_url)
    not_one = sorted(rid for rid in tally.watched if tally.terminals[rid] != 1)
    return {
        "clients": clients, "seconds": round(wall, 1), "seed": seed, **tally.counts,
        "errors": dict(tally.errors), "closes": {str(k): v for k, v in tally.closes.items()},
        "not_exactly_one_terminal": len(not_one), "not_exactly_one_terminal_ids": not_one[:10],
        "leaked_streams": leaked, "rss_mb_start": rss_start,
        "rss_mb_end": server.status("VmRSS") // 1024 if server else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--url", help="a running server's ws://.../ws (default: start one)")
    parser.add_argument("--model", help="the model for the server it starts (default: the embedded one)")
    parser.add_argument("--system-prompt", help="the system prompt of the server it starts (default: the tutor's)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    if args.url:
        result = run(args.url, "http" + args.url[2:].rsplit("/", 1)[0], args.clients, args.seconds, args.seed, None)
    else:
        port = free_port()
        argv = [sys.executable, "-m", "typewriter", "serve", "--host", HOST, "--port", str(port)]
        if args.model:
            argv += ["--model", args.model]
        env = {"TYPEWRITER_MAX_CONNECTIONS_PER_CLIENT": "100000", "TYPEWRITER_CHATS_PER_MINUTE": "100000"}
        if args.system_prompt is not None:
            env["TYPEWRITER_SYSTEM_PROMPT"] = args.system_prompt
        with Server("typewriter", argv, port, "/readyz", env).start(900, poll_s=0.5) as server:
            result = run(f"ws://{HOST}:{port}/ws", server.http_url, args.clients, args.seconds, args.seed, server)
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    ok = result["leaked_streams"] == 0 and result["not_exactly_one_terminal"] == 0 and not result.get("timeouts")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
