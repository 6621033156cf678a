"""SIGTERM and SIGINT on a real `typewriter serve` process: the server drains.

/readyz turns 503 at once, a new socket is closed with 1012 and reason `shutdown`, an answer that can finish
within `drain_s` does, one that cannot ends with reason `shutdown`, and the process exits 0.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time

import pytest
from helpers import chat_json, recv_json
from real_server import STOP_TIMEOUT_S, http_get, server_process
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

DRAIN_S = 1.0
SETTINGS = {
    "TYPEWRITER_MAX_ACTIVE": "2",
    "TYPEWRITER_MAX_CONTEXT": "4096",
    "TYPEWRITER_MAX_NEW_TOKENS_CAP": "3800",
    "TYPEWRITER_DRAIN_S": str(DRAIN_S),
}
SHORT_ANSWER = 6  # tokens: done well within the drain
# Many times what one stream decodes in the 1 s drain: 600, the earlier length, finished inside it once q4-blocks
# decoded faster (as 400 had inside a 3 s drain before)
LONG_ANSWER = 3800  # with the essay's prompt (about 130 tokens with the template), within the context
# Greedy with no repetition penalty it loops to max_new_tokens (with the default penalty it ends by eos at 619)
ESSAY = "Write a long, detailed essay about the history of mathematics, from Babylon to today."


async def frames_until_end(ws, first: list[dict]) -> list[dict]:
    frames = list(first)
    while frames[-1]["type"] not in ("end", "error"):
        frames.append(await recv_json(ws, 60))
    return frames


def test_sigterm_drains_running_answers_refuses_new_ones_and_exits_0(tmp_path):
    sig = signal.SIGTERM  # what docker stop and Kubernetes send
    with server_process(SETTINGS, tmp_path / "server.log") as (proc, base):
        url = base.replace("http://", "ws://", 1) + "/ws"

        async def scenario():
            async with connect(url) as short_ws, connect(url) as long_ws:
                long_chat = chat_json("long", ESSAY, max_new_tokens=LONG_ANSWER, temperature=0.0, repetition_penalty=1.0,
                                      loop_guard=False)
                await long_ws.send(long_chat)
                long_first = [await recv_json(long_ws, 60), await recv_json(long_ws, 60)]  # start, a token
                await short_ws.send(chat_json("short", "Say hi.", max_new_tokens=SHORT_ANSWER))
                # start and a first token: its prefill is done before the signal, so only a few decode steps are
                # left to the drain (on a busy machine, prefill plus six steps once outlasted its 3 s)
                short_first = [await recv_json(short_ws, 60), await recv_json(short_ws, 60)]
                assert short_first[0]["type"] == "start", short_first
                proc.send_signal(sig)
                signalled = time.monotonic()
                await asyncio.sleep(0.5)
                ready = await asyncio.to_thread(http_get, f"{base}/readyz")
                async with connect(url) as late:
                    with pytest.raises(ConnectionClosed) as closed:
                        await asyncio.wait_for(late.recv(), 10)
                short = await frames_until_end(short_ws, short_first)
                long = await frames_until_end(long_ws, long_first)
                return ready, closed.value.rcvd, short, long, time.monotonic() - signalled

        ready, late_close, short, long, drained_s = asyncio.run(scenario())
        proc.wait(timeout=STOP_TIMEOUT_S)
    assert ready[0] == 503 and json.loads(ready[1])["status"] == "stopping"
    assert (late_close.code, late_close.reason) == (1012, "shutdown")
    assert short[-1]["type"] == "end" and short[-1]["reason"] in ("length", "eos")  # finished, not cut
    assert (long[-1]["type"], long[-1]["reason"]) == ("end", "shutdown")
    assert long[-1]["usage"]["completion_tokens"] < LONG_ANSWER
    assert DRAIN_S - 0.5 <= drained_s < DRAIN_S + 10
    assert proc.returncode == 0


def test_sigint_on_an_idle_server_exits_0_at_once(tmp_path, tiny_gguf):
    """Ctrl-C: the same drain, with nothing to wait for (the tiny model: the signal is what is tested)."""
    env = {"TYPEWRITER_MODEL_PATH": str(tiny_gguf), "TYPEWRITER_MAX_CONTEXT": "64", "TYPEWRITER_MAX_ACTIVE": "1"}
    with server_process(env, tmp_path / "server.log") as (proc, _):
        proc.send_signal(signal.SIGINT)
        signalled = time.monotonic()
        proc.wait(timeout=STOP_TIMEOUT_S)
    assert proc.returncode == 0 and time.monotonic() - signalled < 10
    assert "draining" in (tmp_path / "server.log").read_text()
