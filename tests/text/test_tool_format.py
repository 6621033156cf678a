"""A model's tool format (text/tool_format.py): read off its chat template, a grammar that forces one call, and
calls found in a streamed answer however its text is cut into deltas, with nothing sent that is taken back."""

from __future__ import annotations

import json

import pytest

from typewriter.engine.constraints import Grammars
from typewriter.engine.request import Constraint, ConstraintKind
from typewriter.text.tool_format import (
    FENCED_JSON,
    GENERIC,
    HERMES,
    CallArguments,
    CallStarted,
    TextPiece,
    ToolCallParser,
    tool_format,
)

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 * (3 + {4})"}}\n</tool_call>'


def parse(text: str, step: int) -> tuple[str, list[tuple[str, str]], list]:
    """(text outside calls, [(name, arguments streamed)], the parser's complete calls)."""
    parser, pieces = ToolCallParser(HERMES), []
    for i in range(0, len(text), step):
        pieces += parser.push(text[i:i + step])
    pieces += parser.flush()
    calls: list[list[str]] = []
    for piece in pieces:
        if isinstance(piece, CallStarted):
            calls.append([piece.name, ""])
        elif isinstance(piece, CallArguments):
            calls[piece.index][1] += piece.text
    return "".join(p.text for p in pieces if isinstance(p, TextPiece)), [tuple(c) for c in calls], parser.calls


def test_a_hermes_template_is_known_and_any_other_gets_the_generic_format():
    assert tool_format("{% if tools %}<tools>{{ tools }}</tools> <tool_call>{% endif %}") is HERMES
    assert tool_format("{% for m in messages %}{{ m.content }}{% endfor %}") is GENERIC
    assert tool_format("{% if tools %}[AVAILABLE_TOOLS]{{ tools }}{% endif %}") is GENERIC  # a format we do not read
    assert tool_format(None) is GENERIC


@pytest.mark.parametrize("step", [1, 2, 3, 7, 1000])
def test_a_call_streams_its_name_then_its_arguments_whatever_the_cuts(step):
    text, calls, done = parse(f"Let me compute. {CALL} Done.", step)
    assert text == "Let me compute.  Done."
    assert calls == [("calculator", '{"expression": "2 * (3 + {4})"}')]
    assert done == [{"name": "calculator", "arguments": '{"expression": "2 * (3 + {4})"}'}]


def test_text_that_only_looks_like_a_call_is_text_and_a_cut_call_ends_with_what_it_had():
    assert parse("a <tool_c b <tool_call>not json</tool_call>", 2)[0] == "a <tool_c b <tool_call>not json</tool_call>"
    text, calls, _ = parse('<tool_call>\n{"name": "f", "arguments": {"x": 1', 1)
    assert (text, calls) == ("", [("f", '{"x": 1')])
    assert parse('<tool_call>\n{"na', 1)[:2] == ("", [])  # no name yet: never shown as a call


def test_a_call_written_in_another_order_is_read_whole():
    text, calls, _ = parse('<tool_call>{"arguments": {"x": 1}, "name": "f"}</tool_call>', 4)
    assert (text, calls) == ("", [("f", '{"x": 1}')])


def test_the_forced_grammar_names_each_tool_and_its_parameters():
    tools = [{"name": "a", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}},
             {"name": "b"}]
    grammar = HERMES.grammar(tools, strict=False)
    start, call = grammar.splitlines()
    assert start == 'start: "<tool_call>\\n" call "\\n</tool_call>"'
    schema = json.loads(call.removeprefix("call: %json "))
    assert [c["properties"]["name"]["const"] for c in schema["anyOf"]] == ["a", "b"]
    assert schema["x-guidance"]["lenient"] is True


ADD = {"name": "add", "parameters": {"type": "object", "additionalProperties": False, "required": ["x"],
                                     "properties": {"x": {"type": "integer"}}}}


@pytest.fixture(scope="module")
def grammars(real_tokenizer):
    return Grammars(real_tokenizer, real_tokenizer.vocab_size)


def accepts(grammars, tokenizer, grammar: str, text: str) -> tuple[bool, bool]:
    """(every token of `text` allowed, the grammar then complete) on the embedded model's vocabulary."""
    answer = grammars.start(Constraint(ConstraintKind.GRAMMAR, grammar, "tools"))
    for token in tokenizer.encode(text):
        if not answer.matcher.consume_token(token):
            return False, False
    return True, answer.complete


CALL_TEXT = '<tool_call>\n{"name": "add", "arguments": {"x": 2}}\n</tool_call>'


def test_the_auto_grammar_allows_text_or_text_then_one_call_held_to_its_schema(grammars, real_tokenizer):
    auto = GENERIC.grammar([ADD], forced=False)
    assert accepts(grammars, real_tokenizer, auto, "Two and three make five.") == (True, True)
    assert accepts(grammars, real_tokenizer, auto, "Let me add. " + CALL_TEXT) == (True, True)
    assert accepts(grammars, real_tokenizer, auto, "Let me add. <tool_call>") == (True, False)  # a call must follow
    for bad in ('<tool_call>\nsure', '<tool_call>\n{"name": "mul"', '<tool_call>\n{"name": "add", "arguments": '
                                                                     '{"x": "2"', CALL_TEXT + " And more."):
        assert accepts(grammars, real_tokenizer, auto, bad)[0] is False, bad


def test_the_forced_grammar_allows_only_a_call(grammars, real_tokenizer):
    forced = GENERIC.grammar([ADD])
    assert accepts(grammars, real_tokenizer, forced, CALL_TEXT) == (True, True)
    assert accepts(grammars, real_tokenizer, forced, "Sure")[0] is False


def fenced(text: str, step: int) -> tuple[str, list]:
    parser, pieces = ToolCallParser(FENCED_JSON, frozenset({"calculator"})), []
    for i in range(0, len(text), step):
        pieces += parser.push(text[i:i + step])
    pieces += parser.flush()
    assert not any(isinstance(p, (CallStarted, CallArguments)) for p in pieces[:-2])  # nothing streams early
    return "".join(p.text for p in pieces if isinstance(p, TextPiece)), parser.calls


FENCED_CALL = '```json\n{\n  "name": "calculator",\n  "arguments": {\n    "expression": "1234 * 5678"\n  }\n}\n```'


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_a_call_of_a_named_tool_in_a_json_block_is_read_whole_and_any_other_block_is_text(step):
    assert fenced(f"Let me.\n{FENCED_CALL}", step) == (
        "Let me.\n", [{"name": "calculator", "arguments": '{"expression": "1234 * 5678"}'}])
    other = '```json\n{"name": "Ada", "arguments": [1]}\n```\n```json\n{"age": 3}\n```\n```python\nx = 1\n```'
    assert fenced(f"A record: {other} done", step) == (f"A record: {other} done", [])
    assert fenced('```json\n{"name": "calculator", "argu', step) == ('```json\n{"name": "calculator", "argu', [])


def test_a_call_nested_past_the_json_reader_is_text_not_an_error():
    deep = "<tool_call>" + "[" * 5000 + "</tool_call>"
    assert parse(deep, 1000)[:2] == (deep, [])
    assert fenced("```json\n" + "[" * 5000 + "\n```", 1000)[0].startswith("```json\n[[[")
