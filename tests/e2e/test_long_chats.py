"""A chat at the size limits costs the server about what an ordinary full conversation does, over a real server.

A 127-message chat of about 245 KB, under every limit, once cost 3.3 s of server CPU: fitting it into the context
encoded the whole history again for each exchange it dropped, and six sockets sending such chats cut another
student from 95 to 15 tokens a second. What the tokenizer reads per frame is now bounded by the context (see
text/conversation.py); bench/fit_cost.py measures the CPU time of both ways.
"""

from __future__ import annotations

import asyncio
import json

from helpers import quadratic_reference, until_terminal_async
from scripted import script_engine
from served import running
from websockets.asyncio.client import connect

WORD = "abcdefghijklmnopqr "  # 19 characters, one token of the scripted tokenizer


def talk(messages: int, words: int) -> list[dict]:
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": WORD * words} for i in range(messages - 1)]
    return turns + [{"role": "user", "content": "and what is a fraction?"}]


def test_a_127_message_chat_near_the_size_limit_reads_a_small_multiple_of_an_ordinary_conversation():
    engine = script_engine(max_context=2048, slots=2)
    tokenizer = engine.tokenizer
    ordinary, huge = talk(17, 100), talk(127, 100)  # 17 messages fill the context; 127 are 245 KB
    frame = json.dumps({"type": "chat", "id": "huge", "messages": huge, "params": {"max_new_tokens": 4}})
    assert 240_000 < len(frame) < 256 * 1024

    async def send(address, chat_id, messages):
        async with connect(f"ws://{address}/ws", max_size=None) as ws:
            before = tokenizer.read
            await ws.send(json.dumps({"type": "chat", "id": chat_id, "messages": messages,
                                      "params": {"max_new_tokens": 4}}))
            frames = await until_terminal_async(ws, 10)
            return frames, tokenizer.read - before

    with running(engine, max_context=2048, max_message_bytes=256 * 1024, max_messages=128) as (_, address):
        (ordinary_frames, ordinary_read), (huge_frames, huge_read) = (
            asyncio.run(send(address, name, messages)) for name, messages in (("ordinary", ordinary), ("huge", huge)))
    reference = quadratic_reference(huge, lambda m: tokenizer.encode_chat(m, "Be brief."), 2048, 4, 4)
    assert ordinary_frames[-1]["type"] == huge_frames[-1]["type"] == "end"
    assert huge_frames[0]["dropped_messages"] == reference.dropped_messages > 100
    assert huge_read <= 3 * ordinary_read, (huge_read, ordinary_read)
