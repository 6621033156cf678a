"""A blank question, the last user message empty or only whitespace, is a named error at every door, over real
transports: the socket and gRPC (`invalid_request`, INVALID_ARGUMENT), the OpenAI API (400 naming the field) on a
real uvicorn server, and `typewriter generate` as a subprocess. None of them reaches the engine. Earlier messages
of a conversation may be blank; `typewriter chat` asks again on a blank line, as a shell does."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import types

import grpc
import httpx
import pytest
from live_server import running
from repo import ROOT
from scripted import factory, script_engine
from websockets.sync.client import connect

from typewriter.server.grpc.gen import chat_pb2 as pb
from typewriter.server.grpc.gen import chat_pb2_grpc
from typewriter.server.grpc.service import ERROR_CODE_KEY

BLANKS = ["", " ", "\n\t  \n", "\u00a0\u2003"]  # a no-break space and an em space are whitespace too
NAMED = "must not be empty or only whitespace: there is nothing to answer"


def frames_until_terminal(ws) -> list[dict]:
    frames = [json.loads(ws.recv(timeout=10))]
    while frames[-1]["type"] not in ("end", "error"):
        frames.append(json.loads(ws.recv(timeout=10)))
    return frames


def test_the_socket_refuses_a_blank_question_and_the_connection_goes_on():
    engine = script_engine()
    with running(factory(engine)) as (_, address), connect(f"ws://{address}/ws") as ws:
        refusals = []
        for n, blank in enumerate(BLANKS):
            ws.send(json.dumps({"type": "chat", "id": f"b{n}", "messages": [{"role": "user", "content": blank}]}))
            refusals += frames_until_terminal(ws)
        history = [{"role": "user", "content": " "}, {"role": "assistant", "content": "Say something?"},
                   {"role": "user", "content": "What is a prime?"}]
        ws.send(json.dumps({"type": "chat", "id": "ok", "messages": history}))
        answered = frames_until_terminal(ws)
    assert refusals == [{"type": "error", "id": f"b{n}", "code": "invalid_request",
                         "message": f"messages[0].content: {NAMED}"} for n in range(len(BLANKS))]
    assert answered[-1]["type"] == "end" and answered[-1]["reason"] == "eos"  # an earlier blank is fine
    assert len(engine.submitted) == 1


def test_the_openai_api_refuses_a_blank_question_with_400_naming_the_field():
    engine = script_engine()
    with running(factory(engine)) as (_, address):
        url = f"http://{address}/v1/chat/completions"
        plain = httpx.post(url, json={"messages": [{"role": "user", "content": "  \n"}]})
        parts = httpx.post(url, json={"stream": True, "messages": [
            {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": [{"type": "text", "text": " "}, {"type": "text", "text": "\t"}]}]})
    for response, field in ((plain, "messages[0].content"), (parts, "messages[2].content")):
        assert response.status_code == 400
        assert response.json() == {"error": {"message": f"{field}: {NAMED}", "type": "invalid_request_error",
                                             "param": field, "code": "invalid_request"}}
    assert engine.submitted == []


def test_grpc_refuses_a_blank_question_with_invalid_argument(capsys):
    engine = script_engine()
    with running(factory(engine), grpc_port=0):
        address = re.search(r"^gRPC on (\S+)$", capsys.readouterr().out, re.M).group(1)
        with grpc.insecure_channel(address) as channel:
            request = pb.ClientMessage(chat=pb.ChatRequest(id="g1", messages=[pb.Message(role="user", content=" ")]))
            with pytest.raises(grpc.RpcError) as refused:
                list(chat_pb2_grpc.ChatStub(channel).Stream(iter([request]), timeout=10))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == f"invalid_request: messages[0].content: {NAMED}"
    assert dict(refused.value.trailing_metadata())[ERROR_CODE_KEY] == "invalid_request"
    assert engine.submitted == []


@pytest.mark.parametrize("args", [["generate", ""], ["generate", "  \n "], ["generate", "--raw", " "]])
def test_generate_refuses_a_blank_prompt_before_the_model_loads(args):
    run = subprocess.run([sys.executable, "-m", "typewriter", *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert (run.returncode, run.stdout) == (2, "")
    assert run.stderr == f"typewriter: error: invalid_request: prompt: {NAMED}\n"


def test_chat_asks_again_on_a_blank_line_and_sends_only_questions(monkeypatch, capsys):
    from typewriter import cli

    engine = script_engine(slots=1, max_queue=0)
    fake = types.ModuleType("typewriter.assemble")
    fake.load = lambda model_path, **kwargs: (engine, engine.tokenizer, None)
    monkeypatch.setitem(sys.modules, "typewriter.assemble", fake)
    monkeypatch.setattr("sys.stdin", io.StringIO("\n   \n\t\nWhat is a prime?\n"))
    try:
        assert cli.main(["chat"]) == 0
    finally:
        engine.shutdown()
    assert [r.prompt_ids for r in engine.submitted] == [engine.tokenizer.encode_chat(
        [{"role": "user", "content": "What is a prime?"}])]
    assert capsys.readouterr().out.count("you> ") == 5  # asked again after each blank line, and after the answer
