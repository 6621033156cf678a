"""The official `openai` client, sync and async, against a real server process (the tiny model, over a real
socket): streamed and whole answers agree, stop sequences and max_tokens, an aborted stream frees its slot, and a
full server answers 503 with our code."""

from __future__ import annotations

import asyncio
import re
import time

import openai
import pytest
from real_server import http_get, real_server
from tiny_model import HOLD_TOKENS, LONG_SETTINGS

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SETTINGS = {"TYPEWRITER_SYSTEM_PROMPT": "Be brief.", "TYPEWRITER_MAX_ACTIVE": "1",
            "TYPEWRITER_MAX_QUEUE": "0", "TYPEWRITER_CHATS_PER_MINUTE": "1000", **LONG_SETTINGS}
# An answer the next request must find still running (its 200 tokens took tens of milliseconds, a race with a second
# request's round trip)
HOLD = HOLD_TOKENS
# Greedy with repetition favoured (our extension, below 1) and the loop guard off: the answer loops to its length
LOOPS = {"repetition_penalty": 0.5, "loop_guard": False}
QUESTION = [{"role": "user", "content": "hello world"}]
GREEDY = {"temperature": 0, "max_tokens": 24}


@pytest.fixture(scope="module")
def base(tmp_path_factory, long_tiny_gguf):
    with real_server(SETTINGS | {"TYPEWRITER_MODEL_PATH": str(long_tiny_gguf)},
                     tmp_path_factory.mktemp("openai") / "server.log") as url:
        yield url


@pytest.fixture
def client(base):
    with openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0) as c:
        yield c


def metric(base: str, name: str) -> float:
    text = http_get(f"{base}/metrics")[1]
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def wait_idle(base: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while metric(base, "typewriter_active_streams") or metric(base, "typewriter_queued_requests"):
        assert time.monotonic() < deadline, "the server still has a stream after 10 s"
        time.sleep(0.02)


def test_a_streamed_answer_concatenates_to_the_whole_answer_for_the_same_greedy_request(client, base):
    whole = client.chat.completions.create(model="tiny", messages=QUESTION, **GREEDY)
    chunks = list(client.chat.completions.create(model="tiny", messages=QUESTION, stream=True,
                                                 stream_options={"include_usage": True}, **GREEDY))
    text = whole.choices[0].message.content
    assert text and whole.choices[0].finish_reason in ("stop", "length")
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert whole.model == client.models.list().data[0].id


def test_a_stop_sequence_cuts_the_answer_before_it(client):
    full = client.chat.completions.create(model="tiny", messages=QUESTION, **GREEDY).choices[0].message.content
    cut = len(full) // 2
    stop = full[cut:cut + 3]
    assert stop.strip(), f"the greedy answer {full!r} has no text to stop on"
    answer = client.chat.completions.create(model="tiny", messages=QUESTION, stop=[stop], **GREEDY).choices[0]
    assert answer.message.content == full[:full.index(stop)]
    assert answer.finish_reason == "stop"


def test_max_tokens_bounds_the_answer(client):
    answer = client.chat.completions.create(model="tiny", messages=QUESTION, temperature=0, max_tokens=3)
    assert 1 <= answer.usage.completion_tokens <= 3
    assert answer.choices[0].finish_reason == ("length" if answer.usage.completion_tokens == 3 else "stop")


def test_a_bad_parameter_raises_bad_request_naming_it(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="tiny", messages=QUESTION, frequency_penalty=1.5)
    assert caught.value.body["param"] == "frequency_penalty" and caught.value.body["code"] == "invalid_request"


def test_an_aborted_async_stream_frees_its_slot_and_counts_as_cancelled(base):
    cancelled = metric(base, 'typewriter_requests_total{reason="cancelled"}')

    async def abort_after_two_chunks() -> int:
        async with openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0) as aclient:
            stream = await aclient.chat.completions.create(
                model="tiny", messages=QUESTION, stream=True, max_tokens=HOLD, temperature=0,
                extra_body=LOOPS)  # a sampled answer ended by eos within 53 tokens, at times before the abort
            seen = 0
            async for chunk in stream:
                seen += bool(chunk.choices and chunk.choices[0].delta.content)
                if seen == 2:
                    break
            await stream.close()
            return seen

    assert asyncio.run(abort_after_two_chunks()) == 2
    wait_idle(base)
    assert metric(base, 'typewriter_requests_total{reason="cancelled"}') == cancelled + 1


def test_a_full_server_answers_503_overloaded_with_retry_after_while_a_stream_holds_the_slot(client, base):
    wait_idle(base)
    # LOOPS: a sampled answer of the tiny model could end after a few tokens, before the second request arrives
    holder = client.chat.completions.create(model="tiny", messages=QUESTION, stream=True, max_tokens=HOLD,
                                            temperature=0, extra_body=LOOPS)
    try:
        next(iter(holder))  # it holds the only slot, and the queue holds none
        with pytest.raises(openai.APIStatusError) as caught:
            client.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=4)
    finally:
        holder.close()
    assert caught.value.status_code == 503 and caught.value.body["code"] == "overloaded"
    assert caught.value.response.headers["retry-after"] == "1"
    wait_idle(base)
