"""Tools on a model whose chat template has no tool format (the scripted one's, as the embedded model's): the chat
is taken, its tools reach the encoder, and the engine gets a grammar that holds any call to the tools' schemas,
a forced one from the first token, an `auto` one from the call's opening on."""

from __future__ import annotations

import pytest
from helpers import serving
from scripted import script_engine

from typewriter.engine.request import ConstraintKind

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
