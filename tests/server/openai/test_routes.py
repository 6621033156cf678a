"""The OpenAI-compatible HTTP API over Starlette's TestClient and the real engine on a scripted runner: the
response shapes, the parameter mapping, and every refusal in OpenAI's error shape with our codes. The official
`openai` client against a real server is in e2e/test_openai_client.py."""

from __future__ import annotations

import asyncio
import json
import logging
import re

import pytest
from helpers import serving, small_settings

BODY = {"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "say hello"}]}


def events_of(response) -> list:
    """The data of each SSE event: parsed JSON, or the "[DONE]" marker; comments are skipped."""
    events = []
    for block in response.text.split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
        else:
            assert block == "" or block.startswith(":"), block
    return events


def completion(client, **fields):
    return client.post("/v1/chat/completions", json=BODY | fields)


def test_a_completion_is_one_chat_completion_with_the_answer_usage_and_finish_reason():
    with serving() as (client, engine):
        response = completion(client)
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["model"] == "SmolLM2-135M-Instruct"  # the id of Settings, not the engine's name
    assert body["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "Hello, world!"},
                                "logprobs": None, "finish_reason": "stop"}]
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8,
                             "prompt_tokens_details": {"cached_tokens": 0}}
    assert engine.tokenizer.calls == [([{"role": "user", "content": "say hello"}], "Be brief.")]


def test_a_stream_is_chunks_with_a_role_first_then_text_then_the_finish_reason_then_done():
    with serving() as (client, engine):
        response = completion(client, stream=True)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["cache-control"] == "no-cache" and response.headers["x-accel-buffering"] == "no"
    events = events_of(response)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "Hello, world!"
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + ["stop"]
    assert all("usage" not in c for c in chunks)


def test_include_usage_adds_a_last_chunk_with_usage_and_no_choices():
    with serving() as (client, engine):
        events = events_of(completion(client, stream=True, stream_options={"include_usage": True}))
    *chunks, usage, done = events
    assert done == "[DONE]"
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens_details": {"cached_tokens": 0},
                                                         "prompt_tokens": 3, "completion_tokens": 5,
                                                           "total_tokens": 8}
    assert all(c["usage"] is None for c in chunks)


def test_parameters_map_onto_ours_and_a_single_stop_string_is_a_list():
    with serving() as (client, engine):
        completion(client, max_tokens=3, temperature=0, top_p=0.5, seed=4, stop="!", top_k=2,
                   repetition_penalty=1.0, frequency_penalty=0, presence_penalty=0.0, n=1, user="u1",
                   metadata={"k": "v"}, store=False, tools=[], tool_choice="none", logprobs=False,
                   response_format={"type": "text"})
        response = completion(client, max_completion_tokens=2, stop=["?", "#"])
    first, second = engine.submitted
    p = first.params
    assert (p.max_new_tokens, p.temperature, p.top_p, p.seed, p.stop, p.top_k, p.repetition_penalty) == \
        (3, 0, 0.5, 4, ("!",), 2, 1.0)
    assert (second.params.max_new_tokens, second.params.stop) == (2, ("?", "#"))
    assert response.json()["choices"][0]["finish_reason"] == "length"


def test_a_stop_sequence_ends_the_answer_before_it_with_finish_reason_stop():
    with serving() as (client, engine):
        body = completion(client, stop=[" world"]).json()
    assert body["choices"][0]["message"]["content"] == "Hello,"
    assert body["choices"][0]["finish_reason"] == "stop"


def test_content_parts_are_joined_and_developer_is_a_system_message():
    with serving(api_system_prompt="replace") as (client, engine):
        completion(client, messages=[{"role": "developer", "content": "Be terse."},
                                     {"role": "user", "content": [{"type": "text", "text": "say "},
                                                                  {"type": "text", "text": "hello"}]}])
    # with "replace" the client's system message goes to the chat template, which puts it in place of ours
    assert engine.tokenizer.calls[0][0] == [{"role": "system", "content": "Be terse."},
                                            {"role": "user", "content": "say hello"}]


def test_a_system_message_follows_the_servers_prompt_on_both_doors_and_the_setting_can_refuse_it():
    system = [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "say hello"}]
    with serving() as (client, engine):
        completed = completion(client, messages=system)
        responded = client.post("/v1/responses", json={"input": "say hello", "instructions": "Answer in French."})
    assert (completed.status_code, responded.status_code) == (200, 200)
    # the server's prompt first, then the client's: what every chat shares stays a prefix
    assert engine.tokenizer.calls == [([{"role": "user", "content": "say hello"}], "Be brief.\n\nAnswer in French.")] * 2
    with serving(api_system_prompt="refuse") as (client, engine):
        refused = completion(client, messages=system)
    assert refused.status_code == 400 and engine.submitted == []
    assert (refused.json()["error"]["code"], refused.json()["error"]["param"]) == ("system_prompt_not_allowed", None)


@pytest.mark.parametrize("fields, param, code", [
    ({"temperature": 9}, "temperature", "invalid_request"),
    ({"max_tokens": 10_000}, "max_tokens", "invalid_request"),
    ({"max_completion_tokens": 0}, "max_completion_tokens", "invalid_request"),
    ({"max_tokens": 5, "max_completion_tokens": 6}, "max_completion_tokens", "invalid_request"),
    ({"top_p": "high"}, "top_p", "invalid_request"),
    ({"stop": [""]}, "stop", "invalid_request"),
    ({"frequency_penalty": 0.5}, "frequency_penalty", "invalid_request"),
    ({"presence_penalty": 1}, "presence_penalty", "invalid_request"),
    ({"n": 9}, "n", "invalid_request"),
    ({"top_logprobs": 3}, "top_logprobs", "invalid_request"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "invalid_request"),
    ({"logit_bias": {"1": 5}}, "logit_bias", "not_supported"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type", "invalid_request"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function",
      "function": {"name": "g"}}}, "tool_choice", "invalid_request"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}], "logprobs": True}, "logprobs", "not_supported"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}], "response_format": {"type": "json_object"}},
     "response_format", "not_supported"),
    ({"response_format": {"type": "xml"}}, "response_format.type", "invalid_request"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}},
     "response_format.json_schema.name", "invalid_request"),
    ({"response_format": {"type": "regex", "regex": "[a-"}}, "response_format", "invalid_request"),
    ({"stream_options": {"include_usage": True}}, "stream_options", "invalid_request"),
    ({"stream": "yes"}, "stream", "invalid_request"),
    ({"temprature": 0}, "temprature", "invalid_request"),
    ({"messages": []}, "messages", "invalid_request"),
    ({"messages": [{"role": "user", "content": "42", "tool_call_id": "x"}]}, "messages[0].tool_call_id",
     "invalid_request"),
    ({"messages": [{"role": "tool", "content": "42"}]}, "messages[0].tool_call_id", "invalid_request"),
    ({"messages": [{"role": "function", "content": "42"}]}, "messages[0].role", "invalid_request"),
    ({"messages": [{"role": ["user"], "content": "42"}]}, "messages[0].role", "invalid_request"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content[0]", "invalid_request"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "b"},
                   {"role": "user", "content": "c"}]}, "messages[1].role", "invalid_request"),
])
def test_a_bad_field_is_a_400_in_openais_error_shape_naming_the_field(fields, param, code):
    with serving() as (client, engine):
        response = completion(client, **fields)
        rejected = client.get("/metrics").text
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"], error["type"]) == (param, code, "invalid_request_error")
    assert param is None or error["message"].startswith(f"{param}: "), error["message"]
    assert engine.submitted == []
    assert f'typewriter_rejected_requests_total{{code="{code}"}} 1.0' in rejected


@pytest.mark.parametrize("body, code", [(b"{not json", "invalid_json"), (b"[1, 2]", "invalid_request"),
                                        (b"\xff\xfe", "invalid_json"), (b"[" * 5000 + b"]" * 5000, "invalid_json"),
                                        (b'{"messages": NaN}', "invalid_json")])
def test_a_body_that_is_not_a_json_object_is_refused_with_a_named_code(body, code):
    with serving(max_message_bytes=65536) as (client, engine):
        response = client.post("/v1/chat/completions", content=body,
                               headers={"content-type": "application/json"})
    assert response.status_code == 400 and response.json()["error"]["code"] == code


def test_an_oversized_body_is_a_413_whether_or_not_it_declares_its_length():
    big = json.dumps(BODY | {"messages": [{"role": "user", "content": "x" * 5000}]}).encode()
    with serving() as (client, engine):  # max_message_bytes 4096
        declared = client.post("/v1/chat/completions", content=big)
        chunked = client.post("/v1/chat/completions", content=iter([big[:3000], big[3000:]]))
    for response in (declared, chunked):
        assert response.status_code == 413 and response.json()["error"]["code"] == "too_large"


def test_a_prompt_too_long_for_the_context_is_a_400_with_its_code():
    with serving() as (client, engine):  # context 256, scripted tokenizer: a token a word
        response = completion(client, messages=[{"role": "user", "content": "word " * 300}], max_tokens=8)
    assert response.status_code == 400 and response.json()["error"]["code"] == "prompt_too_long"


def test_a_full_queue_is_a_503_with_retry_after():
    with serving() as (client, engine):
        engine.submit = _full  # as the engine refuses a chat when its queue is full
        response = completion(client)
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    assert response.json()["error"]["code"] == "overloaded"


def _full(request, on_event):
    from typewriter.errors import Overloaded

    raise Overloaded(0)


def test_rate_limited_is_a_429_with_the_wait_in_retry_after():
    with serving(chats_per_minute=1) as (client, engine):
        assert completion(client).status_code == 200
        response = completion(client)
    assert response.status_code == 429 and response.json()["error"]["code"] == "rate_limited"
    assert 1 <= int(response.headers["retry-after"]) <= 60


def test_models_lists_the_loaded_model_and_unknown_routes_are_openai_shaped_404s():
    with serving() as (client, engine):
        models = client.get("/v1/models").json()
        missing = client.post("/v1/completions", json={})
        wrong_method = client.get("/v1/chat/completions")
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["SmolLM2-135M-Instruct"]
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    assert wrong_method.status_code == 405 and wrong_method.json()["error"]["code"] == "method_not_allowed"


def test_with_an_api_key_the_api_needs_it():
    with serving(api_key="sesame") as (client, engine):
        refused = completion(client)
        allowed = client.post("/v1/chat/completions", json=BODY, headers={"authorization": "Bearer sesame"})
    assert refused.status_code == 401 and allowed.status_code == 200


# ---- over raw ASGI, where a send can block as it does when a real client stops reading ----


def _asgi_request(body: dict):
    """(scope, receive) of a POST /v1/chat/completions whose client sends its body, then waits (never leaves)."""
    raw = json.dumps(body).encode()
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 5000), "server": ("testserver", 80),
             "headers": [(b"host", b"testserver"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(raw)).encode())]}
    messages = [{"type": "http.request", "body": raw, "more_body": False}]
    left = asyncio.Event()

    async def receive():
        if messages:
            return messages.pop(0)
        await left.wait()
        return {"type": "http.disconnect"}

    return scope, receive, left


def test_a_stream_whose_client_stops_reading_is_cancelled_by_the_backlog(caplog):
    from scripted import factory, script_engine
    from starlette.requests import Request

    from typewriter.server.lifecycle import ServerState
    from typewriter.server.openai.routes import OpenAI

    engine = script_engine(["x"] * 1000, step_s=0.001, max_context=4096)

    async def scenario():
        state = ServerState(small_settings(send_backlog=8, max_new_tokens_cap=1000), factory(engine))
        state.start_loading()
        while not state.ready:
            await asyncio.sleep(0.01)
        scope, receive, left = _asgi_request(BODY | {"stream": True, "max_tokens": 1000})
        answer = await OpenAI(state).chat_completions(Request(scope, receive))
        sent, stalled = [], asyncio.Event()

        async def send(message):  # the headers and the first event go out, then the client reads no more
            sent.append(message)
            if len(sent) >= 2:
                await stalled.wait()
                raise OSError("the client went away")  # as uvicorn's send does once the peer is gone

        running = asyncio.create_task(answer(scope, receive, send))
        while engine.stats().active or not answer.stream.cancelled:
            await asyncio.sleep(0.005)
        waiting = answer.stream.events.qsize()
        left.set()  # now the client goes away
        stalled.set()
        await asyncio.wait_for(running, 10)
        return answer.stream.cancelled, waiting, state.metrics.render().decode()

    with caplog.at_level(logging.INFO):
        cancelled, waiting, metrics = asyncio.run(scenario())
    assert cancelled.value == "backlog" and waiting <= 8 + 2
    generated = float(re.search(r"^typewriter_generated_tokens_total (\S+)$", metrics, re.M).group(1))
    assert generated < 100  # cancelled within a step or two of the backlog filling, not run to 1,000
    assert "the client is not reading" in caplog.text


def test_a_client_that_leaves_while_its_chat_is_queued_frees_its_place_at_once():
    from scripted import factory, script_engine
    from starlette.requests import Request

    from typewriter.server.lifecycle import ServerState
    from typewriter.server.openai.routes import OpenAI

    engine = script_engine(["x"] * 1000, step_s=0.002, slots=1, max_queue=2, max_context=4096)

    async def scenario():
        state = ServerState(small_settings(max_new_tokens_cap=1000), factory(engine))
        state.start_loading()
        while not state.ready:
            await asyncio.sleep(0.01)
        api = OpenAI(state)
        holder_scope, holder_receive, holder_left = _asgi_request(BODY | {"stream": True, "max_tokens": 1000})
        holder = await api.chat_completions(Request(holder_scope, holder_receive))
        waiter_scope, waiter_receive, waiter_left = _asgi_request(BODY | {"stream": True, "max_tokens": 5})
        waiter = await api.chat_completions(Request(waiter_scope, waiter_receive))
        sent = []

        async def record(message):
            sent.append(message)

        tasks = [asyncio.create_task(holder(holder_scope, holder_receive, record)),
                 asyncio.create_task(waiter(waiter_scope, waiter_receive, record))]
        while engine.stats().queued != 1:
            await asyncio.sleep(0.005)
        waiter_left.set()  # the queued client hangs up: nothing was sent to it but the headers
        while engine.stats().queued:
            await asyncio.sleep(0.005)
        still_running = engine.stats().active
        holder_left.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
        return waiter.stream.cancelled, still_running

    cancelled, still_running = asyncio.run(scenario())
    assert cancelled.value == "disconnect" and still_running == 1
