"""The prefix cache is no oracle between students, over a real server. `cached_tokens` (and with it the time to a
first token) told a client how many leading tokens of its prompt any cached conversation held, a classmate's
included and while the classmate's answer still streamed: a probe's right guess of "My student ID is 7138..."
found 82 of 88 tokens cached, a wrong one 71. Now a conversation is reused by its owner (the socket; over HTTP
and gRPC, whoever holds its conversation key) and by everyone else only as far as the server's system prompt.
"""

from __future__ import annotations

import asyncio
import json

import grpc
import httpx
import openai
import pytest
from helpers import small_settings, until_terminal_async, wait_until
from scripted import factory, script_engine
from served import running
from websockets.asyncio.client import connect

from typewriter.server.grpc.gen import chat_pb2 as pb
from typewriter.server.grpc.gen import chat_pb2_grpc
from typewriter.server.grpc.server import GrpcServer
from typewriter.server.lifecycle import ServerState
from typewriter.server.owners import CONVERSATION_KEY, Owners

# 20 words: more than MIN_COPY tokens, so the system prompt is worth copying out of a busy slot too
SYSTEM = "You are a patient tutor. Explain step by step, ask what the student tried, and praise real progress."
SHARED = len(SYSTEM.split()) + 2  # the scripted tokenizer: a message start, a token per word, the question's start
SECRET = "My student ID is 7138 4402 and my password is violet-harbour, please remember both"
WRONG = SECRET.replace("7138", "7139")


def chat(chat_id: str, text: str, history: tuple = (), **params) -> str:
    messages = [*history, {"role": "user", "content": text}]
    return json.dumps({"type": "chat", "id": chat_id, "messages": messages, "params": params})


async def ask(address: str, chat_id: str, text: str) -> list[dict]:
    """One chat on a socket of its own: another student."""
    async with connect(f"ws://{address}/ws") as ws:
        await ws.send(chat(chat_id, text, max_new_tokens=4))
        return await until_terminal_async(ws, 5)


def guessed(guess: str, victim_streaming: bool) -> int:
    """`cached_tokens` of another student's chat `guess`, sent after the victim sent SECRET on its own socket
    (and either got its answer, or is still getting it), on a fresh server."""
    engine = script_engine(["ab"] * 200, step_s=0.02, slots=2, system_prompt=True)

    async def scenario(address):
        async with connect(f"ws://{address}/ws") as victim:
            await victim.send(chat("victim", SECRET, max_new_tokens=100 if victim_streaming else 4))
            if victim_streaming:
                while json.loads(await victim.recv())["type"] != "token":
                    pass
            else:
                await until_terminal_async(victim, 5)
            start = (await ask(address, "guess", guess))[0]
            assert start["type"] == "start" and engine.stats().active == (1 if victim_streaming else 0)
            return start["cached_tokens"]

    with running(engine, system_prompt=SYSTEM, max_new_tokens_cap=128) as (_, address):
        return asyncio.run(scenario(address))


@pytest.mark.parametrize("victim_streaming", [False, True], ids=["after-the-answer", "while-it-streams"])
def test_a_right_and_a_wrong_guess_of_a_classmates_prompt_find_the_same_tokens_cached(victim_streaming):
    right, wrong = guessed(SECRET, victim_streaming), guessed(WRONG, victim_streaming)
    assert right == wrong == SHARED  # the system prompt, and not one token of the classmate's text


def test_a_students_next_turn_reuses_their_history_and_a_new_student_the_system_prompt():
    engine = script_engine(slots=2, system_prompt=True)

    async def scenario(address):
        async with connect(f"ws://{address}/ws") as student:
            await student.send(chat("t1", SECRET, max_new_tokens=4))
            first = await until_terminal_async(student, 5)
            answer = "".join(f.get("text", "") for f in first)
            history = ({"role": "user", "content": SECRET}, {"role": "assistant", "content": answer})
            await student.send(chat("t2", "and my grade?", history, max_new_tokens=4))
            second = await until_terminal_async(student, 5)
        newcomer = await ask(address, "n1", "What is a fraction?")
        return first[0], second[0], newcomer[0]

    with running(engine, system_prompt=SYSTEM) as (_, address):
        first, second, newcomer = asyncio.run(scenario(address))
    assert first["cached_tokens"] == 0  # nothing was cached yet
    assert second["cached_tokens"] >= first["prompt_tokens"]  # the whole first turn, and the answer
    assert newcomer["cached_tokens"] == SHARED


def completion(address: str, text: str, key: str | None = None, history: tuple = ()) -> httpx.Response:
    body = {"messages": [*history, {"role": "user", "content": text}], "max_tokens": 4}
    return httpx.post(f"http://{address}/v1/chat/completions", json=body,
                      headers={CONVERSATION_KEY: key} if key else {})


def reused_so_far(address: str) -> float:
    metrics = httpx.get(f"http://{address}/metrics").text
    return next(float(line.split()[-1]) for line in metrics.splitlines()
                if line.startswith("typewriter_prefix_reused_tokens_total "))


def test_over_http_a_turn_reuses_its_conversation_only_with_the_key_the_server_gave_for_it():
    engine = script_engine(slots=3, max_queue=4, system_prompt=True)  # a slot for each conversation
    with running(engine, system_prompt=SYSTEM) as (_, address):
        first = completion(address, SECRET)
        key = first.headers[CONVERSATION_KEY]
        history = ({"role": "user", "content": SECRET},
                   {"role": "assistant", "content": first.json()["choices"][0]["message"]["content"]})
        responses, reused = [first], [reused_so_far(address)]
        for sent in (f"{key.partition('.')[0]}.{'0' * 32}", None, key):  # forged, none, the one it was given
            responses.append(completion(address, "and my grade?", sent, history))
            reused.append(reused_so_far(address))
    assert [r.status_code for r in responses] == [200] * 4
    assert [r.headers[CONVERSATION_KEY] == key for r in responses] == [True, False, False, True]
    turns = [b - a for a, b in zip([0.0, *reused], reused)]
    assert turns[:3] == [0, SHARED, SHARED]
    assert turns[3] >= len(engine.submitted[0].prompt_ids)  # the whole first turn


def test_a_clients_own_system_message_follows_the_servers_prompt_which_chats_still_share_and_nothing_past_it():
    """The official client sends a system message, as most OpenAI code does: it is taken after the server's prompt,
    so a chat with one, a chat without, and a chat with another client's share the server's prompt both ways, and a
    right guess of a classmate's system message finds no more cached than a wrong one."""
    engine = script_engine(slots=1, max_queue=4, system_prompt=True)  # each chat finds the last one's slot

    def cached(client: openai.OpenAI, system: str | None) -> int:
        messages = [{"role": "system", "content": system}] if system else []
        answer = client.chat.completions.create(model="m", max_tokens=4, messages=[
            *messages, {"role": "user", "content": "What is a fraction?"}])
        return answer.usage.prompt_tokens_details.cached_tokens

    with running(engine, system_prompt=SYSTEM) as (_, address), \
            openai.OpenAI(base_url=f"http://{address}/v1", api_key="unused", max_retries=0) as client:
        seen = [cached(client, system) for system in (SECRET, None, SECRET, WRONG, None)]
    assert seen == [0] + [SHARED - 1] * 4  # each follows one whose system text differs: the server's prompt, no more
    systems = [system for _, system in engine.tokenizer.calls]
    assert systems[0] == f"{SYSTEM}\n\n{SECRET}" and systems[1] == SYSTEM  # the server's prompt first


def test_over_grpc_a_turn_reuses_its_conversation_with_the_key_from_the_first_turns_metadata():
    engine = script_engine(slots=2, system_prompt=True)

    async def turn(stub, text, key=None, history=()):
        messages = [pb.Message(role=m["role"], content=m["content"]) for m in history]
        request = pb.ClientMessage(chat=pb.ChatRequest(id="g", messages=[*messages, pb.Message(role="user",
                                                                                              content=text)],
                                                       params=pb.Params(max_new_tokens=4)))
        call = stub.Stream(iter([request]), metadata=((CONVERSATION_KEY, key),) if key else None)
        events = [event async for event in call]
        metadata = dict(await call.initial_metadata())
        return events, metadata[CONVERSATION_KEY]

    async def scenario():
        state = ServerState(small_settings(system_prompt=SYSTEM), factory(engine))
        state.start_loading()
        await asyncio.to_thread(wait_until, lambda: state.ready)
        server = GrpcServer(state)
        port = await server.start("127.0.0.1", 0)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = chat_pb2_grpc.ChatStub(channel)
                first, key = await turn(stub, SECRET)
                history = ({"role": "user", "content": SECRET},
                           {"role": "assistant", "content": "".join(e.token.text for e in first)})
                stranger, _ = await turn(stub, "and my grade?", None, history)
                own, again = await turn(stub, "and my grade?", key, history)
                return first, stranger, own, key, again
        finally:
            await state.drain()
            await server.stop(0)

    first, stranger, own, key, again = asyncio.run(scenario())
    assert again == key
    assert (first[0].start.cached_tokens, stranger[0].start.cached_tokens) == (0, SHARED)
    assert own[0].start.cached_tokens >= first[0].start.prompt_tokens


def test_a_conversation_key_is_honoured_only_as_issued_by_this_server():
    owners, other = Owners(), Owners()
    owner, key = owners.conversation(None)
    assert owners.conversation(key) == (owner, key)
    for forged in (other.conversation(None)[1], key.partition(".")[0], key + "0", "", "."):
        assert owners.conversation(forged)[0] != owner
    assert owners.socket() != owners.socket()


def test_a_students_history_is_theirs_across_tabs_and_never_a_classmates_behind_the_same_address():
    engine = script_engine(slots=3, system_prompt=True)

    def cookie(address):
        return httpx.get(f"http://{address}/").headers["set-cookie"].split(";", 1)[0]

    async def turn(address, cookie_header, chat_id, text, history=()):
        async with connect(f"ws://{address}/ws", additional_headers={"cookie": cookie_header}) as ws:
            await ws.send(chat(chat_id, text, history, max_new_tokens=4))
            return await until_terminal_async(ws, 5)

    async def scenario(address):
        ana, ben = cookie(address), cookie(address)
        first = await turn(address, ana, "t1", SECRET)  # Ana's first tab
        answer = "".join(f.get("text", "") for f in first)
        history = ({"role": "user", "content": SECRET}, {"role": "assistant", "content": answer})
        ben_probe = await turn(address, ben, "b1", "and my grade?", history)  # Ben sends Ana's words as his own
        ana_tab = await turn(address, ana, "t2", "and my grade?", history)  # Ana's second tab: a new socket
        return first[0], ben_probe[0], ana_tab[0]

    with running(engine, system_prompt=SYSTEM) as (_, address):
        first, ben_probe, ana_tab = asyncio.run(scenario(address))
    assert ben_probe["cached_tokens"] == SHARED  # the system prompt, not a word of Ana's
    assert ana_tab["cached_tokens"] >= first["prompt_tokens"]  # her whole first turn, from another socket
