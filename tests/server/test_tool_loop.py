"""The server's calculator in an answer, over real sockets (uvicorn on loopback, the real engine on a scripted model
that calls it): the step between the text, the answer going on in the same chat from the cached conversation, one
start and one end whose usage sums the parts, the bounds, stop and disconnect between and within parts, and the
OpenAI doors, where a step is a paragraph of the content."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
from helpers import until_terminal_async, wait_until
from scripted import call_pieces, calling_engine
from served import running
from websockets.asyncio.client import connect

from typewriter.server.calculator import FUNCTION, MAX_STEPS

THINK = ["Let me ", "work it out."]
ANSWER = [" So it ", "is 84."]
ROUNDS = [[*THINK, *call_pieces("12 * 7")], ANSWER]


def chat(request_id: str = "q1", **extra) -> str:
    return json.dumps({"type": "chat", "id": request_id, "params": {"max_new_tokens": 64},
                       "messages": [{"role": "user", "content": "what is twelve times seven"}], **extra})


async def ask(address: str, frame: str) -> list[dict]:
    async with connect(f"ws://{address}/ws") as ws:
        await ws.send(frame)
        return await until_terminal_async(ws)


def text(frames: list[dict]) -> str:
    return "".join(f["text"] for f in frames if f["type"] == "token")


def test_a_call_is_evaluated_shown_as_a_step_and_the_answer_goes_on_in_the_same_chat():
    engine = calling_engine(ROUNDS)
    with running(engine, calculator=True) as (_, address):
        frames = asyncio.run(ask(address, chat()))
    kinds = [f["type"] for f in frames]
    assert kinds.count("start") == 1 and kinds[-1] == "end"
    step_at = kinds.index("tool_step")
    assert text(frames[:step_at]) == "Let me work it out." and text(frames[step_at:]) == " So it is 84."
    assert frames[step_at] == {"type": "tool_step", "id": "q1", "index": 0, "name": "calculator",
                               "expression": "12 * 7", "result": "84", "error": None}
    indices = [f["index"] for f in frames if f["type"] == "token"]
    assert indices == sorted(indices) and len(set(indices)) == len(indices)  # they keep counting over the parts
    first, second = engine.submitted
    first_part = 64 - second.params.max_new_tokens  # cut where its call ends: the eos may or may not come first
    assert first_part in (len(ROUNDS[0]), len(ROUNDS[0]) + 1)
    end = frames[-1]
    assert end["reason"] == "eos"  # not tool_calls: the client made no call, the server did
    assert end["usage"] == {"prompt_tokens": len(first.prompt_ids) + len(second.prompt_ids),
                            "completion_tokens": first_part + len(ANSWER) + 1}
    assert engine.tokenizer.tools[0] == [{"type": "function", "function": FUNCTION}]
    assert second.owner == first.owner
    # the second part's prompt is the first's conversation, the call and its result: its start is the first's
    assert second.prompt_ids[:len(first.prompt_ids) - 1] == first.prompt_ids[:-1]
    conversation = engine.tokenizer.calls[-1][0]
    assert [m["role"] for m in conversation] == ["user", "assistant", "tool"]
    assert conversation[1]["content"] == "Let me work it out."
    assert json.loads(conversation[1]["tool_calls"][0]["function"]["arguments"]) == {"expression": "12 * 7"}
    assert conversation[2]["content"] == "84"
    # and it went on where the conversation was cached: only the call, its result and the new marker computed
    second_prefill = [p for p in engine.runner.prefills() if p[1] > 0 or p[2] == len(second.prompt_ids)]
    assert second_prefill[0][1] >= len(first.prompt_ids) - 1


def test_a_call_written_in_a_json_block_as_qwen_coder_writes_it_is_a_step_too():
    fence = ["```", "json", "\n{\n", '  "name": "calculator",\n', '  "arguments": {"expression": "1234 * 5678"}\n',
             "}\n", "```"]
    engine = calling_engine([["Let me.\n", *fence], [" It is 7006652."]])
    with running(engine, calculator=True) as (_, address):
        frames = asyncio.run(ask(address, chat()))
    (step,) = [f for f in frames if f["type"] == "tool_step"]
    assert (step["expression"], step["result"]) == ("1234 * 5678", "7006652")
    assert text(frames) == "Let me.\n It is 7006652."  # the block was the call: never shown


def test_a_part_ends_where_its_call_is_complete_so_a_made_up_result_is_never_shown():
    engine = calling_engine([["Let me.", *call_pieces("12 * 7"), " It will print ", "999", " surely."] + ["."] * 30,
                             [" It is 84."]], step_s=0.01)
    with running(engine, calculator=True) as (_, address):
        frames = asyncio.run(ask(address, chat()))
    assert text(frames) == "Let me. It is 84." and frames[-1]["reason"] == "eos"
    assert frames[-1]["usage"]["completion_tokens"] < 30  # the first part was cut, not run to its end


def test_a_refused_calculation_is_a_named_step_and_the_model_hears_why():
    engine = calling_engine([[*THINK, *call_pieces("5 / (2 - 2)")], ["Oops."]])
    with running(engine, calculator=True) as (_, address):
        frames = asyncio.run(ask(address, chat()))
    (step,) = [f for f in frames if f["type"] == "tool_step"]
    assert (step["error"], step["result"]) == ("division_by_zero", "division by zero: the divisor is 0")
    assert engine.tokenizer.calls[-1][0][-1]["content"] == "error: division by zero: the divisor is 0"
    assert text(frames).endswith("Oops.") and frames[-1]["reason"] == "eos"


def test_a_model_that_keeps_calling_gets_at_most_max_steps_and_then_its_answer_ends():
    engine = calling_engine([[*THINK, *call_pieces("1 + 1")]], max_context=512)  # every part calls again
    with running(engine, calculator=True, max_new_tokens_cap=128) as (_, address):
        frames = asyncio.run(ask(address, chat(params={"max_new_tokens": 128})))
    steps = [f for f in frames if f["type"] == "tool_step"]
    assert [s["index"] for s in steps] == list(range(MAX_STEPS)) and all(s["result"] == "2" for s in steps)
    assert len(engine.submitted) == MAX_STEPS + 1 and frames[-1]["type"] == "end"


def test_the_answer_s_length_is_shared_by_its_parts():
    engine = calling_engine([[*THINK, *call_pieces("12 * 7")], ["a ", "b ", "c ", "d ", "e ", "f "]])
    budget = len(ROUNDS[0]) + 1 + 3  # the first part whole, and three or four tokens of the second
    with running(engine, calculator=True) as (_, address):
        frames = asyncio.run(ask(address, chat(params={"max_new_tokens": budget})))
    left = engine.submitted[1].params.max_new_tokens
    assert left in (3, 4) and frames[-1]["reason"] == "length"
    assert frames[-1]["usage"]["completion_tokens"] == budget and text(frames).endswith("a b c d "[:2 * left])


def test_with_the_setting_off_or_tools_of_its_own_a_chat_is_offered_no_calculator():
    engine = calling_engine(ROUNDS)
    weather = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}
    with running(engine) as (_, address):
        off = asyncio.run(ask(address, chat("off")))
    with running(calling_engine(ROUNDS), calculator=True) as (_, address):
        own = asyncio.run(ask(address, chat("own", tools=[weather])))
        none = asyncio.run(ask(address, chat("none", tools=[weather], tool_choice="none")))
    assert engine.tokenizer.tools == [None] and "<tool_call>" in text(off)  # a model's text, as before
    assert not any(f["type"] == "tool_step" for f in off + own + none)
    (call,) = [f for f in own if f["type"] == "tool_call"]  # the client's own tools: its calls are the client's
    assert call["name"] == "calculator" and own[-1]["reason"] == "tool_calls"


def test_a_stop_between_the_parts_or_within_the_next_ends_the_answer_as_cancelled():
    async def stop_after(address: str, kind: str, count: int) -> list[dict]:
        async with connect(f"ws://{address}/ws") as ws:
            await ws.send(chat())
            frames: list[dict] = []
            while sum(f["type"] == kind for f in frames) < count:
                frames.append(json.loads(await asyncio.wait_for(ws.recv(), 10)))
            await ws.send(json.dumps({"type": "stop", "id": "q1"}))
            return frames + await until_terminal_async(ws)

    slow = [*call_pieces("12 * 7")], ["x "] * 40
    for kind, count in (("tool_step", 1), ("token", 3)):  # the first part has no text: its tokens are the next's
        engine = calling_engine(slow, step_s=0.03)
        with running(engine, calculator=True) as (_, address):
            frames = asyncio.run(stop_after(address, kind, count))
            wait_until(lambda: engine.stats().active == 0 and engine.stats().queued == 0, "every part ended")
        assert frames[-1]["type"] == "end" and frames[-1]["reason"] == "cancelled", frames[-3:]
        assert text(frames).count("x ") < 40


def test_a_disconnect_mid_answer_cancels_the_part_running_then():
    engine = calling_engine([[*call_pieces("12 * 7")], ["x "] * 60], step_s=0.03)

    async def leave(address: str) -> None:
        async with connect(f"ws://{address}/ws") as ws:
            await ws.send(chat())
            while json.loads(await asyncio.wait_for(ws.recv(), 10))["type"] != "tool_step":
                pass
            await asyncio.wait_for(ws.recv(), 10)  # the next part has begun

    with running(engine, calculator=True) as (_, address):
        asyncio.run(leave(address))
        began = time.monotonic()
        wait_until(lambda: engine.stats().active == 0, "the next part was cancelled")
    assert time.monotonic() - began < 60 * 0.03  # well before its 60 tokens were made


def test_on_v1_a_step_is_a_paragraph_of_the_content_streamed_or_whole():
    body = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "what is twelve times seven"}]}
    with running(calling_engine(ROUNDS), calculator=True) as (_, address):
        whole = httpx.post(f"http://{address}/v1/chat/completions", json=body, timeout=10).json()
        with httpx.stream("POST", f"http://{address}/v1/chat/completions", json=body | {"stream": True},
                          timeout=10) as reply:
            chunks = [json.loads(line[6:]) for line in reply.iter_lines() if line.startswith("data: {")]
        response = httpx.post(f"http://{address}/v1/responses", json={"model": "m", "input": "what is 12 * 7",
                                                                      "max_output_tokens": 64}, timeout=10).json()
    expected = "Let me work it out.\n\n> calculator: 12 * 7 = 84\n\n So it is 84."
    (choice,) = whole["choices"]
    assert choice["message"] == {"role": "assistant", "content": expected}
    assert choice["finish_reason"] == "stop" and whole["usage"]["completion_tokens"] - len(ANSWER) - 1 in (
        len(ROUNDS[0]), len(ROUNDS[0]) + 1)
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == expected
    assert response["output"][0]["content"][0]["text"] == expected


def test_a_step_goes_to_its_own_socket_only_and_a_resumed_chat_sends_it_again():
    engine = calling_engine([[*THINK, *call_pieces("12 * 7")], ["x "] * 20], step_s=0.02)

    async def talk(address: str) -> tuple[list[dict], list[dict], list[dict]]:
        async with connect(f"ws://{address}/ws") as other:
            async with connect(f"ws://{address}/ws") as first:
                await first.send(chat(resumable=True))
                before: list[dict] = []
                while not before or before[-1]["type"] != "tool_step":
                    before.append(json.loads(await asyncio.wait_for(first.recv(), 10)))
            token, seen = before[0]["resume_token"], max(f["index"] for f in before if f["type"] == "token")
            async with connect(f"ws://{address}/ws") as again:
                await again.send(json.dumps({"type": "resume", "id": "q1", "token": token, "from": seen + 1}))
                after = await until_terminal_async(again)
            await other.send(json.dumps({"type": "ping"}))
            others = [json.loads(await asyncio.wait_for(other.recv(), 10))]
        return before, after, others

    with running(engine, calculator=True) as (_, address):
        before, after, others = asyncio.run(talk(address))
    assert others == [{"type": "pong"}]  # nothing of another socket's chat
    assert [f["type"] for f in after[:2]] == ["resumed", "tool_step"] and after[1] == before[-1]
    assert text(before) + text(after) == "Let me work it out." + "x " * 20 and after[-1]["reason"] == "eos"
