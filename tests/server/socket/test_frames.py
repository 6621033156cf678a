"""Parsing client frames and building server frames, without a socket."""

from __future__ import annotations

import json

import pytest
from repo import ROOT

from typewriter.engine.request import Finished, FinishReason, Timings
from typewriter.server.chat_request import Chat, ChatMessage, sampling_params
from typewriter.server.refusal import ERROR_CODES, Refusal
from typewriter.server.socket import frames as p


def parse(frame: object, max_messages: int = 8):
    return p.parse_frame(frame if isinstance(frame, str) else json.dumps(frame), max_messages)


def user(text: str = "hi") -> dict:
    return {"role": "user", "content": text}


def chat(**fields) -> dict:
    return {"type": "chat", "id": "c1", "messages": [user()], **fields}


def error_of(frame: object, max_messages: int = 8) -> Refusal:
    with pytest.raises(Refusal) as raised:
        parse(frame, max_messages)
    return raised.value


def test_a_chat_parses_into_typed_messages_and_params():
    message = parse(chat(messages=[{"role": "system", "content": "terse"}, user("a"),
                                   {"role": "assistant", "content": "b"}, user("c")],
                         params={"temperature": 0.5, "stop": ["END"]}))
    assert message == Chat("c1", (ChatMessage("system", "terse"), ChatMessage("user", "a"),
                                    ChatMessage("assistant", "b"), ChatMessage("user", "c")),
                             {"temperature": 0.5, "stop": ["END"]})


def test_stop_and_ping_parse():
    assert parse({"type": "stop", "id": "c1"}) == p.Stop("c1")
    assert parse({"type": "ping"}) == p.Ping()


@pytest.mark.parametrize("text", ["{", "[1,", "", '{"type": "ping", "x": Infinity}', '{"a": NaN}'])
def test_text_that_is_not_json_is_invalid_json(text):
    error = error_of(text)
    assert (error.code, error.request_id) == ("invalid_json", None)


@pytest.mark.parametrize(
    ("frame", "field"),
    [
        ([1, 2], "a frame must be a JSON object"),
        ({"id": "c1"}, "type: must be"),
        ({"type": "CHAT", "id": "c1"}, "type: must be"),
        ({"type": "ping", "id": "c1"}, "id: unknown field"),
        ({"type": "stop"}, "id: must be a string of 1 to 64"),
        ({"type": "stop", "id": ""}, "id: must be a string of 1 to 64"),
        ({"type": "stop", "id": 7}, "id: must be a string of 1 to 64"),
        (chat(id="x" * 65), "id: must be a string of 1 to 64"),
        (chat(extra=True), "extra: unknown field"),
        (chat(messages=[]), "messages: must be a non-empty list"),
        (chat(messages="hi"), "messages: must be a non-empty list"),
        (chat(messages=[user()] * 9), "messages: at most 8 messages per chat, got 9"),
        (chat(messages=["hi"]), "messages[0]: must be an object"),
        (chat(messages=[{"role": "user", "content": "hi", "name": "x"}]), "messages[0].name: unknown field"),
        (chat(messages=[{"role": "tool", "content": "hi"}]), "messages[0].tool_call_id: must name the call"),
        (chat(messages=[{"role": "robot", "content": "hi"}]), "messages[0].role: must be one of"),
        (chat(response_format={"type": "xml"}), "response_format.type: must be"),
        (chat(tools=[{"type": "function", "function": {"name": "a b"}}]), "tools[0].function.name: must be"),
        (chat(tool_choice="required"), "tool_choice: names a tool, but no tools"),
        (chat(messages=[{"role": ["user"], "content": "hi"}]), "messages[0].role: must be one of"),
        (chat(tools=[{"type": "function", "function": {"name": "f"}}], tool_choice={"type": "function",
                                                                                  "function": "f"}), "tool_choice: must"),
        (chat(response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": {"x-guidance": 1}}}),
         "x-guidance: must be an object"),
        (chat(messages=[{"role": "user", "content": 5}]), "messages[0].content: must be a string"),
        (chat(messages=[{"role": "user"}]), "messages[0].content: must be a string"),
        (chat(messages=[user(), {"role": "system", "content": "x"}, user()]), "messages[1].role: only the first"),
        (chat(messages=[user(), {"role": "assistant", "content": "x"}]), "the last message must be the user's"),
        (chat(params=[]), "params: must be an object"),
        (chat(params={"beam_width": 2}), "params.beam_width: unknown parameter"),
        (chat(params={"timeout_s": 2}), "params.timeout_s: unknown parameter"),
    ],
)
def test_a_malformed_frame_is_invalid_request_naming_the_field(frame, field):
    error = error_of(frame)
    assert error.code == "invalid_request"
    assert field in error.message


def test_an_error_echoes_the_id_only_when_it_is_well_formed():
    assert error_of(chat(extra=1)).request_id == "c1"
    assert error_of(chat(id="x" * 65, extra=1)).request_id is None
    assert error_of({"type": "chat", "id": ["c1"]}).request_id is None


def build(params: dict, cap: int = 64, timeout_s: float | None = None):
    return sampling_params(Chat("c1", (ChatMessage("user", "hi"),), params), 16, cap, timeout_s, 1.1)


def test_sampling_params_fill_the_server_default_and_keep_what_the_client_sent():
    params = build({"temperature": 0, "top_p": 0.5, "top_k": 40, "repetition_penalty": 1.1, "seed": 3,
                    "stop": ["a", "b"]}, timeout_s=30.0)
    assert (params.max_new_tokens, params.temperature, params.top_p, params.top_k) == (16, 0, 0.5, 40)
    assert (params.repetition_penalty, params.seed, params.stop, params.timeout_s) == (1.1, 3, ("a", "b"), 30.0)
    assert build({"max_new_tokens": 64}).max_new_tokens == 64


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"max_new_tokens": 65}, "params.max_new_tokens: this server allows at most 64, got 65"),
        ({"max_new_tokens": 0}, "params.max_new_tokens: must be between 1"),
        ({"max_new_tokens": 2.5}, "params.max_new_tokens: must be an integer"),
        ({"max_new_tokens": True}, "params.max_new_tokens: must be an integer"),
        ({"temperature": -0.1}, "params.temperature: must be at least 0.0"),
        ({"temperature": "hot"}, "params.temperature: must be a finite number"),
        ({"top_p": 0}, "params.top_p: must be greater than 0.0"),
        ({"top_p": 1.5}, "params.top_p"),
        ({"top_k": -1}, "params.top_k"),
        ({"repetition_penalty": 0}, "params.repetition_penalty"),
        ({"seed": -1}, "params.seed"),
        ({"stop": "END"}, "params.stop: must be a list of strings"),
        ({"stop": [""]}, "params.stop: every stop sequence must be a non-empty string"),
        ({"stop": ["x"] * 9}, "params.stop: at most 8"),
    ],
)
def test_an_out_of_range_param_is_invalid_request_never_clamped(params, message):
    with pytest.raises(Refusal) as raised:
        build(params)
    assert raised.value.code == "invalid_request"
    assert raised.value.request_id == "c1"
    assert message in raised.value.message


def test_server_frames_have_the_documented_shape():
    finished = Finished("engine-7", FinishReason.STOP_SEQUENCE, 12, 5, Timings(1.23456, 20.0, 90.5, 48.25))
    assert json.loads(p.encode(p.end("c1", finished))) == {
        "type": "end", "id": "c1", "reason": "stop_sequence",
        "usage": {"prompt_tokens": 12, "completion_tokens": 5},
        "timings": {"queue_ms": 1.235, "ttft_ms": 20.0, "total_ms": 90.5, "tokens_per_s": 48.25},
    }
    assert p.queued("c1", 2) == {"type": "queued", "id": "c1", "position": 2}
    assert p.start("c1", 12, 8, 2) == {"type": "start", "id": "c1", "prompt_tokens": 12, "cached_tokens": 8,
                                       "dropped_messages": 2}
    assert p.token("c1", 0, "é") == {"type": "token", "id": "c1", "index": 0, "text": "é"}
    assert p.encode(p.token("c1", 0, "é")) == '{"type":"token","id":"c1","index":0,"text":"é"}'
    assert p.error("busy", "wait", None) == {"type": "error", "id": None, "code": "busy", "message": "wait"}
    assert p.pong() == {"type": "pong"}


def test_the_page_has_plain_words_for_every_error_code_the_server_sends():

    source = (ROOT / "frontend" / "protocol.js").read_text()
    table = source[source.index("const ERROR_TEXT"):source.index("});", source.index("const ERROR_TEXT"))]
    missing = [code for code in ERROR_CODES if f"\n  {code}:" not in table]  # each key starts a line
    assert not missing, f"frontend/protocol.js ERROR_TEXT lacks {missing}"


def test_the_page_has_words_for_every_end_reason_but_the_natural_ones_and_the_errors_sent_as_a_frame():

    source = (ROOT / "frontend" / "protocol.js").read_text()
    table = source[source.index("const END_TEXT"):source.index("});", source.index("const END_TEXT"))]
    silent = {FinishReason.EOS, FinishReason.STOP_SEQUENCE, FinishReason.ERROR,  # these end with an error frame
              FinishReason.CONSTRAINT}
    missing = [r.value for r in FinishReason if r not in silent and f"\n  {r.value}:" not in table]
    assert not missing, f"frontend/protocol.js END_TEXT lacks {missing}"


def test_a_frame_nested_too_deeply_for_the_json_parser_is_invalid_json_not_a_crash():
    with pytest.raises(Refusal) as raised:
        p.parse_frame("[" * 5000 + "]" * 5000, 8)
    assert raised.value.code == "invalid_json" and "too deeply" in raised.value.message
    with pytest.raises(Refusal, match="got a deeply nested value|got \\["):
        p.parse_frame(json.dumps({"type": [[[[1]]]]}), 8)
