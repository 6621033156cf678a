"""Classes over a real server: each class's students get its tutor's system prompt (and share it in the prefix
cache), on the socket, `/v1` and gRPC; a class key reads its own class's settings and streams, never another's;
`/metrics` and `/readyz` count each class's load; a server for its classes only refuses those in none."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re

import grpc
import httpx
import pytest
from helpers import chat_json, recv_json, until_terminal_async, wait_until
from scripted import script_engine
from served import running
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from typewriter.server.grpc.gen import chat_pb2 as pb
from typewriter.server.grpc.gen import chat_pb2_grpc
from typewriter.server.identity import COOKIE
from typewriter.server.openai.streams import TOKEN_HEADER
from typewriter.server.owners import CONVERSATION_KEY

SERVER_PROMPT = "You are a patient tutor who explains every step and asks what the student tried first."
ALGEBRA_KEY, BIOLOGY_KEY = "alg-" + "a" * 28, "bio-" + "b" * 28
CLASSES = f"""
[[class]]
name = "Algebra 1"
join = "ALG1-7QX2"
key = "{ALGEBRA_KEY}"
weight = 2
max_tokens = 12
chats_at_once = 2
[class.tutor]
subject = "algebra"
guided = true

[[class]]
name = "Biologie 2"
key = "{BIOLOGY_KEY}"
[class.tutor]
subject = "biology"
language = "German"
"""
ALGEBRA_PROMPT = (f"{SERVER_PROMPT} You tutor algebra: bring questions on other things back to algebra, kindly. "
                  "Guide the student one step at a time: never give the whole solution at once. Give one hint or "
                  "one step, then ask the student to take the next step themselves, and wait for their answer.")
BIOLOGY_PROMPT = (f"{SERVER_PROMPT} You tutor biology: bring questions on other things back to biology, kindly. "
                  "Always answer in German, whatever language the student writes in.")


@pytest.fixture
def classes_file(tmp_path):
    path = tmp_path / "classes.toml"
    path.write_text(CLASSES)
    return str(path)


def student_cookie(address: str, code: str | None = None) -> str:
    response = httpx.get(f"http://{address}/" + (f"?class={code}" if code else ""))
    return response.headers["set-cookie"].split(";", 1)[0]


async def socket_chat(address: str, cookie: str, chat_id: str, text: str) -> list[dict]:
    async with connect(f"ws://{address}/ws", additional_headers={"cookie": cookie}) as ws:
        await ws.send(chat_json(chat_id, text, max_new_tokens=4))
        return await until_terminal_async(ws, 10)


def completion(address: str, key: str | None, text: str, **headers) -> httpx.Response:
    auth = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"http://{address}/v1/chat/completions", headers=auth | headers, timeout=10,
                      json={"messages": [{"role": "user", "content": text}], "max_tokens": 4})


def grpc_chat(grpc_address: str, key: str, text: str) -> list:
    with grpc.insecure_channel(grpc_address) as channel:
        call = chat_pb2_grpc.ChatStub(channel).Stream(iter([pb.ClientMessage(chat=pb.ChatRequest(
            id="g", messages=[pb.Message(role="user", content=text)], params=pb.Params(max_new_tokens=4)))]),
            metadata=(("authorization", f"Bearer {key}"),), timeout=10)
        return list(call)


def test_each_class_gets_its_tutors_prompt_on_every_door_and_its_students_share_it_in_the_cache(classes_file,
                                                                                                  capsys):
    engine = script_engine(slots=2, system_prompt=True)
    tokenizer = engine.tokenizer
    with running(engine, classes=classes_file, system_prompt=SERVER_PROMPT, grpc_port=0) as (_, address):
        grpc_address = re.search(r"gRPC on (\S+)", capsys.readouterr().out).group(1)
        ana, ben = student_cookie(address, "ALG1-7QX2"), student_cookie(address, "alg1-7qx2")
        nobody = student_cookie(address)
        ana_frames = asyncio.run(socket_chat(address, ana, "a1", "What is x if 2x equals 6?"))
        ben_frames = asyncio.run(socket_chat(address, ben, "b1", "How do I solve 3x plus 1 equals 7?"))
        asyncio.run(socket_chat(address, nobody, "n1", "What is a cell?"))
        assert completion(address, BIOLOGY_KEY, "Was ist eine Zelle?").status_code == 200
        assert completion(address, ALGEBRA_KEY, "What is a variable?").status_code == 200
        grpc_chat(grpc_address, BIOLOGY_KEY, "Was ist DNA?")
    systems = [system for _, system in tokenizer.calls]
    assert systems == [ALGEBRA_PROMPT, ALGEBRA_PROMPT, SERVER_PROMPT, BIOLOGY_PROMPT, ALGEBRA_PROMPT, BIOLOGY_PROMPT]
    # the scripted tokenizer: a token a word and one per message start; the students share the class's system
    # message and the question's start
    shared = len(ALGEBRA_PROMPT.split()) + 2
    assert [r.shared_prefix for r in engine.submitted[:2]] == [(shared, shared - 1)] * 2  # both ways of opening
    assert ben_frames[0]["cached_tokens"] == shared  # Ana's class prompt, cached for Ben; not a word of Ana's
    assert ana_frames[0]["cached_tokens"] == 0
    assert [r.share.group for r in engine.submitted] == ["Algebra 1", "Algebra 1", "default", "Biologie 2",
                                                         "Algebra 1", "Biologie 2"]
    assert [r.share.weight for r in engine.submitted] == [2.0, 2.0, 1.0, 1.0, 2.0, 1.0]
    assert len({r.share.client for r in engine.submitted}) == 5  # Ana, Ben, nobody, and one per class key


def test_a_chat_with_its_own_system_message_shares_the_class_prompt_up_to_where_its_text_follows(classes_file):
    """The page's chats share the class's whole opening (its system message and the question's start); one whose
    own system message follows the class's (the /v1 default) shares up to where that text begins, not nothing."""
    engine = script_engine(slots=2, system_prompt=True)
    with running(engine, classes=classes_file, system_prompt=SERVER_PROMPT) as (_, address):
        plain = completion(address, ALGEBRA_KEY, "What is a variable?")
        own = httpx.post(f"http://{address}/v1/chat/completions", headers={"authorization": f"Bearer {ALGEBRA_KEY}"},
                         timeout=10, json={"messages": [{"role": "system", "content": "Answer in French."},
                                                        {"role": "user", "content": "What is x?"}], "max_tokens": 4})
    assert plain.status_code == own.status_code == 200
    words = len(ALGEBRA_PROMPT.split())
    assert [r.shared_prefix for r in engine.submitted] == [(words + 2, words + 1), (words + 1,)]


def test_a_class_key_reads_its_own_class_and_never_another(classes_file):
    with running(script_engine(), classes=classes_file) as (_, address):
        def read(key):
            return httpx.get(f"http://{address}/v1/class", headers={"authorization": f"Bearer {key}"}).json()

        algebra, biology, unknown = read(ALGEBRA_KEY), read(BIOLOGY_KEY), read("guess-" + "c" * 26)
    assert (algebra["name"], algebra["max_tokens"], algebra["tutor"]["guided"]) == ("Algebra 1", 12, True)
    assert (biology["name"], biology["tutor"]["language"]) == ("Biologie 2", "German")
    assert unknown["name"] == "default" and unknown["client"] == "address"
    assert ALGEBRA_KEY not in json.dumps(algebra) and "ALG1-7QX2" not in json.dumps(algebra)  # never its secrets


def test_a_class_key_cannot_read_or_stop_another_classes_stream_and_its_own_can(classes_file):
    engine = script_engine(["ab"] * 80, step_s=0.02)
    conversation = "conversation-0123456789abcdef"
    with running(engine, classes=classes_file, resume_grace_s=30) as (_, address):
        base = f"http://{address}"
        with httpx.Client(base_url=base, timeout=10) as client:
            with client.stream("POST", "/v1/chat/completions", headers={
                    "authorization": f"Bearer {BIOLOGY_KEY}", "x-conversation-id": conversation},
                    json={"messages": [{"role": "user", "content": "Was ist eine Zelle?"}], "stream": True}) as r:
                token = r.headers[TOKEN_HEADER]
                next(r.iter_lines())
            url = f"/v1/stream/{conversation}?from=0"
            foreign = client.get(url, headers={"authorization": f"Bearer {ALGEBRA_KEY}", TOKEN_HEADER: token})
            keyless = client.get(url, headers={TOKEN_HEADER: token})
            stopped = client.delete(f"/v1/stream/{conversation}",
                                    headers={"authorization": f"Bearer {ALGEBRA_KEY}", TOKEN_HEADER: token})
            assert engine.stats().active == 1  # still running: the other class's stop found nothing
            own = client.get(url, headers={"authorization": f"Bearer {BIOLOGY_KEY}", TOKEN_HEADER: token})
    assert (foreign.status_code, keyless.status_code, stopped.status_code) == (404, 404, 404)
    assert own.status_code == 200 and own.text.rstrip().endswith("data: [DONE]")


def test_metrics_and_readyz_count_each_classs_load_by_its_name(classes_file):
    engine = script_engine(["ab"] * 200, step_s=0.02, slots=1, max_queue=4)

    async def hold(address):
        async with connect(f"ws://{address}/ws", additional_headers={"cookie": student_cookie(address, "ALG1-7QX2")}
                           ) as ws:
            await ws.send(chat_json("a", "x", max_new_tokens=12))
            async with connect(f"ws://{address}/ws") as other:
                await other.send(chat_json("d", "y", max_new_tokens=4))
                await asyncio.to_thread(wait_until, lambda: engine.stats().queued == 1, "one waits")
                return httpx.get(f"http://{address}/metrics").text, httpx.get(f"http://{address}/readyz").json()

    with running(engine, classes=classes_file) as (_, address):
        metrics, ready = asyncio.run(hold(address))
    assert 'typewriter_class_active_streams{class="Algebra 1"} 1.0' in metrics
    assert 'typewriter_class_queued_requests{class="default"} 1.0' in metrics
    assert 'typewriter_class_active_streams{class="Biologie 2"} 0.0' in metrics
    assert 'typewriter_class_chats_total{class="Algebra 1"} 1.0' in metrics
    assert ready["classes"] == {"default": {"active": 0, "queued": 1}, "Algebra 1": {"active": 1, "queued": 0},
                                "Biologie 2": {"active": 0, "queued": 0}}


def test_a_server_for_its_classes_only_lets_in_its_classes_and_nobody_else(tmp_path, capsys):
    path = tmp_path / "classes.toml"
    path.write_text("open = false\n" + CLASSES)

    async def sockets(address, cookie):
        outcomes = []
        for headers in ({}, {"cookie": cookie}):
            try:
                async with connect(f"ws://{address}/ws", additional_headers=headers) as ws:
                    await ws.send(chat_json("c", "x", max_new_tokens=2))
                    outcomes.append((await until_terminal_async(ws, 10))[-1]["type"])
            except ConnectionClosed as e:
                outcomes.append(e.rcvd.code)
        return outcomes

    with running(script_engine(), classes=str(path), grpc_port=0) as (_, address):
        grpc_address = re.search(r"gRPC on (\S+)", capsys.readouterr().out).group(1)
        page = httpx.get(f"http://{address}/")
        joined = student_cookie(address, "ALG1-7QX2")
        outcomes = asyncio.run(sockets(address, joined))
        keyless, keyed = completion(address, None, "hi"), completion(address, ALGEBRA_KEY, "hi")
        with pytest.raises(grpc.RpcError) as refused:
            grpc_chat(grpc_address, "not-a-class-key-at-all-0000", "hi")
        assert grpc_chat(grpc_address, BIOLOGY_KEY, "hi")[-1].WhichOneof("kind") == "end"
    assert "Join your class" in page.text and 'id="question"' not in page.text  # the join form alone
    assert f"{COOKIE}=" in page.headers["set-cookie"]  # an identity all the same, to join with
    assert outcomes == [1008, "end"]
    assert (keyless.status_code, keyless.json()["error"]["code"], keyed.status_code) == (401, "unauthorized", 200)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert dict(refused.value.trailing_metadata())["typewriter-error-code"] == "unauthorized"


def test_a_class_answers_at_most_its_max_tokens(classes_file):
    with running(script_engine(), classes=classes_file) as (_, address):
        too_long = httpx.post(f"http://{address}/v1/chat/completions", headers={"authorization": f"Bearer {ALGEBRA_KEY}"},
                              json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 13})
        fits = completion(address, ALGEBRA_KEY, "hi")
        others = completion(address, BIOLOGY_KEY, "hi", **{CONVERSATION_KEY: ""})
    assert too_long.status_code == 400 and "at most 12" in too_long.json()["error"]["message"]
    assert fits.status_code == 200 and others.status_code == 200


def test_a_schools_range_raises_its_addresss_caps_while_each_students_limits_hold(classes_file):
    engine = script_engine(["ab"] * 100, step_s=0.02, slots=4, max_queue=8)

    async def scenario(address):
        ana, ben = student_cookie(address, "ALG1-7QX2"), student_cookie(address, "ALG1-7QX2")
        outcomes = {}
        async with contextlib.AsyncExitStack() as stack:
            sockets = [(who, n, await stack.enter_async_context(connect(f"ws://{address}/ws",
                                                                         additional_headers={"cookie": cookie})))
                       for who, cookie in (("ana", ana), ("ben", ben)) for n in range(3)]
            for who, n, ws in sockets:
                await ws.send(chat_json(f"{who}{n}", "x", max_new_tokens=12))
                first = await recv_json(ws)
                outcomes[f"{who}{n}"] = first.get("message") if first["type"] == "error" else first["type"]
            try:
                async with connect(f"ws://{address}/ws", additional_headers={"cookie": ana}) as ws:
                    await ws.recv()
            except ConnectionClosed as e:
                outcomes["ana's fourth socket"] = (e.rcvd.code, e.rcvd.reason)
        return outcomes

    # loopback counts as a school's network: 8 connections and chats at once, not 2
    with running(engine, classes=classes_file, max_connections_per_client=3, address_caps="127.0.0.0/8=8") \
            as (_, address):
        outcomes = asyncio.run(scenario(address))
    refused = "too many chats at once (at most 2 for each student, kept answers included); wait for one to end"
    assert [outcomes[f"ana{n}"] for n in range(3)] == ["start", "start", refused]
    assert [outcomes[f"ben{n}"] for n in range(3)] == ["start", "start", refused]  # Ana's took none of Ben's
    assert outcomes["ana's fourth socket"] == (1013, "too many connections of yours (at most 3); close one first")
