"""What a chat hands the engine. Tools on a model whose chat template has no tool format (the scripted one's, as the
embedded model's): the chat is taken, its tools reach the encoder, and the engine gets a grammar that holds any call
to the tools' schemas, a forced one from the first token, an `auto` one from the call's opening on. The repetition
penalty a chat gets when it names none: its model's, or the server's setting."""

from __future__ import annotations

import pytest
from helpers import serving
from scripted import script_engine

from typewriter.engine.request import SMALL_MODEL_PARAMETERS, ConstraintKind

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
# in pieces a real vocabulary has: a piece that opens an object and names a key is not in llguidance's masks
CALL = ["<tool_call>\n", '{"name": ', '"add"', ', "arguments": ', "{", '"x"', ": ", "2", "}}", "\n</tool_call>"]


@pytest.mark.parametrize("choice, forced", [("auto", False), ("required", True),
                                            ({"type": "function", "function": {"name": "add"}}, True)])
def test_a_model_without_a_tool_format_takes_tools_in_the_generic_one(choice, forced):
    engine = script_engine(CALL)  # its fixed answer is a call, which every grammar allows
    with serving(engine) as (client, engine):
        response = client.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "add 2 and 3"}], "tools": TOOLS, "tool_choice": choice})
    assert response.status_code == 200, response.text
    (call,) = response.json()["choices"][0]["message"]["tool_calls"]
    assert call["function"] == {"name": "add", "arguments": '{"x": 2}'}
    (request,) = engine.submitted
    constraint = request.params.constraint
    assert (constraint.kind, constraint.origin) == (ConstraintKind.GRAMMAR, "tools")
    assert constraint.source.startswith('start: "<tool_call>\\n" call' if forced else "start: TEXT | ")


def test_none_offers_no_tools_and_constrains_nothing():
    with serving() as (client, engine):
        response = client.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "add 2 and 3"}], "tools": TOOLS, "tool_choice": "none"})
    assert response.status_code == 200 and engine.submitted[0].params.constraint is None


def test_a_tool_schema_the_grammar_cannot_hold_is_refused_by_name_before_the_chat_starts():
    lookaround = [{"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"x": {"type": "string", "pattern": "(?=a)b"}}}}}]
    with serving() as (client, engine):
        response = client.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "add 2 and 3"}], "tools": lookaround})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_request", "tools") and engine.submitted == []


@pytest.mark.parametrize("parameters, setting, asked, expected", [
    (135_000_000, None, None, 1.1),  # a small model loops without it
    (SMALL_MODEL_PARAMETERS, None, None, 1.0),  # a larger one is more often right without it
    (494_000_000, 1.05, None, 1.05),  # the server's setting, for every model
    (494_000_000, None, 1.2, 1.2),  # a chat that names one keeps it
    (135_000_000, 1.3, 1.0, 1.0),
])
def test_a_chat_that_names_no_repetition_penalty_gets_its_models_or_the_servers(parameters, setting, asked, expected):
    overrides = {} if setting is None else {"repetition_penalty": setting}
    body = {"messages": [{"role": "user", "content": "hi"}]} | ({} if asked is None else {"repetition_penalty": asked})
    with serving(script_engine(parameters=parameters), **overrides) as (client, engine):
        assert client.post("/v1/chat/completions", json=body).status_code == 200
    (request,) = engine.submitted
    assert request.params.repetition_penalty == expected


def test_a_tool_calls_arguments_nested_thousands_deep_are_a_named_refusal_not_an_internal_error():
    deep = "[" * 3000  # about 3 KB: within the body limit, past the JSON reader's recursion
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": None,
                 "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": deep}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "5"}]
    with serving() as (client, engine):
        response = client.post("/v1/chat/completions", json={"messages": messages})
    error = response.json()["error"]
    assert response.status_code == 400 and error["code"] == "invalid_request"
    assert error["param"] == "messages[1].tool_calls[0].function.arguments" and engine.submitted == []
